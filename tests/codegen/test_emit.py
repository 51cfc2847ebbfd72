"""Every loop-IR construct, compiled to machine code, against the loop-IR evaluator.

The kernels are written by hand, small enough for the evaluator; results must agree bit for
bit wherever the code generator promises IEEE arithmetic (everything but transcendentals),
and to a few ulp otherwise. Where the code generator defines what numpy leaves undefined
(float → int conversion out of range, integer division by zero), the expected values are
written out.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen import compile_kernels, llvm_ir
from kiln.loops.ir import (
    FMA,
    Allocate,
    Binary,
    Broadcast,
    Buffer,
    Cast,
    Check,
    Const,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Load,
    Select,
    Seq,
    Store,
    Unary,
    Var,
)

from .conftest import assert_same, run_compiled

RNG = np.random.default_rng(7)


def elementwise(name: str, dtypes: list[str], out_dtype: str, n: int, fn, kind: str = "serial",
                ) -> Kernel:  # noqa: ANN001
    """``out[i] = fn(in0[i], in1[i], ...)`` over a 1-D extent ``n``."""
    ins = tuple(Buffer(f"x{k}", (n,), dt) for k, dt in enumerate(dtypes))
    out = Buffer("y", (n,), out_dtype)
    i = Var("i")
    body = For(i, Const(0), Const(n), Store(out, (i,), fn(*(Load(b, (i,)) for b in ins))), kind)
    return Kernel(name, ins, (out,), body)


def test_the_calling_convention_is_a_pointer_array() -> None:
    k = elementwise("copy", ["float32"], "float32", 4, lambda x: x)
    text = llvm_ir(k)
    assert "(ptr %" in text and "noalias" in text and "dereferenceable(16)" in text
    x = np.arange(4, dtype=np.float32)
    (y,) = run_compiled(k, x)
    np.testing.assert_array_equal(y, x)


@pytest.mark.parametrize("kind", ["serial", "vectorized", "unrolled", "parallel", "scalar",
                                  "rolled"])
def test_loop_kinds(kind: str) -> None:
    n = 37
    k = elementwise(f"loop_{kind}", ["float32", "float32"], "float32", n,
                    lambda a, b: Binary("add", Binary("mul", a, b), a), kind)
    assert_same(k, RNG.standard_normal(n).astype("float32"),
                RNG.standard_normal(n).astype("float32"))
    # a rolled loop asks LLVM neither to vectorize nor to unroll it
    assert ("llvm.loop.unroll.disable" in llvm_ir(k)) == (kind == "rolled")


@pytest.mark.parametrize("n", [14, 37, 100, 112, 130])
def test_short_vectorized_loops_fold_their_tail_on_avx512(n: int) -> None:
    # A vectorized loop shorter than FOLD_TAIL_MAX and not a whole number of 16-lane vectors
    # asks LLVM for masked steps instead of a scalar tail, where the target has AVX-512's
    # masks; the results stay bit for bit (run where the host can)
    from kiln.codegen.emit import FOLD_TAIL_LANES, FOLD_TAIL_MAX
    from kiln.target import Target

    k = elementwise(f"fold_{n}", ["float32", "float32"], "float32", n,
                    lambda a, b: Binary("add", Binary("mul", a, b), a), "vectorized")
    hint = "llvm.loop.vectorize.predicate.enable"
    folds = n % FOLD_TAIL_LANES != 0 and n < FOLD_TAIL_MAX
    assert (hint in llvm_ir(k, target=Target.parse("llvm -mcpu=znver4"))) == folds
    assert hint not in llvm_ir(k, target=Target.parse("llvm -mcpu=znver3"))  # AVX2
    assert_same(k, RNG.standard_normal(n).astype("float32"),
                RNG.standard_normal(n).astype("float32"))


def test_loops_with_offsets_empty_extents_and_nesting() -> None:
    x = Buffer("x", (4, 6), "int32")
    y = Buffer("y", (4, 6), "int32")
    i, j, e = Var("i"), Var("j"), Var("e")
    body = Seq((
        For(i, Const(0), Const(4), For(j, Const(0), Const(6), Store(y, (i, j), Const(0, "int32")))),
        For(i, Const(1), Const(3), For(j, Const(2), Const(0), Store(y, (i, j), Const(5, "int32")))),
        LetStmt(e, Const(3), For(i, Const(1), e,
                                 For(j, Const(2), Const(4),
                                     Store(y, (i, j), Load(x, (i, j)) * Const(2, "int32"))))),
    ))
    k = Kernel("nest", (x,), (y,), body)
    assert_same(k, RNG.integers(-9, 9, size=(4, 6)).astype("int32"))


def test_let_if_else_select_and_a_shared_subexpression() -> None:
    n = 16
    x = Buffer("x", (n,), "float32")
    y = Buffer("y", (n,), "float32")
    i, v = Var("i"), Var("v", "float32")
    shared = Unary("abs", Load(x, (i,)))  # used three times: emitted once per statement
    deep = shared
    for _ in range(300):  # hundreds deep: the emitter must not recurse
        deep = Binary("add", deep, Const(0.0, "float32"))
    body = For(i, Const(0), Const(n), LetStmt(v, Binary("mul", shared, shared), IfThenElse(
        Binary("gt", Load(x, (i,)), Const(0.0, "float32")),
        Store(y, (i,), Select(Binary("lt", v, Const(1.0, "float32")), v, deep)),
        Store(y, (i,), Binary("sub", Const(0.0, "float32"), v)))))
    k = Kernel("branches", (x,), (y,), body)
    assert_same(k, RNG.standard_normal(n).astype("float32") * 2)


def test_vectors_broadcast_and_fma() -> None:
    x = Buffer("x", (4, 16), "float32")
    w = Buffer("w", (16,), "float32")
    s = Buffer("s", (), "float32")
    y = Buffer("y", (4, 16), "float32")
    i, j = Var("i"), Var("j")
    lanes = 8
    value = FMA(Load(x, (i, j * lanes), lanes), Load(w, (j * lanes,), lanes),
                Broadcast(Load(s, ()), lanes))
    body = For(i, Const(0), Const(4), For(j, Const(0), Const(2),
                                          Store(y, (i, j * lanes), value)), "parallel")
    k = Kernel("vec", (x, w, s), (y,), body)
    xs = RNG.standard_normal((4, 16)).astype("float32")
    ws = RNG.standard_normal(16).astype("float32")
    ss = np.array(0.5, dtype="float32")
    (got,) = assert_same(k, xs, ws, ss)
    # One rounding: exactly the float64 product-sum rounded once.
    exact = (xs.astype(np.float64) * ws + 0.5).astype(np.float32)
    np.testing.assert_array_equal(got, exact)


def test_vector_select_compare_and_bool_memory() -> None:
    x = Buffer("x", (16,), "float32")
    m = Buffer("m", (16,), "bool")
    y = Buffer("y", (16,), "float32")
    b = Buffer("b", (16,), "bool")
    j = Var("j")
    xv = Load(x, (j * 8,), 8)
    mask = Binary("and", Load(m, (j * 8,), 8), Binary("gt", xv, Const(0.0, "float32", 8)))
    body = For(j, Const(0), Const(2), Seq((
        Store(y, (j * 8,), Select(mask, xv, Unary("neg", xv))),
        Store(b, (j * 8,), Unary("not", mask)))))
    k = Kernel("vsel", (x, m), (y, b), body)
    assert_same(k, RNG.standard_normal(16).astype("float32"), RNG.random(16) < 0.5)


INT_OPS = ["add", "sub", "mul", "floordiv", "floormod", "truncdiv", "truncmod", "min", "max",
           "and", "or", "xor", "lt", "le", "gt", "ge", "eq", "ne"]


@pytest.mark.parametrize("dtype", ["int8", "int32", "int64", "uint8", "uint32"])
@pytest.mark.parametrize("lanes", [1, 4])
def test_integer_semantics(dtype: str, lanes: int) -> None:
    info = np.iinfo(dtype)
    a = RNG.integers(info.min, info.max, size=64, endpoint=True).astype(dtype)
    b = RNG.integers(-7 if info.min < 0 else 0, 8, size=64).astype(dtype)
    a[:6] = [info.min, info.min, info.max, 0, 7, info.max][:6]
    b[:6] = [-1 if info.min < 0 else 1, 0, 0, 5, -3 if info.min < 0 else 3, 1]
    n = 64 // lanes
    for op in INT_OPS:
        out_dtype = "bool" if op in ("lt", "le", "gt", "ge", "eq", "ne") else dtype
        x, y = Buffer("a", (64,), dtype), Buffer("b", (64,), dtype)
        o = Buffer("o", (64,), out_dtype)
        i = Var("i")
        body = For(i, Const(0), Const(n), Store(o, (i * lanes,), Binary(
            op, Load(x, (i * lanes,), lanes), Load(y, (i * lanes,), lanes))))
        k = Kernel(f"int_{op}", (x, y), (o,), body)
        with np.errstate(all="ignore"):
            assert_same(k, a, b)


def test_integer_division_by_zero_and_overflow_never_trap() -> None:
    n = 4
    k = elementwise("idiv", ["int32", "int32"], "int32", n,
                    lambda a, b: Binary("floordiv", a, b))
    m = elementwise("imod", ["int32", "int32"], "int32", n,
                    lambda a, b: Binary("floormod", a, b))
    a = np.array([7, -7, -2**31, 5], dtype="int32")
    b = np.array([0, 0, -1, -2], dtype="int32")
    np.testing.assert_array_equal(run_compiled(k, a, b)[0], [0, 0, -2**31, -3])
    np.testing.assert_array_equal(run_compiled(m, a, b)[0], [0, 0, 0, -1])


def test_integer_power_and_unary() -> None:
    a = np.array([2, -3, 0, 5, 1, -1, 7, 3], dtype="int64")
    e = np.array([10, 3, 0, 0, 9, 5, 1, 2], dtype="int64")
    k = elementwise("ipow", ["int64", "int64"], "int64", 8, lambda x, y: Binary("pow", x, y))
    assert_same(k, a, e)
    neg = elementwise("ineg", ["int64", "int64"], "int64", 8, lambda x, y: Binary("pow", x, y))
    np.testing.assert_array_equal(run_compiled(neg, a, -e - 1)[0][:3], [0, 0, 0])
    for op in ["neg", "abs", "sign", "not", "floor", "round"]:
        u = elementwise(f"iu_{op}", ["int32"], "int32", 8, lambda x, op=op: Unary(op, x))
        assert_same(u, np.array([0, 1, -1, 7, -9, 2**31 - 1, -2**31, 3], dtype="int32"))


FLOAT_BINARY = ["add", "sub", "mul", "div", "floordiv", "floormod", "min", "max", "pow", "lt",
                "le", "gt", "ge", "eq", "ne"]


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_float_binary_semantics(dtype: str) -> None:
    specials = [np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -2.5, 3.0]
    a = np.concatenate([np.repeat(specials, 8), RNG.standard_normal(32) * 4]).astype(dtype)
    b = np.concatenate([np.tile(specials, 8), RNG.standard_normal(32) * 4]).astype(dtype)
    for op in FLOAT_BINARY:
        out_dtype = "bool" if op in ("lt", "le", "gt", "ge", "eq", "ne") else dtype
        k = elementwise(f"f_{op}", [dtype, dtype], out_dtype, len(a),
                        lambda x, y, op=op: Binary(op, x, y), "vectorized")
        # pow calls libm, whose last bit may differ from numpy's.
        tol = 2e-7 if op == "pow" and dtype != "float16" else 0.0
        with np.errstate(all="ignore"):
            assert_same(k, a, b, rtol=tol)


def test_min_max_propagate_nan_like_numpy() -> None:
    k = elementwise("fmax", ["float32", "float32"], "float32", 4,
                    lambda x, y: Binary("max", x, y))
    a = np.array([np.nan, 1.0, 2.0, -1.0], dtype="float32")
    b = np.array([1.0, np.nan, 1.0, 0.0], dtype="float32")
    np.testing.assert_array_equal(run_compiled(k, a, b)[0], np.maximum(a, b))


@pytest.mark.parametrize("dtype", ["float16", "float32", "float64"])
def test_float_unary(dtype: str) -> None:
    x = np.concatenate([[np.nan, np.inf, -np.inf, 0.0, -0.0, 0.5, -0.5, 2.5, -2.5, 1e-3],
                        RNG.standard_normal(54) * 3]).astype(dtype)
    for op in ["neg", "abs", "sqrt", "rsqrt", "floor", "ceil", "round", "nearbyint", "sign"]:
        k = elementwise(f"fu_{op}", [dtype], dtype, len(x), lambda v, op=op: Unary(op, v),
                        "vectorized")
        with np.errstate(all="ignore"):
            assert_same(k, x)
    for op in ["exp", "log", "tanh", "sigmoid", "erf", "sin", "cos"]:
        k = elementwise(f"ft_{op}", [dtype], dtype, len(x), lambda v, op=op: Unary(op, v),
                        "vectorized")
        rtol = {"float16": 1e-3, "float32": 1e-6, "float64": 1e-13}[dtype]
        with np.errstate(all="ignore"):
            assert_same(k, x, rtol=rtol, atol=rtol * 1e-3)


CAST_DTYPES = ["bool", "int8", "uint8", "int32", "uint32", "int64", "float16", "float32",
               "float64"]


@pytest.mark.parametrize("src", CAST_DTYPES)
def test_casts_in_range(src: str) -> None:
    if src == "bool":
        x = RNG.random(16) < 0.5
    elif src.startswith("float"):
        x = np.concatenate([[0.0, -0.0, 1.5, -1.5, 100.7, 0.999], RNG.random(10) * 100]).astype(src)
    else:
        x = RNG.integers(0, 100, size=16).astype(src)
    for dst in CAST_DTYPES:
        k = elementwise(f"cast_{dst}", [src], dst, len(x), lambda v, dst=dst: Cast(dst, v))
        # Negative floats are out of range for unsigned integers (they saturate, below).
        assert_same(k, np.abs(x) if dst.startswith("uint") and src != "bool" else x)


def test_float_to_int_out_of_range_saturates() -> None:
    x = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 1e20, 255.9, -1.5], dtype="float32")
    want = {
        "int32": [0, 2**31 - 1, -2**31, 2**31 - 1, -2**31, 2**31 - 1, 255, -1],
        "uint8": [0, 255, 0, 255, 0, 255, 255, 0],
        "int64": [0, 2**63 - 1, -2**63, 3000000000, -3000000000, 2**63 - 1, 255, -1],
        "bool": [True, True, True, True, True, True, True, True],
    }
    for dst, expected in want.items():
        k = elementwise(f"sat_{dst}", ["float32"], dst, len(x), lambda v, dst=dst: Cast(dst, v),
                        "vectorized")
        np.testing.assert_array_equal(run_compiled(k, x)[0], np.array(expected, dtype=dst))


@pytest.mark.parametrize("src", ["float32", "float64"])
def test_float_to_narrow_int_saturates_at_every_boundary(src: str) -> None:
    # int8/16/32 conversions are compares and selects around a plain conversion (they
    # vectorize): truncation toward zero, saturation on both sides, NaN -> 0, checked
    # against numpy's float64 arithmetic on a vector's lanes and a tail
    edges = [np.nan, np.inf, -np.inf, 0.0, -0.0, 0.99, -0.99, 127.6, 128.0, -128.6, -129.0,
             255.6, 256.0, 32767.6, 32768.0, -32768.7, 65535.4, 65536.0, 2147483520.0,
             2147483648.0, -2147483648.0, -2147483904.0, 3e9, -3e9, 1e30, -7.9]
    x = np.tile(np.array(edges, dtype=src), 3)
    wide = np.nan_to_num(x.astype(np.float64), nan=0.0, posinf=1e300, neginf=-1e300)
    for dst in ("int8", "uint8", "int16", "uint16", "int32"):
        info = np.iinfo(dst)
        want = np.clip(np.trunc(wide), info.min, info.max).astype(dst)
        k = elementwise(f"narrow_{dst}", [src], dst, len(x), lambda v, dst=dst: Cast(dst, v),
                        "vectorized")
        np.testing.assert_array_equal(run_compiled(k, x)[0], want, err_msg=f"{src} -> {dst}")


def test_constants_of_every_dtype() -> None:
    for dtype, value in [("uint64", 2**64 - 1), ("int64", -2**63), ("float16", 0.1),
                         ("float32", 0.1), ("float64", 0.1), ("bool", True), ("uint8", 255),
                         ("float32", float("inf")), ("float32", float("nan"))]:
        o = Buffer("o", (3,), dtype)
        i = Var("i")
        k = Kernel("const", (), (o,), For(i, Const(0), Const(3), Store(o, (i,),
                                                                      Const(value, dtype))))
        assert_same(k)


def test_local_buffers_on_the_stack_and_the_heap() -> None:
    for n in (8, 64 * 1024):  # 32 bytes (a register tile) and 256 KiB (malloc)
        x = Buffer("x", (n,), "float32")
        y = Buffer("y", (), "float32")
        t = Buffer("t", (n,), "float32", "local")
        acc = Buffer("acc", (1,), "float64", "local")
        i = Var("i")
        z = (Const(0),)
        body = Allocate(t, Allocate(acc, Seq((
            For(i, Const(0), Const(n), Store(t, (i,), Binary("mul", Load(x, (i,)),
                                                             Load(x, (i,)))), "vectorized"),
            Store(acc, z, Const(0.0, "float64")),
            For(i, Const(0), Const(n), Store(acc, z, Binary(
                "add", Load(acc, z), Cast("float64", Load(t, (i,)))))),
            Store(y, (), Cast("float32", Load(acc, z)))))))
        k = Kernel(f"alloc{n}", (x,), (y,), body)
        xs = RNG.standard_normal(n).astype("float32")
        if n > 100:
            (got,) = run_compiled(k, xs)
            np.testing.assert_allclose(got, np.sum(xs.astype(np.float64) ** 2), rtol=1e-6)
            assert "malloc" in llvm_ir(k)
        else:
            assert_same(k, xs)


def test_a_failed_check_raises_eval_error_with_its_message() -> None:
    x = Buffer("x", (6,), "int32")
    y = Buffer("y", (6,), "int32")
    big = Buffer("big", (100_000,), "int32", "local")  # heap: freed on the early return
    i = Var("i")
    body = Allocate(big, For(i, Const(0), Const(6), Seq((
        Check(Binary("ge", Load(x, (i,)), Const(0, "int32")), "x must be non-negative"),
        Check(Binary("ne", Load(x, (i,)), Const(0, "int32")), "x must not be 0"),
        Store(big, (i,), Load(x, (i,))),
        Store(y, (i,), Binary("truncdiv", Const(60, "int32"), Load(big, (i,))))))))
    k = Kernel("checked", (x,), (y,), body)
    lib = compile_kernels([k])
    out = np.empty(6, dtype="int32")
    lib["checked"](np.array([1, 2, 3, 4, 5, 6], dtype="int32"), out)
    np.testing.assert_array_equal(out, [60, 30, 20, 15, 12, 10])
    with pytest.raises(kiln.EvalError, match="must not be 0"):
        lib["checked"](np.array([1, 2, 0, 4, 5, 6], dtype="int32"), out)
    with pytest.raises(kiln.EvalError, match="non-negative"):
        lib["checked"](np.array([1, -2, 0, 4, 5, 6], dtype="int32"), out)
    for _ in range(200):  # no leak, no crash when failing repeatedly
        with pytest.raises(kiln.EvalError):
            lib["checked"](np.array([0, 1, 1, 1, 1, 1], dtype="int32"), out)


def test_a_check_inside_a_parallel_loop() -> None:
    n = 1 << 12
    x = Buffer("x", (n,), "float32")
    y = Buffer("y", (n,), "float32")
    i = Var("i")
    body = For(i, Const(0), Const(n), Seq((
        Check(Binary("eq", Load(x, (i,)), Load(x, (i,))), "x has a NaN"),
        Store(y, (i,), Unary("sqrt", Load(x, (i,)))))), "parallel")
    lib = compile_kernels([Kernel("pcheck", (x,), (y,), body)])
    xs = np.ones(n, dtype="float32")
    out = np.empty_like(xs)
    lib["pcheck"](xs, out)
    xs[n - 3] = np.nan
    with kiln.codegen.threads(2), pytest.raises(kiln.EvalError, match="NaN"):
        lib["pcheck"](xs, out)


def test_arguments_are_checked_before_native_code_runs() -> None:
    k = elementwise("args", ["float32"], "float32", 4, lambda v: v)
    f = compile_kernels([k])["args"]
    good = np.zeros(4, dtype="float32")
    for bad in (np.zeros(5, dtype="float32"), np.zeros(4, dtype="float64"),
                np.zeros(8, dtype="float32")[::2], [0.0, 0.0, 0.0, 0.0]):
        with pytest.raises(kiln.Error):
            f(bad, good)  # type: ignore[arg-type]
    with pytest.raises(kiln.Error):
        f(good)
    readonly = np.zeros(4, dtype="float32")
    readonly.flags.writeable = False
    with pytest.raises(kiln.Error):
        f(good, readonly)


def test_int32_loop_variables_and_indices() -> None:
    x = Buffer("x", (5, 3), "float32")
    y = Buffer("y", (3, 5), "float32")
    i, j = Var("i", "int32"), Var("j", "int32")
    body = For(i, Const(0, "int32"), Const(5, "int32"), For(
        j, Const(0, "int32"), Const(3, "int32"), Store(y, (j, i), Load(x, (i, j))), "unrolled"))
    k = Kernel("i32", (x,), (y,), body)
    assert_same(k, RNG.standard_normal((5, 3)).astype("float32"))


def test_index_arithmetic_of_a_reshape() -> None:
    x = Buffer("x", (6, 4), "float32")
    y = Buffer("y", (24,), "float32")
    i = Var("i")
    body = For(i, Const(0), Const(24), Store(y, (i,), Load(x, ((i // 4) % 6, i % 4))),
               "vectorized")
    k = Kernel("reshape", (x,), (y,), body)
    assert_same(k, RNG.standard_normal((6, 4)).astype("float32"))


@pytest.mark.parametrize("dims", [(4, 3, 16), (2, 6, 16), (3, 2, 2, 32)])
def test_a_flat_position_split_into_coordinates_is_addressed_flat(dims: tuple) -> None:
    # x[f // (b·c·d), (f // (c·d)) % b, (f // d) % c, f % d] with f = r·w + i over rows r
    # and a vectorized i: the pairs join back into f (kiln/codegen/emit_expr.py `_rejoin`),
    # so the copy loads vectors where the coordinates made LLVM gather, and the values are
    # the evaluator's
    from kiln.codegen.compile import optimized_ir
    from kiln.target import Target

    x = Buffer("x", dims, "float32")
    n = int(np.prod(dims))
    w = dims[-1] * 2
    y = Buffer("y", (n // w, w), "float32")
    r, i = Var("r"), Var("i")
    f = i + r * w  # one object in every coordinate, as the reshape lowering makes it
    idx, step = [], n
    for d in dims:
        step //= d
        idx.append(f // step if step * d == n else (f // step) % d if step > 1 else f % d)
    body = For(r, Const(0), Const(n // w), For(i, Const(0), Const(w), Store(
        y, (r, i), Load(x, tuple(idx))), "vectorized"))
    k = Kernel(f"flat_{len(dims)}", (x,), (y,), body)
    text = optimized_ir(k, target=Target.parse("llvm -mcpu=znver4"))
    assert "gather" not in text and "x float>" in text  # vector loads, not gathers
    a = RNG.standard_normal(dims).astype("float32")
    (got,) = run_compiled(k, a)
    np.testing.assert_array_equal(got.reshape(-1), a.reshape(-1))
    assert_same(k, a)


def test_zero_sized_buffers_and_scalars() -> None:
    x = Buffer("x", (0, 3), "float32")
    s = Buffer("s", (), "float32")
    y = Buffer("y", (0, 3), "float32")
    t = Buffer("t", (), "float32")
    i, j = Var("i"), Var("j")
    body = Seq((For(i, Const(0), Const(0), For(j, Const(0), Const(3),
                                               Store(y, (i, j), Load(x, (i, j))))),
                Store(t, (), Binary("mul", Load(s, ()), Const(2.0, "float32")))))
    k = Kernel("empty", (x, s), (y, t), body)
    assert_same(k, np.zeros((0, 3), "float32"), np.array(1.5, "float32"))


def test_every_opt_level_compiles() -> None:
    k = elementwise("levels", ["float32", "float32"], "float32", 40,
                    lambda a, b: Unary("tanh", Binary("add", a, b)), "vectorized")
    a = RNG.standard_normal(40).astype("float32")
    b = RNG.standard_normal(40).astype("float32")
    for level in (0, 1, 2, 3):
        assert_same(k, a, b, rtol=1e-6, atol=1e-7, opt_level=level)



def test_many_local_buffers_overflow_to_the_heap() -> None:
    from kiln.codegen.emit import STACK_BUDGET, heap_allocations

    n = 8 * 1024  # 32 KiB each: 20 of them would be 640 KiB of stack
    x = Buffer("x", (n,), "float32")
    y = Buffer("y", (n,), "float32")
    locals_ = [Buffer(f"t{k}", (n,), "float32", "local") for k in range(20)]
    i = Var("i")
    steps = [For(i, Const(0), Const(n), Store(locals_[0], (i,), Load(x, (i,))))]
    for a, b in zip(locals_, locals_[1:]):
        steps.append(For(i, Const(0), Const(n), Store(b, (i,), Binary(
            "add", Load(a, (i,)), Const(1.0, "float32")))))
    steps.append(For(i, Const(0), Const(n), Store(y, (i,), Load(locals_[-1], (i,)))))
    body = Seq(tuple(steps))
    for buf in reversed(locals_):
        body = Allocate(buf, body)
    k = Kernel("many_locals", (x,), (y,), body)
    on_heap = heap_allocations(k)
    assert len(on_heap) == 20 - STACK_BUDGET // (n * 4)
    xs = RNG.standard_normal(n).astype("float32")
    (got,) = run_compiled(k, xs)
    np.testing.assert_array_equal(got, _chain(xs, 19))


def _chain(x: np.ndarray, steps: int) -> np.ndarray:
    for _ in range(steps):
        x = x + np.float32(1.0)
    return x
