"""Elementwise nests over collapsed trailing axes (kiln/loops/collapse.py), against numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln import op
from kiln.ir.traverse import post_order
from kiln.loops.lower import lower_primitive
from kiln.loops.printer import kernel_text
from kiln.runtime.compiler import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")
RNG = np.random.default_rng(3)


def kernel_of(fn: kiln.Function) -> str:
    fused = kiln.infer_types(kiln.optimize(kiln.IRModule.from_expr(fn)))
    prim = next(f for f in post_order(fused["main"])
                if isinstance(f, kiln.Function) and f.attrs.get("Primitive"))
    return kernel_text(lower_primitive(prim, "k"))


def test_short_trailing_axes_run_as_one_vector_loop() -> None:
    # an optimizer's update of a 3x3 conv weight, with a per-channel term: the last three
    # axes are one loop of 5 * 3 * 3 (the per-channel read does not use them)
    shape = (6, 5, 3, 3)
    a, v = kiln.var("a", shape=shape), kiln.var("v", shape=shape)
    b = kiln.var("b", shape=(6, 1, 1, 1))
    fn = kiln.Function([a, v, b], op.add(op.subtract(a, op.multiply(
        v, kiln.const(np.float32(0.1)))), b))
    text = kernel_of(fn)
    assert "for vectorized i1 in [0, +45)" in text, text
    x, y = RNG.standard_normal(shape).astype("float32"), RNG.standard_normal(shape).astype(
        "float32")
    z = RNG.standard_normal((6, 1, 1, 1)).astype("float32")
    got = kiln.build(kiln.IRModule.from_expr(fn))(x, y, z)
    np.testing.assert_array_equal(got, (x - y * np.float32(0.1)) + z)


@pytest.mark.parametrize("case", ["transpose", "broadcast_inner", "iota"])
def test_reads_that_are_not_flat_keep_their_axes(case: str) -> None:
    # a transposed read, a read broadcast along one of the short axes, and a coordinate used
    # as a value: the collapse must not apply (or must compute the same), checked on values
    shape = (4, 3, 2)
    x = kiln.var("x", shape=shape)
    a = RNG.standard_normal(shape).astype("float32")
    if case == "transpose":
        y = kiln.var("y", shape=(4, 2, 3))
        fn = kiln.Function([x, y], op.add(x, op.transpose(y, axes=[0, 2, 1])))
        b = RNG.standard_normal((4, 2, 3)).astype("float32")
        want = a + b.transpose(0, 2, 1)
    elif case == "broadcast_inner":
        y = kiln.var("y", shape=(4, 1, 2))
        fn = kiln.Function([x, y], op.multiply(x, y))
        b = RNG.standard_normal((4, 1, 2)).astype("float32")
        want = a * b
    else:
        y = kiln.var("y", shape=(2,))
        fn = kiln.Function([x, y], op.add(x, op.cast(op.arange(kiln.const(np.float32(0)),
                                                               kiln.const(np.float32(2)),
                                                               kiln.const(np.float32(1))),
                                                     dtype="float32")))
        b = np.zeros(2, "float32")
        want = a + np.arange(2, dtype="float32")
    got = kiln.build(kiln.IRModule.from_expr(fn))(a, b)
    np.testing.assert_array_equal(got, want)
