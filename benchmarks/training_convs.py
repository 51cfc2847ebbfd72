"""A training step's convolutions layer by layer against PyTorch: ResNet-18's shapes at batch 8,
the weight an input (not a constant), forward and weight gradient.

For each layer, kiln's ``nn.conv2d`` (forward; the data adjoint is the same kernel on the
flipped weight) and ``nn.conv2d_backward_weight`` against torch's ``conv2d`` and its
``convolution_backward`` weight gradient (oneDNN on x86), checked to agree, then timed in
interleaved rounds (benchmarks/peers.py's: a pause and an untimed call before each runtime's
calls, the order turning each round), medians. GFLOP/s from the multiply-adds (2 FLOPs each).
kiln's plan is printed: pixels as the GEMM's rows or columns, and how the images are run
(``parallel``: one image's product per thread; ``rows``: all the images' pixels the rows of
one product; ``serial``: one product after another, each split between the threads).

    .venv/bin/python benchmarks/training_convs.py [--threads 2] [--rounds 6] [--only c64,c512]
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
from kiln.op import nn

BATCH = 8
# name: (input channels, output channels, input size, kernel, stride, padding)
LAYERS = {
    "stem": (3, 64, 224, 7, 2, 3),
    "c64": (64, 64, 56, 3, 1, 1),
    "c128": (128, 128, 28, 3, 1, 1),
    "c256": (256, 256, 14, 3, 1, 1),
    "c512": (512, 512, 7, 3, 1, 1),
    "s128": (64, 128, 56, 3, 2, 1),
    "s512": (256, 512, 14, 3, 2, 1),
    "p128": (64, 128, 56, 1, 2, 0),
}


def _schedule(exe: kiln.Executable) -> dict:
    (kernel,) = [d.kernel for d in exe.program.kernels.values() if d.kernel is not None]
    return kernel.attrs["schedules"][0][1]


def build(name: str) -> list[tuple[str, Callable[[], Any], Callable[[], Any], float, str]]:
    """(what, kiln call, torch call, GFLOP per call, kiln's plan) for the forward convolution
    and the weight gradient of layer ``name``, after checking that kiln and torch agree."""
    import torch

    cin, cout, size, k, s, p = LAYERS[name]
    out = (size + 2 * p - k) // s + 1
    rng = np.random.default_rng(0)
    x = rng.standard_normal((BATCH, cin, size, size)).astype("float32")
    w = (rng.standard_normal((cout, cin, k, k)) * math.sqrt(2 / (cin * k * k))).astype("float32")
    g = rng.standard_normal((BATCH, cout, out, out)).astype("float32")
    tx, tw, tg = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(g)

    xv, wv, gv = var("x", shape=x.shape), var("w", shape=w.shape), var("g", shape=g.shape)
    forward = kiln.build(IRModule.from_expr(Function((xv, wv), nn.conv2d(
        xv, wv, strides=(s, s), padding=(p, p), channels=cout, kernel_size=(k, k)))))
    weight = kiln.build(IRModule.from_expr(Function((gv, xv), nn.conv2d_backward_weight(
        gv, xv, strides=(s, s), padding=(p, p), kernel_size=(k, k), channels=cout))))

    def torch_forward() -> Any:
        return torch.nn.functional.conv2d(tx, tw, stride=s, padding=p)

    def torch_weight() -> Any:
        return torch.ops.aten.convolution_backward(
            tg, tx, tw, None, [s, s], [p, p], [1, 1], False, [0, 0], 1,
            [False, True, False])[1]

    for got, want, what in ((forward(x, w), torch_forward(), "forward"),
                            (weight(g, x), torch_weight(), "weight gradient")):
        want = want.numpy()
        error = float(np.abs(got - want).max() / (np.abs(want).max() + 1e-30))
        if error > 1e-4:
            raise SystemExit(f"{name} {what}: kiln and torch differ by {error:.1e} (relative)")
    gflop = 2 * BATCH * cout * out * out * cin * k * k / 1e9
    fs = _schedule(forward)
    plan = f"{fs.get('pixels')}, images {fs.get('images')}"
    return [("forward", lambda: forward(x, w), torch_forward, gflop, plan),
            ("weight gradient", lambda: weight(g, x), torch_weight, gflop,
             _schedule(weight).get("input") or "phase planes")]


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--only", default="", help="comma-separated: " + ",".join(LAYERS))
    args = parser.parse_args()
    set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    names = [n for n in args.only.split(",") if n] or list(LAYERS)
    print(f"{kiln.Target.host().describe()}; {args.threads} thread(s) each; torch "
          f"{torch.__version__}; batch {BATCH}; medians of {args.rounds}×{INNER} calls, "
          f"interleaved\n")
    print("| layer | C→O, size, k/s | pass | kiln plan | kiln ms | GFLOP/s | torch ms | "
          "GFLOP/s | kiln/torch |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    ratios = []
    for name in names:
        cin, cout, size, k, s, _ = LAYERS[name]
        for what, kiln_call, torch_call, gflop, plan in build(name):
            t = time_rounds({"kiln": kiln_call, "torch": torch_call}, args.rounds * INNER).median
            ratios.append(t["kiln"] / t["torch"])
            print(f"| {name} | {cin}→{cout}, {size}², {k}×{k}/{s} | {what} | {plan} | "
                  f"{t['kiln'] * 1e3:.2f} | {gflop / t['kiln']:.0f} | {t['torch'] * 1e3:.2f} | "
                  f"{gflop / t['torch']:.0f} | {ratios[-1]:.2f} |", flush=True)
    print(f"\ngeomean kiln/torch: {math.exp(statistics.fmean(math.log(r) for r in ratios)):.2f}")


if __name__ == "__main__":
    main()
