"""What a model updates or draws itself in training: running statistics and dropout keys.

A loss function may call ``nn.batch_norm(..., training=True)`` with running statistics that
are parameters of it (torch's buffers), and ``nn.dropout_train(x, %key)`` with a key that is
one. `find_buffers` finds both; `with_statistics` makes the function also return the updated
statistics, after its own results, so that the step program returns them and the Step writes
them back into the statistics' arrays (as it does the weights: donation). The Step fills each
key parameter itself before each step: ``(seed, step * n_keys + j)`` for the j-th, so that
every step and every key parameter draws new masks, reproducibly from the seed.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.errors import Error
from kiln.ir.expr import Call, Expr, Function, If, Let, Match, Op, Tuple, TupleGetItem
from kiln.ir.module import IRModule
from kiln.ir.traverse import post_order
from kiln.ir.ty import TupleType


@dataclass(frozen=True)
class Buffers:
    """Running statistics (parameter index, the expression of its new value) and dropout
    keys (parameter indices) of a loss function."""

    stats: tuple[tuple[int, Expr], ...]
    keys: tuple[int, ...]


def _op_name(e: Expr) -> str | None:
    return e.op.name if isinstance(e, Call) and isinstance(e.op, Op) else None


def _is_training_bn(e: Expr) -> bool:
    return _op_name(e) == "nn.batch_norm" and bool(e.attrs.get("training"))  # type: ignore[attr-defined]


def find_buffers(fn: Function) -> Buffers:
    """The running statistics and dropout keys among ``fn``'s parameters."""
    where = {id(p): i for i, p in enumerate(fn.params)}
    top = post_order(fn.body, gate=lambda n: not isinstance(n, (Function, If, Match)))
    nested = [n for n in post_order(fn.body) if _is_training_bn(n)]
    reached = {id(n) for n in top}
    if any(id(n) not in reached for n in nested):
        raise Error("a batch norm in training mode inside a function or a branch of the loss "
                    "function: kiln.train updates only running statistics it can return")
    # a call bound by a let is read through its variable (not computed a second time)
    bound = {id(n.value): n.var for n in top if isinstance(n, Let)}
    stats: list[tuple[int, Expr]] = []
    keys: list[int] = []
    for node in top:
        if _is_training_bn(node):
            assert isinstance(node, Call)
            value: Expr = bound.get(id(node), node)
            for field, arg in ((1, node.args[3]), (2, node.args[4])):
                i = where.get(id(arg))
                if i is None:
                    continue  # statistics computed in the program: nothing to keep
                if any(j == i for j, _ in stats):
                    raise Error(f"%{fn.params[i].name_hint} is the running statistic of two "
                                "batch norms in training mode: give each its own")
                stats.append((i, TupleGetItem(value, field)))
        elif _op_name(node) == "nn.dropout_train":
            assert isinstance(node, Call)
            i = where.get(id(node.args[1]))
            if i is not None and i not in keys:
                keys.append(i)
    return Buffers(tuple(stats), tuple(keys))


def check_other_functions(mod: IRModule | None) -> None:
    """A `kiln.Error` if a function of ``mod`` other than @main calls a batch norm in
    training mode: its running statistics would not be kept (the Step sees @main's)."""
    if mod is None:
        return
    for gv in mod:
        f = mod[gv]
        if gv.name != "main" and isinstance(f, Function) and any(
                _is_training_bn(n) for n in post_order(f.body)):
            raise Error(f"@{gv.name} calls a batch norm in training mode: kiln.train "
                        "keeps the running statistics of @main's only (inline the function)")


def with_statistics(fn: Function, stats: tuple[tuple[int, Expr], ...]) -> Function:
    """``fn`` returning ``(loss, its other results..., new statistics...)``: the tail of its
    let chain becomes that tuple."""
    lets: list[Let] = []
    tail = fn.body
    while isinstance(tail, Let):
        lets.append(tail)
        tail = tail.body
    t = fn.body.checked_type
    if isinstance(t, TupleType):
        own = (list(tail.fields) if isinstance(tail, Tuple)
               else [TupleGetItem(tail, i) for i in range(len(t.fields))])
    else:
        own = [tail]
    body: Expr = Tuple((*own, *(e for _, e in stats)))
    for let in reversed(lets):
        body = Let(let.var, let.value, body)
    return Function(fn.params, body, type_params=fn.type_params, attrs=fn.attrs)


__all__ = ["Buffers", "check_other_functions", "find_buffers", "with_statistics"]
