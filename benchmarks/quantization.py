"""int8 ResNet-18 against float32: kiln.quantize's model vs kiln float32, and kiln vs ONNX
Runtime on the same QDQ file from quantize_static. One process, batch 1, interleaved.

- ``kiln float32``: ``kiln.build`` of ``kiln.testing.models.resnet18`` (random weights).
- ``kiln int8``: the same module through ``kiln.quantize`` (minmax on ``--calibration``
  random inputs; int8 weights per output channel, uint8/int8 activations), then ``kiln.build``.
- ``ORT QDQ`` / ``kiln QDQ``: the torch twin (kiln/testing/torch_models.py, the same
  weights) exported with ``torch.onnx.export(dynamo=False)``, quantized by
  ``onnxruntime.quantization.quantize_static`` (QDQ, uint8 activations, int8 per-channel
  weights, ``reduce_range=True`` so ORT's x86 u8s8 kernels sum exactly), run by ORT (all
  graph optimizations, ``intra_op_num_threads=--threads``) and by kiln (``from_onnx`` +
  ``kiln.build``: qdq-to-qnn, int8 kernels).

Timing: rounds of (a pause, an untimed call, ``INNER`` timed calls) of each runtime in turn;
the medians and the ratios are printed with the CPU (``kiln.Target.host().describe()``).
On a machine shared with other work every figure is noisy: compare within a run.

    .venv/bin/python benchmarks/quantization.py [--image 224] [--repeat 10] [--threads N]
    .venv/bin/python benchmarks/quantization.py --quick     # 64x64 images, few rounds
    .venv/bin/python benchmarks/quantization.py --quick --profile   # + where int8 time goes

``--profile`` prints ``exe.profile`` of the int8 model and of kiln's build of the QDQ file
and, for their costliest kernels, the input shapes and the schedule each was built with.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import kiln
from kiln.codegen import set_num_threads
from kiln.frontend import from_onnx
from kiln.testing import models, torch_models

INNER = 3


def rounds(runners: dict[str, Callable[[], Any]], repeat: int) -> dict[str, float]:
    """Median seconds of each runner, interleaved round by round."""
    times: dict[str, list[float]] = {n: [] for n in runners}
    for _ in range(repeat):
        for name, f in runners.items():
            time.sleep(0.05)
            f()
            for _ in range(INNER):
                t0 = time.perf_counter()
                f()
                times[name].append(time.perf_counter() - t0)
    return {n: statistics.median(ts) for n, ts in times.items()}


def ort_qdq(twin: Any, x: np.ndarray, calibration: list[np.ndarray], threads: int,
            folder: Path) -> tuple[Any, Path]:
    """The twin exported to ONNX, quantized by quantize_static (QDQ), and an ORT session."""
    import onnxruntime as ort
    import torch
    from onnxruntime import quantization as q

    fp32, qdq = folder / "resnet18.onnx", folder / "resnet18.qdq.onnx"
    torch.onnx.export(twin, (torch.from_numpy(x),), str(fp32), dynamo=False,
                      input_names=["data"], output_names=["prob"], opset_version=17)

    class Reader(q.CalibrationDataReader):
        def __init__(self) -> None:
            self.items = iter([{"data": c} for c in calibration])

        def get_next(self) -> dict | None:
            return next(self.items, None)

    q.quantize_static(str(fp32), str(qdq), Reader(), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                      per_channel=True, reduce_range=True)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.log_severity_level = 3
    sess = ort.InferenceSession(str(qdq), options, providers=["CPUExecutionProvider"])
    return sess, qdq


def print_profile(exe: Any, x: np.ndarray, top: int = 12) -> None:
    """The int8 model's profile, then its ``top`` costliest kernels' shapes and schedules."""
    prof = exe.profile(x)
    print(prof)
    for row in prof.rows[:top]:
        decl = exe.program.kernels.get(row.kernel)
        if decl is None:
            continue
        shapes = ", ".join(f"{t.dtype}{list(t.shape)}" for t in decl.inputs)
        kernel = decl.kernel
        sched = kernel.attrs.get("schedules") if kernel is not None else None
        print(f"{row.kernel}: {row.mean * 1e6:.0f} us  in: {shapes}  schedule: {sched}")
    sys.stdout.flush()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--image", type=int, default=224)
    ap.add_argument("--repeat", type=int, default=10, help="rounds (default 10)")
    ap.add_argument("--calibration", type=int, default=4, help="random calibration inputs")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--quick", action="store_true", help="64x64 images, 2 rounds: a smoke run")
    ap.add_argument("--profile", action="store_true",
                    help="print the int8 model's per-kernel profile, shapes and schedules")
    args = ap.parse_args()
    if args.quick:
        args.image, args.repeat, args.calibration = 64, 2, 2
    if args.threads:
        set_num_threads(args.threads)
    threads = args.threads or kiln.Target.host().cores
    print(f"CPU: {kiln.Target.host().describe()}")
    print(f"ResNet-18, batch 1, {args.image}x{args.image}, {threads} threads", flush=True)

    rng = np.random.default_rng(0)
    mod, params = models.resnet18(image=args.image)
    cal = [rng.standard_normal((1, 3, args.image, args.image)).astype("float32")
           for _ in range(args.calibration)]
    x = rng.standard_normal((1, 3, args.image, args.image)).astype("float32")

    t0 = time.perf_counter()
    f32 = kiln.build(mod, params=params)
    qmod, qparams = kiln.quantize(mod, params, calibration=cal)
    i8 = kiln.build(qmod, params=qparams)
    print(f"built kiln float32 and int8 in {time.perf_counter() - t0:.1f} s", flush=True)
    ref, got = np.asarray(f32(x)), np.asarray(i8(x))
    print(f"kiln int8 vs float32: max |diff| {np.abs(got - ref).max():.3g} (softmax), "
          f"argmax {'equal' if got.argmax() == ref.argmax() else 'differs'}")

    if args.profile:
        print("\nkiln int8 (kiln.quantize):")
        print_profile(i8, x)

    twin = torch_models.torch_resnet18(params)
    with tempfile.TemporaryDirectory() as folder:
        sess, qdq = ort_qdq(twin, x, cal, threads, Path(folder))
        qm, qp = from_onnx(str(qdq))
        kq = kiln.build(qm, params=qp)
    want = sess.run(None, {"data": x})[0]
    have = np.asarray(kq(x))
    print(f"kiln vs ORT on the QDQ file: max |diff| {np.abs(have - want).max():.3g}", flush=True)
    if args.profile:
        print("\nkiln on the QDQ file:")
        print_profile(kq, x)

    med = rounds({
        "kiln float32": lambda: f32(x),
        "kiln int8 (kiln.quantize)": lambda: i8(x),
        "ORT QDQ": lambda: sess.run(None, {"data": x}),
        "kiln QDQ": lambda: kq(x),
    }, args.repeat)
    print(f"\n{'runtime':28s} {'median ms':>10s}")
    for name, t in med.items():
        print(f"{name:28s} {t * 1e3:10.2f}")
    print(f"\nkiln int8 / kiln float32 speed-up: "
          f"{med['kiln float32'] / med['kiln int8 (kiln.quantize)']:.2f}x")
    print(f"kiln QDQ vs ORT QDQ speed-up:      {med['ORT QDQ'] / med['kiln QDQ']:.2f}x")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
