"""alter-layout: constant dense and conv2d weights packed once, at compile time, for the GEMM.

``nn.dense(x, W)`` with a constant float32 weight becomes ``nn.dense_packed(x, Wp)``, where
``Wp`` holds W in the column panels the GEMM micro-kernel reads (kiln/op/nn/packed.py), and
``nn.conv2d(x, W)`` becomes ``nn.conv2d_packed(x, Wp)`` with W in the row panels of the
implicit GEMM's A operand, so the compiled kernel no longer copies the weight on every call
(TVM's alter-op-layout did the same for its packed dense and conv2d schedules). A 3×3
stride-1 conv2d where Winograd's algorithm pays (`kiln.loops.winograd.chosen`: the rule's
choice, or a tuning log's) becomes ``nn.conv2d_winograd(x, Up)`` instead, its weight
transformed (U = G W Gᵀ) and packed for the products (kiln/op/nn/winograd.py). Weights
become constants when ``params`` are bound (``kiln.build(mod, params=...)``).

An 8-bit ``nn.dense`` with ``out_dtype="int32"`` and a constant weight becomes
``nn.dense_int8_packed(x, Wp)``: W in the int32 panels of the int8 GEMM for this Target
(4 bytes or 2 int16 per lane, with its column sums; kiln/op/nn/int8_packed.py), and an
8-bit ``nn.conv2d`` (NCHW, one channel group) ``nn.conv2d_int8_packed(x, Wp)``, the panels
of the int8 convolution that reads its input in place (kiln/loops/int8_conv.py) — or, where
the Target has AMX, ``nn.conv2d_int8_tiled(x, Wt)``, W in the 16×16 int32 tiles of the AMX
convolution (kiln/op/nn/int8_tiled.py,
kiln/loops/int8_amx.py).

Left alone: a weight that is not a constant, depthwise convolutions, other dtypes, an
``out_dtype`` other than the data's, and a dense that the dot-product kernel takes (few rows,
or at most one vector of units: `uses_dot`), which reads the weight rows in place
(kiln/loops/linear_kernels.py). The layout
is the one the GEMM's default schedule for these shapes takes (tile sizes, K padded to its
K blocking); the lowering checks it, and reads the panels like any tensor if they disagree.
"""

from __future__ import annotations

import numpy as np

from kiln.ir.expr import Call, Constant, Expr, Function, Op, const
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.ir.ty import TensorType
from kiln.transform.pass_manager import PassContext, map_typed_functions, module_pass


def _packed(node: Expr) -> Expr | None:
    """``nn.dense_packed`` for a dense call that qualifies (see the module docstring)."""
    from kiln.loops import gemm
    from kiln.loops.linear_kernels import DOT_MAX_ROWS, uses_dot
    from kiln.loops.schedule import lowering_target
    from kiln.op.nn.packed import dense_packed, pack_dense_weight

    if not (isinstance(node, Call) and isinstance(node.op, Op) and node.op.name == "nn.dense"):
        return None
    x, w = node.args
    xt = x.checked_type_
    if not isinstance(w, Constant) or not isinstance(xt, TensorType) or not xt.is_static:
        return None
    if w.dtype != "float32" or xt.dtype != "float32" or node.attrs.out_dtype not in ("", None,
                                                                                    "float32"):
        return None
    units, k = w.data.shape
    rows = 1
    for d in xt.static_shape[:-1]:
        rows *= d
    if rows <= DOT_MAX_ROWS or min(rows, units, k) == 0 \
            or uses_dot(rows, units, k, lowering_target().lanes("float32")):
        return None
    schedule = gemm.GemmSchedule.default(1, rows, units, k, "float32", b_prepacked=True)
    kc, blocks = gemm.k_blocking(k)
    return dense_packed(x, const(pack_dense_weight(w.data, schedule.nr, kc * blocks)),
                        units=units)


def _int8_packed(node: Expr) -> Expr | None:
    """``nn.dense_int8_packed`` for an 8-bit dense call that qualifies (module docstring)."""
    from kiln.loops import int8_amx
    from kiln.loops.int8_gemm import Int8Schedule
    from kiln.op.nn.int8_packed import dense_int8_packed, pack_int8_weight
    from kiln.op.nn.int8_tiled import dense_int8_tiled, pack_tiled_dense_weight

    if not (isinstance(node, Call) and isinstance(node.op, Op) and node.op.name == "nn.dense"):
        return None
    x, w = node.args
    xt = x.checked_type_
    if not isinstance(w, Constant) or not isinstance(xt, TensorType) or not xt.is_static:
        return None
    if w.dtype not in ("int8", "uint8") or xt.dtype not in ("int8", "uint8") \
            or node.attrs.out_dtype != "int32":
        return None
    units, k = w.data.shape
    rows = 1
    for d in xt.static_shape[:-1]:
        rows *= d
    if min(rows, units, k) == 0:
        return None
    if int8_amx.dense_usable(rows, units, k):
        return dense_int8_tiled(x, const(pack_tiled_dense_weight(w.data)), units=units, k=k,
                                weight_dtype=w.dtype)
    s = Int8Schedule.default(1, rows, units, k, xt.dtype, w.dtype, site="dense_prepacked")
    group = 4 if s.form == "vnni" else 2
    return dense_int8_packed(x, const(pack_int8_weight(w.data, s.nr, group)), units=units,
                             k=k, weight_dtype=w.dtype, group=group)


def _conv_of_constant(node: Expr) -> tuple[Expr, Constant, TensorType, TensorType] | None:
    """(data, weight, data type, result type) of an ``nn.conv2d`` call of static shapes with
    a constant weight; None for anything else."""
    if not (isinstance(node, Call) and isinstance(node.op, Op) and node.op.name == "nn.conv2d"):
        return None
    x, w = node.args
    xt, ot = x.checked_type_, node.checked_type_
    if not isinstance(w, Constant) or not isinstance(xt, TensorType) or not xt.is_static \
            or not isinstance(ot, TensorType) or not ot.is_static:
        return None
    return x, w, xt, ot


def _int8_conv_packed(node: Expr) -> Expr | None:
    """``nn.conv2d_int8_packed`` for an 8-bit conv2d call that qualifies (module docstring)."""
    from kiln.loops import int8_amx, int8_conv
    from kiln.op.nn.conv import Conv2DAttrs
    from kiln.op.nn.int8_packed import conv2d_int8_packed, pack_int8_conv_weight
    from kiln.op.nn.int8_tiled import conv2d_int8_tiled, pack_tiled_conv_weight

    parts = _conv_of_constant(node)
    if parts is None or not isinstance(node, Call):  # (it is a call if parts is not None)
        return None
    x, w, xt, ot = parts
    if w.dtype not in ("int8", "uint8") or xt.dtype not in ("int8", "uint8") \
            or ot.dtype != "int32":
        return None
    conv = Conv2DAttrs.view(node.attrs)
    if (conv.data_layout, conv.kernel_layout, conv.out_layout or "NCHW") != \
            ("NCHW", "OIHW", "NCHW"):
        return None
    attrs = {name: node.attrs[name] for name in node.attrs}
    data, data_shape, padding, pad_value = x, xt.static_shape, tuple(conv.padding), 0
    folded = _constant_pad(x, conv.padding)
    if folded is not None:  # the pad becomes the convolution's own
        data, padding, pad_value = folded
        dt = data.checked_type_
        assert isinstance(dt, TensorType)  # the pad's data, typed as the pad is
        data_shape = dt.static_shape
    o, _, kh, kw = w.data.shape
    tiled = int8_amx.plan(data_shape, w.data.shape, conv.strides, padding[:2], conv.dilation,
                          conv.groups, ot.static_shape)
    if tiled is not None:
        attrs.update(channels=o, kernel_size=(kh, kw), weight_dtype=w.dtype, padding=padding,
                     pad_value=pad_value, form=tiled.form)
        return conv2d_int8_tiled(data, const(pack_tiled_conv_weight(w.data, tiled.form)),
                                 **attrs)
    plan = int8_conv.plan(data_shape, w.data.shape, conv.strides, padding[:2],
                          conv.dilation, conv.groups, ot.static_shape, xt.dtype, w.dtype)
    if plan is None:
        return None
    attrs.update(channels=o, kernel_size=(kh, kw), weight_dtype=w.dtype, group=plan.group,
                 padding=padding, pad_value=pad_value)
    packed = pack_int8_conv_weight(w.data, conv.groups, plan.schedule.mr, plan.group)
    return conv2d_int8_packed(data, const(packed), **attrs)


def _constant_pad(x: Expr, padding: tuple[int, ...]
                  ) -> tuple[Expr, tuple[int, int, int, int], int] | None:
    """(data, padding, value) when ``x`` is an ``nn.pad`` of the spatial axes only, by a
    constant, feeding a convolution that pads nothing itself (qnn.conv2d's canonical form
    pads a quantized input with its zero point that way)."""
    if any(padding) or not (isinstance(x, Call) and isinstance(x.op, Op)
                            and x.op.name == "nn.pad" and isinstance(x.args[1], Constant)):
        return None
    from kiln.op.nn.transform import PadAttrs

    widths = [tuple(int(v) for v in p) for p in PadAttrs.view(x.attrs).pad_width]
    value = np.asarray(x.args[1].data)
    if len(widths) != 4 or widths[0] != (0, 0) or widths[1] != (0, 0) or value.size != 1 \
            or min(widths[2] + widths[3]) < 0 or PadAttrs.view(x.attrs).pad_mode != "constant":
        return None
    (top, bottom), (left, right) = widths[2], widths[3]
    return x.args[0], (top, left, bottom, right), int(value.reshape(()))


def _conv_packed(node: Expr) -> Expr | None:
    """``nn.conv2d_packed`` for a conv2d call that qualifies (see the module docstring)."""
    from kiln.loops import conv_kernels, gemm, winograd
    from kiln.op.nn.conv import Conv2DAttrs
    from kiln.op.nn.packed import conv2d_packed, pack_conv_weight
    from kiln.op.nn.winograd import conv2d_winograd

    parts = _conv_of_constant(node)
    if parts is None or not isinstance(node, Call):  # (it is a call if parts is not None)
        return None
    x, w, xt, ot = parts
    if w.dtype != "float32" or xt.dtype != "float32" or ot.dtype != "float32":
        return None
    o, cg, kh, kw = w.data.shape
    groups = node.attrs.groups
    assert isinstance(groups, int)  # conv2d's schema makes it one
    if cg == 1 and groups == xt.shape[1] and groups > 1:
        return None  # depthwise: a direct kernel, no GEMM
    if min(w.data.shape) == 0 or min(ot.static_shape) == 0:
        return None
    conv = Conv2DAttrs.view(node.attrs)
    if (conv.data_layout, conv.kernel_layout, conv.out_layout or "NCHW") != \
            ("NCHW", "OIHW", "NCHW"):
        return None  # the packed kernel reads NCHW data and an OIHW weight
    attrs = {name: node.attrs[name] for name in node.attrs}
    attrs.update(channels=o, kernel_size=(kh, kw))
    m = winograd.chosen(xt.static_shape, w.data.shape, conv.strides, conv.padding,
                        conv.dilation, groups, ot.static_shape)
    if m is not None:
        _, _, kp, mr = winograd.packed_shape(xt.static_shape, ot.static_shape, conv.padding,
                                             m)
        return conv2d_winograd(x, const(winograd.pack_weight(w.data, m, mr, kp)), **attrs)
    plan = conv_kernels.conv_plan(xt.static_shape, w.data.shape, conv.strides,
                                  conv.padding[:2], conv.dilation, groups, ot.static_shape)
    kc, blocks = gemm.k_blocking(cg * kh * kw)
    return conv2d_packed(x, const(pack_conv_weight(w.data, groups, plan.lanes, kc * blocks)),
                         **attrs)


def alter(func: Function) -> Function:
    """``func`` with its qualifying dense calls on packed weights (types from ``func``)."""
    done: dict[int, Expr] = {}
    for node in post_order(func):
        rebuilt = with_children(node, [done[id(c)] for c in children(node)])
        # decided on the typed original
        replaced = (_packed(node) or _int8_packed(node) or _int8_conv_packed(node)
                    or _conv_packed(node))
        if replaced is not None:
            # the packed call made for the original: its data (the original's, or what a
            # pad folded into it padded) as rebuilt
            assert isinstance(replaced, Call)
            replaced = Call(replaced.op, (done[id(replaced.args[0])], replaced.args[1]),
                            replaced.attrs, span=node.span)
        done[id(node)] = rebuilt if replaced is None else replaced
    new = done[id(func)]
    assert isinstance(new, Function)  # with_children rebuilds a node as its own kind
    return new


@module_pass("alter-layout", opt_level=3)
def AlterLayout(mod: IRModule, ctx: PassContext) -> IRModule:
    """Pack constant dense weights into the GEMM's panel layout (nn.dense_packed)."""
    return map_typed_functions(mod, alter)
