"""Dynamic shapes: one executable for every (batch, sequence) — what a new shape costs.

A BERT-style encoder and a GPT-style decoder (kiln.testing's torch twins are static, so the
models here are small torch modules written for the purpose, with a padding mask and a
causal mask built from the sequence length) are exported to ONNX with dynamic batch and
sequence axes, imported once, built once, and called at several shapes. For each shape the
script prints the first call (which compiles the kernels of symbolic shape for it: the
specialization cost), the median of warm calls, and PyTorch eager's median on the same
inputs, side by side. ``KILN_MAX_SPECIALIZATIONS`` bounds how many shapes stay compiled.

Each model is built twice: with symbolic kernels (the default: elementwise, reduction, layer
norm, copy kernels compiled once for every size, their sizes passed at run time) and with
``KILN_SYMBOLIC_KERNELS=0`` (every kernel specialized per shape, as before). The table sets
the two side by side: the first call at each new shape (what compiling for it costs), the
warm calls (the two executables timed in turn, medians; the symbolic kernels' run-time cost
is the ratio), and the kernels compiled. The disk cache is off, so that no compilation is
hidden by an earlier one (the other mode's, or an earlier run's).

    python benchmarks/dynamic_shapes.py [--repeat 20] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = ((3, 16), (4, 32), (8, 64), (5, 24), (3, 16))  # the last again: warm from the start


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def _interleaved_ms(fns, repeat: int) -> list[float]:
    """Medians of the functions' times, each round running every one once, in turn."""
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeat):
        for k, fn in enumerate(fns):
            t = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t)
    return [float(np.median(t)) * 1e3 for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1, help="kiln's and torch's threads")
    args = parser.parse_args()
    os.environ["KILN_CACHE"] = ""  # the disk cache off: every compilation counts

    import torch

    import kiln
    from kiln.frontend.onnx import from_onnx
    from kiln.target import Target

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "frontend"))
    from test_onnx_dynamic import Encoder, export, ids_and_mask  # noqa: E402  (test models)

    torch.set_num_threads(args.threads)
    print(f"machine: {Target.host().describe()}; {args.threads} thread(s)")
    for name, causal in (("BERT-style", False), ("GPT-style", True)):
        torch.manual_seed(0)
        module = Encoder(causal, vocab=1000, d=128, heads=4, layers=4).eval()
        exes = {}
        with tempfile.TemporaryDirectory() as tmp:
            example = ids_and_mask(2, 8, vocab=1000)
            names = ["ids"] if causal else ["ids", "mask"]
            path = export(module, example[:1] if causal else example, names, Path(tmp))
            mod, params = from_onnx(path)
            for mode in ("specialized", "symbolic"):
                os.environ["KILN_SYMBOLIC_KERNELS"] = "0" if mode == "specialized" else "1"
                exes[mode] = kiln.build(mod, params=params, threads=args.threads)
        os.environ.pop("KILN_SYMBOLIC_KERNELS")
        spec, sym = exes["specialized"], exes["symbolic"]
        print(f"\n{name} encoder, d=128, 4 layers (executor: {sym.executor.name}); "
              "first call = compiling for the new shape")
        print(f"{'batch x seq':>12} {'first ms spec':>13} {'first ms sym':>12} "
              f"{'warm ms spec':>12} {'warm ms sym':>11} {'sym/spec':>8} {'torch ms':>9} "
              f"{'max |diff|':>10}")
        totals = {"specialized": 0.0, "symbolic": 0.0}
        for b, s in SHAPES:
            inputs = ids_and_mask(b, s, vocab=1000)[:1 if causal else 2]
            arrays = [x.numpy() for x in inputs]
            first = {}
            for mode, exe in exes.items():
                t = time.perf_counter()
                got = exe(*arrays)
                first[mode] = (time.perf_counter() - t) * 1e3
                totals[mode] += first[mode]
            with torch.inference_mode():
                want = module(*inputs).numpy()
                calls = [lambda: spec(*arrays), lambda: sym(*arrays),  # noqa: B023
                         lambda: module(*inputs)]  # noqa: B023
                w_spec, w_sym, eager = _interleaved_ms(calls, args.repeat)
            print(f"{b:>5} x {s:<5} {first['specialized']:>13.1f} {first['symbolic']:>12.1f} "
                  f"{w_spec:>12.2f} {w_sym:>11.2f} {w_sym / w_spec:>8.3f} {eager:>9.2f} "
                  f"{float(np.abs(got - want).max()):>10.2e}")
        for mode, exe in exes.items():
            st = exe.stats()
            print(f"  {mode:>11}: first calls {totals[mode] / 1e3:.2f} s in all; kernels "
                  f"compiled at run time: {st.symbolic_compiles} for every size, "
                  f"{st.shape_compiles} for one shape")


if __name__ == "__main__":
    main()
