"""Type errors point at the source: line, column, the quoted line, expected and found."""

import pytest

import kiln

DENSE_MISMATCH = """#[version = "0.0.5"]
def @main(%x: Tensor[(1, 784), float32], %w: Tensor[(512, 700), float32]) {
  %0 = nn.dense(%x, %w);
  nn.relu(%0)
}
"""


def test_dense_reduction_mismatch_names_operator_shapes_and_dimension():
    mod = kiln.parse(DENSE_MISMATCH, source_name="model.rly")
    with pytest.raises(kiln.TypeCheckError) as err:
        kiln.infer_types(mod)
    e = err.value
    assert (e.line, e.column) == (3, 8)
    msg = str(e)
    assert "nn.dense" in msg
    assert "(1, 784)" in msg and "(512, 700)" in msg
    assert "dimension 1" in msg
    assert "model.rly:3:8" in msg
    assert "  %0 = nn.dense(%x, %w);" in msg
    assert "^" in msg.splitlines()[-1]


def test_if_branch_mismatch_points_at_the_branch():
    text = """def @main(%c: bool) {
  if (%c) {
    1f
  } else {
    2
  }
}"""
    with pytest.raises(kiln.TypeCheckError) as err:
        kiln.infer_types(kiln.parse(text))
    assert err.value.line == 5
    assert "float32" in str(err.value) and "int32" in str(err.value)


def test_wrong_argument_type_to_global():
    text = """def @f(%x: Tensor[(3), float32]) { %x }
def @main(%y: Tensor[(4), float32]) {
  @f(%y)
}"""
    with pytest.raises(kiln.TypeCheckError) as err:
        kiln.infer_types(kiln.parse(text))
    assert err.value.line == 3
    msg = str(err.value)
    assert "Tensor[(3,), float32]" in msg or "Tensor[(3), float32]" in msg
    assert "dimension 0 is 3 in one and 4 in the other" in msg


def test_non_exhaustive_match_is_located():
    text = """type List[A] { Cons(A, List[A]), Nil, }
def @hd(%xs: List[int32]) -> int32 {
  match (%xs) {
    Cons(%x, _) => %x,
  }
}"""
    with pytest.raises(kiln.TypeCheckError) as err:
        kiln.infer_types(kiln.parse(text))
    assert err.value.line == 3
    assert "Nil is not matched" in str(err.value)


def test_dtype_mismatch_in_binary_op():
    text = "def @main(%a: Tensor[(2), float32], %b: Tensor[(2), float16]) { %a + %b }"
    with pytest.raises(kiln.TypeCheckError, match="float16") as err:
        kiln.infer_types(kiln.parse(text))
    assert (err.value.line, err.value.column) == (1, 65)  # the span of `%a + %b`


def test_match_question_without_matching_clause_fails_at_run_time():
    text = """type List[A] { Cons(A, List[A]), Nil, }
def @hd(%xs: List[int32]) -> int32 {
  match? (%xs) {
    Cons(%x, _) => %x,
  }
}
def @main() { @hd(Nil) }"""
    with pytest.raises(kiln.EvalError) as err:
        kiln.interpret(kiln.parse(text))
    assert err.value.line == 3
    assert "Nil" in str(err.value)


def test_errors_are_kiln_errors():
    assert issubclass(kiln.TypeCheckError, kiln.Error)
    assert issubclass(kiln.ParseError, kiln.Error)
    assert issubclass(kiln.EvalError, kiln.Error)
