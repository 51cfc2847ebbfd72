"""Front-end speed: type inference, parsing and printing of a 10,000-operator graph.

The graph is a 2,500-layer residual MLP built with kiln's Python builder; each layer is
dense → bias_add → relu → add (4 operator calls), with its weights as parameters of @main.
Each step is timed several times in one run and the median reported.

    .venv/bin/python benchmarks/frontend.py [--layers 2500] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import time

import kiln
from kiln.op import nn


def build(layers: int, width: int) -> kiln.IRModule:
    x = kiln.var("x", shape=(1, width))
    params = [x]
    h: kiln.Expr = x
    for i in range(layers):
        w = kiln.var(f"w{i}", shape=(width, width))
        b = kiln.var(f"b{i}", shape=(width,))
        params += [w, b]
        h = kiln.op.add(nn.relu(nn.bias_add(nn.dense(h, w), b, axis=-1)), h)
    return kiln.IRModule.from_expr(kiln.Function(params, h))


def median_time(fn, repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2500)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()

    mod = build(args.layers, args.width)
    ops = 4 * args.layers
    t_infer, typed = median_time(lambda: kiln.infer_types(mod), args.repeat)
    t_print, text = median_time(lambda: kiln.astext(mod), args.repeat)
    t_parse, parsed = median_time(lambda: kiln.parse(text), args.repeat)
    assert kiln.structural_equal(parsed, mod)
    t_print_typed, _ = median_time(lambda: kiln.astext(typed), args.repeat)

    print(f"graph: {ops} operator calls, {len(text.splitlines())} lines of text")
    print(f"median of {args.repeat} runs:")
    print(f"  infer_types           {t_infer:7.3f} s   (goal < 2 s)")
    print(f"  parse                 {t_parse:7.3f} s")
    print(f"  print                 {t_print:7.3f} s")
    print(f"  parse + print         {t_parse + t_print:7.3f} s   (goal < 2 s)")
    print(f"  print with types      {t_print_typed:7.3f} s")


if __name__ == "__main__":
    main()
