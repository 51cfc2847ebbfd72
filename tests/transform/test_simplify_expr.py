"""simplify-expr: reshape, transpose, cast, slice and broadcast rows, their limits, big graphs."""

import time

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import post_order
from kiln.transform.pass_manager import PassContext, typed
from kiln.transform.simplify_expr import SimplifyExpr, lossless


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):
        return SimplifyExpr()(mod)


def program(params: str, body: str) -> kiln.IRModule:
    return kiln.parse(f"def @main({params}) {{ {body} }}")


X = "%x: Tensor[(2, 3, 4), float32]"

CASES = [
    # reshape(reshape(x)) -> reshape(x)
    (X, "reshape(reshape(%x, newshape=[6, 4]), newshape=[4, -1])",
     "reshape(%x, newshape=[4, 6])"),
    # squeeze / expand_dims / batch_flatten are reshapes too
    (X, "nn.batch_flatten(expand_dims(%x, axis=0))", "reshape(%x, newshape=[1, 24])"),
    (X, "squeeze(reshape(%x, newshape=[1, 24]))", "reshape(%x, newshape=[24])"),
    # a chain of reshapes that ends where it began disappears
    (X, "reshape(reshape(reshape(%x, newshape=[24]), newshape=[4, 6]), newshape=[2, 3, 4])",
     "%x"),
    # an empty tensor: the 0 in the merged shape is a size, not "copy"
    ("%x: Tensor[(2, 0, 3), float32]",
     "reshape(reshape(%x, newshape=[-1]), newshape=[3, 0], allowzero=1)",
     "reshape(%x, newshape=[3, 0], allowzero=1)"),
    # reshape to the shape it has -> x
    (X, "reshape(%x, newshape=[2, 3, 4])", "%x"),
    (X, "expand_dims(%x, axis=1, num_newaxis=0)", "%x"),
    # squeeze(expand_dims(x, a), [a]) -> x, even with unknown dimensions
    ("%x: Tensor[(?, 3), float32]", "squeeze(expand_dims(%x, axis=-1), axis=[2])", "%x"),
    # transpose(transpose(x)) -> one transpose, or nothing
    (X, "transpose(transpose(%x, axes=[1, 2, 0]), axes=[2, 0, 1])", "%x"),
    (X, "transpose(transpose(%x, axes=[1, 0, 2]), axes=[0, 2, 1])",
     "transpose(%x, axes=[1, 2, 0])"),
    (X, "transpose(transpose(%x))", "%x"),
    (X, "transpose(%x, axes=[0, 1, 2])", "%x"),
    ("%x: Tensor[(?, ?), float32]", "transpose(transpose(%x))", "%x"),
    # cast(x, x.dtype) -> x; lossless round trips -> x
    (X, 'cast(%x, dtype="float32")', "%x"),
    (X, 'cast(cast(%x, dtype="float64"), dtype="float32")', "%x"),
    ("%x: Tensor[(3), int16]", 'cast(cast(%x, dtype="float32"), dtype="int16")', "%x"),
    ("%x: Tensor[(3), uint8]", 'cast(cast(%x, dtype="int16"), dtype="uint8")', "%x"),
    ("%x: Tensor[(3), bool]", 'cast(cast(%x, dtype="int8"), dtype="bool")', "%x"),
    # identity slices and broadcasts -> x
    (X, "strided_slice(%x, begin=[0, 0], end=[2, 3])", "%x"),
    (X, "strided_slice(%x, begin=[0], end=[100], axes=[2])", "%x"),
    (X, "broadcast_to(%x, shape=[2, 3, 4])", "%x"),
]


@pytest.mark.parametrize("params, before, expected", CASES)
def test_rows(params, before, expected):
    mod = program(params, before)
    out = run(mod)
    assert kiln.structural_equal(out, program(params, expected)), kiln.astext(out)
    t = typed(mod)["main"].params[0].checked_type
    if all(isinstance(d, int) for d in t.shape):
        rng = np.random.default_rng(0)
        arg = (rng.standard_normal(t.shape) * 100).astype(t.dtype)
        np.testing.assert_array_equal(kiln.interpret(out, arg), kiln.interpret(mod, arg))


KEPT = [
    # a lossy round trip changes values
    (X, 'cast(cast(%x, dtype="float16"), dtype="float32")'),
    ("%x: Tensor[(3), int32]", 'cast(cast(%x, dtype="float32"), dtype="int32")'),
    ("%x: Tensor[(3), int64]", 'cast(cast(%x, dtype="float64"), dtype="int64")'),
    ("%x: Tensor[(3), int8]", 'cast(cast(%x, dtype="uint8"), dtype="int8")'),
    ("%x: Tensor[(3), float32]", 'cast(cast(%x, dtype="int32"), dtype="float32")'),
    # a cast that ends in another dtype
    ("%x: Tensor[(3), int8]", 'cast(cast(%x, dtype="int16"), dtype="int32")'),
    # slices that drop, skip or reverse elements
    (X, "strided_slice(%x, begin=[0, 1], end=[2, 3])"),
    (X, "strided_slice(%x, begin=[0], end=[2], strides=[2])"),
    (X, "strided_slice(%x, begin=[0], end=[4], axes=[2], strides=[-1])"),
    (X, "strided_slice(%x, begin=[0], end=[-1], axes=[2])"),
    # unknown dimensions: the merged shape is not known
    ("%x: Tensor[(?, 4), float32]", "reshape(reshape(%x, newshape=[-1]), newshape=[-1, 2])"),
    ("%x: Tensor[(?, 4), float32]", "reshape(%x, newshape=[-1, 4])"),
    # squeezing another axis than the one added
    ("%x: Tensor[(?, 1), float32]", "squeeze(expand_dims(%x, axis=0), axis=[2])"),
    (X, "transpose(%x, axes=[0, 2, 1])"),
    (X, "broadcast_to(%x, shape=[5, 2, 3, 4])"),
]


@pytest.mark.parametrize("params, before", KEPT)
def test_rows_that_must_not_fire(params, before):
    mod = program(params, before)
    assert kiln.structural_equal(run(mod), mod)


@pytest.mark.parametrize("src, dst, expected", [
    ("float32", "float64", True), ("float64", "float32", False), ("float16", "float32", True),
    ("int16", "float32", True), ("int32", "float32", False), ("int32", "float64", True),
    ("int64", "float64", False), ("uint8", "int16", True), ("int8", "uint8", False),
    ("uint32", "int64", True), ("bool", "int8", True), ("int8", "bool", False),
    ("float32", "int64", False), ("uint16", "float16", False), ("uint8", "float16", True),
])
def test_lossless_casts(src, dst, expected):
    assert lossless(src, dst) is expected
    if expected:  # every value of src comes back from dst
        if src == "bool":
            values = np.array([True, False])
        elif src.startswith(("int", "uint")):
            info = np.iinfo(src)
            values = np.array([info.min, info.max, 0, 1], src)
        else:
            info = np.finfo(src)
            values = np.array([info.min, info.max, info.tiny, info.eps, np.inf], src)
        np.testing.assert_array_equal(values.astype(dst).astype(src), values)


def test_shapes_under_lets_closures_and_branches():
    text = """
        def @main(%x: Tensor[(2, 3), float32], %c: bool) {
          let %t = transpose(%x);
          let %u = transpose(%t);
          let %f = fn (%y: Tensor[(2, 3), float32]) {
            reshape(reshape(%y, newshape=[6]), newshape=[2, 3])
          };
          if (%c) { %f(%u) } else { cast(%u, dtype="float32") }
        }"""
    expected = """
        def @main(%x: Tensor[(2, 3), float32], %c: bool) {
          let %t = transpose(%x);
          let %u = %x;
          let %f = fn (%y: Tensor[(2, 3), float32]) { %y };
          if (%c) { %f(%u) } else { %u }
        }"""
    mod = kiln.parse(text)
    out = run(mod)
    assert kiln.structural_equal(out, kiln.parse(expected)), kiln.astext(out)
    arg = np.arange(6, dtype="float32").reshape(2, 3)
    for c in (True, False):
        np.testing.assert_array_equal(kiln.interpret(out, arg, np.array(c)),
                                      kiln.interpret(mod, arg, np.array(c)))


def test_a_20000_node_graph():
    x = kiln.var("x", shape=(4, 6))
    e = x
    for i in range(5000):  # reshape / transpose pairs, 4 nodes each
        if i % 2:
            e = kiln.op.reshape(kiln.op.reshape(e, newshape=[24]), newshape=[4, 6])
        else:
            e = kiln.op.transpose(kiln.op.transpose(e))
    mod = kiln.IRModule.from_expr(kiln.Function([x], e))
    assert len(post_order(mod["main"])) > 20000
    tmod = typed(mod)
    start = time.perf_counter()
    out = SimplifyExpr()(tmod)
    elapsed = time.perf_counter() - start
    assert bool(out["main"].body is out["main"].params[0])
    assert elapsed < 5, f"{elapsed:.1f} s"
