"""nn.dense_packed and nn.conv2d_packed: weights packed ahead of time for the GEMM.

The packed GEMM (kiln/loops/gemm.py) copies the weight of ``nn.dense`` into column panels
``Bp[tile][k][nr]`` on every call. When the weight is a constant, the alter-layout pass
(kiln/transform/alter_layout.py) does it once at compile time instead, as TVM's
alter-op-layout did: ``nn.dense(x, W)`` becomes ``nn.dense_packed(x, pack_dense_weight(W))``
and the kernel reads the micro-kernel's panels straight from the constant.

The packed weight has shape ``(NT, KP, NR)``: column tile t, reduction index p, lane j hold
``W[t·NR + j, p]``, zero where ``t·NR + j ≥ units`` or ``p ≥ K`` (K is padded to the GEMM's
K blocking, `kiln.loops.gemm.k_blocking`).

Likewise ``nn.conv2d(x, W)`` (not depthwise) becomes ``nn.conv2d_packed(x, Wp)``: conv2d's
implicit GEMM has the weight as its A operand, rows = output channels of a group, K = (input
channel, tap row, tap column); ``Wp`` of shape ``(groups, MT, KP, MR)`` holds
``W[g·og + t·MR + i, p]`` at ``[g, t, p, i]``, zero padded. Its attributes are conv2d's, with
``channels`` and ``kernel_size`` required (the packed shape no longer shows them).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.ty import ANY, Dim, TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import BufferTensor, Tensor, reduce
from kiln.loops.ir import Binary, Cast
from kiln.loops.ir import Expr as LExpr
from kiln.op.common import (
    as_array,
    check_dims_equal,
    require_dtype,
    require_rank,
    same_dtype,
    shape_str,
    tensor_args,
)
from kiln.op.nn.conv import Conv2DAttrs, conv2d
from kiln.op.registry import Attr, OpPattern, register


def pack_dense_weight(w: np.ndarray, nr: int, kp: int) -> np.ndarray:
    """``W`` (units, K) as panels (⌈units / nr⌉, kp, nr), zero padded (see the docstring)."""
    units, k = w.shape
    tiles = -(-units // nr)
    padded = np.zeros((tiles * nr, kp), dtype=w.dtype)
    padded[:units, :k] = w
    return np.ascontiguousarray(padded.reshape(tiles, nr, kp).transpose(0, 2, 1))


def unpack_dense_weight(wp: np.ndarray, units: int, k: int) -> np.ndarray:
    """The (units, K) weight held in panels ``wp``."""
    tiles, kp, nr = wp.shape
    return wp.transpose(0, 2, 1).reshape(tiles * nr, kp)[:units, :k]


class DensePackedAttrs(Attrs):
    __slots__ = ()
    units: int | None


def _units(attrs: DensePackedAttrs, packed_shape: Sequence[Dim]) -> Dim:
    if attrs.units is not None:
        return attrs.units
    tiles, _, nr = packed_shape
    return tiles * nr if isinstance(tiles, int) and isinstance(nr, int) else ANY


def _relation(arg_types: Sequence[Type], attrs: DensePackedAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    same_dtype(args, ("data", "weight"))
    require_dtype(data, "data", "numeric")
    require_rank(weight, "packed weight (tiles, k, lanes)", 3)
    if data.ndim < 1:
        raise TypeCheckError("data must have at least one dimension, but is a scalar")
    tiles, kp, nr = weight.shape
    units, k = _units(attrs, weight.shape), data.shape[-1]
    if isinstance(tiles, int) and isinstance(kp, int) and isinstance(nr, int) \
            and isinstance(k, int):
        assert isinstance(units, int)  # given, or tiles * nr
        if kp < k or not (tiles - 1) * nr < units <= tiles * nr:
            raise TypeCheckError(
                f"a packed weight of shape {shape_str(weight.shape)} cannot hold {units} units "
                f"of {k} inputs (data of shape {shape_str(data.shape)})")
    else:
        check_dims_equal(kp, k, "the packed weight's K does not match data")
    return TensorType((*data.shape[:-1], units), data.dtype)


def _compute(arrays: list[np.ndarray], attrs: DensePackedAttrs) -> np.ndarray:
    x, wp = np.asarray(arrays[0]), np.asarray(arrays[1])
    out = x.dtype.name
    acc = "float32" if out == "float16" else out
    units = _units(attrs, wp.shape)
    assert isinstance(units, int)  # an array's shape is static
    w = unpack_dense_weight(wp, units, x.shape[-1])
    return as_array(np.matmul(x.astype(acc), w.astype(acc).T), out)


def _lower(inputs: list, attrs: DensePackedAttrs, out_type: Type) -> Tensor:
    from kiln.loops import linear_kernels as fast

    out = oplib.out_tensor_type(out_type)
    x, wp = inputs
    units = out.static_shape[-1]
    if isinstance(wp, BufferTensor) and fast.usable(x.dtype, x.shape, wp.shape):
        t = fast.dense_prepacked(x, wp.buffer, units, out.static_shape, out.dtype)
        if t is not None:
            return t
    # A plain reduction reading the panels (other dtypes, or a layout this build would not
    # have chosen).
    nr = wp.shape[2]
    acc = "float32" if x.dtype == "float16" else x.dtype

    def body(o: tuple, r: tuple) -> LExpr:
        j = o[-1]
        a, b = x(*o[:-1], r[0]), wp(j // nr, r[0], j % nr)
        return Binary("mul", oplib.convert(a, acc), oplib.convert(b, acc))

    fin = None if acc == x.dtype else (lambda v, o: Cast(x.dtype, v))
    return reduce(out.static_shape, out.dtype, (x.shape[-1],), "add", body,
                  oplib.dtype_const(0, acc), fin, acc)


dense_packed = register(
    "nn.dense_packed",
    inputs=("data", "weight"),
    attrs_type=DensePackedAttrs,
    attrs=(Attr("units", None, kind="int", optional=True,
                doc="output size (the panels are padded); None: tiles × lanes"),),
    relation=_relation,
    compute=_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="data @ W.T with W packed in GEMM panels (tiles, k, lanes): see alter-layout.",
    differentiable=False,
    lower=oplib.zeros_if_empty(_lower),
)



# --- nn.conv2d_packed --------------------------------------------------------------------------


def pack_conv_weight(w: np.ndarray, groups: int, mr: int, kp: int) -> np.ndarray:
    """OIHW ``W`` as A panels (groups, ⌈og / mr⌉, kp, mr), zero padded (see the docstring)."""
    o, cg, kh, kw = w.shape
    og, k = o // groups, cg * kh * kw
    tiles = -(-og // mr)
    padded = np.zeros((groups, tiles * mr, kp), dtype=w.dtype)
    padded[:, :og, :k] = w.reshape(groups, og, k)
    return np.ascontiguousarray(padded.reshape(groups, tiles, mr, kp).transpose(0, 1, 3, 2))


def unpack_conv_weight(wp: np.ndarray, channels: int, in_per_group: int,
                       kernel: Sequence[int]) -> np.ndarray:
    """The OIHW weight held in A panels ``wp``."""
    groups, tiles, kp, mr = wp.shape
    og, kh, kw = channels // groups, kernel[0], kernel[1]
    rows = wp.transpose(0, 1, 3, 2).reshape(groups, tiles * mr, kp)
    return rows[:, :og, :in_per_group * kh * kw].reshape(channels, in_per_group, kh, kw)


def _conv_geometry(
    data: TensorType, weight: TensorType, attrs: Conv2DAttrs
) -> TensorType | None:
    """The OIHW weight type the panels stand for (None while shapes are unknown)."""
    if attrs.channels is None or attrs.kernel_size is None:
        raise TypeCheckError("nn.conv2d_packed needs its channels and kernel_size attributes")
    require_rank(data, "data (NCHW)", 4)
    require_rank(weight, "packed weight (groups, tiles, k, lanes)", 4)
    channels, (kh, kw) = attrs.channels, attrs.kernel_size
    dims = (*weight.shape, data.shape[1])
    known = [d for d in dims if isinstance(d, int)]
    if len(known) < len(dims):
        return None
    groups, tiles, kp, mr, c = known
    if groups != attrs.groups or c % groups or channels % groups:
        raise TypeCheckError(f"a packed weight of shape {shape_str(weight.shape)} does not "
                             f"fit groups={attrs.groups} over {c} channels")
    og, cg = channels // groups, c // groups
    if not (tiles - 1) * mr < og <= tiles * mr or kp < cg * kh * kw:
        raise TypeCheckError(
            f"a packed weight of shape {shape_str(weight.shape)} cannot hold {channels} output "
            f"channels of {cg}×{kh}×{kw} taps")
    return TensorType((channels, cg, kh, kw), weight.dtype)


def _conv_relation(arg_types: Sequence[Type], attrs: Conv2DAttrs) -> Type | None:
    from kiln.op.nn.conv import _conv2d_relation

    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    same_dtype(args, ("data", "weight"))
    oihw = _conv_geometry(args[0], args[1], attrs)
    return None if oihw is None else _conv2d_relation([args[0], oihw], attrs)


def _conv_compute(arrays: list[np.ndarray], attrs: Conv2DAttrs) -> np.ndarray:
    from kiln.op.nn.conv import _conv2d

    x, wp = np.asarray(arrays[0]), np.asarray(arrays[1])
    channels, kernel = attrs.channels, attrs.kernel_size
    assert channels is not None and kernel is not None  # the relation requires both
    w = unpack_conv_weight(wp, channels, x.shape[1] // attrs.groups, kernel)
    return _conv2d([x, w], attrs)


def _conv_lower(inputs: list, attrs: Conv2DAttrs, out_type: Type) -> Tensor:
    from kiln.loops import conv_kernels, gemm
    from kiln.loops.compute import compute
    from kiln.op.nn.conv import _conv2d_lower

    out = oplib.out_tensor_type(out_type)
    x, wp = inputs
    channels, kernel = attrs.channels, attrs.kernel_size
    assert channels is not None and kernel is not None  # the relation requires both
    groups, _, _, mr = wp.shape
    kh, kw = kernel
    cg = x.shape[1] // groups
    og = channels // groups

    def element(o: LExpr, c: LExpr, ky: LExpr, kx: LExpr) -> LExpr:
        # the OIHW weight read out of its panels
        r, p = o % og, (c * kh + ky) * kw + kx
        return wp(o // og, r // mr, p, r % mr)

    w = compute((channels, cg, kh, kw), wp.dtype, element)
    if isinstance(wp, BufferTensor) and gemm.supported(x.dtype) and x.dtype == out.dtype \
            and min(x.shape) > 0:
        return conv_kernels.implicit_gemm(
            x, w, attrs.strides, attrs.padding[:2], attrs.dilation, groups,
            out.static_shape, out.dtype, w_packed=wp.buffer)
    return _conv2d_lower([x, w], attrs, out_type)


conv2d_packed = register(
    "nn.conv2d_packed",
    inputs=("data", "weight"),
    attrs_type=Conv2DAttrs,
    attrs=tuple(conv2d.attrs),  # conv2d's own
    relation=_conv_relation,
    compute=_conv_compute,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="nn.conv2d with its OIHW weight packed in GEMM panels (groups, tiles, k, lanes): "
        "see alter-layout; channels and kernel_size are required.",
    differentiable=False,
    lower=oplib.zeros_if_empty(_conv_lower),
)

__all__ = ["conv2d_packed", "dense_packed", "pack_conv_weight", "pack_dense_weight",
           "unpack_conv_weight", "unpack_dense_weight"]
