"""Native kernels: fp32 dense GFLOP/s against numpy's BLAS, ResNet-18's convolutions against
PyTorch.

1. ``nn.dense`` 1024×1024×1024 (and a few other sizes) built with ``kiln.build``, against
   ``numpy.matmul`` on the same arrays: with every core, and single-threaded. The
   single-threaded lines run in a subprocess with ``KILN_NUM_THREADS=1`` and
   ``OPENBLAS_NUM_THREADS=1`` / ``OMP_NUM_THREADS=1`` / ``MKL_NUM_THREADS=1`` set before
   numpy loads, so both sides really use one thread.
2. The conv2d layers of ResNet-18 at batch 1 (and MobileNetV2's depthwise and pointwise
   layers), each built alone with ``kiln.build`` (conv + bias + relu, fused; the weights
   bound with ``params=`` as in a model, so they are packed at compile time), against
   ``torch.nn.functional.conv2d`` + bias + relu in eager mode with the same thread count:
   with every core, and single-threaded in a subprocess as above.

Medians of ``--repeat`` runs, side by side in one run; ratios are kiln's time over the
other's (below 1: kiln is faster). ``--target`` schedules and compiles kiln's kernels for a
`kiln.Target` other than this machine (e.g. ``"llvm -mattr=-avx512f"``: AVX2 code here).

    .venv/bin/python benchmarks/native.py [--repeat 15] [--quick] [--target SPEC]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable

import numpy as np

ONE_THREAD = {"KILN_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}

DENSE_SIZES = [(1024, 1024, 1024), (64, 512, 784), (1, 512, 784), (512, 512, 512)]

# (name, in channels, size, out channels, kernel, stride, padding, groups)
CONVS = [
    ("resnet conv1 7x7 s2", 3, 224, 64, 7, 2, 3, 1),
    ("resnet layer1 3x3", 64, 56, 64, 3, 1, 1, 1),
    ("resnet layer2 3x3 s2", 64, 56, 128, 3, 2, 1, 1),
    ("resnet layer2 3x3", 128, 28, 128, 3, 1, 1, 1),
    ("resnet layer2 1x1 s2", 64, 56, 128, 1, 2, 0, 1),
    ("resnet layer3 3x3", 256, 14, 256, 3, 1, 1, 1),
    ("resnet layer4 3x3", 512, 7, 512, 3, 1, 1, 1),
    ("mobilenet dw 3x3", 32, 112, 32, 3, 1, 1, 32),
    ("mobilenet dw 3x3 s2", 96, 112, 96, 3, 2, 1, 96),
    ("mobilenet pw 1x1", 96, 56, 24, 1, 1, 0, 1),
]


def median_time(f: Callable[[], object], repeat: int) -> float:
    f()
    f()  # warm up (page faults, thread pool start)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def dense_program(m: int, n: int, k: int):  # noqa: ANN201
    import kiln

    x = kiln.var("x", shape=(m, k), dtype="float32")
    w = kiln.var("w", shape=(n, k), dtype="float32")
    return kiln.IRModule.from_expr(kiln.Function([x, w], kiln.op.nn.dense(x, w)))


def build(mod, target: str, **kwargs):  # noqa: ANN001, ANN201
    """``kiln.build`` with kernels scheduled and compiled for ``target``."""
    import kiln
    from kiln.loops.schedule import target_scope

    with target_scope(target):
        return kiln.build(mod, target=target, **kwargs)


def bench_dense(repeat: int, sizes: list[tuple[int, int, int]], target: str = "llvm"
                ) -> list[dict]:
    """GFLOP/s of kiln's dense and numpy's matmul for each size (this process's threads)."""
    rng = np.random.default_rng(0)
    return [dense_row(m, n, k, repeat, rng, target) for m, n, k in sizes]


def dense_row(m: int, n: int, k: int, repeat: int, rng: np.random.Generator,
              target: str = "llvm") -> dict:
    exe = build(dense_program(m, n, k), target)
    x = rng.standard_normal((m, k)).astype(np.float32)
    w = rng.standard_normal((n, k)).astype(np.float32)
    np.testing.assert_allclose(exe(x, w), x @ w.T, rtol=1e-3, atol=1e-3)
    t_kiln = median_time(lambda: exe(x, w), repeat)
    t_np = median_time(lambda: np.matmul(x, w.T), repeat)
    flops = 2.0 * m * n * k
    return {"size": [m, n, k], "kiln": flops / t_kiln / 1e9, "numpy": flops / t_np / 1e9}


def conv_program(c: int, size: int, o: int, kernel: int, stride: int, pad: int, groups: int):  # noqa: ANN201
    import kiln
    from kiln.op import nn

    x = kiln.var("x", shape=(1, c, size, size), dtype="float32")
    w = kiln.var("w", shape=(o, c // groups, kernel, kernel), dtype="float32")
    b = kiln.var("b", shape=(o,), dtype="float32")
    body = nn.relu(nn.bias_add(nn.conv2d(x, w, strides=(stride, stride), padding=(pad, pad),
                                         groups=groups), b))
    return kiln.IRModule.from_expr(kiln.Function([x, w, b], body))


def bench_convs(repeat: int, target: str = "llvm") -> list[dict]:
    import torch

    from kiln.codegen import num_threads

    torch.set_num_threads(num_threads())
    rng = np.random.default_rng(1)
    return [conv_row(*layer, repeat=repeat, rng=rng, target=target) for layer in CONVS]


def conv_row(name: str, c: int, size: int, o: int, kernel: int, stride: int, pad: int,
             groups: int, *, repeat: int, rng: np.random.Generator, target: str = "llvm"
             ) -> dict:
    import torch

    x = rng.standard_normal((1, c, size, size)).astype(np.float32)
    w = (rng.standard_normal((o, c // groups, kernel, kernel)) * 0.1).astype(np.float32)
    b = rng.standard_normal(o).astype(np.float32)
    # weights bound as constants, as in a model (alter-layout packs them at compile time)
    exe = build(conv_program(c, size, o, kernel, stride, pad, groups), target,
                params={"w": w, "b": b})
    tx, tw, tb = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)

    def torch_conv() -> object:
        with torch.no_grad():
            return torch.relu(torch.nn.functional.conv2d(tx, tw, tb, stride, pad, 1, groups))

    np.testing.assert_allclose(exe(x), torch_conv().numpy(), rtol=1e-3, atol=1e-3)
    t_kiln = median_time(lambda: exe(x), repeat)
    t_torch = median_time(torch_conv, repeat)
    oh = (size + 2 * pad - kernel) // stride + 1
    flops = 2.0 * o * oh * oh * (c // groups) * kernel * kernel
    return {"name": name, "kiln_ms": t_kiln * 1e3, "torch_ms": t_torch * 1e3,
            "gflops": flops / t_kiln / 1e9}


def one_thread(call: str) -> list[dict]:
    """``native.<call>`` in a fresh process with one thread on every side."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import json, sys; sys.path.insert(0, {here!r}); import native; "
            f"print(json.dumps(native.{call}))")
    env = {**os.environ, **ONE_THREAD}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="dense 1024³ only, no convs")
    parser.add_argument("--target", default="llvm", help="kiln target spec (default: llvm)")
    args = parser.parse_args()
    from kiln.codegen import num_threads
    from kiln.target import Target

    print(f"kiln target: {Target.parse(args.target).describe()}")
    sizes = DENSE_SIZES[:1] if args.quick else DENSE_SIZES
    many = bench_dense(args.repeat, sizes, args.target)
    one = one_thread(f"bench_dense({args.repeat}, {sizes!r}, {args.target!r})")
    print(f"fp32 dense (M, N, K): GFLOP/s, median of {args.repeat}")
    print(f"{'size':>18s} {f'kiln {num_threads()}T':>9s} {'numpy':>9s} {'ratio':>6s}"
          f" {'kiln 1T':>9s} {'numpy 1T':>9s} {'ratio':>6s}")
    for a, b in zip(many, one):
        print(f"{str(tuple(a['size'])):>18s} {a['kiln']:9.1f} {a['numpy']:9.1f} "
              f"{a['kiln'] / a['numpy']:6.2f} {b['kiln']:9.1f} {b['numpy']:9.1f} "
              f"{b['kiln'] / b['numpy']:6.2f}")
    if args.quick:
        return
    print(f"\nconv2d + bias + relu, batch 1: ms, median of {args.repeat} (ratio: kiln / torch "
          f"eager; GFLOP/s of kiln in brackets)")
    print(f"{'layer':>22s} {f'kiln {num_threads()}T':>16s} {'torch':>8s} {'ratio':>6s}"
          f" {'kiln 1T':>16s} {'torch 1T':>8s} {'ratio':>6s}")
    for a, b in zip(bench_convs(args.repeat, args.target),
                    one_thread(f"bench_convs({args.repeat}, {args.target!r})")):
        cells = " ".join(f"{r['kiln_ms']:7.3f} [{r['gflops']:5.1f}] {r['torch_ms']:8.3f} "
                         f"{r['kiln_ms'] / r['torch_ms']:6.2f}" for r in (a, b))
        print(f"{a['name']:>22s} {cells}")


if __name__ == "__main__":
    main()
