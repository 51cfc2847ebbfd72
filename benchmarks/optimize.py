"""What kiln.optimize does to real models, and how long it takes.

For ResNet-18 and a BERT-base-sized encoder built with kiln's builder (random weights bound
as constants): operator calls before and after `optimize(opt_level=3)`, the number of fused
primitive functions, and the median time of `optimize`. Also the flop count of a chain of
five matrix products before and after matrix-chain reordering.

    .venv/bin/python benchmarks/optimize.py [--repeat 3] [--bert-layers 12]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter

import kiln
from kiln.ir.expr import Call, Function, Op
from kiln.ir.traverse import post_order
from kiln.testing.models import bert_encoder, resnet18
from kiln.transform.bind_params import bind_params


def census(mod: kiln.IRModule) -> tuple[Counter, int]:
    """(operator calls by name, fused primitive functions) over every function of the module."""
    calls: Counter = Counter()
    prims = 0
    for fn in mod.functions.values():
        for node in post_order(fn):
            if isinstance(node, Call) and isinstance(node.op, Op):
                calls[node.op.name] += 1
            elif isinstance(node, Function) and node.attrs.get("Primitive", 0):
                prims += 1
    return calls, prims


def bench_model(name: str, build, repeat: int, opt_level: int = 3) -> None:  # noqa: ANN001
    mod, params = build()
    bound = bind_params(mod, params)
    before, _ = census(bound)
    times = []
    out = None
    for _ in range(repeat):
        start = time.perf_counter()
        out = kiln.optimize(bound, opt_level=opt_level)
        times.append(time.perf_counter() - start)
    after, prims = census(out)
    n_before, n_after = sum(before.values()), sum(after.values())
    print(f"{name:<10} O{opt_level}  operator calls {n_before:5d} -> {n_after:5d}   "
          f"fused primitive functions {prims:4d}   "
          f"optimize median {statistics.median(times):6.2f} s (of {repeat})")
    changed = sorted(k for k in before | after if before[k] != after[k])
    print("    changed: " + ", ".join(f"{k} {before[k]}->{after[k]}" for k in changed))


def bench_matrix_chain() -> None:
    from kiln.op import nn
    from kiln.transform.matrix_chain_reordering import MatrixChainReordering, chain_flops

    sizes = [(40, 400), (400, 10), (10, 300), (300, 5), (5, 200)]
    x = kiln.var("a", shape=sizes[0])
    h: kiln.Expr = x
    weights = []
    for i, (k, n) in enumerate(sizes[1:]):
        w = kiln.var(f"m{i}", shape=(n, k))  # dense(h, w) = h @ w.T
        weights.append(w)
        h = nn.dense(h, w)
    mod = kiln.IRModule.from_expr(kiln.Function([x, *weights], h))
    before = chain_flops(mod)
    after = chain_flops(MatrixChainReordering()(mod))
    print(f"matrix chain of 5 ({' x '.join(str(s) for s in sizes)}): "
          f"{before:,} -> {after:,} flops ({before / after:.1f}x fewer)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bert-layers", type=int, default=12)
    args = ap.parse_args()
    for level in (3, 4):
        bench_model("ResNet-18", resnet18, args.repeat, level)
        bench_model(f"BERT-{args.bert_layers}L", lambda: bert_encoder(layers=args.bert_layers),
                    args.repeat, level)
    bench_matrix_chain()


if __name__ == "__main__":
    main()
