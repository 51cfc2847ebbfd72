"""The code generator on its own: transcendental throughput, compile time, cache hits.

1. Elementwise throughput: ``y = f(x)`` over 16M float32 for exp, tanh, sigmoid, erf, log
   and sin, as a kernel (a vectorized loop; with a parallel outer loop for the multithreaded
   line) against numpy and, where installed, PyTorch eager with the same thread count.
   Also the same kernels on 8K elements repeated in cache (compute, not memory, bound).
2. Compile time: the fused kernels of ResNet-18 (kiln's builder, random weights) lowered and
   compiled cold (an empty cache: emit + LLVM O3 + object code per distinct kernel), then
   again with a warm cache (machine code loaded from disk, no LLVM work).

Medians of ``--repeat`` runs, side by side in one process.

    .venv/bin/python benchmarks/codegen.py [--repeat 7] [--size 16777216] [--skip-resnet]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable

import numpy as np

import kiln
from kiln.codegen import compile_kernels, num_threads, threads
from kiln.loops.ir import Buffer, Const, For, Kernel, Load, Store, Unary, Var

OPS = ["exp", "tanh", "sigmoid", "erf", "log", "sin"]


def median_time(f: Callable[[], object], repeat: int) -> float:
    f()  # warm up (page faults, thread pool start)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        f()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def elementwise_kernel(op: str, rows: int, cols: int, outer: str, reps: int = 1) -> Kernel:
    """``y[i, j] = op(x[i, j])``: the outer loop ``outer`` (serial or parallel), the inner
    loop vectorized; ``reps`` repeats the whole nest (an in-cache throughput test)."""
    x, y = Buffer("x", (rows, cols), "float32"), Buffer("y", (rows, cols), "float32")
    i, j, r = Var("i"), Var("j"), Var("r")
    body = For(i, Const(0), Const(rows), For(j, Const(0), Const(cols), Store(
        y, (i, j), Unary(op, Load(x, (i, j)))), "vectorized"), outer)
    if reps > 1:
        body = For(r, Const(0), Const(reps), body)
    return Kernel(f"{op}_{outer}_{reps}", (x,), (y,), body)


def numpy_reference(op: str) -> Callable[[np.ndarray, np.ndarray], object] | None:
    return {
        "exp": lambda x, y: np.exp(x, out=y),
        "tanh": lambda x, y: np.tanh(x, out=y),
        "sigmoid": lambda x, y: np.divide(1.0, 1.0 + np.exp(-x), out=y),
        "log": lambda x, y: np.log(x, out=y),
        "sin": lambda x, y: np.sin(x, out=y),
    }.get(op)


def torch_reference(op: str) -> Callable[[object, object], object] | None:
    try:
        import torch
    except ImportError:
        return None
    fn = {"exp": torch.exp, "tanh": torch.tanh, "sigmoid": torch.sigmoid, "erf": torch.erf,
          "log": torch.log, "sin": torch.sin}[op]
    return lambda x, y: fn(x, out=y)


def bench_elementwise(size: int, repeat: int) -> None:
    cols = 4096
    rows = size // cols
    cores = num_threads()
    print(f"elementwise float32, {rows * cols / 1e6:.1f}M elements (median of {repeat}); "
          f"ms, and Gelem/s in brackets")
    print(f"{'op':8s} {'kiln 1T':>16s} {f'kiln {cores}T':>16s} {'numpy':>16s} "
          f"{'torch 1T':>16s} {f'torch {cores}T':>16s}   in-cache kiln 1T")
    for op in OPS:
        bench_op(op, rows, cols, cores, repeat)


def bench_op(op: str, rows: int, cols: int, cores: int, repeat: int) -> None:
    """One line of the elementwise table."""
    n = rows * cols
    x = np.random.default_rng(0).standard_normal((rows, cols)).astype(np.float32)
    if op == "log":
        x = np.abs(x) + np.float32(1e-3)
    y = np.empty_like(x)
    small = elementwise_kernel(op, 1, 8192, "serial", reps=256)
    serial = elementwise_kernel(op, rows, cols, "serial")
    parallel = elementwise_kernel(op, rows, cols, "parallel")
    lib = compile_kernels([serial, parallel, small])
    cells = []
    with threads(1):
        cells.append(median_time(lambda: lib[serial.name](x, y), repeat))
    cells.append(median_time(lambda: lib[parallel.name](x, y), repeat))
    ref = numpy_reference(op)
    cells.append(median_time(lambda: ref(x, y), repeat) if ref else float("nan"))
    tref = torch_reference(op)
    for count in (1, cores):
        cells.append(torch_time(tref, x, y, count, repeat) if tref else float("nan"))
    xs, ys = x.reshape(1, -1)[:, :8192].copy(), np.empty((1, 8192), np.float32)
    with threads(1):
        t_small = median_time(lambda: lib[small.name](xs, ys), repeat)
    text = " ".join(f"{t * 1e3:7.2f} [{n / t / 1e9:5.2f}]" if t == t else f"{'-':>16s}"
                    for t in cells)
    print(f"{op:8s} {text}   {t_small / (8192 * 256) * 1e9:.3f} ns/elem")


def torch_time(fn: Callable, x: np.ndarray, y: np.ndarray, count: int, repeat: int) -> float:
    import torch

    tx, ty = torch.from_numpy(x), torch.from_numpy(y)
    before = torch.get_num_threads()
    torch.set_num_threads(count)
    try:
        return median_time(lambda: fn(tx, ty), repeat)
    finally:
        torch.set_num_threads(before)


def resnet18_kernels() -> list[Kernel]:
    from kiln.ir.traverse import post_order
    from kiln.loops.lower import lower_primitive
    from kiln.ssa.kernels import constants_as_params
    from kiln.testing.models import resnet18
    from kiln.transform.bind_params import bind_params

    mod, params = resnet18()
    mod = kiln.infer_types(kiln.optimize(bind_params(mod, params)))
    kernels = []
    for node in post_order(mod["main"]):
        if isinstance(node, kiln.Function) and node.attrs.get("Primitive"):
            fn, _ = constants_as_params(node)  # weights become parameters, as lift-constants does
            kernels.append(lower_primitive(fn, f"fused{len(kernels)}"))
    return kernels


def bench_compile(repeat: int) -> None:
    kernels = resnet18_kernels()
    saved = os.environ.get("KILN_CACHE")
    with tempfile.TemporaryDirectory() as root:
        os.environ["KILN_CACHE"] = root
        try:
            start = time.perf_counter()
            cold = compile_kernels(kernels)
            t_cold = time.perf_counter() - start
            t_warm = median_time(lambda: compile_kernels(kernels), repeat)
        finally:
            if saved is None:
                del os.environ["KILN_CACHE"]
            else:
                os.environ["KILN_CACHE"] = saved
    s = cold.stats
    per = sorted(s.per_kernel.values())
    print(f"\nResNet-18 kernels: {len(kernels)} fused, {s.distinct} distinct")
    print(f"  cold compile  {t_cold:6.2f} s  (emit {s.emit_seconds:.2f} s, LLVM O3 + object "
          f"{s.llvm_seconds:.2f} s; per kernel median {statistics.median(per) * 1e3:.0f} ms, "
          f"max {per[-1] * 1e3:.0f} ms)")
    print(f"  warm cache    {t_warm:6.3f} s  (all {s.distinct} loaded from disk, median of "
          f"{repeat})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--size", type=int, default=1 << 24)
    parser.add_argument("--skip-resnet", action="store_true")
    args = parser.parse_args()
    bench_elementwise(args.size, args.repeat)
    if not args.skip_resnet:
        bench_compile(max(3, args.repeat // 2))


if __name__ == "__main__":
    main()
