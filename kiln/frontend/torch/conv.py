"""Convolutions, pooling and nearest upsampling, onto kiln's NCHW operators.

A 1-D convolution is a 2-D one over a height of 1. A depthwise convolution is ``groups`` equal
to the channels, as in torch. Adaptive average pooling to 1×1 is ``nn.global_avg_pool2d``; to a
size that divides the input, an ordinary pooling window.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.frontend.torch.registry import AtenCall, Missing, converter
from kiln.ir import Expr
from kiln.op import broadcast_to, expand_dims, nn, reshape, squeeze, strided_slice


def _pair(v: int | Sequence[int], what: str, n: AtenCall) -> tuple[int, int]:
    vals = [v] if isinstance(v, int) else list(v)
    if len(vals) == 1:
        vals = vals * 2
    if len(vals) != 2 or not all(isinstance(x, int) for x in vals):
        raise n.error(f"{what} must be one or two integers, got {v!r}")
    return vals[0], vals[1]


@converter("aten.convolution.default")
def convolution(n: AtenCall, x: Expr, weight: Expr, bias: Expr | None, stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], transposed: bool,
                output_padding: Sequence[int], groups: int) -> Expr:
    rank = n.rank(x)
    if rank not in (3, 4):
        raise n.error(f"kiln has 1-D and 2-D convolutions only, not {rank - 2}-D")
    one_d = rank == 3
    if one_d:  # (N, C, L) as (N, C, 1, L)
        x, weight = expand_dims(x, axis=2), expand_dims(weight, axis=2)
        stride, padding, dilation = [1, *stride], [0, *padding], [1, *dilation]
        output_padding = [0, *output_padding]
    attrs = dict(strides=_pair(stride, "stride", n), padding=_pair(padding, "padding", n),
                 dilation=_pair(dilation, "dilation", n), groups=int(groups))
    if transposed:
        extra = _pair(output_padding, "output_padding", n)
        y = nn.conv2d_transpose(x, weight, output_padding=extra, **attrs)
    else:
        y = nn.conv2d(x, weight, **attrs)
    if bias is not None:
        y = nn.bias_add(y, bias, axis=1)
    return squeeze(y, axis=[2]) if one_d else y


def _pool_sizes(n: AtenCall, x: Expr, kernel: Sequence[int], stride: Sequence[int],
                padding: Sequence[int], dilation: Sequence[int], ceil_mode: bool
                ) -> tuple[dict, tuple[int, int] | None]:
    """kiln's pooling attributes for torch's, and torch's output size (H, W) (None where the
    sizes are symbolic: then kiln's are torch's).

    Two differences from kiln's (TVM's) sizes are bridged. A window larger than the padded
    input (EfficientNet's ``AvgPool2d(1280, ceil_mode=True)`` on a 7×7 map) gives torch one
    output, which reads the taps inside the padded input: the kernel is cut to those. In ceil
    mode torch drops a last window that would start in the right padding, kiln keeps it: the
    caller slices it off (`_cropped`).
    """
    k = _pair(kernel, "kernel_size", n)
    s = _pair(stride, "stride", n) if stride else k  # torch: stride defaults to the kernel
    p, d = _pair(padding, "padding", n), _pair(dilation, "dilation", n)
    attrs = dict(pool_size=k, strides=s, padding=p, dilation=d, ceil_mode=bool(ceil_mode))
    sizes = n.shape(x)[-2:]
    if not all(isinstance(size, int) for size in sizes):
        if ceil_mode:
            raise n.error(f"pooling in ceil mode needs static sizes, but the input has shape "
                          f"{n.shape(x)}")
        return attrs, None
    cut, out = [], []
    for size, kk, ss, pp, dd in zip(sizes, k, s, p, d):
        assert isinstance(size, int)
        o = _torch_out(size, kk, ss, pp, dd, ceil_mode)
        if o < 1:
            raise n.error(f"a pooling window of {kk} (dilation {dd}, padding {pp}) does not fit "
                          f"an input of size {size}")
        if (kk - 1) * dd + 1 > size + 2 * pp:  # then o == 1: the taps inside the padded input
            kk = (size + 2 * pp - 1) // dd + 1
        cut.append(kk)
        out.append(o)
    attrs["pool_size"] = (cut[0], cut[1])
    return attrs, (out[0], out[1])


def _torch_out(size: int, k: int, s: int, p: int, d: int, ceil: bool) -> int:
    """torch's pooled size (``pooling_output_shape``): in ceil mode the last window must start
    inside the input or the left padding."""
    out = (size + 2 * p - d * (k - 1) - 1 + (s - 1 if ceil else 0)) // s + 1
    if ceil and (out - 1) * s >= size + p:
        out -= 1
    return out


def _cropped(n: AtenCall, x: Expr, y: Expr, attrs: dict,
             torch_hw: tuple[int, int] | None) -> Expr:
    """kiln's pooled result ``y`` of ``x`` cut to torch's size (see `_pool_sizes`)."""
    if torch_hw is None or _kiln_out(n, x, attrs) == torch_hw:
        return y
    return strided_slice(y, begin=[0, 0], end=list(torch_hw), axes=[2, 3])


def _kiln_out(n: AtenCall, x: Expr, attrs: dict) -> tuple[int, int]:
    h, w = n.shape(x)[-2:]  # static where torch's size is known (a batch may be symbolic)
    if not (isinstance(h, int) and isinstance(w, int)):
        raise n.error(f"pooling needs static sizes here, but the input has shape {n.shape(x)}")
    (kh, kw), (sh, sw) = attrs["pool_size"], attrs["strides"]
    (ph, pw), (dh, dw) = attrs["padding"], attrs["dilation"]
    ceil = attrs["ceil_mode"]
    return _out_hw(h, 2 * ph, kh, dh, sh, ceil), _out_hw(w, 2 * pw, kw, dw, sw, ceil)


def _out_hw(h: int, pad: int, k: int, d: int, s: int, ceil: bool) -> int:
    """kiln's (TVM's) pooled size."""
    return (h + pad - ((k - 1) * d + 1) + (s - 1 if ceil else 0)) // s + 1


def _batched(n: AtenCall, x: Expr) -> tuple[Expr, bool]:
    """Unbatched (C, H, W) input as a batch of one."""
    if n.rank(x) == 3:
        return expand_dims(x, axis=0), True
    if n.rank(x) != 4:
        raise n.error(f"kiln pools 2-D data (rank 3 or 4), not rank {n.rank(x)}")
    return x, False


def _unbatched(y: Expr, added: bool) -> Expr:
    return squeeze(y, axis=[0]) if added else y


@converter("aten.max_pool2d_with_indices.default")
def max_pool2d(n: AtenCall, x: Expr, kernel: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,),
               ceil_mode: bool = False) -> list[Expr | Missing]:
    attrs, out = _pool_sizes(n, x, kernel, stride, padding, dilation, ceil_mode)
    xb, added = _batched(n, x)
    y = _cropped(n, x, nn.max_pool2d(xb, **attrs), attrs, out)
    return [_unbatched(y, added), Missing("indices of max_pool2d_with_indices")]


@converter("aten.avg_pool2d.default")
def avg_pool2d(n: AtenCall, x: Expr, kernel: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Expr:
    if divisor_override is not None:
        raise n.error("avg_pool2d with divisor_override is not supported")
    # kiln's divisor is torch's: the taps inside the padded input (count_include_pad), or
    # inside the input, never ceil mode's extra room.
    attrs, out = _pool_sizes(n, x, kernel, stride, padding, (1,), ceil_mode)
    xb, added = _batched(n, x)
    y = nn.avg_pool2d(xb, count_include_pad=bool(count_include_pad),
                      **{k: v for k, v in attrs.items() if k != "dilation"})
    return _unbatched(_cropped(n, x, y, attrs, out), added)


def _adaptive(n: AtenCall, x: Expr, output_size: Sequence[int], kind: str) -> Expr:
    xb, added = _batched(n, x)
    oh, ow = _pair(output_size, "output_size", n)
    if (oh, ow) == (1, 1):
        pool = nn.global_avg_pool2d if kind == "avg" else nn.global_max_pool2d
        return _unbatched(pool(xb), added)
    h, w = n.static_shape(x, f"adaptive_{kind}_pool2d")[-2:]
    if h % oh or w % ow:
        raise n.error(f"adaptive pooling of {h}x{w} to {oh}x{ow}: kiln needs sizes that divide")
    window = (h // oh, w // ow)
    pool = nn.avg_pool2d if kind == "avg" else nn.max_pool2d
    return _unbatched(pool(xb, pool_size=window, strides=window), added)


@converter("aten._adaptive_avg_pool2d.default", "aten.adaptive_avg_pool2d.default")
def adaptive_avg_pool2d(n: AtenCall, x: Expr, output_size: Sequence[int]) -> Expr:
    return _adaptive(n, x, output_size, "avg")


@converter("aten.adaptive_max_pool2d.default")
def adaptive_max_pool2d(n: AtenCall, x: Expr, output_size: Sequence[int]) -> list[Expr | Missing]:
    return [_adaptive(n, x, output_size, "max"), Missing("indices of adaptive_max_pool2d")]


@converter("aten.upsample_nearest2d.vec", "aten.upsample_nearest2d.default")
def upsample_nearest2d(n: AtenCall, x: Expr, *_: object) -> Expr:
    """Nearest upsampling by whole factors: each pixel repeated in an (fh, fw) block."""
    shape = n.static_shape(x, "upsample_nearest2d")
    if len(shape) != 4:
        raise n.error("upsample_nearest2d needs NCHW data")
    b, c, h, w = shape
    oh, ow = n.static_out("upsample_nearest2d")[-2:]
    if oh % h or ow % w:
        raise n.error(f"nearest upsampling from {h}x{w} to {oh}x{ow} needs whole factors")
    fh, fw = oh // h, ow // w
    y = reshape(x, newshape=[b, c, h, 1, w, 1])
    y = broadcast_to(y, shape=[b, c, h, fh, w, fw])
    return reshape(y, newshape=[b, c, oh, ow])
