"""Deep and long programs parse and print without Python recursion (no RecursionError)."""

import sys

import pytest

import kiln
from kiln import Call, Function, If, Let, Tuple, TupleGetItem, const, var
from kiln.op import get
from kiln.text import astext, parse, parse_expr, parse_type

LONG = 20_000
DEEP = 5_000


def _nest(inner, template, depth=DEEP):
    for _ in range(depth):
        inner = template.format(inner)
    return inner


@pytest.fixture(autouse=True)
def _small_recursion_limit():
    # Far below the sizes used here: any recursion per level would fail loudly.
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(old)


def round_trip_expr(text):
    e = parse_expr(text)
    printed = astext(e)
    again = parse_expr(printed)
    assert kiln.structural_equal(again, e, map_free_vars=True)
    return e, printed


def test_long_let_chain():
    lines = ["free_var %a: float32;", "let %x0 = add(%a, 1f);"]
    lines += [f"let %x{i} = add(%x{i - 1}, 1f);" for i in range(1, LONG)]
    e, printed = round_trip_expr("\n".join(lines) + f"\n%x{LONG - 1}")
    assert printed.count("let %") == LONG


def test_long_dataflow_graph():
    lines = ["free_var %a: float32;", "%0 = nn.relu(%a);"]
    lines += [f"%{i} = add(%{i - 1}, %{i // 2});" for i in range(1, LONG)]
    e, printed = round_trip_expr("\n".join(lines) + f"\n%{LONG - 1}")
    assert printed.splitlines()[-2] == f"%{LONG - 2} = add(%{LONG - 3}, %{(LONG - 2) // 2});"


def test_long_sequence():
    e, printed = round_trip_expr("free_var %a;\n" + "ref(%a);\n" * LONG + "%a")
    assert printed.count("ref(%a);") == LONG


def test_long_infix_and_projection_chains():
    round_trip_expr("free_var %a: int32;\n" + " + ".join(["%a"] * LONG))
    round_trip_expr("free_var %a;\n%a" + ".0" * LONG)


@pytest.mark.parametrize(
    "name, text",
    [
        ("parens", "(" * DEEP + "%a" + ")" * DEEP),
        ("blocks", "{" * DEEP + "%a" + "}" * DEEP),
        ("functions", "fn () {" * DEEP + "%a" + "}" * DEEP),
        ("ifs", "if (True) {" * DEEP + "%a" + "} else { %a }" * DEEP),
        ("calls", "nn.relu(" * DEEP + "%a" + ")" * DEEP),
        ("tuples", "(" * DEEP + "%a" + ",)" * DEEP),
        ("refs", "ref(" * DEEP + "%a" + ")" * DEEP),
        ("lets in values", _nest("%a", "(let %y = {}; %y)")),
        ("matches", _nest("%a", "match (%a) {{ _ => {} }}")),
    ],
)
def test_deep_nesting(name, text):
    round_trip_expr("free_var %a;\n" + text)


def test_deep_patterns():
    pattern = _nest("_", "Mk({}, Leaf)")
    mod = parse(f"type P {{ Mk(P, P), Leaf }}\ndef @f(%x: P) {{ match (%x) {{ {pattern} => 1 }} }}")
    again = parse(astext(mod))
    assert kiln.structural_equal(again, mod)


def test_deep_types():
    t = parse_type(_nest("int32", "({},)"))
    assert kiln.structural_equal(parse_type(kiln.text.type_text(t)), t)
    f = parse_type(_nest("int32", "fn () -> {}"))
    assert kiln.structural_equal(parse_type(str(f)), f)


def test_deep_programs_built_in_python_print():
    relu = get("nn.relu")
    x = var("x")
    vs = [var(f"v{i}") for i in range(LONG)]
    chain = vs[-1]
    for i in reversed(range(LONG)):
        chain = Let(vs[i], relu(vs[i - 1] if i else x), chain)
    boxed = x
    for _ in range(DEEP):  # lets that are not in tail position print in parentheses
        v = var("v")
        boxed = Tuple([Let(v, boxed, relu(v))])
    nested = x
    for _ in range(DEEP):
        nested = Function([], If(const(True), nested, TupleGetItem(Call(nested, []), 0)))
    mod = kiln.IRModule({"main": Function([x], Tuple([chain, boxed, nested]))})
    again = parse(astext(mod))
    assert kiln.structural_equal(again, mod)
