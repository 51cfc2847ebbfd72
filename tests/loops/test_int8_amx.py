"""AMX: the `TileProduct` statement (evaluator, verifier, saved form, machine code) and the
8-bit convolution on tiles (kiln/loops/int8_amx.py), bit for bit against int64 products
written here.

Code for an AMX Target is checked in the loop evaluator on any machine; it runs natively
only where the host has AMX and Linux grants the tile state (those tests say so when they
skip)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen import assembly, compile_kernels, threads
from kiln.errors import InternalError
from kiln.ir.traverse import post_order
from kiln.loops import int8_amx
from kiln.loops.evaluate import evaluate
from kiln.loops.ir import Buffer, Const, Kernel, Load, TileProduct, Var
from kiln.loops.lower import lower_primitive
from kiln.loops.schedule import target_scope
from kiln.loops.verify import verify
from kiln.op import nn
from kiln.runtime.kernel_format import MalformedKernel, read_kernel, write_kernel
from kiln.target import Target

from .test_int8_gemm import conv_reference

AMX = "llvm -mcpu=sapphirerapids"  # AMX-INT8 (the table's features; code checked, not run)
VNNI = "llvm -mcpu=znver4"  # AVX-512-VNNI, no AMX
PAIRS = [("int8", "uint8"), ("uint8", "int8"), ("int8", "int8"), ("uint8", "uint8")]
RNG = np.random.default_rng(31)


@pytest.fixture(autouse=True)
def private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                  ) -> None:
    monkeypatch.setenv("KILN_CACHE", str(tmp_path_factory.getbasetemp() / "kiln-cache"))


def amx_host() -> Target:
    t = Target.host()
    if not int8_amx.usable(t):
        pytest.skip("this machine has no AMX-INT8 (or Linux did not grant the tile state)")
    return t


def words(shape: tuple[int, ...]) -> np.ndarray:
    """Random int32 words: every byte pattern, the extremes (0x80, 0x7F, 0xFF) often."""
    raw = RNG.integers(0, 256, (*shape, 4))
    edge = RNG.random(raw.shape) < 0.3
    raw = np.where(edge, RNG.choice([0x80, 0x7F, 0xFF, 0], raw.shape), raw)
    return raw.astype(np.uint8).view("<i4").reshape(shape).astype(np.int32)


# --- TileProduct --------------------------------------------------------------------------

STEPS = 3


def tile_kernel(ta: str, tb: str, name: str, b_size: int = STEPS * 16 * 32) -> Kernel:
    """C (32×32) = Σ_k A[k] (2 tiles of 16 rows × 64 values) · B[k] (2 tiles side by side)."""
    a = Buffer("A", (2, STEPS, 16, 16), "int32")
    b = Buffer("B", (b_size,), "int32")
    c = Buffer("C", (32 * 32,), "int32")
    k = Var("k")
    zero = Const(0)
    body = TileProduct(
        k, Const(STEPS), (Load(a, (zero, k, zero, zero)), Load(a, (Const(1), k, zero, zero))),
        (Load(b, (k * 512,)), Load(b, (k * 512 + 16,))),
        tuple(Load(c, (Const(i * 512 + j * 16),)) for i in range(2) for j in range(2)),
        16, 32, 32, ta, tb)
    return verify(Kernel(name, (a, b), (c,), body))


def tile_reference(a: np.ndarray, b: np.ndarray, ta: str, tb: str) -> np.ndarray:
    """The documented product, element by element in Python integers: C[m, n] = Σ over
    steps s, rows r of B and bytes q of A[m // 16, s, m % 16, byte 4r + q] · B[s, r, n, q]."""
    ab = a.astype("<i4").view(np.dtype(ta)).reshape(2, STEPS, 16, 64).astype(np.int64)
    bb = b.astype("<i4").view(np.dtype(tb)).reshape(STEPS, 16, 32, 4).astype(np.int64)
    out = np.zeros((32, 32), np.int64)
    for s in range(STEPS):
        for r in range(16):
            for q in range(4):
                col = ab[:, s, :, 4 * r + q].reshape(32)
                out += np.outer(col, bb[s, r, :, q])
    return ((out + 2**31) % 2**32 - 2**31).astype(np.int32).reshape(-1)


@pytest.mark.parametrize("ta,tb", PAIRS)
def test_tile_product_in_the_evaluator(ta: str, tb: str) -> None:
    kernel = tile_kernel(ta, tb, "t")
    a, b = words((2, STEPS, 16, 16)), words((STEPS * 16 * 32,))
    np.testing.assert_array_equal(evaluate(kernel, a, b)[0], tile_reference(a, b, ta, tb))


@pytest.mark.parametrize("ta,tb", PAIRS)
def test_tile_product_compiled(ta: str, tb: str) -> None:
    amx_host()
    kernel = tile_kernel(ta, tb, f"tiles_{ta}_{tb}")
    lib = compile_kernels([kernel])
    a, b = words((2, STEPS, 16, 16)), words((STEPS * 16 * 32,))
    out = np.zeros(32 * 32, np.int32)
    lib[kernel.name](a, b, out)
    np.testing.assert_array_equal(out, tile_reference(a, b, ta, tb))


@pytest.mark.parametrize("ta,tb,instruction", [("int8", "uint8", "tdpbsud"),
                                               ("uint8", "int8", "tdpbusd"),
                                               ("int8", "int8", "tdpbssd"),
                                               ("uint8", "uint8", "tdpbuud")])
def test_tile_product_instructions(ta: str, tb: str, instruction: str) -> None:
    # accumulators stay in tile registers over the steps: per step 4 loads and 4 products,
    # the configuration written once, the tiles stored after the loop
    asm = assembly(tile_kernel(ta, tb, "t"), target=AMX)
    lines = [x.split()[0] for x in asm.splitlines() if x.startswith("\t")]
    assert lines.count("ldtilecfg") == 1 and "tilerelease" in lines
    assert lines.count(instruction) % 4 == 0 and lines.count(instruction) > 0
    assert lines.count("tilestored") == 4
    with pytest.raises(InternalError, match="without amx"):
        assembly(tile_kernel(ta, tb, "t"), target=VNNI)


def test_verifier_bounds_every_tile() -> None:
    with pytest.raises(InternalError, match="cannot prove the tile read of B"):
        tile_kernel("int8", "uint8", "t", b_size=STEPS * 16 * 32 - 1)  # one word short
    a = Buffer("A", (16, 16), "int32")
    c = Buffer("C", (256,), "int32")
    k = Var("k")
    zero = Const(0)

    def kernel(steps: object, c_ref: Load, outputs: tuple) -> Kernel:
        tile = TileProduct(k, steps, (Load(a, (zero, zero)),), (Load(a, (zero, zero)),),
                           (c_ref,), 16, 16, 16)
        return verify(Kernel("t", (a,), outputs, tile))

    kernel(Const(2), Load(c, (zero,)), (c,))  # fine
    with pytest.raises(InternalError, match="input A is written"):
        kernel(Const(1), Load(a, (zero, zero)), (c,))
    with pytest.raises(InternalError, match="constant number of steps"):
        kernel(Const(0), Load(c, (zero,)), (c,))
    with pytest.raises(InternalError, match="outside its scope"):
        kernel(Const(1), Load(c, (k,)), (c,))  # C is stored after the steps
    with pytest.raises(InternalError, match="8 tiles at most"):
        TileProduct(k, Const(1), (Load(a, (zero, zero)),) * 3, (Load(a, (zero, zero)),) * 2,
                    (Load(c, (zero,)),) * 6, 16, 16, 16)  # 11 tiles live


def test_tile_product_saves_and_loads() -> None:
    kernel = tile_kernel("uint8", "int8", "t")
    again = read_kernel(write_kernel(kernel))
    a, b = words((2, STEPS, 16, 16)), words((STEPS * 16 * 32,))
    np.testing.assert_array_equal(evaluate(again, a, b)[0], evaluate(kernel, a, b)[0])
    doc = write_kernel(kernel)
    entry = next(n for n in doc["nodes"] if n[0] == "TileProduct")
    entry[7] = 33  # B's rows one word further apart: the last tile ends past the buffer
    with pytest.raises(MalformedKernel, match="cannot prove the tile read"):
        read_kernel(doc)
    entry[7], entry[9] = 32, "int4"
    with pytest.raises(MalformedKernel, match="tile product"):
        read_kernel(doc)


# --- the convolution on tiles ---------------------------------------------------------------

CONVS = [  # (data shape, weight shape, strides, padding (t, l, b, r), dilation): channels not
    # a multiple of 64, an odd number of 16-channel tiles, stride phases, 1×1, dilation, batch
    ((1, 64, 9, 8), (32, 64, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((2, 40, 7, 9), (20, 40, 3, 3), (2, 2), (1, 1, 1, 1), (1, 1)),
    ((1, 96, 5, 5), (48, 96, 1, 1), (1, 1), (0, 0, 0, 0), (1, 1)),
    ((1, 33, 10, 7), (17, 33, 3, 2), (1, 2), (2, 0, 1, 1), (2, 1)),
    # fewer than 32 channels: the "taps" form (a 7×7 stem, 3×3, a row of 5 taps, dilation)
    ((1, 3, 15, 15), (20, 3, 7, 7), (2, 2), (3, 3, 3, 3), (1, 1)),
    ((2, 16, 6, 7), (16, 16, 3, 3), (1, 1), (1, 1, 1, 1), (1, 1)),
    ((1, 6, 11, 9), (5, 6, 3, 5), (1, 2), (2, 0, 1, 1), (2, 1)),
]


def rand8(shape: tuple[int, ...], dtype: str) -> np.ndarray:
    info = np.iinfo(dtype)
    x = RNG.integers(info.min, int(info.max) + 1, shape)
    edge = RNG.random(shape) < 0.2
    return np.where(edge, np.where(RNG.random(shape) < 0.5, info.min, info.max), x).astype(dtype)


def conv_call(i: int, da: str, dw: str, case: tuple, pad_value: int = 0
              ) -> tuple[kiln.Var, kiln.Expr, np.ndarray, np.ndarray]:
    """An 8-bit conv2d of a constant weight plus a bias, its input and its answer."""
    xs, ws, strides, padding, dilation = case
    x = kiln.var(f"x{i}", shape=xs, dtype=da)
    w = rand8(ws, dw)
    bias = RNG.integers(-1000, 1000, (1, ws[0], 1, 1)).astype(np.int32)
    data: kiln.Expr = x
    if pad_value:  # a quantized input's zero point, folded into the convolution
        top, left, bottom, right = padding
        data = nn.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)),
                      kiln.const(np.array(pad_value, da)))
    conv = nn.conv2d(data, kiln.const(w), strides=strides, dilation=dilation,
                     padding=(0, 0, 0, 0) if pad_value else padding, channels=ws[0],
                     kernel_size=ws[2:], out_dtype="int32")
    a = rand8(xs, da)
    want = conv_reference(a, w, strides, padding, dilation, pad_value=pad_value) + bias
    return x, kiln.op.add(conv, kiln.const(bias)), a, want


def build_all(calls: list, t: Target) -> tuple[kiln.Executable, list[np.ndarray],
                                               list[np.ndarray]]:
    """One executable of every ``call(i)`` (its variable, body, input and answer), its
    inputs and answers: one build for many kernels."""
    cases = [call(i) for i, call in enumerate(calls)]
    params, bodies = [c[0] for c in cases], [c[1] for c in cases]
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function(params, kiln.Tuple(bodies))),
                     target=t)
    return exe, [c[2] for c in cases], [c[3] for c in cases]


def test_convolutions_on_tiles_exact() -> None:
    # every pair of dtypes on every shape, one executable; alter-layout chose the tiles
    t = amx_host()
    exe, arrays, wants = build_all([lambda i, p=pair, c=case: conv_call(i, *p, c)
                                    for pair in PAIRS for case in CONVS], t)
    ops = {op for decl in exe.program.kernels.values() for op in decl.kernel.attrs["ops"]}
    assert "nn.conv2d_int8_tiled" in ops and "nn.conv2d" not in ops, ops
    for got, want in zip(exe(*arrays), wants):
        np.testing.assert_array_equal(got, want)


def test_zero_point_padding_folds_into_the_tiled_conv() -> None:
    t = amx_host()
    x, body, a, want = conv_call(0, "uint8", "int8", CONVS[1], pad_value=131)
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x], body)), target=t)
    ops = {op for decl in exe.program.kernels.values() for op in decl.kernel.attrs["ops"]}
    assert "nn.pad" not in ops and "nn.conv2d_int8_tiled" in ops, ops
    np.testing.assert_array_equal(exe(a), want)


def test_tiled_conv_result_independent_of_threads() -> None:
    t = amx_host()
    x, body, a, want = conv_call(0, "int8", "int8", ((1, 64, 20, 20), (80, 64, 3, 3), (1, 1),
                                                     (1, 1, 1, 1), (1, 1)))
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x], body)), target=t)
    for count in (1, 2, 3):
        with threads(count):
            np.testing.assert_array_equal(exe(a), want, err_msg=f"{count} threads")


def primitive_kernel(params: list[kiln.Var], body: kiln.Expr, t: Target) -> Kernel:
    fused = kiln.infer_types(kiln.optimize(kiln.IRModule.from_expr(kiln.Function(params, body))))
    prim = next(f for f in post_order(fused["main"])
                if isinstance(f, kiln.Function) and f.attrs.get("Primitive"))
    return lower_primitive(prim, "k", target=t)


@pytest.mark.parametrize("case", [CONVS[1], CONVS[3], CONVS[4], CONVS[6]])
def test_tiled_conv_in_the_evaluator(case: tuple) -> None:
    # the AMX lowering for an AMX Target, exact on any machine: the planes, the tap table,
    # an odd tile of output channels, the pixels past the last
    from kiln.op.nn.int8_tiled import pack_tiled_conv_weight

    t = Target.parse(AMX)
    xs, ws, strides, padding, dilation = case
    form = "channels" if xs[1] >= int8_amx.MIN_CHANNELS else "taps"
    w = rand8(ws, "int8")
    wt = pack_tiled_conv_weight(w, form)
    xv = kiln.var("x", shape=xs, dtype="uint8")
    pv = kiln.var("wt", shape=wt.shape, dtype="int32")
    kernel = primitive_kernel([xv, pv], nn.conv2d_int8_tiled(
        xv, pv, strides=strides, padding=padding, dilation=dilation, channels=ws[0],
        kernel_size=ws[2:], out_dtype="int32", weight_dtype="int8", form=form), t)
    (name, knobs), = kernel.attrs["schedules"]
    assert name == "nn.conv2d_int8_tiled" and (knobs["kernel"], knobs["form"]) == ("amx", form)
    a = rand8(xs, "uint8")
    np.testing.assert_array_equal(evaluate(kernel, a, wt)[0],
                                  conv_reference(a, w, strides, padding, dilation))


def test_alter_layout_tiles_only_for_amx() -> None:
    x, body, _, _ = conv_call(0, "uint8", "int8", CONVS[0])
    mod = kiln.IRModule.from_expr(kiln.Function([x], body))
    for spec, op in ((AMX, "nn.conv2d_int8_tiled"), (VNNI, "nn.conv2d_int8_packed")):
        with target_scope(Target.parse(spec)):
            text = kiln.astext(kiln.optimize(mod))
        assert op in text, (spec, text[:600])
    small, body, _, _ = conv_call(1, "uint8", "int8", CONVS[4])
    with target_scope(Target.parse(AMX)):  # 3 channels: words of 4 taps, not of 4 channels
        text = kiln.astext(kiln.optimize(kiln.IRModule.from_expr(kiln.Function([small], body))))
    assert "nn.conv2d_int8_tiled" in text and 'form="taps"' in text, text[:600]


# --- dense on tiles ----------------------------------------------------------------------

DENSES = [(37, 50, 100), (64, 512, 784), (8, 16, 32), (33, 17, 65), (2, 3, 48, 40)]


def dense_call(i: int, dtype: str, shape: tuple) -> tuple[kiln.Var, kiln.Expr, np.ndarray,
                                                          np.ndarray]:
    *lead, n, k = shape
    x = kiln.var(f"x{i}", shape=(*lead, k), dtype=dtype)
    w = rand8((n, k), dtype)
    a = rand8((*lead, k), dtype)
    want = (a.astype(np.int64) @ w.T.astype(np.int64)).astype(np.int32)
    return x, nn.dense(x, kiln.const(w), out_dtype="int32"), a, want


def test_dense_on_tiles_exact() -> None:
    # int8 and uint8 (nn.dense takes one dtype), rows and units not multiples of 16 or 32,
    # K not of 64, leading axes
    t = amx_host()
    exe, arrays, wants = build_all([lambda i, d=dtype, sh=shape: dense_call(i, d, sh)
                                    for dtype in ("int8", "uint8") for shape in DENSES], t)
    ops = {op for decl in exe.program.kernels.values() for op in decl.kernel.attrs["ops"]}
    assert "nn.dense_int8_tiled" in ops and "nn.dense" not in ops, ops
    for count in (1, 2):
        with threads(count):
            for got, want in zip(exe(*arrays), wants):
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype,shape", [("int8", (37, 50, 100)), ("uint8", (33, 17, 65))])
def test_dense_on_tiles_in_the_evaluator(dtype: str, shape: tuple) -> None:
    from kiln.op.nn.int8_tiled import pack_tiled_dense_weight

    t = Target.parse(AMX)
    m, n, k = shape
    w = rand8((n, k), dtype)
    wt = pack_tiled_dense_weight(w)
    xv = kiln.var("x", shape=(m, k), dtype=dtype)
    pv = kiln.var("wt", shape=wt.shape, dtype="int32")
    kernel = primitive_kernel([xv, pv], nn.dense_int8_tiled(xv, pv, units=n, k=k,
                                                            weight_dtype=dtype), t)
    (name, knobs), = kernel.attrs["schedules"]
    assert name == "nn.dense_int8_tiled" and knobs["kernel"] == "amx"
    a = rand8((m, k), dtype)
    np.testing.assert_array_equal(evaluate(kernel, a, wt)[0],
                                  (a.astype(np.int64) @ w.T.astype(np.int64)).astype(np.int32))
