"""Convolutions, pooling and nearest upsampling, onto kiln's NCHW operators.

A 1-D convolution is a 2-D one over a height of 1. A depthwise convolution is ``groups`` equal
to the channels, as in torch. Adaptive average pooling to 1×1 is ``nn.global_avg_pool2d``; to a
size that divides the input, an ordinary pooling window.
"""

from __future__ import annotations

from collections.abc import Sequence

from kiln.frontend.torch.registry import AtenCall, Missing, converter
from kiln.ir import Expr
from kiln.op import broadcast_to, expand_dims, nn, reshape, squeeze


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
                padding: Sequence[int], dilation: Sequence[int] = (1,)) -> dict:
    k = _pair(kernel, "kernel_size", n)
    s = _pair(stride, "stride", n) if stride else k  # torch: stride defaults to the kernel
    return dict(pool_size=k, strides=s, padding=_pair(padding, "padding", n),
                dilation=_pair(dilation, "dilation", n))


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
    attrs = _pool_sizes(n, x, kernel, stride, padding, dilation)
    xb, added = _batched(n, x)
    if ceil_mode:
        # torch drops a last window that would start in the padding; TVM's formula keeps it.
        # Pad the bottom and right with -inf just enough to reach torch's size instead.
        h, w = n.static_shape(x, "max_pool2d with ceil_mode")[-2:]
        (oh, ow), (kh, kw) = n.static_out("max_pool2d")[-2:], attrs["pool_size"]
        (sh, sw), (ph, pw), (dh, dw) = attrs["strides"], attrs["padding"], attrs["dilation"]
        extra_h = max(0, (oh - 1) * sh + (kh - 1) * dh + 1 - (h + 2 * ph))
        extra_w = max(0, (ow - 1) * sw + (kw - 1) * dw + 1 - (w + 2 * pw))
        attrs["padding"] = (ph, pw, ph + extra_h, pw + extra_w)
    y = _unbatched(nn.max_pool2d(xb, **attrs), added)
    return [y, Missing("indices of max_pool2d_with_indices")]


@converter("aten.avg_pool2d.default")
def avg_pool2d(n: AtenCall, x: Expr, kernel: Sequence[int], stride: Sequence[int] = (),
               padding: Sequence[int] = (0,), ceil_mode: bool = False,
               count_include_pad: bool = True, divisor_override: int | None = None) -> Expr:
    if divisor_override is not None:
        raise n.error("avg_pool2d with divisor_override is not supported")
    attrs = _pool_sizes(n, x, kernel, stride, padding)
    if ceil_mode:
        h, w = n.static_shape(x, "avg_pool2d with ceil_mode")[-2:]
        mine = tuple(_out_hw(size, 2 * p, k, 1, s, True) for size, p, k, s in
                     zip((h, w), attrs["padding"], attrs["pool_size"], attrs["strides"]))
        if mine != tuple(n.static_out("avg_pool2d")[-2:]):
            raise n.error("avg_pool2d with ceil_mode where a window would start in the padding "
                          "is not supported")
    xb, added = _batched(n, x)
    y = nn.avg_pool2d(xb, ceil_mode=bool(ceil_mode), count_include_pad=bool(count_include_pad),
                      **{k: v for k, v in attrs.items() if k != "dilation"})
    return _unbatched(y, added)


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
