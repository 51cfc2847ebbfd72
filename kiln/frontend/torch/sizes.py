"""torch's symbolic sizes as kiln expressions, for programs exported with ``dynamic_shapes``.

torch.export records a dynamic dimension as a symbol (``s27``) and sizes derived from it as
expressions (``2*s27``, ``s27//4``). Where an operator needs such a size as a value — the
bound of an ``arange``, the shape of a new tensor, a reshape no copy code can express —
kiln computes it when the program runs: each symbol is the size of an axis of an input
(``take(shape_of(%x), axis)``), and the expression is int64 arithmetic on those, which the
VM evaluates before the ``dyn.*`` operators that take it (kiln/op/dyn.py).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln import op
from kiln.errors import Error
from kiln.ir import Expr, const

# symbol -> (input, axis, c, d): the input's size along axis is c * symbol + d
Sources = dict[str, tuple[Expr, int, int, int]]


def add_sources(sources: Sources, x: Expr, sizes: Sequence[Any]) -> None:
    """Record which symbols the sizes of input ``x`` give: a symbol itself (``s27``), or one
    in a linear size (``2*s27``, ``s27 + 1``: a ``Dim`` derived from another)."""
    for axis, size in enumerate(sizes):
        node = getattr(size, "node", None)
        if node is None or node.maybe_as_int() is not None:
            continue
        e = node.expr
        if e.is_Symbol:
            sources.setdefault(str(e), (x, axis, 1, 0))
            continue
        free = list(e.free_symbols)
        if len(free) != 1:
            continue
        s = free[0]
        poly = e.as_poly(s) if hasattr(e, "as_poly") else None
        if poly is None or poly.degree() != 1:
            continue
        c, d = (poly.coeff_monomial(s), poly.coeff_monomial(1))
        if c.is_Integer and d.is_Integer and int(c) > 0:
            sources.setdefault(str(s), (x, axis, int(c), int(d)))


def _int64(v: int) -> Expr:
    return const(np.asarray(v, "int64"))


def size_expr(d: Any, sources: Sources) -> Expr:
    """An int64 scalar expression for a torch size (an int or a SymInt)."""
    if isinstance(d, int):
        return _int64(d)
    node = getattr(d, "node", None)
    if node is None:
        raise Error(f"{d!r} is not a size")
    as_int = node.maybe_as_int()
    if as_int is not None:
        return _int64(as_int)
    return _sympy(node.expr, sources)


# sympy's operations in torch's size expressions, as kiln's (FloorDiv and Mod are binary)
_SYMPY_OPS = {"Add": op.add, "Mul": op.multiply, "Max": op.maximum, "Min": op.minimum,
              "FloorDiv": op.floor_divide, "Mod": op.floor_mod, "PythonMod": op.floor_mod}


def _sympy(root: Any, sources: Sources) -> Expr:
    """A sympy expression over symbols of input sizes as kiln arithmetic (post-order, with an
    explicit stack: sympy trees from torch are small, but nothing here recurses)."""
    done: dict[int, Expr] = {}
    stack: list[tuple[Any, bool]] = [(root, False)]
    while stack:
        e, ready = stack.pop()
        if id(e) in done:
            continue
        if e.is_Symbol:
            source = sources.get(str(e))
            if source is None:
                raise Error(f"the symbolic size {e} is not the size of an input's axis")
            x, axis, c, d = source
            size: Expr = op.take(op.shape_of(x, dtype="int64"), _int64(axis))
            if d:
                size = op.subtract(size, _int64(d))
            if c != 1:
                size = op.floor_divide(size, _int64(c))
            done[id(e)] = size
            continue
        if e.is_Integer:
            done[id(e)] = _int64(int(e))
            continue
        if not ready:
            stack.append((e, True))
            stack.extend((a, False) for a in e.args)
            continue
        args = [done[id(a)] for a in e.args]
        kind = type(e).__name__
        combine = _SYMPY_OPS.get(kind)
        if combine is None:
            raise Error(f"kiln cannot compute the symbolic size {root} (it uses {kind})")
        done[id(e)] = functools.reduce(combine, args)  # n-ary Add/Mul/Max/Min fold left
    return done[id(root)]


def shape_tensor(sizes: Sequence[Any], sources: Sources) -> Expr:
    """A 1-D int64 tensor of torch sizes (a constant when they are all numbers)."""
    if all(isinstance(d, int) for d in sizes):
        return const(np.asarray(list(sizes), "int64").reshape(len(sizes)))
    parts = [op.expand_dims(size_expr(d, sources), axis=0) for d in sizes]
    return parts[0] if len(parts) == 1 else op.concatenate(parts, axis=0)
