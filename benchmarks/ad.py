"""Automatic differentiation: the size of gradient programs, and the time of a training step.

1. The gradient of a small CNN (conv2d, batch norm in training form, pooling, dense), in both
   modes: the number of calls in the program kiln.grad returns, before and after the
   optimization pipeline (when kiln has one that accepts it; "n/a" otherwise).
2. One SGD step of the MLP of examples/train_mlp.py (batch 100): the reference interpreter
   running kiln's gradient program, against torch.autograd in eager mode on the same model.
   Each is timed several times and the median reported.

    .venv/bin/python benchmarks/ad.py [--repeat 20]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import kiln
from kiln.ad import grad
from kiln.ir.traverse import post_order

HERE = Path(__file__).resolve().parent

CNN = """
#[version = "0.0.5"]
def @main(%data: Tensor[(2, 3, 10, 10), float32], %label: Tensor[(2, 5), float32],
          %w1: Tensor[(6, 3, 3, 3), float32], %gamma: Tensor[(6), float32],
          %beta: Tensor[(6), float32], %w2: Tensor[(8, 3, 3, 3), float32],
          %wfc: Tensor[(5, 72), float32], %bfc: Tensor[(5), float32]) {
  %1 = nn.conv2d(%data, %w1, padding=[1, 1, 1, 1]);
  let %mean = mean(%1, axis=[0, 2, 3]);
  let %centred = %1 - reshape(%mean, newshape=[1, 6, 1, 1]);
  let %var = mean(%centred * %centred, axis=[0, 2, 3]);
  %2 = nn.batch_norm(%1, %gamma, %beta, %mean, %var);
  %3 = nn.relu(%2.0);
  %4 = nn.max_pool2d(%3, pool_size=[2, 2], strides=[2, 2]);
  %5 = nn.conv2d(%4, %w2, padding=[1, 1, 1, 1], groups=2);
  %6 = nn.avg_pool2d(%5, pool_size=[3, 3], strides=[2, 2], padding=[1, 1, 1, 1],
                     count_include_pad=True);
  %7 = nn.bias_add(nn.dense(nn.batch_flatten(%6), %wfc), %bfc, axis=-1);
  negative(mean(sum(nn.log_softmax(%7) * %label, axis=[1])))
}
"""


def find_optimizer() -> Callable[[kiln.IRModule], kiln.IRModule] | None:
    """kiln's optimization pipeline, wherever this version of kiln keeps it."""
    for module, name in (("kiln", "optimize"), ("kiln.transform", "optimize"),
                         ("kiln.transform.pipeline", "optimize")):
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if callable(found):
            return found
    return None


def count_calls(mod: kiln.IRModule) -> str:
    """"operator calls / all calls" in every function of a module, fused functions included."""
    ops = calls = 0
    for gv in mod.global_vars:
        for node in post_order(mod[gv]):
            if isinstance(node, kiln.Call):
                calls += 1
                ops += isinstance(node.op, kiln.Op)
    return f"{ops} / {calls}"


def optimized_size(whole: kiln.IRModule, without_fusion: bool) -> str:
    """The calls left after kiln's optimize pipeline, or "n/a" and why."""
    optimize = find_optimizer()
    if optimize is None:
        return "n/a (kiln has no optimize pipeline yet)"
    try:
        if without_fusion:
            from kiln.transform import PassContext

            with PassContext(opt_level=3, disabled_pass=["fuse-ops"]):
                return count_calls(optimize(whole, opt_level=None))
        return count_calls(optimize(whole))
    except (kiln.Error, ImportError, TypeError) as e:
        return f"n/a ({str(e).splitlines()[0]})"


def gradient_sizes() -> None:
    mod = kiln.infer_types(kiln.parse(CNN))
    print("1. gradient program of the CNN (operator calls / all calls, fused functions "
          "included)")
    print(f"   forward program:  {count_calls(mod)}")
    for mode in ("higher_order", "first_order"):
        g = grad(mod["main"], mod=mod, mode=mode)
        whole = kiln.infer_types(kiln.IRModule.from_expr(g, mod))
        print(f"   {mode}:")
        print(f"     as kiln.grad returns it:         {count_calls(whole)}")
        print(f"     after optimize:                  {optimized_size(whole, False)}")
        print(f"     after optimize without fuse-ops: {optimized_size(whole, True)}")


def median_ms(fn: Callable[[], Any], repeat: int) -> float:
    fn()  # warm up
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def training_step(repeat: int) -> None:
    import torch

    spec = importlib.util.spec_from_file_location("train_mlp", HERE.parent / "examples" /
                                                  "train_mlp.py")
    train_mlp = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train_mlp)  # type: ignore[union-attr]
    batch = 100
    x, labels = train_mlp.make_data()
    xb = x[:batch]
    yb = np.eye(train_mlp.CLASSES, dtype="float32")[labels[:batch]]
    weights = train_mlp.init_weights()
    names = train_mlp.WEIGHTS
    print(f"2. one SGD step of the MLP of examples/train_mlp.py (2-{train_mlp.HIDDEN}-"
          f"{train_mlp.HIDDEN}-10, batch {batch}), median of {repeat}")
    for mode in ("first_order", "higher_order"):
        program = train_mlp.gradient_program(batch, mode)

        def step(program: kiln.IRModule = program) -> None:
            _, grads = kiln.interpret(program, xb, yb, *(weights[n] for n in names))
            for n, g in zip(names, grads, strict=True):
                weights[n] - np.float32(0.1) * g

        print(f"   kiln interpreter, {mode:13s} {median_ms(step, repeat):8.2f} ms")

    tw = {n: torch.tensor(weights[n], requires_grad=True) for n in names}
    tx, ty = torch.tensor(xb), torch.tensor(yb)

    def torch_step() -> None:
        h = torch.relu(torch.nn.functional.linear(tx, tw["w1"], tw["b1"]))
        h = torch.relu(torch.nn.functional.linear(h, tw["w2"], tw["b2"]))
        logits = torch.nn.functional.linear(h, tw["w3"], tw["b3"])
        loss = -(torch.log_softmax(logits, dim=1) * ty).sum(1).mean()
        grads = torch.autograd.grad(loss, [tw[n] for n in names])
        with torch.no_grad():
            for n, g in zip(names, grads, strict=True):
                tw[n] - 0.1 * g

    torch.set_num_threads(1)
    print(f"   torch.autograd eager (1 thread)  {median_ms(torch_step, repeat):8.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    gradient_sizes()
    training_step(args.repeat)


if __name__ == "__main__":
    main()
