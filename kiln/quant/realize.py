"""realize: rewrite the annotated layers into qnn operators (Relay's third step).

Each layer ``relu?(bias?(conv2d | dense(x, W)))`` becomes

    acc = qnn.conv2d | qnn.dense(xq, Wq, 0, 0, sx, sw)  (+ int32 bias round(b / (sx * sw)))

with ``Wq = round(W / sw)`` int8, ``sw`` per output channel ``max|W[o]| / 127`` (symmetric);
``xq`` is the previous layer's 8-bit output where the input is one (max pooling, reshape and
batch_flatten between two layers pass it through), else ``qnn.quantize(x, sx, 0)``.
Consumers that are quantized layers get ``qnn.requantize(acc, sx * sw, 0, sy, 0)`` in the
output's dtype: int8 stays int8 between layers, and a relu is the requantize's clamp at 0
(its output is uint8 whenever the calibrated tensor was never negative, as after a relu).
Float consumers get ``relu?(qnn.dequantize(acc, sx * sw, 0))`` — the int32 sums rescaled,
without an 8-bit rounding they do not need.
"""

from __future__ import annotations

import numpy as np

from kiln import op
from kiln.ir.expr import Call, Constant, Expr, Function, Op
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.quant.annotate import Annotation, Layer
from kiln.quant.calibrate import Range
from kiln.transform.pass_manager import PassContext, get_pass

# Operators an 8-bit tensor (one scale for the whole tensor) passes through unchanged in
# scale: max pooling commutes with the rounding, the others only move elements.
PASS_THROUGH = ("nn.max_pool2d", "reshape", "nn.batch_flatten")


def _f32(v: float | np.ndarray) -> Constant:
    return Constant(np.asarray(v, dtype=np.float32))


def _i32(v: int) -> Constant:
    return Constant(np.asarray(v, dtype=np.int32))


def weight_scale(w: np.ndarray) -> np.ndarray:
    """Symmetric per-output-channel int8 scales (``max|W[o]| / 127``; 1 for a zero channel)."""
    amax = np.abs(w.reshape(w.shape[0], -1)).max(axis=1).astype(np.float32)
    return np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)


def quantize_weight(w: np.ndarray, sw: np.ndarray) -> np.ndarray:
    """``round(W / sw)`` (halves to even), int8 in [-127, 127]."""
    per = sw.reshape((-1,) + (1,) * (w.ndim - 1))
    return np.clip(np.rint(w / per), -127, 127).astype(np.int8)


Quantized = tuple[Expr, float, str]  # an 8-bit tensor, its scale, its dtype


def _layer(lay: Layer, xq: Quantized, float_x: Expr | None, ann_range: Range,
           rebuild: dict[int, Expr]) -> tuple[Expr, Expr]:
    """The layer's int32 sums (bias added) and their per-channel scale sx * sw."""
    q, sx, _ = xq
    sw = weight_scale(lay.weight)
    wq = Constant(quantize_weight(lay.weight, sw))
    acc: Expr
    c = lay.call
    if lay.op == "nn.conv2d":
        attrs = {k: c.attrs[k] for k in ("strides", "padding", "dilation", "groups", "channels",
                                         "kernel_size", "data_layout", "kernel_layout")}
        acc = op.qnn.conv2d(q, wq, _i32(0), _i32(0), _f32(sx), _f32(sw), out_dtype="int32",
                            **attrs)
    else:
        acc = op.qnn.dense(q, wq, _i32(0), _i32(0), _f32(sx), _f32(sw))
    acc_scale = (np.float32(sx) * sw).astype(np.float32)
    if lay.bias_value is not None:
        b = np.rint(lay.bias_value.astype(np.float64) / acc_scale.astype(np.float64))
        acc = op.nn.bias_add(acc, Constant(np.clip(b, -2**31, 2**31 - 1).astype(np.int32)),
                             axis=1)
    return acc, _f32(acc_scale)


def realize(ann: Annotation, ranges: tuple[Range, ...]) -> IRModule:
    """The annotated module with its layers as qnn operators, in the calibrated ranges."""
    by_end = {id(lay.end): lay for lay in ann.layers}
    inner = {id(e) for lay in ann.layers for e in lay.inner}
    rng = {id(e): ranges[i] for i, e in enumerate(ann.observed)}
    main = ann.module["main"]
    new: dict[int, Expr] = {}
    qval: dict[int, Quantized] = {}
    for node in post_order(main.body):
        if id(node) in inner:
            continue  # rebuilt by the layer that ends after it
        found = by_end.get(id(node))
        if found is None:
            new[id(node)] = with_children(node, [new[id(k)] for k in children(node)])
            if isinstance(node, Call) and isinstance(node.op, Op) and \
                    node.op.name in PASS_THROUGH and id(node.args[0]) in qval:
                q, s, dt = qval[id(node.args[0])]
                qval[id(node)] = (Call(node.op, (q, *node.args[1:]), node.attrs), s, dt)
            continue
        lay = found
        x = lay.data
        if id(x) in qval:
            xq = qval[id(x)]
        else:
            rx = rng[id(x)]
            xq = (op.qnn.quantize(new[id(x)], _f32(rx.scale), _i32(0), out_dtype=rx.dtype),
                  rx.scale, rx.dtype)
        acc, acc_scale = _layer(lay, xq, None, rng[id(node)], new)
        ry = rng[id(node)]
        yq: Expr = op.qnn.requantize(acc, acc_scale, _i32(0), _f32(ry.scale), _i32(0), axis=1,
                                     out_dtype=ry.dtype)
        if lay.relu is not None and ry.dtype != "uint8":
            yq = op.clip(yq, a_min=0.0, a_max=127.0)  # a relu of an int8 output
        qval[id(node)] = (yq, ry.scale, ry.dtype)
        y: Expr = op.qnn.dequantize(acc, acc_scale, _i32(0), axis=1)
        if lay.relu is not None:
            y = op.nn.relu(y)
        new[id(node)] = y
    fn = Function(main.params, new[id(main.body)], None, main.type_params, main.attrs)
    mod = ann.module.with_function("main", fn)
    ctx = PassContext(opt_level=3)
    for name in ("infer-type", "dead-code-elimination", "infer-type"):
        mod = ctx.run_pass(get_pass(name), mod)
    return mod
