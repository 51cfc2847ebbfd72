"""qnn-canonicalize: every ``qnn.*`` call becomes the core operators that compute its integers.

Relay's QNN canonicalization (TVM ``src/relay/qnn/op/*.cc``): ``qnn.dense`` becomes an
``nn.dense`` of the 8-bit operands accumulating in int32 plus zero-point corrections,
``qnn.requantize`` an int64 fixed-point multiply, and so on. Each operator's form lives beside
it (`kiln.op.qnn.common.CANONICAL`); this pass only finds the calls and substitutes. It runs
at every optimization level (there is no other lowering of the qnn operators), after
fold-constant has made the scales constants where it can.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import Error
from kiln.ir.expr import Call, Constant, Expr, Tuple
from kiln.ir.module import IRModule
from kiln.op.qnn.common import CANONICAL
from kiln.op.registry import get
from kiln.transform.pass_manager import PassContext, module_pass
from kiln.transform.pattern import Pat, RewriteContext, RewriteTable, Rule


def _resolved(e: Expr, ctx: RewriteContext) -> Expr:
    """A constant (or a tuple of them) behind a let-bound variable, or ``e`` itself."""
    v = ctx.value_of(e)
    if isinstance(v, Constant):
        return v
    if isinstance(v, Tuple):
        return Tuple(tuple(_resolved(f, ctx) for f in v.fields))
    return e


def _rewrite(name: str) -> Any:
    form = CANONICAL[name]

    def rewrite(root: Expr, ctx: RewriteContext) -> Expr | None:
        assert isinstance(root, Call)  # the pattern matches calls
        types = [ctx.type_of(a) for a in root.args]
        if any(t is None for t in types):
            return None
        call = Call(root.op, tuple(_resolved(a, ctx) for a in root.args), root.attrs,
                    span=root.span)
        try:
            return form(call, types)
        except Error as e:
            raise Error(e.message, e.span or root.span) from None

    rewrite.__name__ = f"canonicalize_{name.replace('.', '_')}"
    return rewrite


RULES = RewriteTable([
    Rule(Pat.op(name, *[Pat.any() for _ in get(name).inputs]), _rewrite(name))
    for name in sorted(CANONICAL)
])


@module_pass("qnn-canonicalize", opt_level=0)
def QnnCanonicalize(mod: IRModule, ctx: PassContext) -> IRModule:
    """Replace each qnn.* call by the core operators computing the same integers."""
    return RULES.apply_to_module(mod, ctx)
