"""The parser builds the same IR as the Python builder API, construct by construct."""

import numpy as np
import pytest

import kiln
from kiln import (
    ANY,
    Call,
    Clause,
    Constant,
    Constructor,
    Function,
    FuncType,
    GlobalTypeVar,
    GlobalVar,
    If,
    IncompleteType,
    Let,
    Match,
    Op,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    RefCreate,
    RefRead,
    RefType,
    RefWrite,
    SymDim,
    TensorType,
    Tuple,
    TupleGetItem,
    TupleType,
    TypeCall,
    TypeData,
    TypeVar,
    const,
    scalar_type,
    var,
)
from kiln.op import get
from kiln.text import parse, parse_expr, parse_type

add, subtract, multiply, divide = get("add"), get("subtract"), get("multiply"), get("divide")
relu, dense, conv2d = get("nn.relu"), get("nn.dense"), get("nn.conv2d")
i32, f32 = scalar_type("int32"), scalar_type("float32")
UNIT = Tuple(())


def same(a, b):
    return kiln.structural_equal(a, b, map_free_vars=True)


def scalar(text):
    c = parse_expr(text)
    assert isinstance(c, Constant) and c.data.ndim == 0
    return c.dtype, c.data.item()


# --- literals -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, dtype, value",
    [
        ("1", "int32", 1),
        ("0", "int32", 0),
        ("-100", "int32", -100),
        ("-05", "int32", -5),
        ("2147483647", "int32", 2147483647),
        ("-2147483648", "int32", -2147483648),
        ("2147483648", "int64", 2147483648),
        ("9223372036854775807", "int64", 9223372036854775807),
        ("-42i", "int32", -42),
        ("7i8", "int8", 7),
        ("-128i8", "int8", -128),
        ("7i16", "int16", 7),
        ("7i32", "int32", 7),
        ("-42i64", "int64", -42),
        ("1.5f", "float32", 1.5),
        ("3f", "float32", 3.0),
        ("1e-05f", "float32", float(np.float32(1e-05))),
        ("1E+1f", "float32", 10.0),
        ("1.0e-1f", "float32", float(np.float32(0.1))),
        ("3f16", "float16", 3.0),
        ("3f32", "float32", 3.0),
        ("3f64", "float64", 3.0),
        ("0.1f64", "float64", 0.1),
        ("2.5", "float32", 2.5),
        ("True", "bool", True),
        ("False", "bool", False),
        ("--10", "int32", 10),
        ("---10", "int32", -10),
        ("inff", "float32", float("inf")),
        ("-inff64", "float64", float("-inf")),
    ],
)
def test_literals(text, dtype, value):
    assert scalar(text) == (dtype, value)


def test_negative_zero_and_nan_literals_keep_their_bits():
    assert parse_expr("-0f").data.tobytes() == np.float32(-0.0).tobytes()
    assert np.isnan(parse_expr("nanf").data)


@pytest.mark.parametrize(
    "text",
    ["2147483648i32", "32768i16", "128i8", "-129i8", "9223372036854775808",
     "3.40283e+38f32", "70000f16", "1e400f64", "1e999f", "1e5i", "1.5i64", "7i7", "3f8",
     "12abc", "1" * 5000],
)
def test_out_of_range_or_malformed_literals_are_errors(text):
    with pytest.raises(kiln.ParseError) as info:
        parse_expr(text)
    assert info.value.line == 1 and info.value.column == 1


def test_comments_nest_and_lines_end_them():
    text = """
    // a line comment ( with an unbalanced paren
    /* a block comment
       /* nested /* twice */ */
       still a comment */
    () // trailing
    """
    assert same(parse_expr(text), UNIT)


# --- bindings -------------------------------------------------------------------------------


def test_let_and_annotations():
    x, y = var("x"), var("y", i32)
    want = Let(x, const(1), Let(y, const(2), Tuple([x, y])))
    assert same(parse_expr("let %x = 1; let %y: int32 = 2; (%x, %y)"), want)


def test_let_shadowing_binds_the_newest():
    x1, x2 = var("x"), var("x")
    want = Let(x1, const(1), Let(x2, add(x1, const(2)), x2))
    assert same(parse_expr("let %x = 1; let %x = %x + 2; %x"), want)


def test_recursive_let_function_sees_its_own_name():
    f, n = var("f"), var("n")
    want = Let(f, Function([n], Call(f, [n])), Call(f, [const(1)]))
    assert same(parse_expr("let %f = fn (%n) { %f(%n) }; %f(1)"), want)


def test_graph_bindings_name_shared_nodes():
    e = parse_expr("free_var %x: float32; %0 = add(%x, %x); %1 = multiply(%0, %0); (%1, %0)")
    assert isinstance(e, Tuple)
    mul, s = e.fields
    assert mul.args[0] is s and mul.args[1] is s  # %0 is one node, used three times
    x = var("x", f32)
    s2 = add(x, x)
    assert same(e, Tuple([multiply(s2, s2), s2]))


def test_graph_binding_can_be_rebound():
    e = parse_expr("%0 = 1; %0 = (%0, %0); %0")
    assert same(e, Tuple([const(1), const(1)]))


def test_sequencing_is_a_let_of_a_fresh_variable():
    e = parse_expr("(); 1; 2")
    assert isinstance(e, Let) and isinstance(e.body, Let)
    assert same(e, Let(var("_"), UNIT, Let(var("_"), const(1), const(2))))
    assert e.var is not e.body.var


def test_free_vars_become_main_params_in_declaration_order():
    mod = parse("free_var %b: float32; free_var %a: int32; (%a, %b)")
    main = mod["main"]
    assert [p.name_hint for p in main.params] == ["b", "a"]
    assert main.params[0].type_annotation == f32
    assert main.body.fields[0] is main.params[1]


def test_bare_function_becomes_main_itself():
    mod = parse('#[version = "0.0.5"]\nfn (%x: float32) { %x }')
    x = var("x", f32)
    assert same(mod["main"], Function([x], x))


def test_bare_expression_without_free_vars_is_a_nullary_main():
    mod = parse("(1, 2)")
    assert same(mod["main"], Function([], Tuple([const(1), const(2)])))


# --- tuples, projections, calls -------------------------------------------------------------


def test_tuples():
    assert same(parse_expr("()"), UNIT)
    assert same(parse_expr("(0,)"), Tuple([const(0)]))
    assert same(parse_expr("(0, 1, 2,)"), Tuple([const(0), const(1), const(2)]))
    assert same(parse_expr("((0))"), const(0))


def test_projection_chains_on_any_expression():
    x = var("x")
    assert same(parse_expr("free_var %x; %x.0.1"), TupleGetItem(TupleGetItem(x, 0), 1))
    assert same(parse_expr("(1, 2).1"), TupleGetItem(Tuple([const(1), const(2)]), 1))
    f = var("f")
    want = TupleGetItem(Call(Call(f, [x]), [x]), 2)
    assert same(parse_expr("free_var %f; free_var %x; %f(%x)(%x).2"), want)
    assert same(parse_expr("(1).0"), TupleGetItem(const(1), 0))


def test_calls_of_closures_globals_and_anonymous_functions():
    x = var("x")
    want = Call(Function([x], x), [const(0)])
    assert same(parse_expr("(fn (%x) { %x })(0)"), want)
    assert same(parse_expr("@f(1, 2)"), Call(GlobalVar("f"), [const(1), const(2)]))
    assert same(parse_expr("@f()"), Call(GlobalVar("f"), []))


def test_operator_calls_get_all_attributes_with_defaults():
    x, w = var("x", shape=(1, 3, 8, 8)), var("w", shape=(4, 3, 3, 3))
    text = """
    free_var %x: Tensor[(1, 3, 8, 8), float32];
    free_var %w: Tensor[(4, 3, 3, 3), float32];
    nn.conv2d(%x, %w, strides=[2, 2], padding=[1, 1, 1, 1], channels=4, kernel_size=[3, 3],)
    """
    e = parse_expr(text)
    want = conv2d(x, w, strides=[2, 2], padding=[1, 1, 1, 1], channels=4, kernel_size=[3, 3])
    assert same(e, want)
    assert e.attrs == want.attrs
    assert e.attrs["data_layout"] == "NCHW"  # the default was filled in


def test_operator_attribute_values():
    e = parse_expr('free_var %x: float32; nn.leaky_relu(%x, alpha=1e-05f)')
    assert e.attrs["alpha"] == 1e-05  # attribute floats are doubles, not float32
    e = parse_expr('free_var %x: float32; cast(%x, dtype="int64")')
    assert e.attrs["dtype"] == "int64"
    e = parse_expr("free_var %x; nn.dense(%x, %x, units=None)")
    assert e.attrs["units"] is None


def test_an_operator_is_a_value():
    assert parse_expr("nn.relu") == Op("nn.relu")
    assert isinstance(parse_expr("add"), Op)


def test_infix_operators_precedence_and_associativity():
    one = const(1)
    cases = {
        "1 * 1": multiply(one, one),
        "1 / 1": divide(one, one),
        "1 + 1": add(one, one),
        "1 - 1": subtract(one, one),
        "1 < 1": get("less")(one, one),
        "1 > 1": get("greater")(one, one),
        "1 <= 1": get("less_equal")(one, one),
        "1 >= 1": get("greater_equal")(one, one),
        "1 == 1": get("equal")(one, one),
        "1 != 1": get("not_equal")(one, one),
    }
    for text, want in cases.items():
        assert same(parse_expr(text), want), text
    assert same(parse_expr("1 * 1 + 1 < 1 == 1"), parse_expr("(((1 * 1) + 1) < 1) == 1"))
    assert same(parse_expr("1 == 1 < 1 + 1 * 1"), parse_expr("1 == (1 < (1 + (1 * 1)))"))
    assert same(parse_expr("1 - 2 - 3"), parse_expr("(1 - 2) - 3"))
    assert same(parse_expr("8 / 2 / 2"), parse_expr("(8 / 2) / 2"))
    assert not same(parse_expr("1 * 1 + 1"), parse_expr("1 * (1 + 1)"))


def test_minus_before_a_literal_after_an_operand_subtracts():
    x = var("x")
    assert same(parse_expr("free_var %x; %x -1"), subtract(x, const(1)))
    assert same(parse_expr("free_var %x; %x--1"), subtract(x, const(-1)))
    assert same(parse_expr("free_var %x; (%x, -1)"), Tuple([x, const(-1)]))


# --- functions and definitions --------------------------------------------------------------


def test_functions():
    x, y = var("x"), var("y")
    assert same(parse_expr("fn () { 0 }"), Function([], const(0)))
    assert same(parse_expr("fn (%x, %y) { %x + %y }"), Function([x, y], add(x, y)))
    xa = var("x", i32)
    assert same(parse_expr("fn (%x: int32) -> int32 { %x }"), Function([xa], xa, i32))


def test_function_attributes_follow_the_params():
    x = var("p0", shape=(1, 4))
    e = parse_expr("fn (%p0: Tensor[(1, 4), float32], Primitive=1, Compiler=\"ccl\") { %p0 }")
    assert same(e, Function([x], x, attrs={"Primitive": 1, "Compiler": "ccl"}))
    e = parse_expr("fn (Primitive=1, relay.reshape_only=1) { () }")
    assert e.attrs == {"Primitive": 1, "relay.reshape_only": 1}


def test_type_parameters():
    a = TypeVar("A")
    x = var("x", a)
    assert same(parse_expr("fn [A](%x: A) -> A { %x }"), Function([x], x, a, [a]))


def test_definitions_in_any_order_and_mutual_recursion():
    mod = parse(
        """
        def @even(%n: int32) -> bool { if (%n == 0) { True } else { @odd(%n - 1) } }
        def @odd(%n: int32) -> bool { if (%n == 0) { False } else { @even(%n - 1) } }
        """
    )
    n = var("n", i32)
    want_even = Function(
        [n],
        If(get("equal")(n, const(0)), const(True), Call(GlobalVar("odd"), [subtract(n, const(1))])),
        scalar_type("bool"),
    )
    assert same(mod["even"], want_even)
    assert set(g.name for g in mod.functions) == {"even", "odd"}


def test_the_version_header_is_optional_and_any_version_is_read():
    for header in ('#[version = "0.0.5"]\n', '#[version = "0.0.4"]\n', ""):
        mod = parse(header + "def @f() { () }")
        assert same(mod["f"], Function([], UNIT))


# --- control flow, ADTs, references ---------------------------------------------------------


def test_if():
    want = If(const(True), const(0), const(1))
    assert same(parse_expr("if (True) { 0 } else { 1 }"), want)
    nested = parse_expr("if (True) { if (False) { 0 } else { 1 } } else { 2 }")
    assert same(nested, If(const(True), If(const(False), const(0), const(1)), const(2)))


LIST = """
type List[A] {
  Cons(A, List[A]),
  Nil,
}
"""


def _list_adt():
    lst, a = GlobalTypeVar("List"), TypeVar("A")
    cons = Constructor("Cons", (a, TypeCall(lst, (a,))), lst)
    nil = Constructor("Nil", (), lst)
    return lst, a, cons, nil, TypeData(lst, (a,), (cons, nil))


def test_type_definitions():
    mod = parse(LIST + "\ntype Either[A, B] { Left(A), Right(B) }\ntype Unit { }\nextern type T[A]")
    lst, a, cons, nil, td = _list_adt()
    assert kiln.structural_equal(mod.type_data("List"), td)
    either = mod.type_data("Either")
    assert [c.name for c in either.constructors] == ["Left", "Right"]
    assert either.constructors[1].inputs == (either.type_vars[1],)
    assert mod.type_data("Unit").constructors == ()
    assert len(mod.type_data("T").type_vars) == 1


def test_types_may_be_used_before_they_are_defined():
    mod = parse("def @f(%x: Box[int32]) -> Box[int32] { %x }\ntype Box[A] { Box1(A) }")
    assert mod["f"].ret_type == TypeCall(GlobalTypeVar("Box"), (i32,))


def test_constructors_bare_and_called():
    mod = parse(LIST + "def @main(%x: int32) { (Cons(%x, Nil), Cons, Nil, Nil()) }")
    lst, a, cons, nil, td = _list_adt()
    x = var("x", i32)
    want = Function([x], Tuple([Call(cons, [x, Call(nil, [])]), cons, Call(nil, []),
                                Call(nil, [])]))
    assert kiln.structural_equal(mod["main"], want)


def test_match_and_patterns():
    text = LIST + """
    def @length[A](%xs: List[A]) -> int32 {
      match (%xs) {
        Cons(_, %rest: List[A]) => {
          ();
          1 + @length(%rest)
        },
        Nil => 0,
      }
    }
    def @pairs(%p: (List[int32], List[int32])) {
      match? (%p) {
        (Cons(%x, Nil), _) => %x,
        (%a, Cons(%b, %c)) => %b
      }
    }
    """
    mod = parse(text)
    lst, _, cons, nil, _ = _list_adt()
    a = TypeVar("A")
    xs = var("xs", TypeCall(lst, (a,)))
    rest = var("rest", TypeCall(lst, (a,)))
    body = Let(var("_"), UNIT, add(const(1), Call(GlobalVar("length"), [rest])))
    want = Function(
        [xs],
        Match(xs, [
            Clause(PatternConstructor(cons, [PatternWildcard(), PatternVar(rest)]), body),
            Clause(PatternConstructor(nil), const(0)),
        ]),
        i32,
        [a],
    )
    assert kiln.structural_equal(mod["length"], want)
    pairs = mod["pairs"].body
    assert pairs.complete is False
    first, second = pairs.clauses
    assert isinstance(first.lhs, PatternTuple)
    assert isinstance(first.lhs.patterns[0].patterns[1], PatternConstructor)
    assert second.rhs is second.lhs.patterns[1].patterns[0].var


def test_match_on_a_tuple_written_inline():
    e = parse_expr("free_var %a; free_var %b; match (%a, %b) { (%x, _) => %x }")
    assert isinstance(e.data, Tuple) and len(e.data.fields) == 2


def test_one_field_tuple_patterns():
    e = parse_expr("free_var %t; match (%t) { (%x) => %x, (%y,) => %y }")
    assert all(isinstance(c.lhs, PatternTuple) and len(c.lhs.patterns) == 1 for c in e.clauses)


def test_references():
    x = var("x")
    e = parse_expr("free_var %x; %0 = ref(%x); ref_write(%0, ref_read(%0)); ref_read(%0)")
    r = RefCreate(x)
    assert same(e, Let(var("_"), RefWrite(r, RefRead(r)), RefRead(r)))


def test_blocks_are_expressions():
    assert same(parse_expr("{ let %x = 1; %x }"), parse_expr("let %x = 1; %x"))


# --- types ----------------------------------------------------------------------------------


def test_tensor_types():
    t = parse_type("Tensor[(1, ?, n), float32]")
    assert t == TensorType((1, ANY, SymDim("n")), "float32")
    assert parse_type("Tensor[(), int8]") == scalar_type("int8")
    assert parse_type("Tensor[(3), bool]") == TensorType((3,), "bool")
    assert parse_type("Tensor[(3,), bool]") == TensorType((3,), "bool")
    assert parse_type("Tensor[(2i64, 3), float16]") == TensorType((2, 3), "float16")
    for dtype in kiln.ir.ty.DTYPES:
        assert parse_type(dtype) == scalar_type(dtype)


def test_compound_types():
    assert parse_type("()") == TupleType(())
    assert parse_type("(int32,)") == TupleType((i32,))
    assert parse_type("(int32)") == i32  # parentheses group; a one-field tuple needs a comma
    assert parse_type("(int32, (float32, bool))") == TupleType(
        (i32, TupleType((f32, scalar_type("bool"))))
    )
    assert parse_type("fn (int32, float32) -> bool") == FuncType((i32, f32), scalar_type("bool"))
    assert parse_type("fn () -> fn (int32) -> int32") == FuncType((), FuncType((i32,), i32))
    assert parse_type("ref(int32)") == RefType(i32)
    assert isinstance(parse_type("_"), IncompleteType)
    poly = parse_type("fn [A, B](A, fn (A) -> B) -> B")
    a, b = TypeVar("A"), TypeVar("B")
    assert kiln.structural_equal(poly, FuncType((a, FuncType((a,), b)), b, (a, b)))


def test_type_variables_are_scoped():
    e = parse_expr("fn [A](%x: A) { fn [A](%y: A) { %y } }")
    outer_a = e.type_params[0]
    inner = e.body
    assert inner.type_params[0] is not outer_a
    assert inner.params[0].type_annotation is inner.type_params[0]
    assert e.params[0].type_annotation is outer_a


# --- metadata and spans ---------------------------------------------------------------------


def test_metadata_constants():
    w = np.arange(6, dtype="float32").reshape(2, 3)
    text = kiln.astext(kiln.Function([], const(w)))
    assert "meta[relay.Constant][0]" in text and "#[metadata]" in text
    e = parse_expr(text)
    np.testing.assert_array_equal(e.body.data, w)


def test_one_metadata_constant_referenced_twice_is_one_node():
    c = const(np.ones((2, 2), "float32"))
    text = kiln.astext(Tuple([c, c]))
    e = parse_expr(text)
    assert e.fields[0] is e.fields[1]


def test_nodes_carry_spans_of_their_source():
    text = "def @main(%x: float32) {\n  %0 = add(%x, 1f);\n  nn.relu(%0)\n}\n"
    mod = parse(text, source_name="model.rly")
    relu_call = mod["main"].body
    assert (relu_call.span.line, relu_call.span.column) == (3, 3)
    assert (relu_call.span.end_line, relu_call.span.end_column) == (3, 14)
    inner = relu_call.args[0]
    assert (inner.span.line, inner.span.column, inner.span.end_column) == (2, 8, 19)
    assert inner.args[1].span.column == 16
    assert str(relu_call.span) == "model.rly:3:3"
    assert mod["main"].params[0].span.column == 11
