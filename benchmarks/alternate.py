"""kiln called in turn with ONNX Runtime or PyTorch in one process: each one's time right
after the other's call, over its time alone.

Users call kiln beside other runtimes. Their thread pools keep a core busy for a while after
a call (ORT's and torch's OpenMP workers spin), and a runtime called right after another may
find its threads behind those spinners. For each of peers.py's workloads named (the same
models, weights and runners), in one process: kiln alone, kiln right after each call of the
other runtime, the other alone, the other right after each kiln call; medians of ``--calls``
calls, the median of ``--runs`` runs of each. numpy/OpenBLAS in turn with kiln is peers.py's
"alternating with numpy" check.

    .venv/bin/python benchmarks/alternate.py [--only mlp64,lstm] [--with ort,torch]
        [--threads 2] [--calls 100] [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable
from typing import Any

import peers  # benchmarks/peers.py: the workloads and their runners

from kiln.codegen import set_num_threads


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="mlp64,lstm,nn_lstm,transformer")
    parser.add_argument("--with", dest="others", default="ort,torch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--calls", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    set_num_threads(args.threads)
    cases = {c.key: c for c in peers.cases(quick=False)}
    peers.machine(args.threads)
    print("\n| workload | other | kiln alone ms | kiln after other | other alone ms "
          "| other after kiln |")
    print("|---|---|---:|---:|---:|---:|")
    for key in args.only.split(","):
        work = peers.prepare(cases[key], args.threads)
        if work.skipped:
            print(f"| {work.case.title} | skipped: {work.skipped} | | | | |")
            continue
        kiln_run = work.runners["kiln"]
        for name in args.others.split(","):
            other = work.runners[name]

            def median_of(f: Callable[[], Any], before: Callable[[], Any] | None) -> float:
                return statistics.median(peers.timed_after(f, before, args.calls)
                                         for _ in range(args.runs))
            alone, after = median_of(kiln_run, None), median_of(kiln_run, other)
            o_alone, o_after = median_of(other, None), median_of(other, kiln_run)
            print(f"| {work.case.title} | {name} | {alone * 1e3:.3f} | {after / alone:.2f} | "
                  f"{o_alone * 1e3:.3f} | {o_after / o_alone:.2f} |", flush=True)


if __name__ == "__main__":
    main()
