"""qdq-to-qnn: a quantize of a float conv2d / dense of dequantized operands becomes integer
arithmetic — the QDQ form that ``onnxruntime.quantization.quantize_static`` writes.

    quantize(relu?(bias?(conv2d(dequantize(x), dequantize(w)), dequantize(b))), sy, zy)
      -> saturate(round(float32(qnn.conv2d(x, w) + b) * f) + zy)     f = (sx * sw) / sy

and the same for ``nn.dense`` (ONNX MatMul and Gemm; the weight dequantized and transposed,
or not). The int32 sums run on the integer GEMM/conv kernels (qnn-canonicalize), and the
rescaling is ONNX Runtime's own when it fuses the group into QLinearConv / QLinearMatMul:
float32 product by the float32 factor ``(sx * sw) / sy`` (per output channel with
per-channel weights), rounded as the quantize rounds (halves to even from ONNX), the int32
bias added before. A relu in between is the lower bound ``zy`` of the saturation.

The group is left as it is (float) unless: the scales and the output zero point are
constants, x is quantized per tensor in 8 bits, w in 8 bits per tensor or per output
channel, and the bias (if any) is int32 with zero point 0 in the scale sx * sw.

``quantize(max_pool2d(dequantize(x, s, z)), s, z)`` — the same scale and zero point on both
sides, as quantize_static writes around a MaxPool — is ``max_pool2d(x)`` on the 8-bit
tensor, exactly (what ONNX Runtime runs too).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln import op
from kiln.ir.expr import Call, Constant, Expr, Op
from kiln.ir.module import IRModule
from kiln.op.qnn.common import qrange
from kiln.op.qnn.quantize import QuantizeAttrs
from kiln.op.registry import get
from kiln.transform.pass_manager import PassContext, module_pass
from kiln.transform.pattern import Pat, RewriteContext, RewriteTable, Rule

EIGHT_BIT = ("int8", "uint8")

xq, sx, zx = Pat.var("xq"), Pat.var("sx"), Pat.var("zx")
wq, sw, zw = Pat.var("wq"), Pat.var("sw"), Pat.var("zw")
bq, sb, zb = Pat.var("bq"), Pat.var("sb"), Pat.var("zb")
sy, zy = Pat.var("sy"), Pat.var("zy")
x_dq = Pat.op("qnn.dequantize", xq, sx, zx)
w_dq = Pat.op("qnn.dequantize", wq, sw, zw, name="w_dq")
b_dq = Pat.op("qnn.dequantize", bq, sb, zb)
b_float = Pat.const("bf")  # a bias dequantized already (the importer folds small constants)

CONV = Pat.op("nn.conv2d", x_dq, w_dq, name="conv")
DENSE_T = Pat.op("nn.dense", x_dq, Pat.op("transpose", w_dq, name="wt"), name="dense")
DENSE = Pat.op("nn.dense", x_dq, w_dq, name="dense")


def _value(e: Expr, ctx: RewriteContext, depth: int = 3) -> np.ndarray | None:
    """The value of a constant, or of a few operators on small constants (the importer's
    casts and reshapes of scales: this pass runs before fold-constant, which would otherwise
    fold the weights' dequantize away)."""
    v = ctx.value_of(e)
    if isinstance(v, Constant):
        return np.asarray(v.data) if v.data.size <= 65536 else None
    if depth == 0 or not isinstance(v, Call) or not isinstance(v.op, Op):
        return None
    opdef = get(v.op.name)
    if opdef.host or opdef.name.startswith("qnn."):
        return None
    args = [_value(a, ctx, depth - 1) for a in v.args]
    if any(a is None for a in args):
        return None
    return np.asarray(opdef.compute(args, v.attrs))


def _fuse(root: Expr, ctx: RewriteContext, b: dict[str, Any]) -> Expr | None:
    q = root
    assert isinstance(q, Call)  # the pattern's root is the quantize
    found = {k: _value(b[k], ctx) for k in ("sx", "zx", "sw", "zw", "sy", "zy")}
    values: dict[str, np.ndarray] = {k: v for k, v in found.items() if v is not None}
    if len(values) != len(found):
        return None
    vx, vw = ctx.tensor_type(b["xq"]), ctx.tensor_type(b["wq"])
    if vx is None or vw is None or vx.dtype not in EIGHT_BIT or vw.dtype not in EIGHT_BIT:
        return None
    if values["sx"].size != 1 or values["zx"].size != 1 or values["sy"].size != 1 or \
            values["zy"].size != 1:
        return None
    conv = b.get("conv")
    w = b["wq"]
    channels = vw.shape[0]
    w_axis = int(b["w_dq"].attrs["axis"]) % max(vw.ndim, 1)
    if conv is None and "wt" in b:  # MatMul: dense(x, transpose(w)), w is (k, n)
        channels, w_axis = vw.shape[1], 1 - w_axis
        w = op.transpose(w)
    sw_v = values["sw"].reshape(-1)
    if sw_v.size != 1 and (w_axis != 0 or sw_v.size != channels):
        return None  # per-channel along some other axis than the output channels
    if conv is not None and (conv.attrs["data_layout"] != "NCHW"
                             or conv.attrs["kernel_layout"] != "OIHW"):
        return None
    factor32 = (np.float32(values["sx"].reshape(())) * sw_v.astype(np.float32)).astype(np.float32)
    bias = None
    if "bq" in b:
        vb, sb_v, zb_v = ctx.tensor_type(b["bq"]), _value(b["sb"], ctx), _value(b["zb"], ctx)
        if vb is None or vb.dtype != "int32" or sb_v is None or zb_v is None or np.any(zb_v):
            return None
        if not np.allclose(np.broadcast_to(sb_v.reshape(-1), factor32.shape), factor32,
                           rtol=1e-6, atol=0):
            return None  # a bias in another scale than sx * sw: not one integer sum
        bias = b["bq"]
    elif "bf" in b:  # back to the int32 it was dequantized from, when it is exactly that
        bf = np.asarray(b["bf"].data)
        if bf.dtype != np.float32 or bf.ndim != 1:
            return None
        scale = np.broadcast_to(factor32, bf.shape)
        ints = np.rint(bf.astype(np.float64) / scale)
        if np.any(np.abs(ints) >= 2**31) or np.any((ints.astype(np.float32) * scale)
                                                   .astype(np.float32) != bf):
            return None
        bias = Constant(ints.astype(np.int32))
    factor = (factor32 / np.float32(values["sy"].reshape(()))).astype(np.float32)
    one_scale = Constant(values["sx"].reshape(()).astype(np.float32))
    w_scale = Constant(sw_v if sw_v.size > 1 else sw_v.reshape(()))
    zx_c = Constant(values["zx"].reshape(()).astype(np.int32))
    zw_c = Constant(values["zw"].reshape(-1).astype(np.int32) if values["zw"].size > 1
                    else values["zw"].reshape(()).astype(np.int32))
    acc: Expr
    if conv is not None:
        attrs = {a.name: conv.attrs[a.name] for a in get("nn.conv2d").attrs}
        attrs["out_dtype"] = "int32"
        acc = op.qnn.conv2d(b["xq"], w, zx_c, zw_c, one_scale, w_scale, **attrs)
        if bias is not None:
            acc = op.nn.bias_add(acc, bias, axis=1)
        f = Constant(factor.reshape(-1, 1, 1) if factor.size > 1 else factor.reshape(()))
    else:
        acc = op.qnn.dense(b["xq"], w, zx_c, zw_c, one_scale, w_scale)
        if bias is not None:
            acc = op.add(acc, bias)
        f = Constant(factor if factor.size > 1 else factor.reshape(()))
    qattrs = QuantizeAttrs.view(q.attrs)
    v: Expr = op.multiply(op.cast(acc, dtype="float32"), f)
    v = op.nearbyint(v) if qattrs.rounding == "HALF_TO_EVEN" else op.round(v)
    z = int(values["zy"].reshape(()))
    v = op.add(v, Constant(np.asarray(z, np.float32)))
    lo, hi = qrange(qattrs.out_dtype)
    if b.get("relu") is not None:
        lo = max(lo, z)  # relu(v) quantizes to max(q, zy)
    return op.cast(op.clip(v, a_min=float(lo), a_max=float(hi)), dtype=qattrs.out_dtype)


def _rule(inner: Pat, bias_op: tuple[str, bool] | None, relu: bool) -> Rule:
    body = inner
    if bias_op is not None:
        body = Pat.op(bias_op[0], body, b_dq if bias_op[1] else b_float)
    if relu:
        body = Pat.op("nn.relu", body, name="relu")
    pattern = Pat.op("qnn.quantize", body, sy, zy)

    def rewrite(root: Expr, ctx: RewriteContext, **bindings: Any) -> Expr | None:
        return _fuse(root, ctx, bindings)

    return Rule(pattern, rewrite)


def _pool(root: Expr, ctx: RewriteContext, **b: Any) -> Expr | None:
    """A max pooling of the 8-bit tensor itself when the quantize undoes the dequantize
    (the same scale and zero point: max commutes with the increasing dequantize, and
    ``round((q - z)·s / s) = q - z`` exactly in float32 for 8-bit q)."""
    q = root
    assert isinstance(q, Call)  # the pattern's root is the quantize
    vals = [_value(b[k], ctx) for k in ("sx", "zx", "sy", "zy")]
    vx = ctx.tensor_type(b["xq"])
    if any(v is None or v.size != 1 for v in vals) or vx is None:
        return None
    vsx, vzx, vsy, vzy = (np.asarray(v).reshape(()) for v in vals if v is not None)
    if vx.dtype != QuantizeAttrs.view(q.attrs).out_dtype or vx.dtype not in EIGHT_BIT \
            or np.float32(vsx) != np.float32(vsy) or not np.float32(vsx) > 0 \
            or int(vzx) != int(vzy):
        return None
    pool = b["pool"]
    return op.nn.max_pool2d(b["xq"], **{a.name: pool.attrs[a.name]
                                        for a in get("nn.max_pool2d").attrs})


POOL = Pat.op("qnn.quantize", Pat.op("nn.max_pool2d", x_dq, name="pool"), sy, zy)

RULES = RewriteTable([
    _rule(inner, bias, relu)
    for inner, add in ((CONV, "nn.bias_add"), (DENSE_T, "add"), (DENSE, "add"))
    for bias in ((add, True), (add, False), None)
    for relu in (True, False)
] + [Rule(POOL, _pool)])


@module_pass("qdq-to-qnn", opt_level=1)
def QdqToQnn(mod: IRModule, ctx: PassContext) -> IRModule:
    """Rewrite quantize(conv2d/dense(dequantize, dequantize)) groups into integer arithmetic."""
    return RULES.apply_to_module(mod, ctx)
