"""How long `kiln.build` takes on ResNet-18, cold and warm, and where the time goes by pass.

Each build runs in a fresh process: cold with an empty ``$KILN_CACHE``, warm again with the
cache the cold build filled. ``--baseline DIR`` builds with another checkout of kiln too (its
package directory put first on ``PYTHONPATH``), alternating with this one in the same run,
so that the comparison sees the same machine load. Medians of ``--repeat`` rounds.

    .venv/bin/python benchmarks/build.py [--repeat 3] [--image 224] [--baseline ../old-kiln]
    .venv/bin/python benchmarks/build.py --passes      # one warm build's time per pass
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BUILD = """
import time
import kiln
from kiln.testing.models import resnet18
mod, params = resnet18(image={image})
start = time.perf_counter()
kiln.build(mod, params=params)
print(time.perf_counter() - start)
"""

PASSES = """
import kiln
from kiln.testing.models import resnet18
from kiln.transform import PassContext, PassTimingInstrument
mod, params = resnet18(image={image})
timing = PassTimingInstrument()
with PassContext(instruments=[timing]):
    kiln.build(mod, params=params)
print(timing.render())
"""


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def run(script: str, tree: Path, cache: str) -> str:
    env = {**os.environ, "KILN_CACHE": cache, "PYTHONPATH": str(tree)}
    proc = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, check=True)
    return proc.stdout.strip()


def cold_warm(tree: Path, image: int) -> tuple[float, float]:
    script = BUILD.format(image=image)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-cache-") as cache:
        cold = float(run(script, tree, cache).splitlines()[-1])
        warm = float(run(script, tree, cache).splitlines()[-1])
    return cold, warm


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--baseline", type=Path, help="another kiln checkout to compare with")
    parser.add_argument("--passes", action="store_true", help="time each pass of a warm build")
    args = parser.parse_args()
    print(f"CPU: {cpu_name()}, {os.cpu_count()} cores; ResNet-18 at {args.image}²")
    if args.passes:
        with tempfile.TemporaryDirectory(prefix="kiln-bench-cache-") as cache:
            run(BUILD.format(image=args.image), ROOT, cache)  # fill the cache
            print(run(PASSES.format(image=args.image), ROOT, cache))
        return
    trees = {"this tree": ROOT}
    if args.baseline is not None:
        trees["baseline"] = args.baseline.resolve()
    times: dict[str, list[tuple[float, float]]] = {name: [] for name in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            times[name].append(cold_warm(tree, args.image))
    for name, got in times.items():
        cold = statistics.median(c for c, _ in got)
        warm = statistics.median(w for _, w in got)
        print(f"{name:<10} cold {cold:6.2f} s   warm {warm:6.2f} s   (medians of {len(got)})")


if __name__ == "__main__":
    main()
