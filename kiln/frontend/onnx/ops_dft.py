"""The converter of ONNX's DFT: the transform along one axis as products with constant
cosine and sine matrices (the signal length is static, so the matrices are built at import).

ONNX keeps complex numbers as a last axis of size 2 (real, imaginary), or 1 for a real
signal. For a signal z of length N along ``axis`` and a transform of length n
(``dft_length``; the signal is cut or zero-padded to it):

    forward   X[k] = sum_j z[j] exp(-2 pi i j k / n)          (k < n//2 + 1 when onesided)
    inverse   x[j] = 1/n sum_k Z[k] exp(+2 pi i j k / n)
    inverse, onesided (irfft): the real signal whose one-sided spectrum is Z (Hermitian
              symmetry gives the other half; the imaginary parts of Z[0] and Z[n/2] drop out)

Each is ``re' = re . A + im . B``, ``im' = re . C + im . D`` with ``nn.dense`` on the axis
moved last, in float64 (the reference computes the transform in double precision).
"""

from __future__ import annotations

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext, cast
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Constant, Expr


def _matrices(n_in: int, n: int, inverse: bool, onesided: bool
              ) -> tuple[np.ndarray, np.ndarray, tuple[np.ndarray, np.ndarray] | None, int]:
    """(A, B, (C, D), output length): out_re = A re + B im, out_im = C re + D im.

    (C, D) is None when the output is real (the inverse of a one-sided transform).
    """
    if inverse and onesided:
        k = np.arange(n_in)[None, :]
        j = np.arange(n)[:, None]
        theta = 2 * np.pi * j * k / n
        weight = np.where((k == 0) | ((n % 2 == 0) & (k == n // 2)), 1.0, 2.0)
        weight = np.where(k > n // 2, 0.0, weight)  # numpy's irfft reads n//2 + 1 entries
        return weight * np.cos(theta) / n, -weight * np.sin(theta) / n, None, n
    out_len = n // 2 + 1 if onesided and not inverse else n
    k = np.arange(out_len)[:, None]
    j = np.arange(n_in)[None, :]
    theta = 2 * np.pi * j * k / n
    cos, sin = np.cos(theta), np.sin(theta)
    cos, sin = np.where(j < n, cos, 0.0), np.where(j < n, sin, 0.0)  # cut to n samples
    if inverse:
        return cos / n, -sin / n, (sin / n, cos / n), out_len
    return cos, sin, (-sin, cos), out_len


def dft(ctx: NodeContext, axis: int, n: int | None) -> Expr:
    shape = list(ctx.shape(0))
    rank = len(shape)
    if rank < 2 or shape[-1] not in (1, 2):
        raise ctx.error(f"the input's last axis must hold (real) or (real, imaginary) parts: "
                        f"size 1 or 2, not shape {tuple(shape)}")
    if not -rank <= axis < rank - 1 and axis != -1:
        raise ctx.error(f"axis {axis} is not a signal axis of a tensor of rank {rank}")
    axis %= rank
    if axis == rank - 1:
        raise ctx.error("axis may not be the last axis, which holds the complex parts")
    inverse, onesided = bool(ctx.attr("inverse", 0)), bool(ctx.attr("onesided", 0))
    n_in = shape[axis]
    if n is None:
        n = 2 * (n_in - 1) if inverse and onesided else n_in
    if n <= 0:
        raise ctx.error(f"dft_length must be positive, not {n}")
    dtype = ctx.dtype(0)
    rows_out = n if inverse and onesided else n // 2 + 1 if onesided else n
    ctx.check_elements((rows_out, n_in), "its cosine and sine matrices")
    a, b, imag, out_len = _matrices(n_in, n, inverse, onesided)
    x = cast(ctx.x(0), "float64")  # sums of n terms: float64 keeps float32 results exact
    # Move the signal axis last, the complex axis just before it.
    batch = [q for q in range(rank - 1) if q != axis]
    moved = op.transpose(x, axes=[*batch, rank - 1, axis])
    rows = int(np.prod([shape[q] for q in batch], dtype=np.int64))
    parts = op.reshape(moved, newshape=[rows, shape[-1], n_in])
    re = op.reshape(op.strided_slice(parts, begin=[0], end=[1], axes=[1]), newshape=[rows, n_in])
    im = (op.reshape(op.strided_slice(parts, begin=[1], end=[2], axes=[1]),
                     newshape=[rows, n_in]) if shape[-1] == 2 else None)

    def apply(m: np.ndarray, v: Expr) -> Expr:
        return op.nn.dense(v, Constant(m.astype("float64")))

    out_re = apply(a, re) if im is None else op.add(apply(a, re), apply(b, im))
    results = [out_re]
    if imag is not None:
        c, d = imag
        results.append(apply(c, re) if im is None else op.add(apply(c, re), apply(d, im)))
    out = op.stack(results, axis=1)  # (rows, parts, out_len)
    out = op.reshape(out, newshape=[*(shape[q] for q in batch), len(results), out_len])
    # Back: the signal axis to its place, the parts last.
    perm = [rank - 2 if q == rank - 1 else rank - 1 if q == axis else batch.index(q)
            for q in range(rank)]
    return cast(op.transpose(out, axes=perm), dtype)


@converter("DFT", since=17)
def dft_17(ctx: NodeContext) -> Expr:
    n = ctx.ints(1, "dft_length")[0] if ctx.has(1) else None
    return dft(ctx, int(ctx.attr("axis", 1)), n)


@converter("DFT", since=20)
def dft_20(ctx: NodeContext) -> Expr:
    n = ctx.ints(1, "dft_length")[0] if ctx.has(1) else None
    axis = ctx.ints(2, "axis")[0] if ctx.has(2) else -2
    return dft(ctx, axis, n)
