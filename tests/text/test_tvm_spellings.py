"""Relay text as TVM 0.12 printed it: dtype shorthands, call attributes of functions, float16
literal range, and where an unclosed call is reported. The programs are typed in as TVM wrote
them; the oracle for values is numpy."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.ir.ty import TensorType
from kiln.text.parser import parse, parse_expr, parse_type


@pytest.mark.parametrize(
    ("text", "dtype"),
    [
        ("Tensor[(2), int]", "int32"),
        ("Tensor[(2), uint]", "uint32"),
        ("Tensor[(2), float]", "float32"),
        ("Tensor[(2), bool]", "bool"),
        ("Tensor[(2), uint1]", "bool"),  # TVM's own name for bool
        ("Tensor[(2), int8]", "int8"),
        ("Tensor[(2), uint16]", "uint16"),
        ("Tensor[(2), float16]", "float16"),
    ],
)
def test_tvm_dtype_spellings_in_tensor_types(text: str, dtype: str) -> None:
    assert parse_type(text) == TensorType((2,), dtype)


@pytest.mark.parametrize(("text", "dtype"), [("int", "int32"), ("float", "float32"),
                                              ("uint", "uint32"), ("bool", "bool")])
def test_tvm_dtype_spellings_as_scalar_types(text: str, dtype: str) -> None:
    assert parse_type(text) == TensorType((), dtype)


def test_dtype_attributes_take_tvm_spellings() -> None:
    mod = parse(
        '#[version = "0.0.5"]\n'
        "def @main(%x: Tensor[(3), float]) -> Tensor[(3), int] {\n"
        '  cast(%x, dtype="int")\n'
        "}\n"
    )
    call = mod["main"].body
    assert call.attrs["dtype"] == "int32"
    x = np.array([1.7, -2.5, 3.0], "float32")
    out = kiln.interpret(mod, x)
    np.testing.assert_array_equal(out, x.astype("int32"))
    assert out.dtype == np.int32
    assert 'dtype="int32"' in str(mod)  # printed in kiln's (and TVM's canonical) spelling


def test_unknown_shorthand_is_still_an_error() -> None:
    with pytest.raises(kiln.ParseError, match="unsupported dtype 'int1'") as info:
        parse_type("Tensor[(2), int1]")
    assert (info.value.span.line, info.value.span.column) == (1, 13)


# A call of a function with attributes, as TVM's printer writes it (PrintCallAttrs adds the
# attrs_type_key so that its parser can rebuild the attributes).
CALL_WITH_ATTRS = """#[version = "0.0.5"]
def @main(%x: Tensor[(2, 2), float32]) -> Tensor[(2, 2), float32] {
  %0 = fn (%a: Tensor[(2, 2), float32], Primitive=1) -> Tensor[(2, 2), float32] {
    negative(%a)
  };
  %0(%x, lanes=4, attrs_type_key="relay.attrs.TestAttrs")
}
"""


def test_call_attributes_of_functions_are_read_and_ignored() -> None:
    mod = parse(CALL_WITH_ATTRS)
    call = mod["main"].body
    assert isinstance(call.op, kiln.Function) and not call.attrs
    x = np.arange(4, dtype="float32").reshape(2, 2)
    np.testing.assert_array_equal(kiln.interpret(mod, x), -x)


def test_call_attributes_of_functions_need_their_type_key() -> None:
    text = CALL_WITH_ATTRS.replace(', attrs_type_key="relay.attrs.TestAttrs"', "")
    with pytest.raises(kiln.ParseError, match="attrs_type_key") as info:
        parse(text)
    assert (info.value.span.line, info.value.span.column) == (6, 10)


@pytest.mark.parametrize("text", ["70000f16", "-65520f16", "1e5f16"])
def test_float16_literal_out_of_range(text: str) -> None:
    with pytest.raises(kiln.ParseError, match="out of range for float16") as info:
        parse_expr(f"add(1f16, {text})")
    span = info.value.span
    assert (span.line, span.column, span.end_column) == (1, 11, 11 + len(text))


def test_float16_literals_in_range() -> None:
    for text, value in [("65504f16", 65504.0), ("-65504f16", -65504.0), ("65519f16", 65504.0)]:
        c = parse_expr(text)
        assert c.data.dtype == np.float16 and float(c.data) == value


@pytest.mark.parametrize(
    ("text", "line", "column"),
    [
        ("free_var %x: Tensor[(2), float32];\n%0 = add(%x, %x;\nnegative(%0)", 2, 16),
        ("free_var %x: Tensor[(2), float32];\nadd(%x, %x;\n%x", 2, 11),
        ("fn (%x: Tensor[(2), float32]) {\n  %0 = nn.relu(%x;\n  %1 = add(%0, %0);\n  %1\n}",
         2, 18),
        ("free_var %x: Tensor[(2), float32];\n%0 = add(%x, negative(%x);\n%0", 2, 26),
    ],
)
def test_unclosed_call_reports_the_missing_paren(text: str, line: int, column: int) -> None:
    with pytest.raises(kiln.ParseError, match=r"found `;`: the `\(` of this call") as info:
        parse_expr(text)
    span = info.value.span
    assert (span.line, span.column) == (line, column), info.value.render()


def test_a_sequence_inside_a_call_still_parses() -> None:
    # TVM's grammar allows `e1; e2` as an argument; only a failure is read as a missing `)`.
    e = parse_expr("free_var %x: Tensor[(2), float32];\nadd(%x, (%x; %x))")
    assert isinstance(e, kiln.Call)
    e = parse_expr("free_var %x: Tensor[(2), float32];\nadd(%x, let %y = %x; %y)")
    assert isinstance(e.args[1], kiln.Let)


def test_errors_inside_a_let_argument_keep_their_own_message() -> None:
    with pytest.raises(kiln.ParseError, match="unbound variable %z"):
        parse_expr("free_var %x: Tensor[(2), float32];\nadd(%x, let %y = %x; %z)")
