"""kiln's conv2d kernels layer by layer against ONNX Runtime: ResNet-18's and MobileNetV2's
convolution shapes, each alone (conv + relu, batch 1, the weight a constant), same weights.

For each layer: kiln and ORT timed in interleaved rounds (a pause and an untimed call
before each runtime's calls, so that neither starts while the other's threads still spin),
medians; GFLOP/s from the convolution's multiply-adds (2 FLOPs each, padding taps
included as the definition counts them), the plan kiln chose (`conv_plan`: pixels as the
GEMM's columns or rows; or the channel-blocked kernel convert-layout gave it), and
kiln/ORT. Also with one thread each (``--threads 1``), where the kernel's own efficiency
shows without the pool. A layer alone takes and gives NCHW, so in channel blocks two
layout_transform kernels are timed with it (ORT's NCHWc reorders likewise); ``--nchw``
turns convert-layout off.

    .venv/bin/python benchmarks/conv_layers.py [--threads 2] [--rounds 8] [--only c64,stem]
        [--nchw]
"""

from __future__ import annotations

import argparse
import math
import statistics
from collections.abc import Callable
from typing import Any

import numpy as np
from peers import INNER, time_rounds  # benchmarks/peers.py: the same interleaved rounds

import kiln
from kiln.codegen import set_num_threads
from kiln.ir import Function, IRModule, var
from kiln.loops.conv_kernels import conv_plan
from kiln.op import nn
from kiln.transform import PassContext

# name: (input channels, output channels, input size, kernel, stride, padding, groups)
LAYERS = {
    "stem": (3, 64, 224, 7, 2, 3, 1),       # ResNet-18's first layer
    "c64": (64, 64, 56, 3, 1, 1, 1),        # its four stages, 3×3 stride 1
    "c128": (128, 128, 28, 3, 1, 1, 1),
    "c256": (256, 256, 14, 3, 1, 1, 1),
    "c512": (512, 512, 7, 3, 1, 1, 1),
    "s128": (64, 128, 56, 3, 2, 1, 1),      # a stage's first, stride 2
    "s512": (256, 512, 14, 3, 2, 1, 1),
    "p128": (64, 128, 56, 1, 2, 0, 1),      # its projection shortcut
    "m_stem": (3, 32, 224, 3, 2, 1, 1),     # MobileNetV2: its first layer,
    "x1x1": (24, 144, 56, 1, 1, 0, 1),      # expansion, projection, depthwise
    "y1x1": (144, 24, 56, 1, 1, 0, 1),
    "dw3": (144, 144, 56, 3, 1, 1, 144),
    "dw32": (32, 32, 112, 3, 1, 1, 32),     # its other depthwise shapes: the largest map,
    "dw96s2": (96, 96, 112, 3, 2, 1, 96),   # stride 2, and the smallest map
    "dw960": (960, 960, 7, 3, 1, 1, 960),
    "v256": (256, 256, 56, 3, 1, 1, 1),     # VGG-16's wide 3×3 layers: Winograd's
    "v512": (512, 512, 28, 3, 1, 1, 1),     # transformed weights of 9 to 38 MB
    "v512_14": (512, 512, 14, 3, 1, 1, 1),
    "c96_20": (96, 96, 20, 3, 1, 1, 1),     # maps of 20 and 10 pixels (SSD's heads have
    "c384_10": (384, 384, 10, 3, 1, 1, 1),  # 19×19 and 10×10): 25 tiles of Winograd's
    "c512_10": (512, 512, 10, 3, 1, 1, 1),
}


def build(name: str, threads: int, nchw: bool = False
          ) -> tuple[Callable[[], Any], Callable[[], Any], float, str, float]:
    """(kiln call, ORT call, GFLOP per call, kiln's plan, max relative error vs ORT)."""
    import onnxruntime as ort
    from onnx import TensorProto, helper

    cin, cout, size, k, s, p, g = LAYERS[name]
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((cout, cin // g, k, k)) * math.sqrt(2 / (cin // g * k * k)))
    w = w.astype("float32")
    x = rng.standard_normal((1, cin, size, size)).astype("float32")
    xv, wv = var("data", shape=x.shape), var("weight", shape=w.shape)
    body = nn.relu(nn.conv2d(xv, wv, strides=(s, s), padding=(p, p), channels=cout,
                             kernel_size=(k, k), groups=g))
    with PassContext(config={"convert-layout": not nchw}):
        exe = kiln.build(IRModule.from_expr(Function((xv, wv), body)), params={"weight": w})
    out = (size + 2 * p - k) // s + 1
    plan = "depthwise" if g > 1 else conv_plan(
        x.shape, w.shape, (s, s), (p, p), (1, 1), g, (1, cout, out, out)).pixels
    blocked = [d.get("algorithm") or d.get("kernel") for f in exe.kernels.functions.values()
               for _, d in f.kernel.attrs.get("schedules", ())
               if "NCHW" in str(d.get("algorithm", "")) or "nchwc" in str(d.get("kernel", ""))]
    plan = blocked[0] if blocked else plan

    graph = helper.make_graph(
        [helper.make_node("Conv", ["data", "weight"], ["c"], kernel_shape=[k, k],
                          strides=[s, s], pads=[p] * 4, group=g),
         helper.make_node("Relu", ["c"], ["out"])],
        "conv", [helper.make_tensor_value_info("data", TensorProto.FLOAT, x.shape)],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)],
        [helper.make_tensor("weight", TensorProto.FLOAT, w.shape, w.ravel())])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    want = session.run(None, {"data": x})[0]
    error = float(np.abs(exe(x) - want).max() / (np.abs(want).max() + 1e-30))
    gflop = 2 * cout * out * out * (cin // g) * k * k / 1e9
    return (lambda: exe(x)), (lambda: session.run(None, {"data": x})), gflop, plan, error


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--only", default="", help="comma-separated: " + ",".join(LAYERS))
    parser.add_argument("--nchw", action="store_true",
                        help="convert-layout off: the NCHW kernels, no transforms")
    args = parser.parse_args()
    set_num_threads(args.threads)
    names = [n for n in args.only.split(",") if n] or list(LAYERS)
    target = kiln.Target.host()
    print(f"{target.describe()}; {args.threads} thread(s); medians of {args.rounds}×"
          f"{INNER} calls, interleaved\n")
    print("| layer | C→O, size, k/s | plan | kiln ms | GFLOP/s | ORT ms | GFLOP/s | kiln/ORT |")
    print("|---|---|---|---:|---:|---:|---:|---:|")
    ratios = []
    for name in names:
        kiln_call, ort_call, gflop, plan, error = build(name, args.threads, args.nchw)
        if error > 1e-4:
            raise SystemExit(f"{name}: kiln and ORT differ by {error:.1e} (relative)")
        t = time_rounds({"kiln": kiln_call, "ort": ort_call}, args.rounds * INNER).median
        cin, cout, size, k, s, _, _ = LAYERS[name]
        ratios.append(t["kiln"] / t["ort"])
        print(f"| {name} | {cin}→{cout}, {size}², {k}×{k}/{s} | {plan} | "
              f"{t['kiln'] * 1e3:.3f} | {gflop / t['kiln']:.0f} | {t['ort'] * 1e3:.3f} | "
              f"{gflop / t['ort']:.0f} | {ratios[-1]:.2f} |", flush=True)
    print(f"\ngeomean kiln/ORT: {math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f}")


if __name__ == "__main__":
    main()
