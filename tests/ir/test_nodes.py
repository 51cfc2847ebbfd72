"""IR nodes: immutability, identity of variables, builders, traversal without recursion."""

import dataclasses

import numpy as np
import pytest

import kiln
from kiln.ir.traverse import bound_vars, children, free_vars, post_order, rewrite, trampoline


def test_nodes_are_frozen():
    x = kiln.var("x", shape=(2,))
    t = kiln.Tuple([x, x])
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.fields = ()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        x.name_hint = "y"  # type: ignore[misc]


def test_vars_compare_by_identity_and_globals_by_name():
    a, b = kiln.var("x"), kiln.var("x")
    assert a != b and a == a
    assert len({a, b}) == 2
    assert kiln.GlobalVar("f") == kiln.GlobalVar("f")
    assert kiln.Op("add") == kiln.Op("add") and kiln.Op("add") != kiln.Op("subtract")


def test_var_builder_makes_tensor_types():
    x = kiln.var("x", shape=(1, "n", None), dtype="float16")
    assert x.type_annotation == kiln.TensorType((1, kiln.SymDim("n"), kiln.ANY), "float16")
    assert x.type_annotation.shape[1] == kiln.SymDim("n")
    with pytest.raises(kiln.Error, match="unsupported dtype"):
        kiln.var("x", shape=(1,), dtype="float13")
    with pytest.raises(kiln.Error, match="vector dtypes"):
        kiln.TensorType((1,), "float16x4")


def test_constant_is_a_readonly_copy():
    a = np.arange(6, dtype="int64").reshape(2, 3)
    c = kiln.const(a)
    a[0, 0] = 100
    assert c.data[0, 0] == 0
    with pytest.raises(ValueError):
        c.data[0, 0] = 1
    assert kiln.const(1.5).dtype == "float32"
    assert kiln.const(3).dtype == "int32"
    assert kiln.const(2**40).dtype == "int64"
    assert kiln.const(True).dtype == "bool"
    assert kiln.const([1.0, 2.0]).dtype == "float32"
    assert kiln.const(np.float64(1.0)).dtype == "float64"


def test_arithmetic_sugar_builds_operator_calls():
    x = kiln.var("x", shape=(2,))
    e = (x + 1.0) * x - x / 2.0
    assert isinstance(e, kiln.Call) and e.op == kiln.Op("subtract")
    assert e.args[0].op == kiln.Op("multiply")
    assert isinstance(e.args[0].args[0].args[1], kiln.Constant)
    assert (-x).op == kiln.Op("negative")
    assert isinstance(kiln.Tuple([x, x])[1], kiln.TupleGetItem)
    with pytest.raises(TypeError):
        list(x)


def test_children_and_post_order():
    x, y = kiln.var("x"), kiln.var("y")
    shared = kiln.Tuple([x, y])
    root = kiln.Tuple([shared, kiln.TupleGetItem(shared, 0)])
    order = post_order(root)
    assert order[-1] is root
    assert order.index(shared) < order.index(root.fields[1])
    assert sum(1 for n in order if n is shared) == 1
    assert children(kiln.If(x, y, x)) == (x, y, x)


def test_free_and_bound_vars():
    x, y, z = kiln.var("x"), kiln.var("y"), kiln.var("z")
    body = kiln.Let(z, kiln.Tuple([x, y]), kiln.Tuple([z, x]))
    f = kiln.Function([x], body)
    assert free_vars(f) == [y]
    assert set(map(id, bound_vars(f))) == {id(x), id(z)}


def test_rewrite_replaces_bottom_up():
    x, y = kiln.var("x"), kiln.var("y")
    e = kiln.Tuple([x, kiln.Tuple([x, y])])
    out = rewrite(e, lambda n: y if n is x else None)
    assert out.fields[0] is y and out.fields[1].fields[0] is y
    assert e.fields[0] is x  # the original is untouched


def test_deep_let_chain_traversal_has_no_recursion():
    x = kiln.var("x")
    e = x
    for i in range(20000):
        v = kiln.var(f"v{i}")
        e = kiln.Let(v, kiln.Tuple([e]), v)
    assert len(post_order(e)) == 3 * 20000 + 1
    assert free_vars(e) == [x]
    assert kiln.structural_equal(e, e)


def test_trampoline_runs_deep_generator_recursion_and_delivers_exceptions():
    def depth(n):
        if n == 0:
            return 0
        return 1 + (yield depth(n - 1))

    assert trampoline(depth(50000)) == 50000

    def fails(n):
        if n == 0:
            raise ValueError("bottom")
        yield fails(n - 1)

    def catches():
        try:
            yield fails(1000)
        except ValueError as e:
            return str(e)

    assert trampoline(catches()) == "bottom"


def test_function_params_must_be_vars():
    with pytest.raises(kiln.Error, match="parameters must be kiln.Var"):
        kiln.Function([kiln.const(1.0)], kiln.const(1.0))  # type: ignore[list-item]
