"""The kernel sites a model has to tune, and a one-operator program for each.

A *site* is where a schedule with searchable knobs is chosen (kiln/loops/tunable.py): a
packed GEMM (`kiln.loops.gemm.GemmSchedule.default`), the dot products of a dense layer of
a few rows (`kiln.loops.linear_kernels.DotSchedule.default`), a convolution's implicit GEMM
(`kiln.loops.conv_kernels.conv_plan`), a Winograd convolution's products
(`kiln.loops.winograd.schedule`), a channel-blocked direct convolution's register tile and
chunks (`kiln.loops.nchwc_kernels.chosen_tile`, what convert-layout gives a CNN), a
channel-blocked depthwise convolution's tile and chunks
(`kiln.loops.nchwc_kernels.depthwise_schedule`) or the products of a Winograd convolution
on blocked data (`kiln.loops.winograd_nchwc.schedule`), an 8-bit dense layer's or
batch_matmul's int8 product (`kiln.loops.int8_gemm.Int8Schedule.default`) or an 8-bit
convolution's (`kiln.loops.int8_conv.plan`), or the units of an 8-bit dense on AMX tiles
(`kiln.loops.int8_amx.DenseUnits.default`), or the GEMM of conv2d's weight gradient in a
training step (`kiln.loops.conv_grad_kernels.backward_weight`). Its key names
the shapes and operand layouts; the Target is the tuning run's. Lowering records each
site's key in ``kernel.attrs["schedules"]``, so the sites of a model are read off its
build, deduplicated by key, with each one's share of the model's time from
`Executable.profile`.

To measure a candidate, the site is rebuilt alone: a program of one operator (dense on a
constant weight for a GEMM whose B is prepacked, batch_matmul otherwise, conv2d on a
constant or variable weight, nn.contrib_conv2d_NCHWc on a constant blocked weight, a 3×3
conv2d that convert-layout takes to Winograd on blocks, an 8-bit dense, batch_matmul or
conv2d into int32, nn.conv2d_backward_weight of an adjoint and data) whose
lowering meets the same key, so alter-layout packs its weight for the candidate's tiles
just as the model's build will. It is built knowing the model's weight bytes, as the model's
kernels were (`weights_scope`, kiln/loops/schedule.py): a product with a constant operand
is split by whether the model's weights, not the one operator's, fit the cores' caches.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.ir.module import IRModule
from kiln.loops import (
    conv_grad_kernels,
    conv_kernels,
    gemm,
    int8_amx,
    int8_conv,
    int8_gemm,
    linear_kernels,
    nchwc_kernels,
    winograd,
    winograd_nchwc,
)
from kiln.loops.schedule import weights_scope
from kiln.loops.tunable import Knobs, Space, parse_key
from kiln.target import Target


@dataclass(frozen=True)
class Site:
    """A kernel site to tune: its key, kind, search space, and its program alone."""

    key: str
    # "gemm", "dot", "conv2d", "winograd", "conv2d_nchwc", "depthwise_nchwc",
    # "winograd_nchwc", "int8_gemm", "int8_conv", "amx_dense" or "conv2d_backward_weight"
    kind: str
    space: Space
    text: str  # Relay text of the one-operator program
    constants: tuple[str, ...]  # parameters bound as weights (constant, so prepacked)
    flops: int  # multiply-adds × 2 of one call
    # the bytes of the model's weights, under which its schedules were chosen (None: the
    # program's own): the site's default and its candidates are built as in the model
    weight_bytes: int | None = None
    # convert-layout's channel block for the program (None: the Target's lanes), where the
    # model runs in another (kiln/transform/convert_layout.py `block_scope`)
    block: int | None = None
    # knobs of other keys the program is built with, as the model is: the algorithms
    # tuning gave its convolutions (`kiln.loops.winograd.algorithm_space`)
    pinned: Mapping[str, Knobs] | None = None

    def program(self, seed: int = 0) -> tuple[IRModule, dict[str, np.ndarray],
                                              list[np.ndarray]]:
        """The module, its weights and random inputs for the other parameters (floats in
        [-1, 1), integers over their dtype's range)."""
        from kiln.text import parse

        mod = parse(self.text)
        rng = np.random.default_rng(seed)
        params: dict[str, np.ndarray] = {}
        inputs: list[np.ndarray] = []
        for p in mod["main"].params:
            t = p.type_annotation
            shape = tuple(int(d) for d in t.shape)  # type: ignore[union-attr]
            dtype = np.dtype(str(t.dtype))  # type: ignore[union-attr]
            if dtype.kind in "iu":  # 8-bit operands of an int8 product: their whole range
                info = np.iinfo(dtype)
                value = rng.integers(info.min, info.max + 1, shape).astype(dtype)
            else:
                value = rng.uniform(-1, 1, shape).astype(np.float32)
            if p.name_hint in self.constants:
                params[p.name_hint] = value
            else:
                inputs.append(value)
        return mod, params, inputs


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split("x"))


def _tensor(shape: tuple[int, ...], dtype: str = "float32") -> str:
    return f"Tensor[({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''}), {dtype}]"


def site_of(key: str, target: Target, weight_bytes: int | None = None) -> Site | None:
    """The site a key names (None for a kind or layout kiln cannot rebuild alone), in a
    model whose weights take ``weight_bytes`` (None: its program's own; see `Site`)."""
    if weight_bytes is not None:
        with weights_scope(weight_bytes):
            site = site_of(key, target)
        return None if site is None else replace(site, weight_bytes=weight_bytes)
    try:
        kind, f = parse_key(key)
        make = _SITE_KINDS.get(kind)
        return None if make is None else make(key, f, target)
    except (KeyError, ValueError):
        return None


def _gemm_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    batch, m, n, k = (int(f[x]) for x in ("batch", "m", "n", "k"))
    b_pre, a_pre = f["b_prepacked"] == "1", f["a_prepacked"] == "1"
    if f["dtype"] != "float32" or a_pre or "threads" in f or (b_pre and batch != 1):
        return None
    space = gemm.space_of(batch, m, n, k, "float32", b_pre, a_pre, target=target)
    if space.key != key:
        return None
    if b_pre:  # a dense layer on a constant weight (alter-layout packs it)
        text = (f"def @main(%x: {_tensor((m, k))}, %w: {_tensor((n, k))}) "
                "{ nn.dense(%x, %w) }")
        constants: tuple[str, ...] = ("w",)
    else:
        text = (f"def @main(%x: {_tensor((batch, m, k))}, %y: {_tensor((batch, k, n))}) "
                "{ nn.batch_matmul(%x, %y, transpose_b=False) }")
        constants = ()
    return Site(key, "gemm", space, f"#[version = \"0.0.5\"]\n{text}\n", constants,
                2 * batch * m * n * k)


def _dot_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # a dense layer on a constant weight, which its few rows take to the dot products
    m, n, k = (int(f[x]) for x in ("m", "n", "k"))
    if f["dtype"] != "float32" or not linear_kernels.uses_dot(m, n, k,
                                                              target.lanes("float32")):
        return None
    space = linear_kernels.dot_space(m, n, k, "float32", target)
    if space.key != key:
        return None
    text = f"def @main(%x: {_tensor((m, k))}, %w: {_tensor((n, k))}) {{ nn.dense(%x, %w) }}"
    return Site(key, "dot", space, f"#[version = \"0.0.5\"]\n{text}\n", ("w",), 2 * m * n * k)


def _window(x: tuple[int, ...], w: tuple[int, ...], out: tuple[int, ...],
            strides: tuple[int, ...], pad: tuple[int, ...], dil: tuple[int, ...]) -> str:
    """A convolution's window attributes in Relay text, with the bottom and right padding
    the least that gives this output size (a site's key names only the top and left)."""
    ends = []
    for axis in range(2):
        reach = (out[2 + axis] - 1) * strides[axis] + dil[axis] * (w[2 + axis] - 1) + 1
        ends.append(max(0, reach - x[2 + axis] - pad[axis]))
    return (f"strides=[{strides[0]}, {strides[1]}], padding=[{pad[0]}, {pad[1]}, "
            f"{ends[0]}, {ends[1]}], dilation=[{dil[0]}, {dil[1]}]")


def _conv_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    x, w, out = _ints(f["x"]), _ints(f["w"]), _ints(f["out"])
    strides, pad, dil = _ints(f["strides"]), _ints(f["padding"]), _ints(f["dilation"])
    groups, prepacked = int(f["groups"]), f["prepacked"] == "1"
    space = conv_kernels.conv_space(x, w, strides, pad, dil, groups, out, prepacked,
                                    target=target)
    if space.key != key:
        return None
    attrs = f"{_window(x, w, out, strides, pad, dil)}, groups={groups}"
    text = (f"def @main(%x: {_tensor(x)}, %w: {_tensor(w)}) "
            f"{{ nn.conv2d(%x, %w, {attrs}) }}")
    flops = 2 * out[0] * out[1] * out[2] * out[3] * w[1] * w[2] * w[3]
    return Site(key, "conv2d", space, f"#[version = \"0.0.5\"]\n{text}\n",
                ("w",) if prepacked else (), flops)


def _winograd_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # the convolution alone on a constant weight: alter-layout takes it to Winograd's
    # products when `winograd.chosen` picks the same tile size (the rule's, or the tile
    # size a tuning of the model's algorithms gave, in `Site.pinned`)
    x, out, pad, m = _ints(f["x"]), _ints(f["out"]), _ints(f["padding"]), int(f["m"])
    w = (out[1], x[1], 3, 3)
    ends = [max(0, out[2 + axis] + 2 - x[2 + axis] - pad[axis]) for axis in range(2)]
    full = (*pad, *ends)
    if winograd.chosen(x, w, (1, 1), full, (1, 1), 1, out) != m:
        return None
    space = winograd.space(x, out, pad, m, target)
    if space.key != key:
        return None
    text = (f"def @main(%x: {_tensor(x)}, %w: {_tensor(w)}) "
            f"{{ nn.conv2d(%x, %w, padding=[{pad[0]}, {pad[1]}, {ends[0]}, {ends[1]}]) }}")
    flops = 2 * out[0] * out[1] * out[2] * out[3] * x[1] * 9
    return Site(key, "winograd", space, f"#[version = \"0.0.5\"]\n{text}\n", ("w",), flops)


def _nchwc_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # the blocked convolution alone (what convert-layout makes), on a constant blocked weight
    x, w, out = _ints(f["x"]), _ints(f["w"]), _ints(f["out"])
    strides, pad, dil = _ints(f["strides"]), _ints(f["padding"]), _ints(f["dilation"])
    if len(w) != 6 or len(out) != 5 or len(x) not in (4, 5):
        return None
    space = nchwc_kernels.space(x, w, strides, pad, dil, out, target)
    if space.key != key:
        return None
    bi, bo = w[4], w[5]
    layouts = (f'data_layout="{"NCHW" if len(x) == 4 else f"NCHW{bi}c"}", '
               f'kernel_layout="OIHW{bi}i{bo}o", out_layout="NCHW{bo}c"')
    attrs = (f"{_window(x, w, out, strides, pad, dil)}, channels={out[1] * bo}, "
             f"kernel_size=[{w[2]}, {w[3]}], {layouts}")
    text = (f"def @main(%x: {_tensor(x)}, %w: {_tensor(w)}) "
            f"{{ nn.contrib_conv2d_NCHWc(%x, %w, {attrs}) }}")
    flops = 2 * out[0] * out[1] * bo * out[2] * out[3] * w[1] * bi * w[2] * w[3]
    return Site(key, "conv2d_nchwc", space, f"#[version = \"0.0.5\"]\n{text}\n", ("w",),
                flops)


def _depthwise_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # the blocked depthwise convolution alone, on a constant blocked weight
    x, w, out = _ints(f["x"]), _ints(f["w"]), _ints(f["out"])
    strides, pad, dil = _ints(f["strides"]), _ints(f["padding"]), _ints(f["dilation"])
    if len(x) != 5 or len(w) != 6 or len(out) != 5 or x[4] != out[4] or w[5] != out[4]:
        return None
    space = nchwc_kernels.depthwise_space(x, w, strides, pad, dil, out, target)
    if space.key != key:
        return None
    b, channels = out[4], out[1] * out[4]
    attrs = (f"{_window(x, w, out, strides, pad, dil)}, groups={channels}, "
             f"channels={channels}, kernel_size=[{w[2]}, {w[3]}], data_layout=\"NCHW{b}c\", "
             f"kernel_layout=\"OIHW1i{b}o\", out_layout=\"NCHW{b}c\"")
    text = (f"def @main(%x: {_tensor(x)}, %w: {_tensor(w)}) "
            f"{{ nn.contrib_conv2d_NCHWc(%x, %w, {attrs}) }}")
    flops = 2 * out[0] * channels * out[2] * out[3] * w[2] * w[3]
    return Site(key, "depthwise_nchwc", space, f"#[version = \"0.0.5\"]\n{text}\n", ("w",),
                flops)


def _winograd_nchwc_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # A plain 3×3 conv2d on a constant weight, which convert-layout takes to Winograd on
    # blocks when `winograd.chosen` picks this tile size; then a 1×1 convolution to one
    # block of channels, since convert-layout leaves a lone convolution as it is (a few %
    # of the program's work, the same for every candidate)
    x, out, pad, m = _ints(f["x"]), _ints(f["out"]), _ints(f["padding"]), int(f["m"])
    lanes = target.lanes("float32")
    if len(x) != 5 or len(out) != 5 or x[4] != out[4] or x[4] not in (lanes, 2 * lanes):
        return None
    b = x[4]
    plain_x = (x[0], x[1] * b, x[2], x[3])
    plain_out = (out[0], out[1] * b, out[2], out[3])
    w = (plain_out[1], plain_x[1], 3, 3)
    ends = [max(0, out[2 + axis] + 2 - x[2 + axis] - pad[axis]) for axis in range(2)]
    if winograd.chosen(plain_x, w, (1, 1), (*pad, *ends), (1, 1), 1, plain_out) != m:
        return None
    space = winograd_nchwc.space(x, out, pad, m, target)
    if space.key != key:
        return None
    text = (f"def @main(%x: {_tensor(plain_x)}, %w: {_tensor(w)}, "
            f"%w1: {_tensor((b, plain_out[1], 1, 1))}) {{\n"
            f"  %0 = nn.conv2d(%x, %w, padding=[{pad[0]}, {pad[1]}, {ends[0]}, {ends[1]}]);\n"
            "  nn.conv2d(%0, %w1)\n}")
    flops = 2 * plain_out[0] * plain_out[1] * plain_out[2] * plain_out[3] * plain_x[1] * 9
    return Site(key, "winograd_nchwc", space, f"#[version = \"0.0.5\"]\n{text}\n",
                ("w", "w1"), flops, block=None if b == lanes else b)


def _int8_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # an 8-bit dense on a constant weight (alter-layout packs its panels for the candidate's
    # tiles), on a variable one, or an 8-bit batch_matmul; all into int32
    op, a, b = f["op"], f["a"], f["b"]
    batch, m, n, k = (int(f[x]) for x in ("batch", "m", "n", "k"))
    if op not in int8_gemm.SITES or a not in int8_gemm.INPUT_DTYPES \
            or b not in int8_gemm.INPUT_DTYPES:
        return None
    if op == "dense_prepacked" and int8_amx.dense_usable(m, n, k, target):
        return None  # such a dense runs on AMX tiles here, not this product
    space = int8_gemm.space(op, batch, m, n, k, a, b, target)
    if space.key != key:
        return None
    if op == "batch_matmul":
        text = (f"def @main(%x: {_tensor((batch, m, k), a)}, %y: {_tensor((batch, k, n), b)}) "
                "{ nn.batch_matmul(%x, %y, out_dtype=\"int32\", transpose_b=False) }")
        constants: tuple[str, ...] = ()
    elif batch == 1:
        text = (f"def @main(%x: {_tensor((m, k), a)}, %w: {_tensor((n, k), b)}) "
                "{ nn.dense(%x, %w, out_dtype=\"int32\") }")
        constants = ("w",) if op == "dense_prepacked" else ()
    else:
        return None
    return Site(key, "int8_gemm", space, f"#[version = \"0.0.5\"]\n{text}\n", constants,
                2 * batch * m * n * k)


def _int8_conv_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # an 8-bit conv2d into int32 on a constant weight, which alter-layout takes to the
    # int8 convolution on channel-group planes (not to AMX tiles, where the Target has them)
    x, w, out = _ints(f["x"]), _ints(f["w"]), _ints(f["out"])
    strides, pad, dil = _ints(f["strides"]), _ints(f["padding"]), _ints(f["dilation"])
    a, b = f["a"], f["b"]
    if a not in int8_gemm.INPUT_DTYPES or b not in int8_gemm.INPUT_DTYPES \
            or len(x) != 4 or len(w) != 4 or len(out) != 4:
        return None
    if int8_amx.plan(x, w, strides, pad, dil, 1, out, target) is not None:
        return None
    space = int8_conv.space(x, w, strides, pad, dil, out, a, b, target)
    if space is None or space.key != key:
        return None
    text = (f"def @main(%x: {_tensor(x, a)}, %w: {_tensor(w, b)}) "
            f"{{ nn.conv2d(%x, %w, {_window(x, w, out, strides, pad, dil)}, "
            "out_dtype=\"int32\") }")
    flops = 2 * out[0] * out[1] * out[2] * out[3] * w[1] * w[2] * w[3]
    return Site(key, "int8_conv", space, f"#[version = \"0.0.5\"]\n{text}\n", ("w",), flops)


def _amx_dense_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # an 8-bit dense on a constant weight, which alter-layout puts on AMX tiles
    m, n, k = (int(f[x]) for x in ("m", "n", "k"))
    a, b = f["a"], f["b"]
    if a != b or a not in int8_gemm.INPUT_DTYPES or not int8_amx.dense_usable(m, n, k, target):
        return None
    space = int8_amx.dense_space(m, n, k, a, b, target)
    if space.key != key:
        return None
    text = (f"def @main(%x: {_tensor((m, k), a)}, %w: {_tensor((n, k), b)}) "
            "{ nn.dense(%x, %w, out_dtype=\"int32\") }")
    return Site(key, "amx_dense", space, f"#[version = \"0.0.5\"]\n{text}\n", ("w",),
                2 * m * n * k)


def _weight_grad_site(key: str, f: Mapping[str, str], target: Target) -> Site | None:
    # conv2d's weight gradient of an adjoint and the data (a training step's), float32
    grad, data, kernel = _ints(f["grad"]), _ints(f["data"]), _ints(f["kernel"])
    strides, pad, dil = _ints(f["strides"]), _ints(f["padding"]), _ints(f["dilation"])
    if len(grad) != 4 or len(data) != 4 or len(kernel) != 2 or grad[0] != data[0]:
        return None
    space = conv_grad_kernels.weight_space(grad, data, kernel, strides, pad, dil, target)
    if space.key != key:
        return None
    w = (grad[1], data[1], *kernel)
    text = (f"def @main(%g: {_tensor(grad)}, %x: {_tensor(data)}) "
            f"{{ nn.conv2d_backward_weight(%g, %x, {_window(data, w, grad, strides, pad, dil)}, "
            f"channels={grad[1]}, kernel_size=[{kernel[0]}, {kernel[1]}]) }}")
    flops = 2 * grad[0] * grad[1] * grad[2] * grad[3] * data[1] * kernel[0] * kernel[1]
    return Site(key, "conv2d_backward_weight", space, f"#[version = \"0.0.5\"]\n{text}\n",
                (), flops)


# A site's kind (its key's first word) -> the function that makes the site of such a key
_SITE_KINDS: dict[str, Callable[[str, Mapping[str, str], Target], Site | None]] = {
    "gemm": _gemm_site, "dot": _dot_site, "conv2d": _conv_site, "winograd": _winograd_site,
    "conv2d_nchwc": _nchwc_site, "depthwise_nchwc": _depthwise_site,
    "winograd_nchwc": _winograd_nchwc_site, "int8_gemm": _int8_site,
    "int8_conv": _int8_conv_site, "amx_dense": _amx_dense_site,
    "conv2d_backward_weight": _weight_grad_site,
}


def kernel_keys(kernel_attrs: Mapping[str, Any]) -> list[str]:
    """The site keys a lowered kernel records (``attrs["schedules"]``)."""
    keys = []
    for _, knobs in kernel_attrs.get("schedules", ()):
        key = knobs.get("key")
        if isinstance(key, str) and key not in keys:
            keys.append(key)
    return keys


def random_inputs(exe: Any, seed: int = 0) -> list[np.ndarray]:
    """Random values for an executable's inputs (floats in [-1, 1), integers 0)."""
    rng = np.random.default_rng(seed)
    out = []
    for info in exe.inputs:
        shape = info.shape
        if shape is None or any(not isinstance(d, int) for d in shape):
            raise Error(f"kiln.tune needs inputs of static shape; input {info.name!r} is "
                        f"{info.shape}")
        dtype = np.dtype(info.dtype)
        if dtype.kind == "f":
            out.append(rng.uniform(-1, 1, shape).astype(dtype))
        else:
            out.append(np.zeros(shape, dtype))
    return out
