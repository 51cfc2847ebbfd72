"""Elementwise loop nests over collapsed trailing axes.

An elementwise kernel's loops follow its output's axes. When the innermost extent is too
short to vectorize — a 3×3 convolution weight (512, 512, 3, 3), an optimizer's update of
it — the loops run scalar: `a - lr * v` over that weight took 15.6 ms against 1.0 ms as a
flat array. Where every read of the trailing axes is of a tensor of the same trailing
extents, at the same positions, those axes are one axis in memory for every tensor
involved: the nest runs over it as one loop (long, vectorized, row-major order kept), and
each coordinate is rebuilt from the flat position by floor division and modulo, which the
code generator joins back into the flat position for each address (kiln/codegen/emit_expr.py
`_rejoin`), so the loads and the store stay contiguous vectors.

A kernel being lowered at stand-in sizes to be compiled for every size
(kiln/loops/generalize.py) keeps its axes (`axes_kept`): a collapsed extent is a product of
sizes, which the comparison of its two lowerings could not name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

from kiln.loops.ir import Binary, Const, Expr, Load, Stmt, Var, operands
from kiln.loops.schedule import VECTORIZE_MIN_EXTENT, loop_nest

Element = Callable[[tuple[Expr, ...]], Expr]

_KEPT: ContextVar[bool] = ContextVar("kiln_axes_kept", default=False)


@contextmanager
def axes_kept() -> Iterator[None]:
    """Within: no nest is collapsed (a lowering at stand-in sizes)."""
    token = _KEPT.set(True)
    try:
        yield
    finally:
        _KEPT.reset(token)


def nests_kept() -> bool:
    """Whether nests keep their plain form here (a lowering at stand-in sizes)."""
    return _KEPT.get()


def collapsible_axes(shape: Sequence[int], element: Element) -> int:
    """How many trailing axes of ``shape`` the nest computing ``element`` may run as one
    (0: none). Worth it only when the innermost extent is shorter than a vector loop wants
    and the collapsed one is not. (Any count would compute the same values: the coordinates
    are exact; the conditions are for the addresses to stay contiguous.)"""
    n = len(shape)
    if n < 2 or shape[-1] >= VECTORIZE_MIN_EXTENT or _KEPT.get():
        return 0
    probe = tuple(Var(f"c{k}") for k in range(n))
    value = element(probe)
    for k in range(n - 1):  # the most axes first
        extent = 1
        for d in shape[k:]:
            extent *= d
        if extent >= VECTORIZE_MIN_EXTENT and _flat_readable(value, probe, shape, k):
            return n - k
    return 0


def _flat_readable(e: Expr, probe: tuple[Var, ...], shape: Sequence[int], k: int) -> bool:
    """Whether every read of axes ``k`` and beyond in ``e`` is a load that has them all as
    its own last axes (probe variables in order, the same extents) or reads none of them:
    the loads a flat position addresses contiguously (or not at all)."""
    n = len(probe)
    tail = {id(v) for v in probe[k:]}
    stack: list[Expr] = [e]
    seen: set[int] = set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, Var) and id(x) in tail:
            return False  # a coordinate used as a value, or in a computed index
        if isinstance(x, Load):
            idx, dims = x.indices, x.buffer.shape
            lead = n - len(idx)  # the load's axes align with the nest's last ones
            own = [j for j in range(len(idx)) if lead + j >= k]
            if own and all(idx[j] is probe[lead + j] and dims[j] == shape[lead + j]
                           for j in own) and lead <= k:
                stack.extend(idx[j] for j in range(len(idx)) if lead + j < k)
                continue
        stack.extend(operands(x))
    return True


def collapsed_nest(shape: Sequence[int], body: Callable[[tuple[Expr, ...]], Stmt],
                   count: int) -> Stmt:
    """The loops over ``shape`` with its last ``count`` axes as one, around
    ``body(indices)``: the coordinates of the collapsed axes rebuilt from the flat one."""
    shape = tuple(int(d) for d in shape)
    head, tail = shape[:len(shape) - count], shape[len(shape) - count:]
    flat = 1
    for d in tail:
        flat *= d

    def inner(idx: tuple[Expr, ...]) -> Stmt:
        *outer, f = idx
        coords: list[Expr] = []
        rest = f  # the position within the collapsed axes still to split
        for k in range(len(tail) - 1):
            below = 1
            for e in tail[k + 1:]:
                below *= e
            coords.append(Binary("floordiv", rest, Const(below)))
            rest = Binary("floormod", rest, Const(below))
        coords.append(rest)
        return body((*outer, *coords))

    return loop_nest((*head, flat), inner)
