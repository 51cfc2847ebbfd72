"""The int8 kernels: `DotProduct` and the int8 GEMM of dense, batch_matmul and conv2d.

Every result is compared bit for bit with numpy's int64 arithmetic (wrapped to int32, as
int32 sums wrap), for the host Target and for narrower ones this machine also runs (AVX2
only, and x86-64 without AVX2: the plain widening form). Targets with VNNI are checked
where the host cannot run them by their machine code (``vpdpbusd`` in the micro-kernel) and
by the loop-IR evaluator on the kernel lowered for them (the +128 shift and its column-sum
correction are loop IR, so the evaluator checks them exactly on any machine).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

import kiln
from kiln.codegen import assembly, compile_kernels, threads
from kiln.ir.traverse import post_order
from kiln.loops import int8_conv
from kiln.loops.evaluate import evaluate
from kiln.loops.int8_gemm import Int8Schedule, dot_form, int8_gemm
from kiln.loops.ir import Buffer, Const, DotProduct, Kernel, Load, Store
from kiln.loops.lower import lower_primitive
from kiln.loops.schedule import target_scope
from kiln.loops.verify import verify
from kiln.op import nn
from kiln.op.nn.int8_packed import pack_int8_conv_weight, pack_int8_weight
from kiln.runtime.compiler import native_available
from kiln.runtime.kernel_format import read_kernel, write_kernel
from kiln.target import Target

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

AVX2 = "llvm -mcpu=x86-64-v3"  # a generic AVX2 CPU: vpmaddwd, no VNNI
PLAIN = "llvm -mattr=-avx2,-amx-tile"  # this CPU without AVX2 (nor AMX): the widening form
AVX512_VNNI = "llvm -mcpu=znver4"  # zmm vpdpbusd
AVX_VNNI = "llvm -mcpu=znver5 -mattr=-avx512f"  # ymm {vex} vpdpbusd
# this machine without AMX tiles: the VNNI kernels where it has VNNI (an 8-bit conv2d of a
# constant weight takes AMX tiles where the host has them: tests/loops/test_int8_amx.py)
HOST = "llvm -mattr=-amx-tile"
RUNNABLE = [HOST, AVX2, PLAIN]
PAIRS = [("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8"), ("int8", "uint8")]
SAME = [("int8", "int8"), ("uint8", "uint8")]  # nn.dense / batch_matmul: one input dtype


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


RNG = np.random.default_rng(14)


def rand(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    """Random 8-bit values, the extremes included often (the saturating cases of
    vpmaddubsw: 255 · -128 twice overflows int16)."""
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, int(info.max) + 1, shape)
    edge = RNG.random(shape) < 0.3
    x = np.where(edge, np.where(RNG.random(shape) < 0.5, info.min, info.max), x)
    return x.astype(dtype)


def exact(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` in int64, wrapped to int32 (what int32 accumulation gives)."""
    return (a.astype(np.int64) @ b.astype(np.int64)).astype(np.int32)


def runnable(spec: str) -> Target:
    t = Target.parse(spec)
    if not t.is_host:
        pytest.skip(f"this machine cannot run code for {spec}")
    return t


# --- DotProduct ---------------------------------------------------------------------------


DOT_PAIRS = PAIRS + [("int16", "int16")]


def unpack(word: int, dtype: str) -> list[int]:
    """The values a 32-bit lane packs, lowest first, in Python integers."""
    bits = 16 if dtype == "int16" else 8
    values = [(word >> (bits * q)) & (2 ** bits - 1) for q in range(32 // bits)]
    if dtype != "uint8":
        values = [v - 2 ** bits if v >= 2 ** (bits - 1) else v for v in values]
    return values


def dot_reference(a: np.ndarray, b: np.ndarray, c: np.ndarray, ta: str, tb: str) -> np.ndarray:
    """Independent of the evaluator: lane by lane, value by value, in Python integers."""
    out = []
    for x, y, z in zip(a.tolist(), b.tolist(), c.tolist()):
        bx, by = unpack(x, ta), unpack(y, tb)
        total = z + sum(p * q for p, q in zip(bx, by))
        out.append((total + 2 ** 31) % 2 ** 32 - 2 ** 31)
    return np.array(out, dtype=np.int32)


def dot_kernel(lanes: int, ta: str, tb: str, name: str) -> Kernel:
    a, b, c = (Buffer(n, (lanes,), "int32") for n in "abc")
    o = Buffer("o", (lanes,), "int32")
    zero = (Const(0),)
    body = Store(o, zero, DotProduct(Load(a, zero, lanes), Load(b, zero, lanes),
                                     Load(c, zero, lanes), ta, tb))
    return verify(Kernel(name, (a, b, c), (o,), body))


def dot_inputs(lanes: int) -> list[np.ndarray]:
    words = [RNG.integers(-2 ** 31, 2 ** 31, lanes).astype(np.int32) for _ in range(3)]
    edge = min(lanes, 2)
    words[0][:2] = [-1, 0x7F7F7F7F][:edge]  # 255/-1 in every byte; 127 in every byte
    words[1][:2] = [-2139062144, -1][:edge]  # 0x80808080: -128 (or 128) in every byte
    if lanes > 2:  # 0x80008000 twice: int16 pairs of -32768, whose two products sum to 2³¹
        words[0][2] = words[1][2] = -2147450880
    words[2][:2] = [2 ** 31 - 1, 2 ** 31 - 1][:edge]  # the sum wraps
    return words


@pytest.mark.parametrize("ta,tb", DOT_PAIRS)
def test_dot_product_evaluator(ta: str, tb: str) -> None:
    kernel = dot_kernel(8, ta, tb, "dot_eval")
    a, b, c = dot_inputs(8)
    np.testing.assert_array_equal(evaluate(kernel, a, b, c)[0], dot_reference(a, b, c, ta, tb))


@pytest.mark.parametrize("spec", RUNNABLE)
def test_dot_product_compiled(spec: str) -> None:
    t = runnable(spec)
    kernels = [dot_kernel(lanes, ta, tb, f"dot_{ta}_{tb}_{lanes}")
               for ta, tb in DOT_PAIRS for lanes in (1, 4, 8, 16)]
    lib = compile_kernels(kernels, t)
    for kernel in kernels:
        lanes = kernel.inputs[0].shape[0]
        node = kernel.body.value  # type: ignore[attr-defined]
        a, b, c = dot_inputs(lanes)
        out = np.zeros(lanes, np.int32)
        lib[kernel.name](a, b, c, out)
        np.testing.assert_array_equal(out, dot_reference(a, b, c, node.a_dtype, node.b_dtype),
                                      err_msg=kernel.name)


@pytest.mark.parametrize("spec,lanes,form,register", [
    (AVX512_VNNI, 16, "vnni", "zmm"), (AVX_VNNI, 8, "vnni", "ymm"),
    (AVX2, 8, "pmaddwd", "ymm"), ("aarch64-linux-gnu", 4, "widen", None)])
def test_dot_product_instructions(spec: str, lanes: int, form: str, register: str | None
                                  ) -> None:
    # The instruction follows the Target's features, never the host's; vpmaddubsw (whose
    # int16 pair sums saturate) is never used.
    t = Target.parse(spec)
    assert dot_form(t.features, lanes, "uint8", "int8") == form
    asm = assembly(dot_kernel(lanes, "uint8", "int8", "dot_asm"), target=t)
    assert "pmaddubsw" not in asm
    if form == "vnni":
        assert re.search(rf"vpdpbusd\s+.*%{register}", asm), asm
    if form == "pmaddwd":
        assert re.search(rf"vpmaddwd\s+.*%{register}", asm) and "vpdpbusd" not in asm
    # unsigned × unsigned has no vpdpbusd: the exact widening forms
    assert "vpdpbusd" not in assembly(dot_kernel(lanes, "uint8", "uint8", "dot_uu"), target=t)
    # int16 pairs (the AVX2 GEMM's operands, widened as they are packed): one vpmaddwd
    pairs = assembly(dot_kernel(lanes, "int16", "int16", "dot_ww"), target=t)
    if form == "pmaddwd":
        assert re.search(rf"vpmaddwd\s+.*%{register}", pairs), pairs


def test_dot_product_saves_and_loads() -> None:
    kernel = dot_kernel(8, "int8", "uint8", "dot_save")
    again = read_kernel(write_kernel(kernel))
    a, b, c = dot_inputs(8)
    np.testing.assert_array_equal(evaluate(again, a, b, c)[0],
                                  dot_reference(a, b, c, "int8", "uint8"))
    assert str(again.body) == str(kernel.body)


# --- dense, batch_matmul, conv2d through kiln.build ------------------------------------------


def build(params: list[kiln.Var], body: kiln.Expr, t: Target) -> kiln.Executable:
    return kiln.build(kiln.IRModule.from_expr(kiln.Function(params, body)), target=t)


def primitive_kernel(params: list[kiln.Var], body: kiln.Expr, t: Target) -> Kernel:
    fused = kiln.infer_types(kiln.optimize(kiln.IRModule.from_expr(kiln.Function(params, body))))
    prim = next(f for f in post_order(fused["main"])
                if isinstance(f, kiln.Function) and f.attrs.get("Primitive"))
    return lower_primitive(prim, "k", target=t)


DENSE_SHAPES = [(1, 1, 1), (3, 10, 33), (5, 17, 7), (13, 48, 30), (29, 33, 190),
                (37, 75, 401), (15, 31, 17)]


def build_many(params: list[kiln.Var], bodies: list[kiln.Expr], t: Target
               ) -> kiln.Executable:
    """One executable computing several results (one build for many kernels: faster)."""
    return build(params, kiln.Tuple(bodies) if len(bodies) > 1 else bodies[0], t)


def slow_unless(condition: bool) -> list:
    return [] if condition else [pytest.mark.slow]


TARGET_PARAMS = [pytest.param(spec, marks=slow_unless(spec == HOST)) for spec in RUNNABLE]


@pytest.mark.parametrize("spec", RUNNABLE)
@pytest.mark.parametrize("dtype", ["int8", "uint8"])
def test_dense_exact(spec: str, dtype: str) -> None:
    t = runnable(spec)
    shapes = DENSE_SHAPES if spec == HOST else DENSE_SHAPES[1::2]
    params, bodies, arrays, wants = [], [], [], []
    for n_, (m, n, k) in enumerate(shapes):
        x = kiln.var(f"x{n_}", shape=(m, k), dtype=dtype)
        w = kiln.var(f"w{n_}", shape=(n, k), dtype=dtype)
        params += [x, w]
        bodies.append(nn.dense(x, w, out_dtype="int32"))
        a, b = rand((m, k), dtype), rand((n, k), dtype)
        arrays += [a, b]
        wants.append(exact(a, b.T))
    got = build_many(params, bodies, t)(*arrays)
    for shape, g, want in zip(shapes, got, wants):
        np.testing.assert_array_equal(g, want, err_msg=f"{shape}")


def test_dense_takes_the_int8_kernel_and_fuses_its_consumers() -> None:
    t = Target.host()
    x = kiln.var("x", shape=(9, 20), dtype="int8")
    w = kiln.var("w", shape=(11, 20), dtype="int8")
    bias = kiln.var("bias", shape=(11,), dtype="int32")
    body = kiln.op.add(nn.dense(x, w, out_dtype="int32"), bias)
    kernel = primitive_kernel([x, w, bias], body, t)
    (name, knobs), = kernel.attrs["schedules"]
    assert (name, knobs["kernel"]) == ("nn.dense", "int8_gemm")
    assert "dot4<" in str(kernel)
    exe = build([x, w, bias], body, t)
    a, b = rand((9, 20), "int8"), rand((11, 20), "int8")
    c = RNG.integers(-1000, 1000, 11).astype(np.int32)
    np.testing.assert_array_equal(exe(a, b, c), exact(a, b.T) + c)


def test_int32_sums_wrap_as_int32() -> None:
    # 255 · 255 · 40000 > 2³¹: the sum wraps exactly as int32 addition does
    t = Target.host()
    x = kiln.var("x", shape=(2, 40000), dtype="uint8")
    w = kiln.var("w", shape=(3, 40000), dtype="uint8")
    exe = build([x, w], nn.dense(x, w, out_dtype="int32"), t)
    a, b = np.full((2, 40000), 255, np.uint8), np.full((3, 40000), 255, np.uint8)
    np.testing.assert_array_equal(exe(a, b), exact(a, b.T))


@pytest.mark.parametrize("spec", TARGET_PARAMS)
def test_batch_matmul_exact(spec: str) -> None:
    t = runnable(spec)
    params, bodies, arrays, wants = [], [], [], []
    for dtype in ("int8", "uint8"):
        for (bx, by), ta, tb in [((3, 3), False, True), ((3, 1), False, False),
                                 ((1, 2), True, False), ((2, 2), True, True)]:
            m, n, k = 7, 19, 13
            xs = (bx, k, m) if ta else (bx, m, k)
            ys = (by, n, k) if tb else (by, k, n)
            x = kiln.var(f"x{len(params)}", shape=xs, dtype=dtype)
            y = kiln.var(f"y{len(params)}", shape=ys, dtype=dtype)
            params += [x, y]
            bodies.append(nn.batch_matmul(x, y, out_dtype="int32", transpose_a=ta,
                                          transpose_b=tb))
            a, b = rand(xs, dtype), rand(ys, dtype)
            arrays += [a, b]
            wants.append(exact(a.swapaxes(1, 2) if ta else a, b.swapaxes(1, 2) if tb else b))
    got = build_many(params, bodies, t)(*arrays)
    for g, want in zip(got, wants):
        np.testing.assert_array_equal(g, want)


def conv_reference(x: np.ndarray, w: np.ndarray, stride: tuple[int, int],
                   pad: tuple[int, int, int, int], dilation: tuple[int, int],
                   groups: int = 1, pad_value: int = 0) -> np.ndarray:
    """NCHW / OIHW convolution in int64 by explicit windows, wrapped to int32 (the input
    padded with ``pad_value``)."""
    if groups > 1:
        og, cg = w.shape[0] // groups, w.shape[1]
        return np.concatenate([conv_reference(x[:, g * cg:(g + 1) * cg], w[g * og:(g + 1) * og],
                                              stride, pad, dilation)
                               for g in range(groups)], axis=1)
    top, left, bottom, right = pad
    xp = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (top, bottom), (left, right)),
                constant_values=pad_value)
    o, _, kh, kw = w.shape
    sh, sw = stride
    dh, dw = dilation
    oh = (xp.shape[2] - (kh - 1) * dh - 1) // sh + 1
    ow = (xp.shape[3] - (kw - 1) * dw - 1) // sw + 1
    out = np.zeros((x.shape[0], o, oh, ow), np.int64)
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, :, ky * dh: ky * dh + sh * (oh - 1) + 1: sh,
                       kx * dw: kx * dw + sw * (ow - 1) + 1: sw]
            out += np.einsum("nchw,oc->nohw", patch, w[:, :, ky, kx].astype(np.int64))
    return out.astype(np.int32)


CONVS = [  # (data shape, weight shape, strides, padding, dilation)
    ((1, 3, 9, 11), (5, 3, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 4, 10, 7), (6, 4, 3, 2), (2, 1), (0, 1, 2, 0), (1, 1)),
    ((1, 5, 12, 12), (7, 5, 1, 1), (2, 2), (0, 0, 0, 0), (1, 1)),
    ((1, 2, 11, 9), (3, 2, 3, 3), (1, 2), (2, 2, 2, 2), (2, 1)),
]


@pytest.mark.parametrize("spec,full", [(HOST, False)] + [
    pytest.param(spec, True, marks=pytest.mark.slow) for spec in RUNNABLE])
def test_conv2d_exact(spec: str, full: bool) -> None:
    t = runnable(spec)
    params, bodies, arrays, wants = [], [], [], []
    for da, dw in PAIRS:
        for xs, ws, strides, padding, dilation in CONVS if full else CONVS[3:]:
            x = kiln.var(f"x{len(params)}", shape=xs, dtype=da)
            w = kiln.var(f"w{len(params)}", shape=ws, dtype=dw)
            params += [x, w]
            bodies.append(nn.conv2d(x, w, strides=strides, padding=padding,
                                    dilation=dilation, out_dtype="int32"))
            a, b = rand(xs, da), rand(ws, dw)
            arrays += [a, b]
            wants.append(conv_reference(a, b, strides, padding, dilation))
    got = build_many(params, bodies, t)(*arrays)
    for g, want in zip(got, wants):
        np.testing.assert_array_equal(g, want)


@pytest.mark.parametrize("spec", TARGET_PARAMS)
def test_grouped_conv2d_exact(spec: str) -> None:
    # groups as the GEMM's batch (images × groups); depthwise stays on the plain loops
    t = runnable(spec)
    for da, dw, xs, ws, groups in [("uint8", "int8", (2, 6, 7, 8), (9, 2, 3, 3), 3),
                                   ("int8", "int8", (1, 4, 6, 6), (4, 2, 1, 3), 2),
                                   ("uint8", "int8", (1, 3, 5, 5), (6, 1, 3, 3), 3)]:
        x = kiln.var("x", shape=xs, dtype=da)
        w = kiln.var("w", shape=ws, dtype=dw)
        body = nn.conv2d(x, w, padding=(1, 1), groups=groups, out_dtype="int32")
        kernel = primitive_kernel([x, w], body, t)
        (_, knobs), = kernel.attrs.get("schedules", ((None, {}),))
        assert (knobs.get("kernel") == "int8_gemm") == (ws[1] > 1)
        exe = build([x, w], body, t)
        a, b = rand(xs, da), rand(ws, dw)
        np.testing.assert_array_equal(exe(a, b), conv_reference(a, b, (1, 1), (1, 1, 1, 1),
                                                                (1, 1), groups))


def test_conv2d_small_on_narrow_targets() -> None:
    # the default run's share of the AVX2 and plain forms of conv2d (the rest: slow)
    for spec in (AVX2, PLAIN):
        t = runnable(spec)
        xs, ws, strides, padding, dilation = CONVS[1]
        x = kiln.var("x", shape=xs, dtype="uint8")
        w = kiln.var("w", shape=ws, dtype="int8")
        exe = build([x, w], nn.conv2d(x, w, strides=strides, padding=padding,
                                      dilation=dilation, out_dtype="int32"), t)
        a, b = rand(xs, "uint8"), rand(ws, "int8")
        np.testing.assert_array_equal(exe(a, b), conv_reference(a, b, strides, padding,
                                                                dilation))


# --- VNNI Targets: the lowering for them, checked by the loop evaluator ----------------------


@pytest.mark.parametrize("spec", [AVX512_VNNI, AVX_VNNI])
def test_vnni_lowering_exact_in_the_evaluator(spec: str) -> None:
    # int8 × int8 runs as (A + 128) × B − 128 · colsum(B): exact, wraps included
    t = Target.parse(spec)
    shapes = [(17, 9, 6), (2, 33, 13)] if spec == AVX512_VNNI else [(3, 19, 7)]
    for m, n, k in shapes:
        x = kiln.var("x", shape=(m, k), dtype="int8")
        w = kiln.var("w", shape=(n, k), dtype="int8")
        kernel = primitive_kernel([x, w], nn.dense(x, w, out_dtype="int32"), t)
        (_, knobs), = kernel.attrs["schedules"]
        assert (knobs["form"], knobs["shift"]) == ("vnni", True)
        a, b = rand((m, k), "int8"), rand((n, k), "int8")
        np.testing.assert_array_equal(evaluate(kernel, a, b)[0], exact(a, b.T))
    xs, ws = (1, 3, 6, 5), (4, 3, 3, 3)
    for da, dw in PAIRS if spec == AVX512_VNNI else PAIRS[1:2]:
        x = kiln.var("x", shape=xs, dtype=da)
        w = kiln.var("w", shape=ws, dtype=dw)
        kernel = primitive_kernel([x, w], nn.conv2d(x, w, padding=(1, 1), out_dtype="int32"),
                                  t)
        a, b = rand(xs, da), rand(ws, dw)
        np.testing.assert_array_equal(evaluate(kernel, a, b)[0],
                                      conv_reference(a, b, (1, 1), (1, 1, 1, 1), (1, 1)))


@pytest.mark.parametrize("spec,register,accumulators", [(AVX512_VNNI, "zmm", 28),
                                                         (AVX_VNNI, "ymm", 12)])
def test_vnni_micro_kernel(spec: str, register: str, accumulators: int) -> None:
    # the K loop of the tile: one vpdpbusd per accumulator, in registers of the Target's width
    t = Target.parse(spec)
    s = Int8Schedule.default(1, 64, 64, 256, "int8", "int8", target=t)
    assert s.mr * s.nr // s.lanes == accumulators
    x = kiln.var("x", shape=(64, 256), dtype="int8")
    w = kiln.var("w", shape=(64, 256), dtype="int8")
    asm = assembly(primitive_kernel([x, w], nn.dense(x, w, out_dtype="int32"), t), target=t)
    dots = [line for line in asm.splitlines() if "vpdpbusd" in line]
    assert len(dots) % accumulators == 0 and dots
    assert all(f"%{register}" in line for line in dots)
    if register == "ymm":
        assert "zmm" not in asm


@pytest.mark.parametrize("oc,mr", [(64, 8), (40, 10), (24, 12), (13, 14), (7, 14)])
def test_a_convolution_tile_pads_its_output_channels_least(oc: int, mr: int) -> None:
    # On VNNI the convolution's tile height, from 8 up to the rule's 14, is the one that pads
    # the output channels with the fewest rows (ties: the taller); 7 or 13 channels fit the
    # rule's one tile
    chosen = int8_conv.plan((1, 16, 9, 9), (oc, 16, 3, 3), (1, 1), (1, 1), (1, 1), 1,
                            (1, oc, 9, 9), "uint8", "int8", Target.parse(AVX512_VNNI))
    assert chosen is not None and chosen.schedule.mr == mr


def test_a_convolution_of_a_constant_weight_in_short_tiles_is_exact() -> None:
    # a constant weight takes the prepacked convolution (alter-layout), in tiles of 8 and 10
    # rows for 64 and 40 output channels on a VNNI host; uint8 data, int8 weight
    t = runnable(HOST)
    for oc, stride in ((64, 1), (40, 2)):
        x = kiln.var("x", shape=(1, 24, 10, 9), dtype="uint8")
        w = kiln.var("w", shape=(oc, 24, 3, 3), dtype="int8")
        body = nn.conv2d(x, w, strides=(stride, stride), padding=(1, 1), out_dtype="int32")
        a, b = rand((1, 24, 10, 9), "uint8"), rand((oc, 24, 3, 3), "int8")
        exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, w], body)),
                         params={"w": b}, target=t)
        (knobs,) = [k for d in exe.program.kernels.values() if d.kernel is not None
                    for _, k in d.kernel.attrs.get("schedules", ())
                    if k.get("kernel") == "int8_gemm"]
        if knobs["form"] == "vnni":
            assert knobs["mr"] == (8 if oc == 64 else 10)
        np.testing.assert_array_equal(exe(a), conv_reference(a, b, (stride, stride),
                                                             (1, 1, 1, 1), (1, 1)))


def test_schedule_follows_the_target() -> None:
    wide = Int8Schedule.default(1, 1024, 1024, 1024, "int8", "int8", threads=2,
                                target=Target.parse(AVX512_VNNI))
    assert (wide.mr, wide.nr, wide.lanes, wide.form, wide.shift) == (14, 32, 16, "vnni", True)
    assert wide.parallel == "n"
    u8s8 = Int8Schedule.default(1, 64, 64, 64, "uint8", "int8",
                                target=Target.parse(AVX512_VNNI))
    assert (u8s8.form, u8s8.shift) == ("vnni", False)
    avx2 = Int8Schedule.default(1, 64, 64, 64, "int8", "int8", target=Target.parse(AVX2))
    assert (avx2.mr, avx2.nr, avx2.lanes, avx2.form, avx2.shift) == (6, 16, 8, "pmaddwd", False)
    arm = Int8Schedule.default(1, 64, 64, 64, "uint8", "int8",
                               target=Target.parse("aarch64-linux-gnu"))
    assert (arm.lanes, arm.form) == (4, "widen")


# --- threads -----------------------------------------------------------------------------


def gemm_kernel(batch: int, m: int, n: int, k: int, schedule: Int8Schedule, name: str
                ) -> Kernel:
    x = Buffer("x", (batch, m, k), "int8")
    w = Buffer("w", (batch, n, k), "int8")
    o = Buffer("o", (batch, m, n), "int32")
    body = int8_gemm(batch, m, n, k, lambda b, i, p: Load(x, (b, i, p)),
                     lambda b, p, j: Load(w, (b, j, p)),
                     lambda b, i, j, v: Store(o, (b, i, j), v), "int8", "int8", schedule)
    return verify(Kernel(name, (x, w), (o,), body))


def test_result_independent_of_threads() -> None:
    t = Target.host()
    base = Int8Schedule.default(1, 64, 64, 64, "int8", "int8", target=t)
    mr, nr = base.mr, base.nr
    cases = [(1, 5 * mr + 3, 7 * nr + 1, 37, "n"), (1, 9 * mr + 1, 2 * nr + 5, 22, "m"),
             (3, 2 * mr + 1, nr + 3, 9, "batch")]
    # over M, two blocks per iteration share one packing of B (5 blocks: the last one alone)
    kernels = [gemm_kernel(batch, m, n, k, dataclasses.replace(
        base, mc=2 * mr, nc=2 * nr, parallel=parallel, m_blocks=2 if parallel == "m" else 1),
        f"par_{parallel}") for batch, m, n, k, parallel in cases]
    lib = compile_kernels(kernels, t)
    for (batch, m, n, k, _), kernel in zip(cases, kernels):
        a, b = rand((batch, m, k), "int8"), rand((batch, n, k), "int8")
        want = exact(a, b.swapaxes(1, 2))
        for count in (1, 2, 3):
            out = np.zeros((batch, m, n), np.int32)
            with threads(count):
                lib[kernel.name](a, b, out)
            np.testing.assert_array_equal(out, want, err_msg=f"{kernel.name}: {count} threads")


# --- saved executables ---------------------------------------------------------------------


def test_saved_int8_executable_rebuilt_from_its_loop_ir(tmp_path) -> None:  # noqa: ANN001
    # a file sealed by a stranger's key: its machine code is made again from the saved loop
    # IR, DotProducts included, and computes the same
    t = Target.host()
    x = kiln.var("x", shape=(6, 23), dtype="int8")
    w = kiln.var("w", shape=(9, 23), dtype="int8")
    exe = build([x, w], nn.dense(x, w, out_dtype="int32"), t)
    path = tmp_path / "int8.kiln"
    exe.save(path, key=bytes(range(32)))
    again = kiln.load(path)
    assert again.code_source == "rebuilt"
    a, b = rand((6, 23), "int8"), rand((9, 23), "int8")
    np.testing.assert_array_equal(again(a, b), exact(a, b.T))


# --- a constant weight packed at compile time (alter-layout: nn.dense_int8_packed) ----------


def packed_module(m: int, n: int, k: int, dtype: str) -> tuple[kiln.IRModule, np.ndarray]:
    x = kiln.var("x", shape=(m, k), dtype=dtype)
    w = kiln.var("w", shape=(n, k), dtype=dtype)
    bias = kiln.var("bias", shape=(n,), dtype="int32")
    body = kiln.op.add(nn.dense(x, w, out_dtype="int32"), bias)
    return kiln.IRModule.from_expr(kiln.Function([x, w, bias], body)), rand((n, k), dtype)


@pytest.mark.parametrize("spec", RUNNABLE)
def test_constant_weight_packed_at_compile_time(spec: str) -> None:
    t = runnable(spec)
    for dtype, (m, n, k) in [("int8", (7, 19, 37)), ("uint8", (1, 33, 9)), ("int8", (3, 5, 1))]:
        mod, wv = packed_module(m, n, k, dtype)
        bv = RNG.integers(-1000, 1000, n).astype(np.int32)
        exe = kiln.build(mod, params={"w": wv}, target=t)
        ops = [op for decl in exe.program.kernels.values() for op in decl.kernel.attrs["ops"]]
        assert "nn.dense_int8_packed" in ops and "nn.dense" not in ops
        a = rand((m, k), dtype)
        np.testing.assert_array_equal(exe(a, bv), exact(a, wv.T) + bv)


@pytest.mark.parametrize("spec", [AVX512_VNNI, AVX_VNNI])
def test_constant_weight_packed_for_vnni_in_the_evaluator(spec: str) -> None:
    # alter-layout packs bytes for the VNNI form, and the kernel reads them and the column
    # sums that the shifted int8 × int8 subtracts
    t = Target.parse(spec)
    m, n, k = 5, 21, 11
    mod, wv = packed_module(m, n, k, "int8")
    with target_scope(t):
        text = kiln.astext(kiln.optimize(mod, params={"w": wv}))
    s = Int8Schedule.default(1, m, n, k, "int8", "int8", target=t)
    panels = f"Tensor[({-(-n // s.nr)}, {-(-k // 4) + 1}, {s.nr}), int32]"  # bytes: K/4 groups
    assert "nn.dense_int8_packed" in text and panels in text, text[:800]
    x = kiln.var("x", shape=(m, k), dtype="int8")
    wp = pack_int8_weight(wv, s.nr, 4)
    p = kiln.var("wp", shape=wp.shape, dtype="int32")
    kernel = primitive_kernel([x, p], nn.dense_int8_packed(x, p, units=n, k=k, group=4), t)
    (name, knobs), = kernel.attrs["schedules"]
    assert name == "nn.dense_int8_packed" and knobs["b_prepacked"] and knobs["shift"]
    a = rand((m, k), "int8")
    np.testing.assert_array_equal(evaluate(kernel, a, wp)[0], exact(a, wv.T))


# --- a constant conv2d weight packed at compile time (nn.conv2d_int8_packed) ----------------

PACKED_CONVS = [  # (data shape, weight shape, strides, padding, dilation): channels not a
    # multiple of 4, stride phases, dilation, 1×1, a 7×7 stem, an odd output width
    ((1, 5, 9, 11), (7, 5, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 13, 10, 9), (30, 13, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((1, 16, 8, 8), (33, 16, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((1, 3, 15, 15), (8, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),
    ((1, 6, 11, 9), (5, 6, 3, 2), (1, 2), (2, 0, 1, 1), (2, 1)),
]


def packed_conv_case(i: int, da: str, dw: str, case: tuple) -> tuple[kiln.Var, kiln.Expr,
                                                                    np.ndarray, np.ndarray]:
    """A conv2d of a constant weight plus a bias (a fused consumer), its input and answer."""
    xs, ws, strides, padding, dilation = case
    x = kiln.var(f"x{i}", shape=xs, dtype=da)
    w = rand(ws, dw)
    bias = RNG.integers(-1000, 1000, (1, ws[0], 1, 1)).astype(np.int32)
    body = kiln.op.add(nn.conv2d(x, kiln.const(w), strides=strides, padding=padding,
                                 dilation=dilation, channels=ws[0], kernel_size=ws[2:],
                                 out_dtype="int32"), kiln.const(bias))
    a = rand(xs, da)
    return x, body, a, conv_reference(a, w, strides, padding, dilation) + bias


@pytest.mark.parametrize("spec", [pytest.param(s, marks=slow_unless(s != PLAIN))
                                  for s in RUNNABLE])
def test_constant_conv_weight_packed_at_compile_time(spec: str) -> None:
    # the int8 convolution reading its input in place from channel-group planes: every pair
    # of dtypes (int8 × int8 shifted by +128 on VNNI), bit for bit
    t = runnable(spec)
    params, bodies, arrays, wants = [], [], [], []
    cases = PACKED_CONVS if spec == HOST else PACKED_CONVS[:2]
    for da, dw in PAIRS:
        for case in cases:
            x, body, a, want = packed_conv_case(len(params), da, dw, case)
            params.append(x)
            bodies.append(body)
            arrays.append(a)
            wants.append(want)
    exe = build_many(params, bodies, t)
    ops = {op for decl in exe.program.kernels.values() for op in decl.kernel.attrs["ops"]}
    assert "nn.conv2d_int8_packed" in ops and "nn.conv2d" not in ops, ops
    for got, want in zip(exe(*arrays), wants):
        np.testing.assert_array_equal(got, want)


def test_packed_conv_result_independent_of_threads() -> None:
    t = Target.parse(HOST)
    x, body, a, want = packed_conv_case(0, "int8", "int8",
                                        ((1, 24, 20, 20), (40, 24, 3, 3), (1, 1), (1, 1, 1, 1),
                                         (1, 1)))
    exe = build([x], body, t)
    for count in (1, 2, 3):
        with threads(count):
            np.testing.assert_array_equal(exe(a), want, err_msg=f"{count} threads")


@pytest.mark.parametrize("spec", [AVX512_VNNI, AVX_VNNI])
def test_constant_conv_weight_packed_for_vnni_in_the_evaluator(spec: str) -> None:
    # alter-layout packs bytes of 4 channels for VNNI; the kernel's +128 shift of int8 data,
    # its padding of 128 and the weight-sum correction are loop IR, exact on any machine
    t = Target.parse(spec)
    for da, dw in PAIRS:
        xs, ws, strides, padding, dilation = PACKED_CONVS[1 if da == "int8" else 4]
        x, body, a, _ = packed_conv_case(0, da, dw, PACKED_CONVS[0])
        with target_scope(t):
            text = kiln.astext(kiln.optimize(kiln.IRModule.from_expr(kiln.Function([x], body))))
        assert "nn.conv2d_int8_packed" in text, text[:800]
        chosen = int8_conv.plan(xs, ws, strides, padding[:2], dilation, 1, conv_out(
            xs, ws, strides, padding, dilation), da, dw, target=t)
        assert chosen is not None
        assert chosen.group == (2 if (da, dw) == ("uint8", "uint8") else 4)
        assert chosen.shift == ((da, dw) == ("int8", "int8"))
        w = rand(ws, dw)
        wp = pack_int8_conv_weight(w, 1, chosen.schedule.mr, chosen.group)
        xv = kiln.var("x", shape=xs, dtype=da)
        pv = kiln.var("wp", shape=wp.shape, dtype="int32")
        kernel = primitive_kernel([xv, pv], nn.conv2d_int8_packed(
            xv, pv, strides=strides, padding=padding, dilation=dilation, channels=ws[0],
            kernel_size=ws[2:], out_dtype="int32", weight_dtype=dw, group=chosen.group), t)
        (name, knobs), = kernel.attrs["schedules"]
        assert name == "nn.conv2d_int8_packed" and knobs["input"] == "channel-group planes"
        assert knobs["shifted"] == chosen.shift
        a = rand(xs, da)
        np.testing.assert_array_equal(evaluate(kernel, a, wp)[0],
                                      conv_reference(a, w, strides, padding, dilation))


def conv_out(xs: tuple, ws: tuple, strides: tuple, padding: tuple, dilation: tuple) -> tuple:
    """The NCHW output shape of a convolution (padding: top, left, bottom, right)."""
    sizes = [(xs[2 + d] + padding[d] + padding[d + 2] - (ws[2 + d] - 1) * dilation[d] - 1)
             // strides[d] + 1 for d in (0, 1)]
    return (xs[0], ws[0], *sizes)


@pytest.mark.parametrize("spec", [pytest.param(s, marks=slow_unless(s == HOST))
                                  for s in (*RUNNABLE, AVX512_VNNI)])
def test_zero_point_padding_folds_into_the_packed_conv(spec: str) -> None:
    # qnn.conv2d pads a quantized input with its zero point (nn.pad); alter-layout makes the
    # pad the packed convolution's own (pad_value), so no padded copy is written
    t = Target.parse(spec)
    for da, dw, zx in [("uint8", "int8", 7), ("int8", "int8", -3), ("uint8", "uint8", 200)]:
        xs, ws = (1, 5, 7, 6), (4, 5, 3, 3)
        x = kiln.var("x", shape=xs, dtype=da)
        w = rand(ws, dw)
        body = kiln.op.qnn.conv2d(x, kiln.const(w), kiln.const(zx, "int32"),
                                  kiln.const(0, "int32"), kiln.const(np.float32(0.1)),
                                  kiln.const(np.float32(0.2)), padding=(1, 2), channels=4,
                                  kernel_size=(3, 3), out_dtype="int32")
        with target_scope(t):
            text = kiln.astext(kiln.optimize(kiln.IRModule.from_expr(kiln.Function([x],
                                                                                   body))))
        assert "pad_value=" in text, text[:1500]
        # (a uint8 weight's zero point needs the window sums of the padded input too)
        assert ("nn.pad(" in text) == (dw == "uint8"), text[:1500]
        a = rand(xs, da)
        shifted = a.astype(np.int64) - zx  # the definition: (x - zx) * w, padded with zx
        want = conv_reference(shifted, w, (1, 1), (1, 2, 1, 2), (1, 1))
        if t.is_host:
            np.testing.assert_array_equal(build([x], body, t)(a), want)
        elif dw != "uint8":  # the lowering for a VNNI Target, in the loop evaluator (one
            # kernel; a uint8 weight's program keeps the pad and its window sums apart)
            with target_scope(t):
                kernel, args = kernel_and_constants([x], body, t)
            np.testing.assert_array_equal(evaluate(kernel, *[a if v is None else v
                                                            for v in args])[0], want)


def kernel_and_constants(params: list[kiln.Var], body: kiln.Expr, t: Target
                         ) -> tuple[Kernel, list[np.ndarray | None]]:
    """The one primitive of a fused function lowered for ``t``, and its call's arguments:
    the constants' values, None for the function's parameter."""
    fused = kiln.infer_types(kiln.optimize(kiln.IRModule.from_expr(kiln.Function(params, body))))
    call = next(c for c in post_order(fused["main"]) if isinstance(c, kiln.Call)
                and isinstance(c.op, kiln.Function) and c.op.attrs.get("Primitive"))
    args = [np.asarray(a.data) if isinstance(a, kiln.Constant) else None for a in call.args]
    return lower_primitive(call.op, "k", target=t), args
