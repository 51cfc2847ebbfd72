"""The one post-order walk: order, sharing, gates, other edges, depth."""

import numpy as np
import pytest

import kiln
from kiln.errors import InternalError
from kiln.ir.expr import Call, Function, Let, Tuple
from kiln.ir.traverse import children, post_order


def test_children_come_first_and_shared_nodes_once():
    x = kiln.var("x", shape=(2,))
    a = kiln.op.negative(x)
    t = Tuple((a, a, x))
    order = post_order(t)
    # Written out by hand: left to right, each node once, after its children.
    assert [id(n) for n in order] == [id(n) for n in (a.op, x, a, t)]


def test_a_gated_node_is_listed_but_not_entered():
    x = kiln.var("x", shape=(2,))
    inner = Function((x,), kiln.op.negative(x))
    y = kiln.var("y", shape=(2,))
    call = Call(inner, (y,))
    order = post_order(call, gate=lambda n: not isinstance(n, Function))
    assert [id(n) for n in order] == [id(inner), id(y), id(call)]
    assert all(n is not x for n in order)


def test_the_root_is_gated_like_any_node():
    x = kiln.var("x", shape=(2,))
    fn = Function((x,), kiln.op.negative(x))
    assert post_order(fn, gate=lambda n: False) == [fn]


def test_kids_chooses_the_edges():
    x = kiln.var("x", shape=(2,))
    neg = kiln.op.negative(x)
    # Follow only call arguments, not the operator.
    order = post_order(neg, kids=lambda n: n.args if isinstance(n, Call) else children(n))
    assert [id(n) for n in order] == [id(x), id(neg)]


def test_a_deep_let_chain_needs_no_recursion():
    n = 30000
    x = kiln.var("x", shape=(2,))
    vs = [kiln.var(f"v{i}") for i in range(n)]
    body: kiln.Expr = vs[-1]
    for i in reversed(range(n)):
        body = Let(vs[i], x if i == 0 else vs[i - 1], body)
    order = post_order(body)
    assert order[-1] is body
    assert sum(isinstance(e, Let) for e in order) == n
    lets = [e for e in order if isinstance(e, Let)]
    assert lets[-1] is body and lets[0].var is vs[-1]  # the innermost let finishes first


@pytest.mark.parametrize("body", [None, 2.5, np.ones(3, np.float32)])
def test_a_field_that_is_not_an_expression_is_a_clear_error(body: object) -> None:
    # a program built in Python with a value where an expression belongs: a kiln.Error that
    # names the node and the value's type, from the first walk (here, kiln.build's), never
    # an internal error
    x = kiln.var("x", shape=(3,), dtype="float32")
    fn = Function((x,), body)  # type: ignore[arg-type]
    with pytest.raises(kiln.Error, match=f"a Function holds a {type(body).__name__} where an "
                                         "expression belongs") as info:
        kiln.build(kiln.IRModule.from_expr(fn))
    assert not isinstance(info.value, InternalError)
    with pytest.raises(kiln.Error, match="where an expression belongs"):
        post_order(Tuple((x, body)))  # type: ignore[arg-type]
