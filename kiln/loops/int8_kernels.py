"""int8 kernels of nn.dense, nn.batch_matmul and nn.conv2d: 8-bit inputs, int32 results.

The integer paths of the operators' ``lower=`` rules (kiln/op/nn/linear.py, conv.py): with
uint8 or int8 inputs and ``out_dtype="int32"`` (what the qnn operators lower to), each is the
int8 product of kiln/loops/int8_gemm.py, whose dot products the code generator makes from
the Target (VNNI, AVX2, plain). Each returns an extern `Tensor` whose int32 elements go out
through the lowering's ``write`` (the fused epilogue). A 2-D convolution is an implicit GEMM:
C[oc, pixel] = Σ W[oc, (c, ky, kx)] · X[(c, ky, kx), pixel], the input read through its
zero padding (pixels of a batch element are N; the images times the channel groups are the
GEMM's batch, each group a product of its own channels).
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.loops import int8_gemm as q
from kiln.loops import oplib
from kiln.loops.compute import Tensor, WriteFn, extern
from kiln.loops.ir import INDEX, Allocate, Const, Expr, For, Load, Seq, Stmt, Store, Var
from kiln.loops.ir import Buffer as LBuffer
from kiln.loops.linear_kernels import prod, split_index
from kiln.loops.schedule import lowering_target
from kiln.target import Target


def usable(a_dtype: str, b_dtype: str, out_dtype: str, *shapes: Sequence[int]) -> bool:
    """Whether the int8 kernels apply: 8-bit inputs, int32 out, no empty dimension."""
    return q.supported(a_dtype, b_dtype, out_dtype) and all(d > 0 for s in shapes for d in s)


def dense(x: Tensor, w: Tensor, out_shape: Sequence[int],
          target: Target | None = None) -> Tensor:
    """``x @ w.T`` in int32 for x of shape (..., K) and w of shape (N, K)."""
    tgt = lowering_target(target)
    lead = tuple(x.shape[:-1])
    m, k, n = prod(lead), x.shape[-1], w.shape[0]
    s = q.Int8Schedule.default(1, m, n, k, x.dtype, w.dtype, target=tgt, site="dense")

    def emit(write: WriteFn) -> Stmt:
        return q.int8_gemm(
            1, m, n, k,
            lambda b, i, p: x(*split_index(i, lead), p),
            lambda b, p, j: w(j, p),
            lambda b, i, j, v: write((*split_index(i, lead), j), v),
            x.dtype, w.dtype, s, tgt)

    t = extern(tuple(out_shape), "int32", emit)
    t.schedule = s.attrs()
    return t


def dense_prepacked(x: Tensor, wp: LBuffer, units: int, out_shape: Sequence[int],
                    weight_dtype: str, group: int, target: Target | None = None
                    ) -> Tensor | None:
    """``x @ W.T`` in int32 with W's panels prepacked in ``wp`` (kiln/op/nn/int8_packed.py);
    None when the panels are not in the layout this GEMM would choose for ``target``."""
    tgt = lowering_target(target)
    lead = tuple(x.shape[:-1])
    m, k = prod(lead), x.shape[-1]
    s = q.Int8Schedule.default(1, m, units, k, x.dtype, weight_dtype, target=tgt,
                               site="dense_prepacked")
    kg = -(-k // group)
    if (4 if s.form == "vnni" else 2) != group or wp.shape != (-(-units // s.nr), kg + 1, s.nr):
        return None

    def emit(write: WriteFn) -> Stmt:
        return q.int8_gemm(
            1, m, units, k,
            lambda b, i, p: x(*split_index(i, lead), p),
            lambda b, p, j: Const(0, weight_dtype),  # B is never packed: read from wp
            lambda b, i, j, v: write((*split_index(i, lead), j), v),
            x.dtype, weight_dtype, s, tgt,
            b_panel=lambda b, tile, p, c: Load(wp, (tile, p, c), s.lanes),
            b_sums=lambda tile, c: Load(wp, (tile, Const(kg, INDEX), c)))

    t = extern(tuple(out_shape), "int32", emit)
    t.schedule = {**s.attrs(), "b_prepacked": True}
    return t


def batch_matmul(x: Tensor, y: Tensor, out_shape: Sequence[int], transpose_a: bool,
                 transpose_b: bool, target: Target | None = None) -> Tensor:
    """Batched ``x @ y`` in int32, with Relay's transpose flags and a broadcast batch of 1."""
    tgt = lowering_target(target)
    batch, m, n = out_shape
    k = x.shape[1] if transpose_a else x.shape[2]
    bx = (lambda b: b) if x.shape[0] == batch else (lambda b: Const(0, INDEX))
    by = (lambda b: b) if y.shape[0] == batch else (lambda b: Const(0, INDEX))
    s = q.Int8Schedule.default(batch, m, n, k, x.dtype, y.dtype, target=tgt,
                               site="batch_matmul")

    def a(b: Expr, i: Expr, p: Expr) -> Expr:
        return x(bx(b), p, i) if transpose_a else x(bx(b), i, p)

    def bread(b: Expr, p: Expr, j: Expr) -> Expr:
        return y(by(b), j, p) if transpose_b else y(by(b), p, j)

    def emit(write: WriteFn) -> Stmt:
        return q.int8_gemm(batch, m, n, k, a, bread, lambda b, i, j, v: write((b, i, j), v),
                           x.dtype, y.dtype, s, tgt)

    t = extern(tuple(out_shape), "int32", emit)
    t.schedule = s.attrs()
    return t


def conv2d(x: Tensor, w: Tensor, strides: tuple[int, int], pad: tuple[int, int],
           dilation: tuple[int, int], out_shape: Sequence[int], groups: int = 1,
           target: Target | None = None) -> Tensor:
    """An NCHW / OIHW convolution in int32 as an implicit GEMM per image and channel group;
    ``pad`` is (top, left)."""
    tgt = lowering_target(target)
    nb, oc, oh, ow = out_shape
    c, kh, kw = w.shape[1], w.shape[2], w.shape[3]  # c: input channels of a group
    og = oc // groups
    (sh, sw), (top, left), (dh, dw) = strides, pad, dilation
    k, n = c * kh * kw, oh * ow
    rows, cols = oplib.window_span(oh, sh, kh, dh, top), oplib.window_span(ow, sw, kw, dw, left)
    spans = [None, None, rows, cols]
    zero = Const(0, x.dtype)
    s = q.Int8Schedule.default(nb * groups, og, n, k, w.dtype, x.dtype, target=tgt)

    def image_group(b: Expr) -> tuple[Expr, Expr]:
        if groups == 1:
            return b, Const(0, INDEX)
        img, g = split_index(b, (nb, groups))
        return img, g

    def a(b: Expr, o: Expr, p: Expr) -> Expr:
        g = image_group(b)[1]
        return w(g * og + o, *split_index(p, (c, kh, kw)))

    # Where the windows reach past the image, it is first copied once into a zero-padded
    # local buffer covering exactly the rows and columns they read, so that packing the
    # im2col columns reads without a bounds test per element.
    hp, wp = rows[1] + top + 1, cols[1] + left + 1
    padded = top > 0 or left > 0 or rows[1] > x.shape[2] - 1 or cols[1] > x.shape[3] - 1
    xp = LBuffer("xpad", (x.shape[0], x.shape[1], hp, wp), x.dtype, "local") if padded else None

    def bread(b: Expr, p: Expr, j: Expr) -> Expr:
        img, g = image_group(b)
        ch, ry, rx = split_index(p, (c, kh, kw))
        y, xx = split_index(j, (oh, ow))
        if xp is not None:
            return Load(xp, (img, g * c + ch, y * sh + ry * dh, xx * sw + rx * dw))
        at = [img, g * c + ch, y * sh + ry * dh - top, xx * sw + rx * dw - left]
        return oplib.guarded_read(x, at, spans, zero)

    def pad_copy(xp: LBuffer) -> Stmt:
        ii, cc, yy, xx = (Var(v) for v in ("n", "c", "y", "x"))
        value = oplib.guarded_read(x, [ii, cc, yy - top, xx - left],
                                   [None, None, (-top, hp - 1 - top), (-left, wp - 1 - left)],
                                   zero)
        body: Stmt = For(xx, Const(0), Const(wp), Store(xp, (ii, cc, yy, xx), value),
                         "vectorized")
        for v, extent in ((yy, hp), (cc, x.shape[1]), (ii, x.shape[0])):
            body = For(v, Const(0), Const(extent), body)
        return body

    def emit(write: WriteFn) -> Stmt:
        def put(b: Expr, o: Expr, j: Expr, v: Expr) -> Stmt:
            img, g = image_group(b)
            return write((img, g * og + o, *split_index(j, (oh, ow))), v)

        gemm = q.int8_gemm(nb * groups, og, n, k, a, bread, put, w.dtype, x.dtype, s, tgt)
        return gemm if xp is None else Allocate(xp, Seq((pad_copy(xp), gemm)))

    t = extern(tuple(out_shape), "int32", emit)
    t.schedule = s.attrs()
    return t
