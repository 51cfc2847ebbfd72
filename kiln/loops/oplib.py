"""Building blocks for operator lowerings (the ``lower=`` rule beside each operator).

A lowering is ``lower(inputs, attrs, out_type) -> Tensor`` (or a tuple of them for an
operator with a tuple result): ``inputs`` are `Tensor`s (a tuple argument arrives as a tuple
of Tensors), ``out_type`` is the call's checked type, always static. The helpers here cover the
common shapes of operator:

- `unary(fn)` / `binary(fn)`: elementwise and broadcasting operators from a scalar function;
- `reduction(combine, init, finalize)`: sum/max/... over ``axis``/``keepdims``/``exclude``;
- `reshape_indices`, `reduce_index`, `window_span`: index arithmetic of reshapes, reductions
  and sliding windows;
- `guarded_read`, `clamp`: reads that may fall outside a tensor (padding, data-dependent
  indices), clamped so the verifier can prove the access in bounds and selected away;
- `dtype_const`, `convert`, `lowest`, `highest`: scalar pieces with numpy's semantics;
- `elementwise_extern`, `outer_nest`, `fail`: results that need statements (a run-time
  `Check`, a loop per element, an error known when lowering);
- `zeros_if_empty`: a rule's guard for results without elements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.ir.dtype import dtype_of
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.loops.compute import Indices, Tensor, WriteFn, broadcast_indices, compute, extern, reduce
from kiln.loops.ir import (
    INDEX,
    Allocate,
    Binary,
    Broadcast,
    Buffer,
    Cast,
    Check,
    Const,
    Expr,
    For,
    LetStmt,
    Load,
    Select,
    Seq,
    Stmt,
    Store,
    Unary,
    Var,
)
from kiln.loops.ir import binary as ir_binary
from kiln.loops.schedule import NestSchedule, loop_nest

LowerFn = Callable[[list[Any], Any, Type], Any]


def out_tensor_type(out_type: Type) -> TensorType:
    assert isinstance(out_type, TensorType)
    return out_type


def dtype_const(value: float | int | bool, dtype: str) -> Const:
    """A constant of a tensor dtype (Python value converted as numpy would)."""
    if dtype == "bool":
        return Const(bool(value), dtype)
    if dtype_of(dtype).is_float:
        return Const(float(value), dtype)
    return Const(int(value), dtype)


def unary(fn: str | Callable[[Expr], Expr]) -> LowerFn:
    """An elementwise operator: ``fn`` is a loop-IR unary op name or a scalar function."""
    scalar = (lambda x: Unary(fn, x)) if isinstance(fn, str) else fn

    def lower(inputs: list[Tensor], attrs: Any, out_type: Type) -> Tensor:
        out = out_tensor_type(out_type)
        (x,) = inputs
        return compute(out.static_shape, out.dtype, lambda *i: scalar(x(*i)))

    return lower


def binary(fn: str | Callable[[Expr, Expr], Expr]) -> LowerFn:
    """A broadcasting binary operator: ``fn`` is a loop-IR binary op name or a function."""
    scalar = (lambda a, b: Binary(fn, a, b)) if isinstance(fn, str) else fn

    def lower(inputs: list[Tensor], attrs: Any, out_type: Type) -> Tensor:
        out = out_tensor_type(out_type)
        a, b = inputs
        shape = out.static_shape

        def element(*i: Expr) -> Expr:
            return scalar(a(*broadcast_indices(a.shape, shape, i)),
                          b(*broadcast_indices(b.shape, shape, i)))

        return compute(shape, out.dtype, element)

    return lower


def reduced_axes(ndim: int, axis: Sequence[int] | int | None, exclude: bool) -> list[int]:
    """The axes a reduction runs over, from Relay's ``axis``/``exclude`` attributes.

    As the reference (kiln/op/reduce.py): no axes, or an empty list, means every axis, even
    with ``exclude``.
    """
    if axis is None or (not isinstance(axis, int) and len(axis) == 0):
        return list(range(ndim))
    axes = sorted({a % ndim for a in ((axis,) if isinstance(axis, int) else axis)})
    if exclude:
        axes = [k for k in range(ndim) if k not in axes]
    return axes


def reduce_index(
    ndim: int, axes: Sequence[int], keepdims: bool, o: Sequence[Expr], r: Sequence[Expr]
) -> list[Expr]:
    """The input indices of a reduction over ``axes``: output indices ``o`` on the kept axes
    (with ``keepdims`` the output has the reduced axes too, as size 1), ``r`` on the others."""
    idx: list[Expr] = [Const(0, INDEX)] * ndim
    kept = [k for k in range(ndim) if k not in axes]
    outer = [o[k] for k in kept] if keepdims else list(o)
    for k, v in zip(kept, outer):
        idx[k] = v
    for k, v in zip(axes, r):
        idx[k] = v
    return idx


def reduction(
    combine: str,
    init: Callable[[str], Expr],
    finalize: Callable[[Expr, int], Expr] | None = None,
    acc_dtype: Callable[[str], str] | None = None,
    empty: str | None = None,
) -> LowerFn:
    """A reduction operator with Relay's ``axis``, ``keepdims`` and ``exclude`` attributes.

    ``init(dtype)`` gives the starting value, ``finalize(acc, count)`` post-processes the
    accumulated value (mean divides by the count). ``empty``, when given, is the error of a
    reduction over no elements (max has no value there).
    """

    def lower(inputs: list[Tensor], attrs: Any, out_type: Type) -> Tensor:
        out = out_tensor_type(out_type)
        shape = out.static_shape
        (x,) = inputs
        axes = reduced_axes(x.ndim, attrs["axis"], attrs["exclude"])
        extents = [x.shape[k] for k in axes]
        count = 1
        for e in extents:
            count *= e
        if count == 0 and empty is not None:
            return fail(shape, out.dtype, f"{empty} (a tensor of shape {x.shape})")
        acc = acc_dtype(x.dtype) if acc_dtype else x.dtype

        def body(o: tuple[Expr, ...], r: tuple[Expr, ...]) -> Expr:
            value = x(*reduce_index(x.ndim, axes, attrs["keepdims"], o, r))
            return convert(value, acc)

        def finish(a: Expr, o: tuple[Expr, ...]) -> Expr:
            if finalize is not None:
                a = finalize(a, count)
            return convert(a, out.dtype) if acc != out.dtype else a

        fin = finish if finalize is not None or acc != out.dtype else None
        return reduce(shape, out.dtype, extents, combine, body, init(acc), fin, acc)

    return lower


def reshape_indices(
    in_shape: Sequence[int], out_shape: Sequence[int], idx: Sequence[Expr]
) -> tuple[Expr, ...]:
    """The input indices of a reshape: through the row-major flat position.

    Size-1 axes carry nothing, and leading or trailing axes that the two shapes share map
    straight across; only the axes between go through the flat position.
    """
    if tuple(in_shape) == tuple(out_shape):
        return tuple(idx)
    if 0 in in_shape or 0 in out_shape:
        # Nothing is read, but the access must still verify: an empty axis's loop index
        # ranges over [0, -1], which is inside every axis.
        empty = next(i for i, d in zip(idx, out_shape) if d == 0)
        return tuple(empty for _ in in_shape)
    ins = [k for k, d in enumerate(in_shape) if d != 1]
    outs = [k for k, d in enumerate(out_shape) if d != 1]
    result: list[Expr] = [Const(0, INDEX)] * len(in_shape)
    lo = 0
    while lo < min(len(ins), len(outs)) and in_shape[ins[lo]] == out_shape[outs[lo]]:
        result[ins[lo]] = idx[outs[lo]]
        lo += 1
    hi_in, hi_out = len(ins), len(outs)
    while hi_in > lo and hi_out > lo and in_shape[ins[hi_in - 1]] == out_shape[outs[hi_out - 1]]:
        hi_in, hi_out = hi_in - 1, hi_out - 1
        result[ins[hi_in]] = idx[outs[hi_out]]
    flat: Expr = Const(0, INDEX)
    step = 1
    for k in reversed(outs[lo:hi_out]):
        flat = flat + idx[k] * step
        step *= out_shape[k]
    step = 1
    split: list[tuple[int, int]] = []
    for k in reversed(ins[lo:hi_in]):
        split.append((k, step))
        step *= in_shape[k]
    for n, (k, stride) in enumerate(reversed(split)):
        # flat is less than the product of these axes: the outermost needs no modulo
        result[k] = flat // stride if n == 0 else (flat // stride) % in_shape[k]
    return tuple(result)


# --- scalar pieces ----------------------------------------------------------------------------


def convert(e: Expr, dtype: str) -> Expr:
    """``e`` converted to ``dtype`` as numpy's ``astype`` does: to bool means "nonzero"."""
    if e.dtype == dtype:
        return e
    if dtype == "bool":
        return Binary("ne", e, _splat(dtype_const(0, e.dtype), e.lanes))
    return Cast(dtype, e)


def _splat(c: Const, lanes: int) -> Expr:
    return c if lanes == 1 else Broadcast(c, lanes)


def lowest(dtype: str) -> Const:
    """The identity of ``max``: -inf, or the integer dtype's minimum."""
    if dtype_of(dtype).is_float:
        return Const(float("-inf"), dtype)
    if dtype == "bool":
        return Const(False, dtype)
    return Const(int(np.iinfo(dtype).min), dtype)


def highest(dtype: str) -> Const:
    """The identity of ``min``: inf, or the integer dtype's maximum."""
    if dtype_of(dtype).is_float:
        return Const(float("inf"), dtype)
    if dtype == "bool":
        return Const(True, dtype)
    return Const(int(np.iinfo(dtype).max), dtype)


def as_index(value: int) -> Const:
    """An index constant (int64)."""
    return Const(int(value), INDEX)


def clamp(e: Expr, lo: int | Expr, hi: int | Expr) -> Expr:
    """``min(max(e, lo), hi)``: how lowerings keep data-dependent indices provably in range."""
    return ir_binary("min", ir_binary("max", e, lo), hi)


def all_of(conds: Sequence[Expr]) -> Expr | None:
    """The conjunction of bool expressions (None for none)."""
    out: Expr | None = None
    for c in conds:
        out = c if out is None else Binary("and", out, c)
    return out


def guarded_read(
    t: Tensor,
    idx: Sequence[Expr],
    spans: Sequence[tuple[int, int] | None],
    fill: Expr,
    extra: Sequence[Expr] = (),
    read: Callable[[list[Expr]], Expr] | None = None,
) -> Expr:
    """``t[idx]`` where the indices fall inside ``t`` (and every ``extra`` holds), else ``fill``.

    ``spans[k]`` is the static range [lo, hi] that index ``k`` can take (None: it is known to be
    inside). An index whose range may leave the tensor is clamped for the access (so the read
    is always in bounds, as `Select` evaluates both arms) and tested for the select. A read of
    an empty tensor is never needed, so it gives ``fill``. ``read``, when given, makes the
    value from the safe indices instead of reading ``t`` (to divide by a count there, say).
    """
    if any(d == 0 for d in t.shape):
        return fill
    conds = list(extra)
    safe: list[Expr] = []
    for i, span, n in zip(idx, spans, t.shape):
        access = i
        if span is not None:
            lo, hi = span
            if lo < 0:
                conds.append(ir_binary("ge", i, 0))
                access = ir_binary("max", access, 0)
            if hi > n - 1:
                conds.append(ir_binary("lt", i, n))
                access = ir_binary("min", access, n - 1)
        safe.append(access)
    value = read(safe) if read is not None else t(*safe)
    cond = all_of(conds)
    return value if cond is None else Select(cond, value, fill)


def window_span(
    out_size: int, stride: int, kernel: int, dilation: int, pad: int
) -> tuple[int, int]:
    """The range of ``o * stride + r * dilation - pad`` over the output positions ``o`` and the
    taps ``r`` of a sliding window: where convolution and pooling read their input."""
    return -pad, (out_size - 1) * stride + (kernel - 1) * dilation - pad


def windows_inside(size: int, stride: int, taps: int, dilation: int, pad: int,
                   out: int) -> tuple[int, int]:
    """The output positions [lo, hi) of a sliding window (`window_span`'s) whose every tap
    lies inside an input axis of ``size``: those that read it without a bounds test."""
    span = (taps - 1) * dilation
    lo = -(-pad // stride)
    hi = (size - 1 - span + pad) // stride + 1
    lo = min(max(lo, 0), out)
    return lo, min(max(hi, lo), out)


# --- lowerings that write their own loops -----------------------------------------------------


def fail(shape: Sequence[int], dtype: str, message: str) -> Tensor:
    """A result that cannot be computed (a max over an empty axis): the kernel stops with
    ``message`` (as `kiln.EvalError`) when it runs, as the reference implementation raises."""
    return extern(shape, dtype, lambda write: Check(Const(False, "bool"), message))


def outer_nest(
    shape: Sequence[int], body: Callable[[Indices], Stmt], work_per_element: int
) -> Stmt:
    """Loops over ``shape`` around a body with loops of its own (a row of softmax, a window):
    parallel when the whole work pays for it, and none marked vectorized, as the body holds
    the innermost loops."""
    default = NestSchedule.default(shape, work_per_element=work_per_element)
    return loop_nest(shape, body, NestSchedule(default.parallel_axis, None))


def elementwise_extern(
    shape: Sequence[int],
    dtype: str,
    element: Callable[[Indices, WriteFn], Stmt],
    work_per_element: int = 1,
) -> Tensor:
    """An elementwise result whose elements need statements, not just an expression (a run-time
    `Check`, a loop): ``element(idx, write)`` is the statement for the element at ``idx``,
    calling ``write(idx, value)`` once. ``work_per_element`` > 1 says the statement loops."""
    if work_per_element > 1:
        return extern(shape, dtype, lambda write: outer_nest(
            shape, lambda idx: element(idx, write), work_per_element))
    return extern(shape, dtype, lambda write: loop_nest(shape, lambda idx: element(idx, write)))


def zeros_if_empty(rule: LowerFn) -> LowerFn:
    """``rule``, except that a result without elements lowers to a constant: its loops never
    run, and index arithmetic over an empty range need not (and cannot) be proven in bounds."""

    def lower(inputs: list[Any], attrs: Any, out_type: Type) -> Any:
        is_tuple = isinstance(out_type, TupleType)
        types = out_type.fields if isinstance(out_type, TupleType) else (out_type,)
        fields = [out_tensor_type(t) for t in types]
        if all(0 in t.shape for t in fields):
            made = tuple(compute(t.static_shape, t.dtype,
                                 lambda *i, t=t: dtype_const(0, t.dtype)) for t in fields)
            return made if is_tuple else made[0]
        return rule(inputs, attrs, out_type)

    return lower


def lanes_combined(acc: Buffer, combine: str) -> list[Stmt]:
    """The lanes of ``acc[0]`` (a vector of a power of two lanes) combined into ``acc[0, 0]``
    as a tree: its upper half into its lower, then that half's, down to one lane.

    A fixed order, so the result does not depend on the threads; log2(L) vector steps where
    one lane after another was L - 1 dependent scalar steps (four cycles each): on rows of
    128 floats, softmax spent more on its two horizontal folds than on the exponentials."""
    lanes = acc.shape[1]
    zero = Const(0, INDEX)
    stmts: list[Stmt] = []
    half = lanes // 2
    while half >= 1:
        stmts.append(Store(acc, (zero, zero), Binary(
            combine, Load(acc, (zero, zero), half), Load(acc, (zero, Const(half, INDEX)), half))))
        half //= 2
    return stmts


def lane_fold(n: int, lanes: int, dtype: str, init: Expr,
              vector_step: Callable[[Expr, Expr], Expr], combine: str,
              scalar_step: Callable[[Expr, Expr], Expr],
              use: Callable[[Expr], Stmt], loops: bool = False) -> Stmt:
    """A fold over ``n`` positions in vectors of ``lanes``: four vector accumulators
    (``vector_step(acc, p)`` folds the ``lanes`` positions from ``p`` into ``acc``), then the
    four and their lanes combined with ``combine`` ("add", "max", "min"), then the scalar
    tail (``scalar_step(total, q)``); ``use(value)`` is the statement that uses the result.
    The order is fixed by the shapes, so the result does not depend on threads. The dot
    product of batch-1 dense (kiln/loops/linear_kernels.py) and softmax's row maximum.

    With ``loops``, the vector and scalar tails are loops whose bounds are expressions of
    ``n`` left unfolded (``n // L * L``), the same operations in the same order: the fold
    lowered at two sizes then differs only by ``n``, so a kernel of symbolic ``n`` can be
    made of it (kiln/loops/generalize.py), and the verifier proves it for every ``n``."""
    if loops:
        return _lane_fold_loops(n, lanes, dtype, init, vector_step, combine, scalar_step, use)
    acc = Buffer("fold", (4, lanes), dtype, "local")
    chunks = n // (4 * lanes)
    vec_tail = (n - chunks * 4 * lanes) // lanes

    def at(u: int) -> Load:
        return Load(acc, (Const(u, INDEX), Const(0, INDEX)), lanes)

    def put(u: int, value: Expr) -> Store:
        return Store(acc, (Const(u, INDEX), Const(0, INDEX)), value)

    stmts: list[Stmt] = [put(u, Broadcast(init, lanes)) for u in range(4)]
    if chunks:
        p0 = Var("p0")
        stmts.append(For(p0, Const(0, INDEX), Const(chunks, INDEX), Seq(tuple(
            put(u, vector_step(at(u), p0 * (4 * lanes) + u * lanes)) for u in range(4)))))
    for t in range(vec_tail):
        stmts.append(put(t, vector_step(at(t), Const(chunks * 4 * lanes + t * lanes, INDEX))))
    stmts.append(put(0, Binary(combine, Binary(combine, at(0), at(1)),
                               Binary(combine, at(2), at(3)))))
    stmts += lanes_combined(acc, combine)
    total: Expr = Load(acc, (Const(0, INDEX), Const(0, INDEX)))
    for q in range(chunks * 4 * lanes + vec_tail * lanes, n):
        total = scalar_step(total, Const(q, INDEX))
    value = Var("folded", dtype)
    return Allocate(acc, Seq((*stmts, LetStmt(value, total, use(value)))))


def _lane_fold_loops(n: int, lanes: int, dtype: str, init: Expr,
                     vector_step: Callable[[Expr, Expr], Expr], combine: str,
                     scalar_step: Callable[[Expr, Expr], Expr],
                     use: Callable[[Expr], Stmt]) -> Stmt:
    """`lane_fold` with its tails as loops over unfolded expressions of ``n`` (see there)."""
    acc = Buffer("fold", (4, lanes), dtype, "local")
    size, block, vec = Const(n, INDEX), Const(4 * lanes, INDEX), Const(lanes, INDEX)
    zero = Const(0, INDEX)
    # Binary, not the folding operators: n // (4L), (n % 4L) // L and n // L * L stay
    # expressions of the constant n, for a symbolic n to take its place
    chunks = Binary("floordiv", size, block)
    vec_tail = Binary("floordiv", Binary("floormod", size, block), vec)
    scalar_start = Binary("mul", Binary("floordiv", size, vec), vec)

    def at(u: Expr) -> Load:
        return Load(acc, (u, zero), lanes)

    def put(u: Expr, value: Expr) -> Store:
        return Store(acc, (u, zero), value)

    p0, t, q = Var("p0"), Var("t"), Var("q")
    units = [Const(u, INDEX) for u in range(4)]
    first = (0, 0)
    stmts: list[Stmt] = [put(u, Broadcast(init, lanes)) for u in units]
    stmts.append(For(p0, zero, chunks, Seq(tuple(
        put(u, vector_step(at(u), p0 * (4 * lanes) + u.value * lanes)) for u in units))))
    stmts.append(For(t, zero, vec_tail, put(t, vector_step(
        at(t), Binary("add", Binary("mul", chunks, block), t * lanes)))))
    stmts.append(put(units[0], Binary(combine, Binary(combine, at(units[0]), at(units[1])),
                                      Binary(combine, at(units[2]), at(units[3])))))
    stmts += lanes_combined(acc, combine)
    cell = tuple(Const(i, INDEX) for i in first)
    stmts.append(For(q, scalar_start, Binary("sub", size, scalar_start),
                     Store(acc, cell, scalar_step(Load(acc, cell), q))))
    value = Var("folded", dtype)
    return Allocate(acc, Seq((*stmts, LetStmt(value, Load(acc, cell), use(value)))))
