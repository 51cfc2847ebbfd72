"""Parse errors point at the offending token (1-based line and column) and say what is wrong."""

import pytest

import kiln
from kiln.text import parse, parse_expr, parse_type


def error_of(fn, text):
    with pytest.raises(kiln.ParseError) as info:
        fn(text)
    return info.value


@pytest.mark.parametrize(
    "text, line, column, message",
    [
        # names and scopes
        ("let %x = 1;\n(%x, %y)", 2, 6, "unbound variable %y"),
        ("fn (%x) { %x };\n%x", 2, 1, "unbound variable %x"),
        ("if (True) {\n  let %x = ();\n  ()\n} else {\n  %x\n}", 5, 3, "unbound variable %x"),
        ("if (True) { %0 = 1; %0 } else { %0 }", 1, 33, "%0 is not defined here"),
        ("fn () { %0 = 1; %0 }; %0", 1, 23, "%0 is not defined here"),
        ("let %x = %x; %x", 1, 10, "unbound variable %x"),
        ("let %value = 1; %valeu", 1, 17, "did you mean %value?"),
        ("nn.reluu(1)", 1, 1, "did you mean nn.relu?"),
        ("Cons(1)", 1, 1, "undefined constructor or operator `Cons`"),
        ("float32", 1, 1, "`float32` is a type, not an expression"),
        ("let %0 = 1; %0", 1, 5, "`%0` is a graph binding"),
        # operators and attributes
        ("free_var %x;\nnn.conv2d(%x, %x, stride=[1, 1])", 2, 19, "did you mean strides?"),
        ("free_var %x;\nnn.conv2d(%x, %x, strides=\"a\")", 2, 27, "strides must be a list"),
        ("free_var %x; nn.relu(%x, %x)", 1, 14, "nn.relu takes 1 argument"),
        ("free_var %f; %f(1, axis=1)", 1, 20, "a function (not an operator) need `attrs_type_key"),
        ("free_var %x; cast(%x)", 1, 14, "needs attribute 'dtype'"),
        ("free_var %x; nn.bias_add(%x, %x, axis=1, axis=2)", 1, 42, "given twice"),
        ("free_var %x; nn.bias_add(%x, axis=1, %x)", 1, 38, "positional arguments come before"),
        ("free_var %x; cast(%x, dtype=int32)", 1, 29, "expected an attribute value"),
        # literals and tokens
        ("(1, 2147483648i32)", 1, 5, "out of range for int32"),
        ("1.5i", 1, 1, "integer suffix"),
        ("(1, 2) $", 1, 8, "unexpected character '$'"),
        ("\"abc", 1, 1, "never closed"),
        ("/* open /* nested */ still open", 1, 1, "block comment is never closed"),
        ("#[foo]", 1, 1, "unknown attribute"),
        ('"a\\q"', 1, 1, "unknown escape"),
        ("- %x", 1, 1, "negates only number literals"),
        ("1 + let %x = 1; %x", 1, 5, "must be wrapped in parentheses"),
        # structure
        ("fn (%x) { %x", 1, 13, "expected `}` to close the function body"),
        ("(1, 2", 1, 6, "expected `)` to close the tuple"),
        ("(1 2)", 1, 4, "expected `,` or `)`"),
        ("if (True) { 1 }", 1, 16, "an `if` needs both branches"),
        ("let %x = 1", 1, 11, "expected `;`"),
        ("fn (%x, %x) { %x }", 1, 9, "parameter %x is declared twice"),
        ("fn (%x: Tensor[(1, -1), float32]) { %x }", 1, 20, "expected a dimension"),
        ("fn (%x: Tensor[(1), float16x4]) { %x }", 1, 21, "vector dtypes"),
        ("fn (%x: Foo) { %x }", 1, 9, "undefined type `Foo`"),
        ("fn [A](%x: B) { %x }", 1, 12, "undefined type `B`"),
        ("fn [A](%x: A[int32]) { %x }", 1, 13, "takes no type arguments"),
        ("1; 2;", 1, 6, "the input ended"),
        ("meta[relay.Constant][0]", 1, 1, "this text has none"),
        ("free_var %x; free_var %x; %x", 1, 23, "declared twice"),
    ],
)
def test_expression_errors(text, line, column, message):
    err = error_of(parse_expr, text)
    assert (err.line, err.column) == (line, column), err.render()
    assert message in err.message, err.render()


LIST = "type List[A] {\n  Cons(A, List[A]),\n  Nil,\n}\n"


@pytest.mark.parametrize(
    "text, line, column, message",
    [
        ("def @f() { @g() }", 1, 12, "undefined global function @g"),
        ("def @main() { @mian() }", 1, 15, "did you mean @main?"),
        ("def @f() { () }\ndef @f() { () }", 2, 5, "@f is defined twice"),
        (LIST + "type List[B] { Other }", 5, 6, "type List is defined twice"),
        (LIST + "type Other { Nil }", 5, 14, "constructor Nil is defined twice"),
        (LIST + "def @f(%x: List[A]) { %x }", 5, 17, "undefined type `A`"),
        (LIST + "def @f(%x) { match (%x) { Cons(%h, %h) => %h } }", 5, 36, "bound twice"),
        (LIST + "def @f(%x) { match (%x) { Cons(%h) => %h } }", 5, 27, "has 2 field(s)"),
        (LIST + "def @f(%x) { match (%x) { cons(%h, _) => %h } }", 5, 27, "write `%cons`"),
        (LIST + "def @f(%x) {\n  match (%x) {\n    Cons(%h, _) => %h,\n    Nil => %h,\n  }\n}",
         8, 12, "unbound variable %h"),
        ("def @f() { () }\n1", 2, 1, None),  # a trailing expression is @main: fine
        ("def @main() { () }\n1", 2, 1, "also has a bare expression"),
        ("def f() { () }", 1, 5, "expected a global name"),
        ('def @f() { () }\n#[version = "0.0.5"]', 2, 1, "must come first"),
        ("type float32 { A }", 1, 6, "built-in type"),
        ("extern type T { A }", 1, 15, "extern type has no constructors"),
        ("def @f() { () }\n#[metadata]\n{not json", 2, 1, "not valid JSON"),
        ('def @f() { () }\n#[metadata]\n{"relay.Constant": [{"dtype": "float32", '
         '"shape": [2], "data": "AAAA"}]}', 2, 1, "holds 3 bytes"),
    ],
)
def test_module_errors(text, line, column, message):
    if message is None:
        parse(text)
        return
    err = error_of(parse, text)
    assert (err.line, err.column) == (line, column), err.render()
    assert message in err.message, err.render()


def test_type_errors():
    err = error_of(parse_type, "Tensor[(1, 2) float32]")
    assert (err.line, err.column) == (1, 15)
    assert "expected `,` between the shape and the dtype" in err.message
    err = error_of(parse_type, "List[int32]")
    assert "undefined type `List`" in err.message
    err = error_of(parse_type, "fn (int32) int32")
    assert (err.column, "expected `->`") == (12, err.message[: len("expected `->`")])


def test_error_text_quotes_the_line_with_a_caret():
    text = "def @main(%x: float32) {\n  %0 = add(%x, %y);\n  %0\n}\n"
    err = error_of(lambda t: parse(t, source_name="model.rly"), text)
    rendered = str(err)
    assert rendered.startswith("model.rly:2:16: syntax error: unbound variable %y")
    assert " 2 |   %0 = add(%x, %y);" in rendered
    assert rendered.splitlines()[-1] == "   |                ^^"
    assert isinstance(err, kiln.Error)


def test_errors_point_past_tabs_and_carriage_returns_correctly():
    err = error_of(parse_expr, "let %x = 1;\r\n\tlet %y = %z;\r\n%y")
    assert (err.line, err.column) == (2, 11)


def test_parse_rejects_non_text():
    with pytest.raises(kiln.Error):
        parse(b"def @f() { () }")  # type: ignore[arg-type]
