"""ResNet-18's int8 convolutions, layer by layer: AMX tiles, VNNI, float32 and ONNX Runtime.

Each layer is ``qnn``-style: uint8 data, a constant int8 weight, int32 sums requantized to
uint8 in the fused epilogue (bias, scale, round, clamp), as kiln.quantize's ResNet-18 has
them. Built for this machine (`kiln.Target.host()`: AMX tiles where it has them), for this
machine without AMX (the VNNI kernel, kiln/loops/int8_conv.py) and, for scale, as a float32
convolution, and ONNX Runtime's ``QLinearConv`` of the same uint8 data and int8 weight
(per output channel scales, int32 bias, uint8 result: the convolutions of a QDQ model after
ORT's fusions), with as many threads as kiln; timed in turn, round by round, medians of
``--repeat`` rounds (each runtime's ``--calls`` calls after a pause and an untimed call).
GOP/s count 2·OC·C·kh·kw·OH·OW per call.

    .venv/bin/python benchmarks/int8_convs.py [--threads 1] [--repeat 15] [--calls 10]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import kiln
from kiln import op
from kiln.loops import int8_amx
from kiln.op import nn
from kiln.target import Target

# Before each runtime's calls of a round: a pause and an untimed call. ORT's workers spin
# after a run, and the calls right after it (kiln's, in turn) ran on a crowded core: 1.4-1.8×
# ORT's time without the pause where ORT's own alternated measure gave 1.1-1.2×.
PAUSE_S = 0.05

# (input channels, size, output channels, kernel, stride): the stem, each stage's 3×3
# convolutions, a strided 3×3 and a 1×1 downsampling
LAYERS = [(3, 224, 64, 7, 2), (64, 56, 64, 3, 1), (128, 28, 128, 3, 1), (256, 14, 256, 3, 1),
          (512, 7, 512, 3, 1), (256, 14, 512, 3, 2), (64, 56, 128, 1, 2)]


def layer(c: int, size: int, oc: int, k: int, stride: int, dtype: str
          ) -> tuple[kiln.IRModule, dict[str, np.ndarray]]:
    """One convolution of a constant weight with the model's epilogue."""
    rng = np.random.default_rng(c * oc + k)
    x = kiln.var("x", shape=(1, c, size, size), dtype="uint8" if dtype == "int8" else dtype)
    w = kiln.var("w", shape=(oc, c, k, k), dtype=dtype)
    conv = nn.conv2d(x, w, strides=(stride, stride), padding=(k // 2, k // 2), channels=oc,
                     kernel_size=(k, k), out_dtype="int32" if dtype == "int8" else "")
    if dtype == "int8":
        bias = kiln.const(rng.integers(-500, 500, (oc, 1, 1)).astype("int32"))
        scale = kiln.const((rng.random((oc, 1, 1)) * 1e-3).astype("float32"))
        scaled = op.multiply(op.cast(op.add(conv, bias), dtype="float32"), scale)
        body = op.cast(op.clip(op.nearbyint(scaled), a_min=0.0, a_max=255.0), dtype="uint8")
        weight = rng.integers(-128, 128, (oc, c, k, k)).astype("int8")
    else:
        body = nn.relu(conv)
        weight = rng.standard_normal((oc, c, k, k)).astype("float32")
    return kiln.IRModule.from_expr(kiln.Function([x, w], body)), {"w": weight}


def ort_layer(c: int, size: int, oc: int, k: int, stride: int, weight: np.ndarray,
              threads: int) -> Callable[[np.ndarray], object]:
    """ONNX Runtime's QLinearConv of ``weight`` (uint8 data, zero point 128; the scales are
    arbitrary: the work does not depend on them), as a function of the data."""
    import onnxruntime as ort
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    out = (size + 2 * (k // 2) - k) // stride + 1
    consts = {"xs": np.array(0.02, "float32"), "xz": np.array(128, "uint8"), "w": weight,
              "ws": (rng.random(oc) * 0.01 + 0.001).astype("float32"),
              "wz": np.zeros(oc, "int8"), "ys": np.array(0.05, "float32"),
              "yz": np.array(0, "uint8"), "b": rng.integers(-500, 500, oc).astype("int32")}
    node = helper.make_node("QLinearConv", ["x", *consts], ["y"], kernel_shape=[k, k],
                            strides=[stride, stride], pads=[k // 2] * 4)
    graph = helper.make_graph(
        [node], "layer", [helper.make_tensor_value_info("x", TensorProto.UINT8,
                                                        [1, c, size, size])],
        [helper.make_tensor_value_info("y", TensorProto.UINT8, [1, oc, out, out])],
        [numpy_helper.from_array(v, n) for n, v in consts.items()])
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    sess = ort.InferenceSession(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]).SerializeToString(),
        options, providers=["CPUExecutionProvider"])
    return lambda a: sess.run(None, {"x": a})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=None, help="kiln's threads (default: all)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--calls", type=int, default=10)
    args = ap.parse_args()
    host = Target.host()
    print(f"CPU: {host.describe()}; AMX tiles: {'yes' if int8_amx.usable(host) else 'no'}")
    targets = {"host": "llvm"}
    if int8_amx.usable(host):
        targets["no AMX"] = "llvm -mattr=-amx-tile,-amx-int8,-amx-bf16"
    threads = args.threads or host.cores
    print("| layer | " + " | ".join(f"int8 {n} us (GOP/s)" for n in targets)
          + " | ORT us (GOP/s) | float32 us | "
          + " | ".join(f"{n}/float32 | {n}/ORT" for n in targets) + " |")
    print("|---" * (3 + 3 * len(targets)) + "|")
    for c, size, oc, k, stride in LAYERS:
        runs: dict[str, Callable[[], object]] = {}
        mod, params = layer(c, size, oc, k, stride, "int8")
        x = np.random.default_rng(1).integers(0, 256, (1, c, size, size)).astype("uint8")
        for name, spec in targets.items():
            exe = kiln.build(mod, params=params, target=spec, threads=args.threads)
            runs[name] = (lambda e, a: lambda: e(a))(exe, x)
        fmod, fparams = layer(c, size, oc, k, stride, "float32")
        fexe = kiln.build(fmod, params=fparams, threads=args.threads)
        xf = x.astype("float32")
        runs["float32"] = (lambda e, a: lambda: e(a))(fexe, xf)
        runs["ORT"] = (lambda g, a: lambda: g(a))(
            ort_layer(c, size, oc, k, stride, params["w"], threads), x)
        for f in runs.values():
            f()
        times: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.repeat):
            for name, f in runs.items():
                time.sleep(PAUSE_S)  # the runtime before (ORT's spinning workers) goes idle
                f()
                start = time.perf_counter()
                for _ in range(args.calls):
                    f()
                times[name].append((time.perf_counter() - start) / args.calls)
        med = {name: statistics.median(ts) for name, ts in times.items()}
        out = (size + 2 * (k // 2) - k) // stride + 1
        ops = 2 * oc * c * k * k * out * out
        cells = [f"{med[n] * 1e6:.0f} ({ops / med[n] / 1e9:.0f})" for n in (*targets, "ORT")]
        ratios = [f"{med[n] / med['float32']:.2f} | {med[n] / med['ORT']:.2f}" for n in targets]
        print(f"| {c}→{oc} {size}² {k}×{k} s{stride} | " + " | ".join(cells)
              + f" | {med['float32'] * 1e6:.0f} | " + " | ".join(ratios) + " |", flush=True)


if __name__ == "__main__":
    main()
