"""split-to-slices: a split whose fields all feed fusible operators becomes slices.

``split(x)`` makes a tuple, and fuse-ops keeps a tuple-producing call in a kernel of its own:
the split then writes every section to memory for the kernels that read them. When each
field ``%s.k`` is used only by elementwise, broadcast or injective operator calls, each field
is replaced by ``strided_slice(x, begin, end, axes=[axis])``, which fuse-ops folds into those
consumers' kernels (a TreeLSTM cell's gates: the split kernel of every cell disappears).

Left alone: a split whose fields reach anything else (a dense, a tuple, a function's result,
a call of a function), or whose sections along the axis are not known integers.
"""

from __future__ import annotations

import itertools

from kiln.ir.expr import Call, Expr, Function, Op, TupleGetItem
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.ir.ty import TensorType
from kiln.op import registry
from kiln.op.registry import OpPattern
from kiln.op.shape import SplitAttrs, _split_sizes, strided_slice
from kiln.transform.pass_manager import PassContext, map_typed_functions, module_pass

FUSIBLE = (OpPattern.ELEMWISE, OpPattern.BROADCAST, OpPattern.INJECTIVE)


def _sections(split: Call) -> list[tuple[int, int]] | None:
    """(begin, end) of each section of ``split`` along its axis, or None if unknown."""
    data = split.args[0].checked_type_
    if not isinstance(data, TensorType) or not data.is_static:
        return None
    a = SplitAttrs.view(split.attrs)
    axis = a.axis % data.ndim
    sizes = [int(d) for d in _split_sizes(data.static_shape[axis], a.indices_or_sections, axis)
             if isinstance(d, int)]  # every size, the dimension being known
    return list(itertools.pairwise(itertools.accumulate(sizes, initial=0)))


def _fusible_consumer(e: Expr) -> bool:
    return (isinstance(e, Call) and isinstance(e.op, Op)
            and registry.get(e.op.name, e.span).pattern in FUSIBLE)


def split_to_slices(func: Function) -> Function:
    """``func`` with its qualifying splits' fields as slices (see the module docstring)."""
    users: dict[int, list[Expr]] = {}
    nodes = list(post_order(func))
    for node in nodes:
        for c in children(node):
            users.setdefault(id(c), []).append(node)
    chosen: dict[int, tuple[Call, list[tuple[int, int]], int]] = {}  # id(item) -> ...
    for node in nodes:
        if not (isinstance(node, Call) and isinstance(node.op, Op) and node.op.name == "split"):
            continue
        items = users.get(id(node), [])
        sections = _sections(node)
        if sections is None or not items or not all(
                isinstance(i, TupleGetItem) and users.get(id(i))
                and all(_fusible_consumer(u) for u in users[id(i)]) for i in items):
            continue
        data = node.args[0].checked_type_
        assert isinstance(data, TensorType)  # _sections saw it
        axis = SplitAttrs.view(node.attrs).axis % data.ndim
        for item in items:
            assert isinstance(item, TupleGetItem)  # checked above
            chosen[id(item)] = (node, sections, axis)
    if not chosen:
        return func
    done: dict[int, Expr] = {}
    for node in nodes:
        if id(node) in chosen:
            split, sections, axis = chosen[id(node)]
            assert isinstance(node, TupleGetItem)
            begin, end = sections[node.index]
            done[id(node)] = strided_slice(done[id(split.args[0])], begin=[begin], end=[end],
                                           axes=[axis])
            continue
        done[id(node)] = with_children(node, [done[id(c)] for c in children(node)])
    new = done[id(func)]
    assert isinstance(new, Function)  # with_children rebuilds a node as its own kind
    return new


@module_pass("split-to-slices", opt_level=1)
def SplitToSlices(mod: IRModule, ctx: PassContext) -> IRModule:
    """Replace the fields of splits that feed only fusible operators by strided slices."""
    return map_typed_functions(mod, split_to_slices)
