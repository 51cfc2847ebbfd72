"""int8 matrix products against float32: kiln's int8 kernels, kiln float32, numpy float32.

One process, one machine, medians of ``--repeat`` calls, interleaved round by round:

- kiln int8 dense ``M×K @ (N×K)ᵀ`` of int8 × int8 → int32 (``nn.dense(out_dtype="int32")``,
  what ``qnn.dense`` lowers to), the weight an argument (packed every call) and a constant
  (``params=``: packed once at compile time by alter-layout, nn.dense_int8_packed),
- kiln int8 uint8 × int8 → int32 (nn.dense takes one input dtype, so the same product as a
  1×1 ``nn.conv2d`` of uint8 data and int8 weight: C[oc, pixel] over K channels), the weight
  an argument (the im2col GEMM, both operands packed every call) and a constant
  (nn.conv2d_int8_packed: the input read in place from channel-group planes,
  kiln/loops/int8_conv.py; on AMX hosts nn.conv2d_int8_tiled and nn.dense_int8_tiled,
  kiln/loops/int8_amx.py),
- kiln float32 dense and numpy (OpenBLAS) float32 ``@`` of the same shape (numpy in rounds
  of its own, after the others: OpenBLAS's spinning threads slow what runs right after it).

GFLOP/s count 2·M·N·K operations (a multiply and an add) for every product. The script prints
the Target (`kiln.Target.host()`, or ``--target``), the form of the int8 dot products it
gives (``vnni``: vpdpbusd; ``pmaddwd``: AVX2's exact sequence; ``widen``: plain), the tile,
and `exe.profile`'s table for the int8 kernel with ``--profile``. The issue's goal is int8 ≥ 3×
float32 on a VNNI machine; on one without VNNI the int8 path is the AVX2 sequence.

    .venv/bin/python benchmarks/int8.py [--size 1024] [--repeat 15] [--threads N] [--profile]
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

import kiln
from kiln.op import nn


def timings(fns: dict[str, Callable[[], object]], repeat: int) -> dict[str, float]:
    """Median seconds of each function, called in turn once per round (after a warm-up)."""
    for f in fns.values():
        f()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeat):
        for name, f in fns.items():
            start = time.perf_counter()
            f()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}


def int8_schedule(exe: kiln.Executable) -> dict:
    """The knobs the int8 kernel of ``exe`` was built with (its loop IR's attrs)."""
    for decl in exe.program.kernels.values():
        kernel = getattr(decl, "kernel", None)
        for _, knobs in (kernel.attrs.get("schedules", ()) if kernel is not None else ()):
            if knobs.get("kernel") == "int8_gemm":
                return dict(knobs)
    return {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024, help="M = N = K (default 1024)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--threads", type=int, default=None, help="kiln's threads (default: all)")
    ap.add_argument("--target", default=None, help="a kiln.Target spec (default: this CPU)")
    ap.add_argument("--profile", action="store_true", help="print the int8 kernel's profile")
    args = ap.parse_args()
    n = args.size
    target = kiln.Target.parse(args.target) if args.target else kiln.Target.host()
    rng = np.random.default_rng(0)

    def build(params: list[kiln.Var], body: kiln.Expr, bound: dict | None = None
              ) -> kiln.Executable:
        exe = kiln.build(kiln.IRModule.from_expr(kiln.Function(params, body)), target=target,
                         params=bound)
        if args.threads is not None:
            exe.set_threads(args.threads)
        return exe

    xs = kiln.var("x", shape=(n, n), dtype="int8")
    ws = kiln.var("w", shape=(n, n), dtype="int8")
    s8 = build([xs, ws], nn.dense(xs, ws, out_dtype="int32"))
    # K channels of N pixels, as square an image as N allows (32x32 for 1024)
    side = next(d for d in range(int(n ** 0.5), 0, -1) if n % d == 0)
    image = (1, n, side, n // side)
    xu = kiln.var("x", shape=image, dtype="uint8")
    wu = kiln.var("w", shape=(n, n, 1, 1), dtype="int8")  # M out channels
    u8 = build([xu, wu], nn.conv2d(xu, wu, out_dtype="int32"))
    xf = kiln.var("x", shape=(n, n), dtype="float32")
    wf = kiln.var("w", shape=(n, n), dtype="float32")
    f32 = build([xf, wf], nn.dense(xf, wf))

    a8 = rng.integers(-128, 128, (n, n)).astype(np.int8)
    b8 = rng.integers(-128, 128, (n, n)).astype(np.int8)
    au = rng.integers(0, 256, image).astype(np.uint8)
    af = rng.standard_normal((n, n)).astype(np.float32)
    bf = rng.standard_normal((n, n)).astype(np.float32)
    bft = np.ascontiguousarray(bf.T)
    # the results are checked once, exactly, before anything is timed
    want = a8.astype(np.int64) @ b8.T.astype(np.int64)
    assert np.array_equal(s8(a8, b8), want.astype(np.int32)), "int8 x int8 result differs"
    s8c = build([xs, ws], nn.dense(xs, ws, out_dtype="int32"), {"w": b8})
    assert np.array_equal(s8c(a8), want.astype(np.int32)), "prepacked result differs"
    want_u = (b8.astype(np.int64) @ au.reshape(n, n).astype(np.int64)).astype(np.int32)
    assert np.array_equal(u8(au, b8.reshape(n, n, 1, 1)).reshape(n, n), want_u), \
        "uint8 x int8 result differs"
    wu_arr = b8.reshape(n, n, 1, 1)
    u8c = build([xu, wu], nn.conv2d(xu, wu, out_dtype="int32"), {"w": wu_arr})
    assert np.array_equal(u8c(au).reshape(n, n), want_u), "packed uint8 x int8 conv differs"

    # numpy is timed in rounds of its own, last: right after an OpenBLAS call its threads
    # spin for a while, and kiln's float32 1024³ dense interleaved with it took 23-29 ms
    # against 11 alone on the 2-core Sapphire Rapids-class VM (docs/runtime.md)
    med = timings({
        "kiln int8 x int8 dense": lambda: s8(a8, b8),
        "kiln int8 x int8, constant weight": lambda: s8c(a8),
        "kiln uint8 x int8 (1x1 conv)": lambda: u8(au, wu_arr),
        "kiln uint8 x int8 conv, constant weight": lambda: u8c(au),
        "kiln float32 dense": lambda: f32(af, bf),
    }, args.repeat)
    med.update(timings({"numpy float32 @": lambda: af @ bft}, args.repeat))
    knobs = int8_schedule(s8)
    flops = 2.0 * n ** 3
    print(f"target: {target.describe()}")
    print(f"  features: vnni={'avx512vnni' in target.features} "
          f"avx_vnni={'avxvnni' in target.features} avx2={'avx2' in target.features}")
    if knobs:
        print(f"int8 kernel: form={knobs['form']} (shift={knobs['shift']}), tile "
              f"{knobs['mr']}x{knobs['nr']} int32 x {knobs['lanes']} lanes, "
              f"parallel={knobs['parallel']}")
    print(f"{n}^3, medians of {args.repeat}, threads={args.threads or target.cores}")
    base = flops / med["kiln float32 dense"]
    for name, t in med.items():
        rate = flops / t
        print(f"  {name:40s} {t * 1e3:8.2f} ms {rate / 1e9:8.1f} GFLOP/s "
              f"{rate / base:5.2f}x kiln float32")
    if args.profile:
        print(s8.profile(a8, b8))


if __name__ == "__main__":
    main()
