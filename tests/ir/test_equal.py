"""Structural equality and hashing up to renaming of bound variables."""

import numpy as np

import kiln
from kiln import structural_equal as seq
from kiln import structural_hash as shash


def _fn(name_x, name_y):
    x = kiln.var(name_x, shape=(2, 2))
    y = kiln.var(name_y, shape=(2, 2))
    return kiln.Function([x], kiln.Let(y, kiln.Tuple([x, x]), kiln.TupleGetItem(y, 1)))


def test_alpha_equivalent_functions_are_equal_and_hash_alike():
    a, b = _fn("x", "y"), _fn("p", "q")
    assert seq(a, b)
    assert shash(a) == shash(b)


def test_different_structure_is_unequal():
    x = kiln.var("x", shape=(2, 2))
    y = kiln.var("y", shape=(2, 2))
    a = kiln.Function([x, y], kiln.Tuple([x, y]))
    x2 = kiln.var("x", shape=(2, 2))
    y2 = kiln.var("y", shape=(2, 2))
    b = kiln.Function([x2, y2], kiln.Tuple([y2, x2]))
    assert not seq(a, b)


def test_bound_variable_correspondence_is_one_to_one():
    x, y = kiln.var("x"), kiln.var("y")
    a = kiln.Function([x, y], x)
    p, q = kiln.var("p"), kiln.var("q")
    assert not seq(a, kiln.Function([p, q], q))
    assert seq(a, kiln.Function([p, q], p))


def test_free_variables_must_match_unless_mapped():
    x, y = kiln.var("x"), kiln.var("y")
    assert not seq(kiln.Tuple([x]), kiln.Tuple([y]))
    assert seq(kiln.Tuple([x]), kiln.Tuple([y]), map_free_vars=True)
    assert seq(kiln.Tuple([x]), kiln.Tuple([x]))


def test_annotations_and_attrs_matter():
    a = kiln.Function([kiln.var("x", shape=(2,))], kiln.const(1.0))
    b = kiln.Function([kiln.var("x", shape=(3,))], kiln.const(1.0))
    assert not seq(a, b)
    x = kiln.var("x")
    c1 = kiln.Call(kiln.Op("sum"), [x], {"axis": (1,)})
    c2 = kiln.Call(kiln.Op("sum"), [x], {"axis": (0,)})
    assert not seq(c1, c2)
    assert seq(c1, kiln.Call(kiln.Op("sum"), [x], {"axis": [1]}))


def test_constants_compare_bit_for_bit():
    assert seq(kiln.const(np.float32(0.1)), kiln.const(np.float32(0.1)))
    assert not seq(kiln.const(np.float32(0.0)), kiln.const(np.float32(-0.0)))
    assert not seq(kiln.const(np.int32(1)), kiln.const(np.int64(1)))
    nan = np.array([np.nan], "float32")
    assert seq(kiln.const(nan), kiln.const(nan.copy()))


def test_type_params_compare_up_to_renaming():
    a, b = kiln.TypeVar("A"), kiln.TypeVar("B")
    fa = kiln.FuncType([a], a, [a])
    fb = kiln.FuncType([b], b, [b])
    assert fa != fb  # == on types is syntactic
    assert seq(fa, fb)
    x = kiln.var("x", a)
    y = kiln.var("y", b)
    assert seq(kiln.Function([x], x, a, [a]), kiln.Function([y], y, b, [b]))
    assert shash(kiln.Function([x], x, a, [a])) == shash(kiln.Function([y], y, b, [b]))


def test_patterns_bind_variables():
    lst = kiln.GlobalTypeVar("List")
    t = kiln.TypeVar("A")
    cons = kiln.Constructor("Cons", [t, lst[t]], lst)
    nil = kiln.Constructor("Nil", [], lst)

    def prog(n1, n2):
        xs, h = kiln.var(n1), kiln.var(n2)
        clauses = [
            kiln.Clause(
                kiln.PatternConstructor(cons, [kiln.PatternVar(h), kiln.PatternWildcard()]), h
            ),
            kiln.Clause(kiln.PatternConstructor(nil), xs),
        ]
        return kiln.Function([xs], kiln.Match(xs, clauses))

    assert seq(prog("a", "b"), prog("c", "d"))
    assert shash(prog("a", "b")) == shash(prog("c", "d"))


def test_shared_dag_compares_in_linear_time():
    # 60 levels of a diamond: 2**60 paths, 120 nodes.
    x = kiln.var("x")
    e = x
    for _ in range(60):
        e = kiln.Tuple([e, e])
    y = kiln.var("y")
    f = y
    for _ in range(60):
        f = kiln.Tuple([f, f])
    assert seq(kiln.Function([x], e), kiln.Function([y], f))
    assert shash(kiln.Function([x], e)) == shash(kiln.Function([y], f))


def test_modules_compare_by_global_names_and_bodies():
    m1 = kiln.IRModule({"main": _fn("x", "y")})
    m2 = kiln.IRModule({"main": _fn("a", "b")})
    m3 = kiln.IRModule({"other": _fn("a", "b")})
    assert seq(m1, m2) and shash(m1) == shash(m2)
    assert not seq(m1, m3)
