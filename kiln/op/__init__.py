"""kiln's operators: the registry and a builder for each operator.

``kiln.op.add(a, b)``, ``kiln.op.sum(x, axis=[1])`` and ``kiln.op.nn.conv2d(x, w, padding=1)``
build calls; ``kiln.op.get("nn.conv2d")`` gives an operator's full definition. Importing this
package registers every operator family.
"""

from kiln.op import create, dyn, elementwise, nn, qnn, reduce, shape
from kiln.op.create import *  # noqa: F403
from kiln.op.dyn import *  # noqa: F403
from kiln.op.elementwise import *  # noqa: F403
from kiln.op.fixed_point import fixed_point_multiply
from kiln.op.layout import copy, layout_transform
from kiln.op.reduce import *  # noqa: F403
from kiln.op.registry import REQUIRED, Attr, OpDef, OpPattern, all_ops, get, lookup, register
from kiln.op.shape import *  # noqa: F403

# Builders named like Python builtins are defined with a trailing underscore in their family
# file, so that the family's own code can still use the builtins.
abs = elementwise.abs_
round = elementwise.round_
sum = reduce.sum_
max = reduce.max_
min = reduce.min_
all = reduce.all_
any = reduce.any_

_BUILTIN_NAMES = ["abs", "all", "any", "max", "min", "round", "sum"]

# fmt: off
__all__ = [
    "REQUIRED", "Attr", "OpDef", "OpPattern", "all_ops", "get", "lookup", "register", "nn", "qnn",
    *(n for n in elementwise.__all__ if not n.endswith("_")),
    *(n for n in reduce.__all__ if not n.endswith("_")),
    *shape.__all__,
    *create.__all__,
    "copy", "fixed_point_multiply", "layout_transform",
    *dyn.__all__,
    *_BUILTIN_NAMES,
]
# fmt: on
