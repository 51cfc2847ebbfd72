"""Dynamic shapes: one executable for every (batch, sequence) — what a new shape costs.

A BERT-style encoder and a GPT-style decoder (kiln.testing's torch twins are static, so the
models here are small torch modules written for the purpose, with a padding mask and a
causal mask built from the sequence length) are exported to ONNX with dynamic batch and
sequence axes, imported once, built once, and called at several shapes. For each shape the
script prints the first call (which compiles the kernels of symbolic shape for it: the
specialization cost), the median of warm calls, and PyTorch eager's median on the same
inputs, side by side. ``KILN_MAX_SPECIALIZATIONS`` bounds how many shapes stay compiled.

    python benchmarks/dynamic_shapes.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

SHAPES = ((1, 16), (4, 32), (8, 64), (1, 16))  # the last one again: warm from the start


def _median_ms(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()

    import torch

    import kiln
    from kiln.frontend.onnx import from_onnx
    from kiln.target import Target

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "frontend"))
    from test_onnx_dynamic import Encoder, export, ids_and_mask  # noqa: E402  (test models)

    torch.set_num_threads(2)
    print(f"machine: {Target.host().describe()}")
    for name, causal in (("BERT-style", False), ("GPT-style", True)):
        torch.manual_seed(0)
        module = Encoder(causal, vocab=1000, d=128, heads=4, layers=4).eval()
        with tempfile.TemporaryDirectory() as tmp:
            example = ids_and_mask(2, 8, vocab=1000)
            names = ["ids"] if causal else ["ids", "mask"]
            path = export(module, example[:1] if causal else example, names, Path(tmp))
            t = time.perf_counter()
            mod, params = from_onnx(path)
            exe = kiln.build(mod, params=params)
            build_s = time.perf_counter() - t
        print(f"\n{name} encoder, d=128, 4 layers: import + build {build_s:.2f} s "
              f"(executor: {exe.executor.name})")
        print(f"{'batch x seq':>12} {'first call ms':>14} {'warm ms':>9} {'torch ms':>9} "
              f"{'kiln/torch':>10} {'max |diff|':>10}")
        for b, s in SHAPES:
            inputs = ids_and_mask(b, s, vocab=1000)[:1 if causal else 2]
            arrays = [x.numpy() for x in inputs]
            t = time.perf_counter()
            got = exe(*arrays)
            first = (time.perf_counter() - t) * 1e3
            warm = _median_ms(lambda: exe(*arrays), args.repeat)  # noqa: B023
            with torch.inference_mode():
                want = module(*inputs).numpy()
                eager = _median_ms(lambda: module(*inputs), args.repeat)  # noqa: B023
            print(f"{b:>5} x {s:<5} {first:>14.1f} {warm:>9.2f} {eager:>9.2f} "
                  f"{warm / eager:>10.2f} {float(np.abs(got - want).max()):>10.2e}")


if __name__ == "__main__":
    main()
