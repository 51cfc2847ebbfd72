"""The loop-IR verifier's bounds proofs (kiln/loops/verify.py): accesses a guard proves in
bounds, and the ones it must still refuse."""

from __future__ import annotations

import pytest

import kiln
from kiln.loops.ir import INDEX, Binary, Buffer, Const, For, IfThenElse, Kernel, Load, Store, Var
from kiln.loops.verify import verify


def _kernel(body_of) -> Kernel:  # noqa: ANN001
    src = Buffer("src", (8,), "float32")
    out = Buffer("out", (8,), "float32")
    return Kernel("k", (src,), (out,), body_of(src, out))


def test_a_guard_bounds_the_expression_it_tests() -> None:
    # for i in [0, 12): if i + 1 < 8: out[i + 1] = src[i + 1]
    def body(src: Buffer, out: Buffer) -> For:
        i = Var("i")
        j = i + 1
        guarded = IfThenElse(Binary("lt", j, Const(8, INDEX)), Store(out, (j,), Load(src, (j,))))
        return For(i, Const(0), Const(12), guarded)

    verify(_kernel(body))


def test_the_guard_holds_only_in_its_branch() -> None:
    def body(src: Buffer, out: Buffer) -> For:
        i = Var("i")
        guard = Binary("lt", i, Const(8, INDEX))
        store = Store(out, (i,), Load(src, (i,)))
        zero = Store(out, (i,), Const(0.0, "float32"))
        return For(i, Const(0), Const(12), IfThenElse(guard, zero, store))

    with pytest.raises(kiln.InternalError, match="cannot prove the (read|write)"):
        verify(_kernel(body))


def test_an_equal_but_different_expression_is_not_bounded() -> None:
    # the guard tests one node i + 1, the access indexes another: facts go by identity
    def body(src: Buffer, out: Buffer) -> For:
        i = Var("i")
        guarded = IfThenElse(Binary("lt", i + 1, Const(8, INDEX)),
                             Store(out, (i + 1,), Const(0.0, "float32")))
        return For(i, Const(0), Const(12), guarded)

    with pytest.raises(kiln.InternalError, match="cannot prove the write"):
        verify(_kernel(body))


def test_a_guard_that_reads_memory_proves_nothing() -> None:
    # a stored value could change what the guard read: no fact from an expression with loads
    src, out = Buffer("src", (8,), "float32"), Buffer("out", (8,), "float32")
    idx = Buffer("idx", (1,), "int64")
    i = Var("i")
    e = Load(idx, (Const(0, INDEX),))
    zero = Store(out, (e,), Const(0.0, "float32"))
    guarded = IfThenElse(Binary("lt", e, Const(8, "int64")), zero)
    with pytest.raises(kiln.InternalError, match="cannot prove the write"):
        verify(Kernel("k", (src, idx), (out,), For(i, Const(0), Const(1), guarded)))
