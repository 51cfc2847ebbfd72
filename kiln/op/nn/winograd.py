"""nn.conv2d_winograd: a 3×3 stride-1 conv2d whose weight was transformed ahead of time for
Winograd's F(m×m, 3×3) (kiln/loops/winograd.py).

alter-layout (kiln/transform/alter_layout.py) turns ``nn.conv2d(x, W)`` with a constant W
into ``nn.conv2d_winograd(x, Up)`` where `kiln.loops.winograd.choose` says it pays. ``Up`` has
shape ``(α², MT, KP, MR)``: position ξ of the α×α grid (α = m + 2, so the shape tells m), row
tile t, input channel p, lane i hold ``U[ξ, t·MR + i, p]`` of U = G W Gᵀ, zero padded — the A
panels of the α² products. Its attributes are conv2d's, with ``channels`` and
``kernel_size`` required. The result is the convolution of x with W (to the transforms'
rounding): the evaluator recovers W from U (G has a left inverse) and convolves directly.

Data and result may both be channel-blocked instead (``data_layout="NCHW16c"``, the same
``out_layout``), as the convert-layout pass makes them; the same array then holds Uᵀ in the
B panels of kiln/loops/winograd_nchwc.py (its row tile the GEMM's ``nr``).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor
from kiln.loops.ir import Binary, Const, Select
from kiln.loops.ir import Expr as LExpr
from kiln.op.common import require_rank, same_dtype, shape_str, tensor_args
from kiln.op.nn.conv import Conv2DAttrs, conv2d
from kiln.op.registry import OpPattern, register


def _left_inverse(m: int) -> np.ndarray:
    """P (3×α) with P·G = I: W = P U Pᵀ."""
    from kiln.loops.winograd import matrices

    return np.linalg.pinv(matrices(m)[1])


def _tile(weight: TensorType) -> int:
    from kiln.loops.winograd import tile_of

    m = tile_of([int(d) for d in weight.shape])  # type: ignore[arg-type]
    if m is None:
        raise TypeCheckError(f"a Winograd weight of shape {shape_str(weight.shape)}: its "
                             "first axis must be α² for a tile size kiln has (36 or 16)")
    return m


def block_of(attrs: Conv2DAttrs) -> int | None:
    """The channel block of the data and the result (``NCHW16c``: 16; NCHW: None); a
    TypeCheckError for other layouts."""
    data, out = attrs.data_layout, attrs.out_layout or attrs.data_layout
    match = re.fullmatch(r"NCHW([1-9][0-9]*)c", data)
    if data == out and attrs.kernel_layout == "OIHW" and (match or data == "NCHW"):
        return int(match.group(1)) if match else None
    raise TypeCheckError(
        "nn.conv2d_winograd takes data and gives its result in NCHW, or both in the same "
        f"NCHW[b]c, with kernel_layout OIHW; got data_layout={attrs.data_layout!r}, "
        f"kernel_layout={attrs.kernel_layout!r}, out_layout={attrs.out_layout!r}")


def _plain(attrs: Conv2DAttrs) -> Conv2DAttrs:
    """The attributes with NCHW data and result."""
    values = {k: attrs[k] for k in attrs}
    values.update(data_layout="NCHW", out_layout="")
    return Conv2DAttrs.view(conv2d.normalize_attrs(values))


def _relation(arg_types: Sequence[Type], attrs: Conv2DAttrs) -> Type | None:
    from kiln.op.nn.conv import _conv2d_relation

    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    same_dtype(args, ("data", "weight"))
    data, weight = args
    if attrs.channels is None or attrs.kernel_size is None:
        raise TypeCheckError("nn.conv2d_winograd needs its channels and kernel_size attributes")
    block = block_of(attrs)
    if block is not None:  # NCHW[b]c: NCHW's relation, the result blocked
        require_rank(data, f"data ({attrs.data_layout})", 5)
        if data.shape[4] != block or attrs.channels % block:
            raise TypeCheckError(
                f"nn.conv2d_winograd in {attrs.data_layout}: data of shape "
                f"{shape_str(data.shape)} and {attrs.channels} output channels must come in "
                f"blocks of {block}")
        n, c0, h, w = data.shape[:4]
        c = c0 * block if isinstance(c0, int) else c0
        plain = _relation([TensorType((n, c, h, w), data.dtype), weight], _plain(attrs))
        if not isinstance(plain, TensorType):
            return plain
        n, _, oh, ow = plain.shape
        return TensorType((n, attrs.channels // block, oh, ow, block), plain.dtype)
    require_rank(data, "data (NCHW)", 4)
    require_rank(weight, "Winograd weight (positions, tiles, k, lanes)", 4)
    dims = [d for d in (*weight.shape, data.shape[1]) if isinstance(d, int)]
    if len(dims) < 5:
        return None
    _tile(weight)
    _, tiles, kp, mr, c = dims
    channels = attrs.channels
    if tuple(attrs.kernel_size) != (3, 3) or attrs.groups != 1 \
            or tuple(attrs.strides) != (1, 1) or tuple(attrs.dilation) != (1, 1):
        raise TypeCheckError("nn.conv2d_winograd is a 3×3 convolution of stride 1, one group, "
                             "no dilation")
    if not (tiles - 1) * mr < channels <= tiles * mr or kp < c:
        raise TypeCheckError(f"a Winograd weight of shape {shape_str(weight.shape)} cannot "
                             f"hold {channels} output channels of {c} input channels")
    oihw = TensorType((channels, c, 3, 3), weight.dtype)
    return _conv2d_relation([data, oihw], attrs)


def unpack_weight(up: np.ndarray, channels: int, in_channels: int) -> np.ndarray:
    """The OIHW weight W whose transform ``up`` holds (float64 sums, then the dtype)."""
    from kiln.loops.winograd import tile_of

    m = tile_of(up.shape)
    assert m is not None  # the relation checked the shape
    pos, tiles, kp, mr = up.shape
    alpha = m + 2
    u = up.transpose(0, 1, 3, 2).reshape(pos, tiles * mr, kp)[:, :channels, :in_channels]
    u = u.reshape(alpha, alpha, channels, in_channels).astype(np.float64)
    p = _left_inverse(m)
    return np.einsum("ia,aboc,jb->ocij", p, u, p).astype(up.dtype)


def _compute(arrays: list[np.ndarray], attrs: Conv2DAttrs) -> np.ndarray:
    from kiln.op.nn.conv import _conv2d

    x, up = np.asarray(arrays[0]), np.asarray(arrays[1])
    assert attrs.channels is not None  # the relation requires it
    block = block_of(attrs)
    if block is not None:  # NCHW[b]c: unblocked, convolved, blocked again
        from kiln.op.layout import from_logical, parse_layout, to_logical

        layout = parse_layout(attrs.data_layout)
        plain = _compute([to_logical(x, layout), up], _plain(attrs))
        return from_logical(plain, "NCHW", layout)
    return _conv2d([x, unpack_weight(up, attrs.channels, x.shape[1])], attrs)


def _lower(inputs: list, attrs: Conv2DAttrs, out_type: Type) -> Tensor:
    from kiln.loops import winograd
    from kiln.loops.compute import compute
    from kiln.op.nn.conv import _conv2d_lower

    out = oplib.out_tensor_type(out_type)
    x, up = inputs
    channels = attrs.channels
    assert channels is not None  # the relation requires it
    block = block_of(attrs)
    if block is not None:
        return _lower_blocked(x, up, attrs, out, block)
    m = winograd.tile_of(up.shape)
    assert m is not None
    _, oh, ow = out.static_shape[1:]
    if isinstance(up, BufferTensor) and isinstance(x, BufferTensor) \
            and x.dtype == out.dtype == "float32" \
            and min(x.shape) > 0 and min(out.static_shape) > 0 \
            and tuple(up.shape) == winograd.packed_shape(x.shape, out.static_shape,
                                                         attrs.padding, m):
        return winograd.conv2d(x, up.buffer, m, attrs.padding[:2], out.static_shape,
                               out.dtype)
    # otherwise W recovered from U (P U Pᵀ, P = G's left inverse) and the direct kernel
    p = _left_inverse(m)
    alpha, mr = m + 2, int(up.shape[3])

    def coeff(row: int, axis: LExpr) -> LExpr:  # P[axis][row] for axis in 0..2
        c0, c1, c2 = (Const(float(p[i][row]), up.dtype) for i in range(3))
        return Select(Binary("eq", axis, Const(0, axis.dtype)), c0,
                      Select(Binary("eq", axis, Const(1, axis.dtype)), c1, c2))

    def element(o: LExpr, c: LExpr, ky: LExpr, kx: LExpr) -> LExpr:
        # clamped: a kernel may read the rows of its padded tiles (and drop them)
        o, c = oplib.clamp(o, 0, channels - 1), oplib.clamp(c, 0, int(x.shape[1]) - 1)
        total: LExpr | None = None
        for a in range(alpha):
            for b in range(alpha):
                term = coeff(a, ky) * coeff(b, kx) * up(Const(a * alpha + b, o.dtype), o // mr,
                                                        c, o % mr)
                total = term if total is None else total + term
        assert total is not None
        return total

    w = compute((channels, int(x.shape[1]), 3, 3), up.dtype, element)
    return _conv2d_lower([x, w], attrs, out_type)


def _lower_blocked(x: Tensor, up: Tensor, attrs: Conv2DAttrs, out: TensorType,
                   block: int) -> Tensor:
    """NCHW[b]c: kiln/loops/winograd_nchwc.py where U is packed for it and the data is in
    a buffer (fusion gives a convolution no producers), else the NCHW lowering reading the
    data through its blocks and read back in blocks."""
    from kiln.loops import winograd, winograd_nchwc
    from kiln.loops.compute import compute

    m = winograd.tile_of(up.shape)
    assert m is not None  # the relation checked the shape
    if isinstance(up, BufferTensor) and isinstance(x, BufferTensor) \
            and x.dtype == out.dtype == "float32" \
            and min(x.shape) > 0 and min(out.static_shape) > 0 \
            and tuple(up.shape) == winograd_nchwc.packed_shape(x.shape, out.static_shape,
                                                               attrs.padding, m):
        return winograd_nchwc.conv2d(x, up.buffer, m, attrs.padding[:2], out.static_shape)
    n, c0, h, w, _ = (int(d) for d in x.shape)
    _, o0, oh, ow, _ = out.static_shape
    view = compute((n, c0 * block, h, w), x.dtype,
                   lambda i, c, y, xx: x(i, c // block, y, xx, c % block))
    plain = _lower([view, up], _plain(attrs), TensorType((n, o0 * block, oh, ow), out.dtype))
    return compute(out.static_shape, out.dtype,
                   lambda i, o, y, xx, o1: plain(i, o * block + o1, y, xx))


conv2d_winograd = register(
    "nn.conv2d_winograd",
    inputs=("data", "weight"),
    attrs_type=Conv2DAttrs,
    attrs=tuple(conv2d.attrs),  # conv2d's own
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="nn.conv2d (3×3, stride 1) with its weight transformed for Winograd's F(m×m, 3×3) "
        "and packed in GEMM panels (positions, tiles, k, lanes): see alter-layout; channels "
        "and kernel_size are required; data and result NCHW or both NCHW[b]c.",
    differentiable=False,
    lower=oplib.zeros_if_empty(_lower),
)

__all__ = ["conv2d_winograd", "unpack_weight"]
