"""Executors side by side: the whole-program native executor, the VM, and PyTorch eager.

1. Per-call overhead: a program of one tiny kernel (``x * 2`` on 4 floats), where the time is
   all executor: checking the input, allocating the result, getting to the kernel and back.
2. MLP 784-512-512-10 (kiln's builder, random weights) at batch 1 and 64: the native
   executor, the VM (the same compiled kernels, called from Python one by one), the sum of
   the kernels alone (each called directly, back to back: the floor both executors share),
   and PyTorch eager on the same weights (``torch.no_grad``, as many threads as kiln).
3. The LSTM of kiln's builder (32 steps, batch 1), the same three ways.

Medians of ``--repeat`` calls after a warm-up, in one process, the contenders taking turns
call by call; ratios against the native executor (above 1: slower than native).

    .venv/bin/python benchmarks/runtime.py [--repeat 2000] [--threads N]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import kiln
from kiln.codegen import num_threads, set_num_threads
from kiln.testing.models import lstm, mlp


def medians_us(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """The median time of one call of each, in microseconds. The calls take turns (one of
    each per round), so a machine busy with other work slows them all alike."""
    for f in fns.values():
        for _ in range(max(repeat // 20, 5)):
            f()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, f in fns.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(t) * 1e6 for name, t in times.items()}


def table(fns: dict[str, Callable[[], object]], repeat: int) -> None:
    us = medians_us(fns, repeat)
    base = next(iter(us.values()))
    for name, t in us.items():
        print(f"  {name:<28} {t:10.1f} us   {t / base:6.2f}x")


def kernels_alone(exe: kiln.Executable, args: list[np.ndarray]) -> Callable[[], None]:
    """Every kernel of @main called directly, in order, on arrays made ahead (no executor)."""
    program = exe.program
    main = program.main
    values: dict[object, np.ndarray] = dict(zip(main.params, args))
    calls = []
    for ins in main.instructions():
        if ins.op == "const":
            values[ins] = program.constants[ins.attrs["index"]]
        elif ins.op == "alloc":
            t = ins.type
            values[ins] = np.empty([int(d) for d in t.shape], t.dtype)  # type: ignore[attr-defined]
        elif ins.op == "kernel":
            calls.append((exe.kernels.functions[ins.attrs["kernel"]],
                          [values[v] for v in ins.operands]))
        elif ins.op not in ("tuple", "get_field"):
            raise SystemExit(f"kernels_alone: @main uses {ins.op}")

    def run() -> None:
        for f, arrays in calls:
            f(*arrays)
    return run


def torch_fn(kind: str, params: dict, x: np.ndarray) -> Callable[[], object] | None:
    try:
        import torch

        from kiln.testing.torch_models import torch_lstm, torch_mlp
    except ImportError:
        return None
    torch.set_num_threads(num_threads())
    module = torch_mlp(params) if kind == "mlp" else torch_lstm(params)
    tx = torch.from_numpy(x)

    def run() -> object:
        with torch.no_grad():
            return module(tx)
    return run


def bench_overhead(repeat: int) -> None:
    mod = kiln.parse("def @main(%x: Tensor[(4), float32]) { %x * 2f }")
    native, vm = kiln.build(mod), kiln.build(mod, executor="vm")
    assert native.stats().executor == "native"
    x = np.ones(4, "float32")
    print("per-call overhead: x * 2f on 4 floats")
    table({"native executor": lambda: native(x), "VM": lambda: vm(x),
           "the kernel alone": kernels_alone(native, [x])}, repeat)


def bench_model(kind: str, mod: kiln.IRModule, params: dict, x: np.ndarray,
                repeat: int) -> None:
    native = kiln.build(mod, params=params)
    vm = kiln.build(mod, params=params, executor="vm")
    assert native.stats().executor == "native", native.stats().executor
    np.testing.assert_allclose(native(x), vm(x), rtol=1e-5, atol=1e-6)
    fns = {"native executor": lambda: native(x), "VM": lambda: vm(x)}
    try:
        fns["kernels alone"] = kernels_alone(native, [x])
    except SystemExit as e:
        print(f"  (kernels alone: {e})")
    f = torch_fn(kind, params, x)
    if f is not None:
        fns["PyTorch eager"] = f
    table(fns, repeat)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=0, help="kiln and torch threads (0: all)")
    args = ap.parse_args()
    if args.threads:
        set_num_threads(args.threads)
    print(f"kiln {num_threads()} thread(s); median of {args.repeat} calls\n")
    bench_overhead(args.repeat)
    rng = np.random.default_rng(0)
    for batch in (1, 64):
        mod, params = mlp(batch=batch)
        x = rng.standard_normal((batch, 784)).astype("float32")
        print(f"\nMLP 784-512-512-10, batch {batch}")
        bench_model("mlp", mod, params, x, args.repeat if batch == 1 else args.repeat // 4)
    mod, params = lstm()
    x = rng.standard_normal((32, 1, 256)).astype("float32")
    print("\nLSTM, 32 steps, batch 1, 256 -> 256")
    bench_model("lstm", mod, params, x, args.repeat // 4)


if __name__ == "__main__":
    main()
