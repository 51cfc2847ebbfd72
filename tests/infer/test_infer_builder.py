"""Type inference on programs built from Python: ADTs, polymorphism, closures, references."""

import numpy as np
import pytest

import kiln
from kiln.infer import infer_types

A = kiln.TypeVar("A")
LIST = kiln.GlobalTypeVar("List")
CONS = kiln.Constructor("Cons", [A, LIST[A]], LIST)
NIL = kiln.Constructor("Nil", [], LIST)
LIST_DEF = kiln.TypeData(LIST, [A], [CONS, NIL])


def _length_like():
    """def @tl[B](%xs: List[B]) -> List[B] { match (%xs) { Cons(_, %r) => %r, Nil => Nil } }"""
    b = kiln.TypeVar("B")
    xs, r = kiln.var("xs", LIST[b]), kiln.var("r")
    clauses = [
        kiln.Clause(kiln.PatternConstructor(CONS, [kiln.PatternWildcard(), kiln.PatternVar(r)]), r),
        kiln.Clause(kiln.PatternConstructor(NIL), kiln.Call(NIL, [])),
    ]
    return kiln.Function([xs], kiln.Match(xs, clauses), LIST[b], [b])


def test_polymorphic_global_is_instantiated_at_each_call():
    x = kiln.var("x", shape=(2, 3))
    i = kiln.var("i", shape=(), dtype="int32")
    tl = kiln.GlobalVar("tl")
    one = kiln.Call(CONS, [x, kiln.Call(NIL, [])])
    two = kiln.Call(CONS, [i, kiln.Call(NIL, [])])
    main = kiln.Function([x, i], kiln.Tuple([kiln.Call(tl, [one]), kiln.Call(tl, [two])]))
    mod = infer_types(kiln.IRModule({"tl": _length_like(), "main": main}, [LIST_DEF]))
    t = mod["main"].checked_type.ret_type
    assert t.fields[0] == LIST[kiln.TensorType((2, 3), "float32")]
    assert t.fields[1] == LIST[kiln.scalar_type("int32")]
    assert mod.is_typed


def test_every_node_gets_a_checked_type():
    x = kiln.var("x", shape=(2,))
    r = kiln.var("r")
    body = kiln.Let(r, kiln.RefCreate(x), kiln.Tuple([kiln.RefWrite(r, x), kiln.RefRead(r)]))
    mod = infer_types(kiln.IRModule.from_expr(kiln.Function([x], body)))
    from kiln.ir.traverse import post_order

    for node in post_order(mod["main"]):
        if not isinstance(node, kiln.Op):
            assert node.checked_type is not None
    let = mod["main"].body
    assert let.var.checked_type == kiln.RefType(kiln.TensorType((2,), "float32"))
    assert let.body.checked_type == kiln.TupleType([kiln.TupleType([]), x.type_annotation])


def test_unannotated_closure_gets_its_type_from_use():
    f, y = kiln.var("f"), kiln.var("y")
    c = kiln.const(np.zeros((4,), "float16"))
    e = kiln.Let(f, kiln.Function([y], kiln.Tuple([y, y])), kiln.Call(f, [c]))
    typed = infer_types(e)
    t16 = kiln.TensorType((4,), "float16")
    assert typed.checked_type == kiln.TupleType([t16, t16])
    assert typed.var.checked_type == kiln.FuncType([t16], kiln.TupleType([t16, t16]))


def test_mutually_recursive_globals_without_annotations_on_one():
    # @even(%n) calls @odd, @odd(%n: bool) calls @even: the type of @even comes from @odd.
    n1, n2 = kiln.var("n"), kiln.var("n", shape=(), dtype="bool")
    even = kiln.Function([n1], kiln.If(n1, kiln.Call(kiln.GlobalVar("odd"), [n1]), n1))
    odd = kiln.Function([n2], kiln.Call(kiln.GlobalVar("even"), [n2]))
    mod = infer_types(kiln.IRModule({"even": even, "odd": odd}))
    b = kiln.scalar_type("bool")
    assert mod["even"].checked_type == kiln.FuncType([b], b)


def test_constructor_passed_as_a_function_value():
    # @apply[X, Y](%f: fn(X) -> Y, %x: X) -> Y; @apply(Some, 1)
    x_t, y_t = kiln.TypeVar("X"), kiln.TypeVar("Y")
    f = kiln.var("f", kiln.FuncType([x_t], y_t))
    v = kiln.var("x", x_t)
    apply = kiln.Function([f, v], kiln.Call(f, [v]), y_t, [x_t, y_t])
    opt = kiln.GlobalTypeVar("Option")
    t = kiln.TypeVar("T")
    some = kiln.Constructor("Some", [t], opt)
    none = kiln.Constructor("None", [], opt)
    main = kiln.Function([], kiln.Call(kiln.GlobalVar("apply"), [some, kiln.const(1)]))
    mod = kiln.IRModule({"apply": apply, "main": main}, [kiln.TypeData(opt, [t], [some, none])])
    typed = infer_types(mod)
    assert typed["main"].checked_type.ret_type == opt[kiln.scalar_type("int32")]


def test_if_condition_must_be_a_bool_scalar():
    with pytest.raises(kiln.TypeCheckError, match="condition of an if must be a scalar bool"):
        infer_types(kiln.If(kiln.const(1), kiln.const(1.0), kiln.const(2.0)))


def test_if_branches_must_agree():
    with pytest.raises(kiln.TypeCheckError, match="branches of an if have different types"):
        infer_types(kiln.If(kiln.const(True), kiln.const(1.0), kiln.const(2)))


def test_projection_out_of_range_and_of_non_tuple():
    t = kiln.Tuple([kiln.const(1.0)])
    with pytest.raises(kiln.TypeCheckError, match="tuple index 1 is out of range"):
        infer_types(kiln.TupleGetItem(t, 1))
    with pytest.raises(kiln.TypeCheckError, match="not a tuple"):
        infer_types(kiln.TupleGetItem(kiln.const(1.0), 0))


def test_call_arity_and_calling_a_non_function():
    x = kiln.var("x", shape=())
    f = kiln.Function([x], x)
    with pytest.raises(kiln.TypeCheckError, match="takes 1 argument"):
        infer_types(kiln.Call(f, [kiln.const(1.0), kiln.const(2.0)]))
    with pytest.raises(kiln.TypeCheckError, match="not a function type"):
        infer_types(kiln.Call(kiln.const(1.0), []))


def test_argument_mismatch_names_both_types():
    x = kiln.var("x", shape=(2, 3))
    f = kiln.Function([x], x)
    with pytest.raises(kiln.TypeCheckError) as err:
        infer_types(kiln.Call(f, [kiln.const(np.zeros((2, 4), "float32"))]))
    msg = str(err.value)
    assert "Tensor[(2, 3), float32]" in msg and "Tensor[(2, 4), float32]" in msg
    assert "dimension 1 is 3 in one and 4 in the other" in msg


def test_non_exhaustive_match_is_an_error_but_match_question_is_not():
    b = kiln.TypeVar("B")
    xs, r = kiln.var("xs", LIST[b]), kiln.var("r")
    clause = kiln.Clause(
        kiln.PatternConstructor(CONS, [kiln.PatternWildcard(), kiln.PatternVar(r)]), r
    )
    for complete in (True, False):
        fn = kiln.Function([xs], kiln.Match(xs, [clause], complete), LIST[b], [b])
        mod = kiln.IRModule({"tl": fn}, [LIST_DEF])
        if complete:
            with pytest.raises(kiln.TypeCheckError, match="Nil is not matched"):
                infer_types(mod)
        else:
            infer_types(mod)


def test_nested_patterns_exhaustiveness_finds_the_missing_case():
    b = kiln.TypeVar("B")
    xs, h = kiln.var("xs", LIST[b]), kiln.var("h")
    clauses = [
        kiln.Clause(
            kiln.PatternConstructor(CONS, [kiln.PatternVar(h), kiln.PatternConstructor(NIL)]), xs
        ),
        kiln.Clause(kiln.PatternConstructor(NIL), xs),
    ]
    fn = kiln.Function([xs], kiln.Match(xs, clauses), LIST[b], [b])
    with pytest.raises(kiln.TypeCheckError, match=r"Cons\(_, Cons\(_, _\)\) is not matched"):
        infer_types(kiln.IRModule({"f": fn}, [LIST_DEF]))


def test_tuple_patterns():
    p = kiln.var("p", kiln.TupleType([kiln.scalar_type("int32"), kiln.scalar_type("bool")]))
    a, b = kiln.var("a"), kiln.var("b")
    m = kiln.Match(
        p,
        [
            kiln.Clause(
                kiln.PatternTuple([kiln.PatternVar(a), kiln.PatternVar(b)]), kiln.Tuple([b, a])
            )
        ],
    )
    typed = infer_types(kiln.Function([p], m))
    assert typed.checked_type.ret_type == kiln.TupleType(
        [kiln.scalar_type("bool"), kiln.scalar_type("int32")]
    )


def test_unknown_global_and_out_of_scope_variable():
    with pytest.raises(kiln.TypeCheckError, match="no global function @nope"):
        infer_types(
            kiln.IRModule({"main": kiln.Function([], kiln.Call(kiln.GlobalVar("nope"), []))})
        )
    x = kiln.var("x", shape=())
    inner = kiln.Function([x], x)
    with pytest.raises(kiln.TypeCheckError, match="outside the scope"):
        infer_types(kiln.IRModule({"main": kiln.Function([], kiln.Tuple([inner, x]))}))


def test_unconstrained_parameter_is_reported():
    x = kiln.var("x")
    with pytest.raises(kiln.TypeCheckError, match="cannot infer the type of %x"):
        infer_types(kiln.IRModule({"main": kiln.Function([x], kiln.const(1.0))}))


def test_infinite_type_is_rejected():
    f = kiln.var("f")
    # fn (%f) { %f(%f) } has no finite type.
    with pytest.raises(kiln.TypeCheckError, match="contain itself"):
        infer_types(kiln.Function([f], kiln.Call(f, [f])))
