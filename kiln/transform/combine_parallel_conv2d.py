"""combine-parallel-conv2d: parallel convolutions of one input become one wider convolution.

An Inception block reads one tensor with several convolutions. When at least
``min_num_branches`` (default 3, as TVM's CombineParallelConv2D) ``nn.conv2d`` calls read the
same input node with the same strides, padding, dilation, layouts, ``groups=1`` and kernel
shape (only the number of output channels may differ), they become one ``nn.conv2d`` on the
weights concatenated along the output channels, and each branch takes its channels back with
a field of one ``split`` along axis 1. One large convolution uses a machine better than
several thin ones. Option: ``config={"combine-parallel-conv2d.min_num_branches": n}``.

Safety: the branches must run together, so they must lie in the same region of the program
(not in different branches of an ``if`` or ``match``, nor in different functions), and their
weights must be constants or variables bound outside that region (so the combined call, which
runs where the first branch ran, sees them all). Other convolutions are left alone.

`combine_parallel` is the machinery, shared with combine-parallel-dense (TVM's
ParallelOpCombiner).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

from kiln.errors import Error
from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    If,
    Let,
    Match,
    Op,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.op import concatenate, split
from kiln.op.nn import conv2d
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass, typed

# a (typed) call -> the key of the calls it may combine with, or None
KeyFn = Callable[[Call], Hashable | None]
# (the shared data, the branch calls) -> the combined call and the size of each branch's part
BuildFn = Callable[[Expr, Sequence[Call]], tuple[Expr, list[int], int]]


def regions(func: Function) -> tuple[dict[int, int], dict[int, int]]:
    """Which region each node of ``func`` runs in, and where each let variable is bound.

    A region is code that runs as a whole: a function body, a branch of an ``if``, a clause of
    a ``match``. A node reached from two regions gets region -1.
    """
    region: dict[int, int] = {}
    let_region: dict[int, int] = {}
    fresh = iter(range(1, 1 << 62))
    stack: list[tuple[Expr, int]] = [(func.body, 0)]
    while stack:
        node, r = stack.pop()
        seen = region.get(id(node))
        if seen is not None:
            if seen != r:
                region[id(node)] = -1
            continue
        region[id(node)] = r
        match node:
            case Function():
                stack.append((node.body, next(fresh)))
            case If():
                stack += [(node.cond, r), (node.true_branch, next(fresh)),
                          (node.false_branch, next(fresh))]
            case Match():
                stack.append((node.data, r))
                stack += [(c.rhs, next(fresh)) for c in node.clauses]
            case Let():
                let_region[id(node.var)] = r
                stack += [(node.value, r), (node.body, r)]
            case _:
                stack += [(k, r) for k in children(node)]
    return region, let_region


def combine_parallel(func: Function, op_name: str, key: KeyFn, build: BuildFn,
                     min_branches: int) -> Function:
    """``func`` with each group of at least ``min_branches`` combinable ``op_name`` calls (same
    data node, same region, same ``key``) replaced by fields of one combined call's split."""
    region, let_region = regions(func)
    groups: dict[Hashable, list[Call]] = {}
    for node in post_order(func.body):
        if not (isinstance(node, Call) and isinstance(node.op, Op) and node.op.name == op_name):
            continue
        r = region.get(id(node), -1)
        data, weight = node.args
        if r < 0 or not _available(data, r, region) or not _outside(weight, r, let_region):
            continue
        k = key(node)
        if k is not None:
            groups.setdefault((id(data), r, k), []).append(node)
    branch_of: dict[int, tuple[int, int]] = {}  # id(call) -> (group number, branch index)
    members = [g for g in groups.values() if len(g) >= min_branches]
    for gi, calls in enumerate(members):
        for bi, call in enumerate(calls):
            branch_of[id(call)] = (gi, bi)
    if not branch_of:
        return func
    combined: dict[int, Expr] = {}
    done: dict[int, Expr] = {}
    for node in post_order(func):
        place = branch_of.get(id(node))
        if place is None:
            done[id(node)] = with_children(node, [done[id(k)] for k in children(node)])
            continue
        gi, bi = place
        if gi not in combined:
            calls = members[gi]
            wide, sizes, axis = build(done[id(calls[0].args[0])], calls)
            bounds = [sum(sizes[: i + 1]) for i in range(len(sizes) - 1)]
            combined[gi] = split(wide, indices_or_sections=bounds, axis=axis)
        done[id(node)] = TupleGetItem(combined[gi], bi)
    new = done[id(func)]
    assert isinstance(new, Function)  # with_children rebuilds a node as its own kind
    return new


def _available(data: Expr, r: int, region: dict[int, int]) -> bool:
    """A variable or constant (in scope at every use), or a node computed in region ``r``."""
    return isinstance(data, (Var, Constant)) or region.get(id(data)) == r


def _outside(weight: Expr, r: int, let_region: dict[int, int]) -> bool:
    """A constant, or a variable not let-bound in region ``r`` (in scope for all of it)."""
    if isinstance(weight, Constant):
        return True
    return isinstance(weight, Var) and let_region.get(id(weight)) != r


def min_branches(ctx: PassContext, pass_name: str) -> int:
    """The ``<pass_name>.min_num_branches`` option (default 3); a kiln.Error if malformed."""
    key = f"{pass_name}.min_num_branches"
    value = ctx.config.get(key, 3)
    if isinstance(value, bool) or not isinstance(value, int) or value < 2:
        raise Error(f"the option {key} must be an integer of at least 2, got {value!r}")
    return value


def combine_module(mod: IRModule, op_name: str, key: KeyFn, build: BuildFn,
                   min_branches: int) -> IRModule:
    """`combine_parallel` on every non-primitive function; ``mod`` itself if none changed."""
    tmod = typed(mod)
    funcs = {}
    for gv, fn in tmod.functions.items():
        funcs[gv] = fn if is_primitive(fn) else combine_parallel(
            fn, op_name, key, build, min_branches)
    if all(funcs[gv] is tmod.functions[gv] for gv in funcs):
        return mod
    return IRModule(funcs, tmod.type_definitions)


# --- conv2d -------------------------------------------------------------------------------


def conv2d_key(call: Call) -> Hashable | None:
    """Convolutions combine when all but their output channel count agree."""
    attrs, weight = call.attrs, call.args[1].checked_type
    if attrs.groups != 1 or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW":
        return None
    if not weight.is_static:  # type: ignore[attr-defined]
        return None
    rest = tuple(sorted((k, v) for k, v in attrs.items() if k != "channels"))
    return (rest, weight.shape[1:], weight.dtype)  # type: ignore[attr-defined]


def conv2d_build(data: Expr, calls: Sequence[Call]) -> tuple[Expr, list[int], int]:
    """One conv2d over the weights concatenated along the output channels (axis 0)."""
    sizes = [c.args[1].checked_type.shape[0] for c in calls]  # type: ignore[attr-defined]
    weight = concatenate(Tuple(tuple(c.args[1] for c in calls)), axis=0)
    attrs = dict(calls[0].attrs)
    attrs["channels"] = sum(sizes) if all(c.attrs.channels is not None for c in calls) else None
    return conv2d(data, weight, **attrs), sizes, 1


@module_pass("combine-parallel-conv2d", opt_level=4)
def CombineParallelConv2D(mod: IRModule, ctx: PassContext) -> IRModule:
    """Combine parallel conv2d calls on one input into one wider conv2d and a split."""
    least = min_branches(ctx, "combine-parallel-conv2d")
    return combine_module(mod, "nn.conv2d", conv2d_key, conv2d_build, least)
