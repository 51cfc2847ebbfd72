"""convert-layout: a CNN's convolutions and what lies between them in channel blocks (NCHW[b]c).

TVM's alter-op-layout rewrote x86 convolutions into ``nn.contrib_conv2d_NCHWc`` and kept the
data blocked from one convolution to the next, inserting ``layout_transform`` only where an
operator needs the plain layout. This pass does the same for float32 ``nn.conv2d`` calls in
NCHW / OIHW with a constant weight that a kernel of kiln/loops/nchwc_kernels.py takes:

- the block b is the Target's vector lanes (or, from a tuning log, twice that: `layout_space`,
  a knob of the whole function, keyed by its convolutions' shapes, `layout_key`); a
  convolution whose output channels b does not divide computes the next multiple of b, the
  padding's weights zero, where that adds at most half (`padded_channels`: MobileNetV2's 24
  as 32), else it stays as it is;
- a convolution's input keeps the block it arrives in (a plain input whose channels the lanes
  do not divide, such as a stem's 3, is read as plain NCHW, blocks of one), its weight is
  blocked at compile time (``OIHW[bi]i[bo]o``; depthwise ``OIHW1i[b]o``), and its result is
  ``NCHW[bo]c``; one that Winograd's algorithm takes (`winograd.chosen`) becomes
  ``nn.conv2d_winograd`` on blocked data (kiln/loops/winograd_nchwc.py);
- elementwise operators (relu, clip, ...) and broadcasting ones whose other operands are
  constants over channels (a folded batch norm's shift: shape (C, 1, 1); ``nn.bias_add`` of
  a constant bias becomes such an ``add``), scalars, or blocked
  tensors of the same shape (a residual add) work on the blocked tensors as they are,
  constants blocked at compile time; beside a whole NCHW tensor they run in NCHW, and a
  padded tensor goes only through `PADDING_SAFE` operators;
- 2-D pooling takes the blocked layout (``layout="NCHW16c"``);
- every other use of a blocked tensor gets it back in NCHW through one ``layout_transform``
  (and a ``strided_slice`` dropping the padding).

A convolution is converted where its weight is constant, so the pass runs after the weights
are bound (``kiln.build(mod, params=...)``); the alter-layout pass that follows packs what is
left for the NCHW kernels. ``PassContext(config={"convert-layout": False})`` turns it off.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import AbstractContextManager as ContextManager
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

from kiln.ir.expr import Call, Constant, Expr, Function, Op, const
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.ir.ty import TensorType
from kiln.loops.schedule import lowering_target
from kiln.loops.tunable import Space, current_overrides, ordered, override, recording, site_key
from kiln.op import registry
from kiln.op.layout import from_logical, parse_layout
from kiln.op.registry import OpPattern
from kiln.transform.pass_manager import PassContext, map_typed_functions, module_pass

CONFIG_KEY = "convert-layout"
# Elementwise operators that keep the padding channels finite (zero weights then ignore
# them): a padded tensor passes through no other (a division of zeros would make NaN there).
PADDING_SAFE = frozenset(["add", "subtract", "multiply", "maximum", "minimum", "clip",
                          "nn.relu", "nn.leaky_relu", "negative", "abs", "sigmoid", "tanh",
                          "copy", "cast"])
# A direct convolution alone gains less in blocks than moving its input in and its result
# out costs. One that Winograd's algorithm takes gains more since its products run a group
# of tiles at a time (kiln/loops/winograd_nchwc.py): peers.py's 64-channel 56² layer took
# 0.72 ms in blocks where NCHW took 0.50 (ORT 0.58), now 0.41 where NCHW takes 0.61.
MIN_CONVOLUTIONS = 2
POOLS = ("nn.max_pool2d", "nn.avg_pool2d", "nn.global_avg_pool2d", "nn.global_max_pool2d")


def padded_channels(channels: int, lanes: int) -> int | None:
    """The channels a convolution's blocked result holds: ``channels`` where the lanes
    divide them, else rounded up to a multiple of the lanes with zero weights where the
    padding costs at most half the channels (MobileNetV2's 24 as 32, on AVX-512, as ONNX
    Runtime does); else None (the convolution stays NCHW).

    Blocks of 8 for 24 channels ran MobileNetV2's 1×1 convolutions at half width, 2.2-2.5
    times slower than the NCHW GEMM; one block of all 24 made LLVM split each 24-lane vector
    with inserts and shuffles; left NCHW, the 96 and 144 channels feeding them were moved
    out of blocks and back, 387 µs an inference (Emerald Rapids, 2 threads)."""
    padded = -(-channels // lanes) * lanes
    return padded if 2 * (padded - channels) <= channels else None


def _static4(e: Expr) -> tuple[int, ...] | None:
    t = e.checked_type_
    if isinstance(t, TensorType) and t.is_static and t.ndim == 4 and t.dtype == "float32":
        return t.static_shape
    return None


class _Converter:
    def __init__(self, lanes: int) -> None:
        self.lanes = lanes
        self.new: dict[int, Expr] = {}
        self.layout: dict[int, str | None] = {}  # a node's blocked layout (None: its own)
        self.padded: dict[int, int] = {}  # a blocked node's channels with the padding
        self.moved: dict[tuple[int, str], Expr] = {}  # (node, layout) -> node in that layout
        self.winograds = 0  # convolutions made Winograd's on blocks

    def plain(self, node: Expr) -> Expr:
        """``node`` rebuilt, in its own layout (its padding channels dropped)."""
        return self.as_layout(node, "NCHW") if self.layout.get(id(node)) else self.new[id(node)]

    def as_layout(self, node: Expr, layout: str) -> Expr:
        """``node`` rebuilt in ``layout`` (NCHW or NCHW[b]c), one transform per layout. A
        plain node is moved into blocks only where the block divides its channels."""
        have = self.layout.get(id(node)) or "NCHW"
        if have == layout:
            return self.new[id(node)]
        key = (id(node), layout)
        if key not in self.moved:
            moved = registry.get("layout_transform")(self.new[id(node)], src_layout=have,
                                                     dst_layout=layout)
            shape = _static4(node)
            if layout == "NCHW" and shape is not None and self.padded.get(id(node), shape[1]) \
                    != shape[1]:
                moved = registry.get("strided_slice")(moved, begin=[0], end=[shape[1]],
                                                      axes=[1])
            self.moved[key] = moved
        return self.moved[key]

    def visit(self, node: Expr) -> None:
        made = None
        if isinstance(node, Call) and isinstance(node.op, Op):
            name = node.op.name
            made = (self.conv(node, name) or self.pool(node, name)
                    or self.bias_add(node, name) or self.elementwise(node, name))
        if made is not None:
            self.new[id(node)], self.layout[id(node)], self.padded[id(node)] = made
            return
        self.new[id(node)] = with_children(node, [self.plain(c) for c in children(node)])

    def channels(self, node: Expr) -> int:
        """The channels of ``node`` as rebuilt (with its padding)."""
        shape = _static4(node)
        assert shape is not None
        return self.padded.get(id(node), shape[1])

    # --- the rules -------------------------------------------------------------------------

    def conv(self, node: Call, name: str) -> tuple[Expr, str, int] | None:
        from kiln.loops import winograd
        from kiln.op.nn.conv import Conv2DAttrs

        if name != "nn.conv2d":
            return None
        x, w = node.args
        xs, ys = _static4(x), _static4(node)
        if xs is None or ys is None or not isinstance(w, Constant) or w.dtype != "float32":
            return None
        attrs = Conv2DAttrs.view(node.attrs)
        if (attrs.data_layout, attrs.kernel_layout, attrs.out_layout or "NCHW") != \
                ("NCHW", "OIHW", "NCHW") or attrs.out_dtype not in ("", "float32"):
            return None
        o, cg = w.data.shape[0], w.data.shape[1]
        c = xs[1]
        op = padded_channels(o, self.lanes)
        if op is None or min(xs + ys + w.data.shape) == 0:
            return None
        have = self.layout.get(id(x))
        cp = self.channels(x)  # the input's channels with its padding
        bo = self.lanes
        m = winograd.chosen(xs, w.data.shape, attrs.strides, attrs.padding, attrs.dilation,
                            attrs.groups, ys)
        if m is not None:
            return self.winograd(node, m, cp if have else c, op) if have or c % bo == 0 \
                else None
        weight = w.data
        if attrs.groups == 1:
            bi = int(have[4:-1]) if have else (bo if c % bo == 0 else 1)
            # zero weights for the padding channels, in and out
            weight = np.pad(weight, ((0, op - o), (0, (cp if have else c) - c), (0, 0), (0, 0)))
            groups = 1
        elif attrs.groups == c == o and cg == 1 and (have or c % bo == 0):
            bi, groups = bo, op
            weight = np.pad(weight, ((0, op - o), (0, 0), (0, 0), (0, 0)))
        else:
            return None
        data_layout = f"NCHW{bi}c" if bi > 1 else "NCHW"
        kernel_layout = f"OIHW{bi if groups == 1 else 1}i{bo}o"
        out_layout = f"NCHW{bo}c"
        params = {name: node.attrs[name] for name in node.attrs}
        params.update(data_layout=data_layout, kernel_layout=kernel_layout,
                      out_layout=out_layout, channels=op, kernel_size=w.data.shape[2:],
                      groups=groups)
        call = registry.get("nn.contrib_conv2d_NCHWc")(
            self.as_layout(x, data_layout),
            const(from_logical(weight, "OIHW", parse_layout(kernel_layout))), **params)
        return Call(call.op, call.args, call.attrs, span=node.span), out_layout, op

    def winograd(self, node: Call, m: int, cp: int, op: int) -> tuple[Expr, str, int]:
        """A convolution Winograd's algorithm takes (a quarter of the multiplies), as
        ``nn.conv2d_winograd`` on blocked data: U = G W Gᵀ of the weight padded to ``cp``
        input and ``op`` output channels, in the B panels of kiln/loops/winograd_nchwc.py."""
        from kiln.loops import winograd, winograd_nchwc
        from kiln.op.nn.conv import Conv2DAttrs

        self.winograds += 1
        x, w = node.args
        assert isinstance(w, Constant)
        xs, ys = _static4(x), _static4(node)
        assert xs is not None and ys is not None
        b = self.lanes
        layout = f"NCHW{b}c"
        o, c = w.data.shape[:2]
        weight = np.pad(w.data, ((0, op - o), (0, cp - c), (0, 0), (0, 0)))
        blocked_x = (xs[0], cp // b, xs[2], xs[3], b)
        blocked_y = (ys[0], op // b, ys[2], ys[3], b)
        padding = Conv2DAttrs.view(node.attrs).padding
        _, _, kp, nr = winograd_nchwc.packed_shape(blocked_x, blocked_y, padding, m)
        params = {name: node.attrs[name] for name in node.attrs}
        params.update(data_layout=layout, out_layout=layout, channels=op,
                      kernel_size=w.data.shape[2:])
        call = registry.get("nn.conv2d_winograd")(
            self.as_layout(x, layout), const(winograd.pack_weight(weight, m, nr, kp)),
            **params)
        return Call(call.op, call.args, call.attrs, span=node.span), layout, op

    def pool(self, node: Call, name: str) -> tuple[Expr, str, int] | None:
        if name not in POOLS:
            return None
        (x,) = node.args
        have = self.layout.get(id(x))
        if have is None or node.attrs.layout != "NCHW" or node.attrs.out_layout not in ("",
                                                                                      "NCHW"):
            return None
        params = {name: node.attrs[name] for name in node.attrs}
        params.update(layout=have, out_layout=have)
        call = registry.get(name)(self.new[id(x)], **params)
        return Call(call.op, call.args, call.attrs, span=node.span), have, self.channels(x)

    def bias_add(self, node: Call, name: str) -> tuple[Expr, str, int] | None:
        """``nn.bias_add`` of a constant bias over the channels of a blocked tensor (what
        ONNX's Conv with a bias imports as) as an ``add`` of the bias blocked, zeros for the
        padding channels: left to the plain rule, the result went back to NCHW and the next
        convolution's input into blocks again (ResNet-18 from ONNX: 1.12× the time of the
        same network built without bias_add)."""
        from kiln.op.nn.linear import BiasAddAttrs

        if name != "nn.bias_add":
            return None
        x, bias = node.args
        have = self.layout.get(id(x))
        shape = _static4(node)
        if have is None or shape is None or not isinstance(bias, Constant) \
                or bias.data.shape != (shape[1],) \
                or BiasAddAttrs.view(node.attrs).axis not in (1, -3):
            return None
        moved = _blocked_constant(const(bias.data.reshape(shape[1], 1, 1)), shape,
                                  int(have[4:-1]), self.channels(x))
        assert moved is not None  # a (C, 1, 1) constant always blocks
        call = registry.get("add")(self.new[id(x)], moved)
        return Call(call.op, call.args, call.attrs, span=node.span), have, self.channels(x)

    def elementwise(self, node: Call, name: str) -> tuple[Expr, str, int] | None:
        opdef = registry.get(name)
        if opdef.pattern > OpPattern.BROADCAST or any("axis" in a or "layout" in a
                                                      for a in node.attrs):
            return None
        shape = _static4(node)
        blocked = [a for a in node.args if self.layout.get(id(a))]
        if shape is None or not blocked:
            return None
        layout = self.layout[id(blocked[0])]
        assert layout is not None
        b = int(layout[4:-1])
        cp = self.channels(blocked[0])
        if cp != shape[1] and name not in PADDING_SAFE:
            return None  # it might make the padding channels infinite or NaN
        if any(not self.layout.get(id(a)) and not isinstance(a, Constant)
               and _static4(a) == shape for a in node.args):
            # a whole tensor in NCHW beside: the operator runs in NCHW (moving the NCHW one
            # into blocks would cost as much, and its other users are likely NCHW too)
            return None
        args: list[Expr] = []
        for a in node.args:
            if self.layout.get(id(a)):
                if self.channels(a) != cp:
                    return None
                args.append(self.as_layout(a, layout))
                continue
            moved = _blocked_constant(a, shape, b, cp)
            if moved is None:
                return None
            args.append(moved)
        return Call(node.op, tuple(args), node.attrs, span=node.span), layout, cp


def _blocked_constant(a: Expr, shape: tuple[int, ...], b: int, padded: int) -> Expr | None:
    """A constant operand of a broadcast with an NCHW result of ``shape``, as the same
    broadcast needs it against NCHW[b]c with ``padded`` channels: a scalar or all-ones
    shape as it is, a per-channel (C, 1, 1) or (1, C, 1, 1) one blocked (zeros for the
    padding channels); None for anything else."""
    if not isinstance(a, Constant):
        return None
    data = a.data
    if data.size == 1:
        return a
    c = shape[1]
    dims = (1,) * (4 - data.ndim) + data.shape
    if data.ndim > 4 or dims[1:] != (c, 1, 1) or dims[0] != 1:
        return None
    per_channel = np.pad(data.reshape(c, 1, 1), ((0, padded - c), (0, 0), (0, 0)))
    return const(from_logical(per_channel, "CHW", parse_layout(f"CHW{b}c")))


def convert(func: Function, lanes: int) -> Function:
    """``func`` with its qualifying convolutions in channel blocks (module docstring); as
    it is where fewer than `MIN_CONVOLUTIONS` convolutions would be, none of them Winograd's."""
    conv = _Converter(lanes)
    converted = 0
    for node in post_order(func):
        if node is func:
            break
        conv.visit(node)
        if conv.layout.get(id(node)) and isinstance(node, Call) and isinstance(node.op, Op) \
                and node.op.name == "nn.conv2d":
            converted += 1
    if converted < MIN_CONVOLUTIONS and not conv.winograds:
        return func
    body = conv.plain(func.body)
    return Function(func.params, body, func.ret_type, func.type_params, func.attrs,
                    span=func.span)


def layout_key(func: Function) -> str | None:
    """The key naming the channel block of ``func``'s convolutions in a tuning log (None
    where it has none this pass could convert): their shapes and attributes, in order,
    digested — the same function in another build has the same key."""
    from kiln.op.nn.conv import Conv2DAttrs

    parts = []
    for node in post_order(func):
        if not (isinstance(node, Call) and isinstance(node.op, Op)
                and node.op.name == "nn.conv2d"):
            continue
        xs, ys, w = _static4(node.args[0]), _static4(node), node.args[1]
        if xs is None or ys is None or not isinstance(w, Constant):
            continue
        a = Conv2DAttrs.view(node.attrs)
        parts.append(f"{xs} {w.data.shape} {ys} {list(a.strides)} {list(a.padding)} "
                     f"{list(a.dilation)} {a.groups} {a.data_layout} {a.kernel_layout}")
    if not parts:
        return None
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    return site_key("convert_layout", convolutions=len(parts), digest=digest)


def layout_space(key: str, lanes: int) -> Space:
    """The blocks a function's convolutions may run in: a vector's lanes (the default) or
    two vectors'. (Half a vector runs every vector operation at half width: ResNet-18 1.49×
    slower on AVX-512.)"""
    return Space(key, (("block", ordered(lanes, [2 * lanes])),))


_SEEN: ContextVar[list[str] | None] = ContextVar("kiln_convert_layout_keys", default=None)
_BLOCK: ContextVar[int | None] = ContextVar("kiln_convert_layout_block", default=None)


@contextmanager
def block_scope(block: int | None) -> Iterator[None]:
    """Inside the block, functions without a tuning log's entry run in channel blocks of
    ``block`` (None: the Target's lanes) — kiln.tune's one-operator program of a site that
    a model runs in blocks of two vectors."""
    token = _BLOCK.set(block)
    try:
        yield
    finally:
        _BLOCK.reset(token)


def recorded_keys() -> ContextManager[list[str]]:
    """The `layout_key`s of the functions this pass meets inside the block (what kiln.tune
    searches the block of)."""
    return recording(_SEEN)


def _converted(func: Function, lanes: int) -> Function:
    """`convert` with the block a tuning log gives ``func``'s key, else `block_scope`'s or
    ``lanes``."""
    if current_overrides() is None and _SEEN.get() is None:  # no log, no tuning run
        return convert(func, _BLOCK.get() or lanes)
    key = layout_key(func)
    if key is None:
        return func
    knobs = override(layout_space(key, lanes))
    out = convert(func, int(knobs["block"]) if knobs is not None else _BLOCK.get() or lanes)
    seen = _SEEN.get()
    if seen is not None and out is not func:  # (one left as it is has no block to search)
        seen.append(key)
    return out


@module_pass("convert-layout", opt_level=3)
def ConvertLayout(mod: IRModule, ctx: PassContext) -> IRModule:
    """Run float32 CNNs in channel blocks (NCHW[b]c) between their convolutions."""
    if not ctx.config.get(CONFIG_KEY, True):
        return mod
    lanes = lowering_target().lanes("float32")
    return map_typed_functions(mod, lambda f: _converted(f, lanes))
