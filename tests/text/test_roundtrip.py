"""parse(astext(m)) is m: for parsed programs, for programs built in Python, for every constant."""

from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln import (
    Call,
    Clause,
    Constant,
    Function,
    If,
    IRModule,
    Let,
    Match,
    PatternVar,
    PatternWildcard,
    Tuple,
    TupleGetItem,
    Var,
    const,
    var,
)
from kiln.ir.ty import DTYPES
from kiln.op import get
from kiln.text import astext, parse, parse_expr

DATA = Path(__file__).parent / "data"
PROGRAMS = Path(__file__).parent.parent / "programs"
SOURCES = sorted(DATA.glob("*.rly")) + sorted(PROGRAMS.glob("*.rly"))


def round_trip(mod):
    text = astext(mod)
    again = parse(text)
    assert kiln.structural_equal(again, mod), text
    assert astext(again) == text
    return text


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: p.name)
def test_source_programs_round_trip(path):
    mod = parse(path.read_text(), source_name=path.name)
    round_trip(mod)


def test_the_prelude_style_library_parses_as_written():
    mod = parse((DATA / "stdlib.rly").read_text(), source_name="stdlib.rly")
    names = {g.name for g in mod.functions}
    assert {"ident", "after", "fold_right1", "pairs", "scan_right", "unfold", "repeat"} <= names
    assert {t.name for t in mod.type_definitions} == {"Seq", "Maybe", "Rose", "Opaque"}
    # `-> (fn(T) -> T)` is a parenthesized function type, not a one-field tuple
    assert isinstance(mod["repeat"].ret_type, kiln.FuncType)
    # `None` is an ordinary constructor name
    assert mod.get_constructor("None").belong_to.name == "Maybe"


def test_typed_programs_round_trip_with_type_comments():
    text = (PROGRAMS / "cnn.rly").read_text()
    typed = kiln.infer_types(parse(text))
    printed = astext(typed)
    assert "/* ty=Tensor[(2, 8, 16, 16), float32] */;" in printed
    assert kiln.structural_equal(parse(printed), parse(text))


def test_programs_built_in_python_round_trip():
    relu, add, dense = get("nn.relu"), get("add"), get("nn.dense")
    x = var("x", shape=(2, 4))
    w = var("w", shape=(3, 4))
    h = relu(dense(x, w))
    acc = var("acc")
    loop = Let(acc, add(h, h), Tuple([acc, TupleGetItem(Tuple([acc, h]), 1)]))
    c = var("c", kiln.scalar_type("bool"))
    f = Function([var("p")], const(np.float16(2.5)))
    body = If(c, Call(f, [loop]), Call(f, [h]))
    round_trip(IRModule({"main": Function([x, w, c], body)}))


def test_a_function_value_shared_by_two_branches_keeps_its_parameters():
    # A function built once and used in both branches: its parameters are bound once in the
    # original, so the text must define it once, where both branches can see it.
    n = var("n")
    f = Function([n], get("negative")(n))
    c, x = var("c"), var("x")
    round_trip(IRModule({"main": Function([c, x], If(c, Call(f, [x]), Call(f, [f])))}))


def test_let_bound_match_and_pattern_names_round_trip():
    mod = parse(
        """
        type Opt[A] { Yes(A), No }
        def @main(%o: Opt[int32]) {
          let %r = match (%o) { Yes(%v) => %v, No => 0 };
          let %s = match? (%o) { Yes(%v) => %v };
          (%r, %s)
        }
        """
    )
    round_trip(mod)


@pytest.mark.parametrize("dtype", DTYPES)
def test_constants_of_every_dtype_round_trip_bit_for_bit(dtype):
    rng = np.random.default_rng(0)
    if dtype == "bool":
        arrays = [np.array(True), rng.random((2, 3)) > 0.5]
    elif dtype.startswith(("int", "uint")):
        info = np.iinfo(dtype)
        arrays = [np.array(v, dtype) for v in (info.min, info.max, 0, 1)]
        arrays.append(rng.integers(info.min, info.max, (3, 2), dtype=dtype, endpoint=True))
    else:
        finfo = np.finfo(dtype)
        special = [0.0, -0.0, 1.0, -2.5, finfo.max, finfo.min, finfo.tiny, finfo.smallest_subnormal,
                   finfo.eps, np.inf, -np.inf, np.nan, 0.1, 1 / 3, 1e-5, 12345.678]
        arrays = [np.array(v, dtype) for v in special]
        arrays.append(rng.standard_normal((4, 5)).astype(dtype))
        arrays.append(np.frombuffer(b"\x01\x00\xc0\x7f" * 2, "<f4").astype(dtype))  # NaN payload
        arrays.append(np.zeros((0, 3), dtype))
    consts = [Constant(a) for a in arrays]
    e = Tuple(consts)
    back = parse_expr(astext(e))
    assert kiln.structural_equal(back, e)
    for a, b in zip(consts, back.fields):
        assert a.data.tobytes() == b.data.tobytes() and a.data.shape == b.data.shape


def test_float32_literals_are_shortest_and_exact():
    rng = np.random.default_rng(1)
    values = np.concatenate([rng.standard_normal(300), rng.standard_normal(300) * 1e30,
                             rng.standard_normal(300) * 1e-30]).astype("float32")
    for v in values:
        text = astext(const(v))
        assert not text.startswith("meta")
        assert parse_expr(text).data.tobytes() == v.tobytes(), text


def test_unicode_and_escapes_in_string_attributes_round_trip():
    x = var("x")
    for s in ["", "é∑😀", 'quote " and \\ backslash', "line\nbreak\ttab\rcr", "\x00\x7f"]:
        f = Function([x], x, attrs={"name": s})
        assert parse_expr(astext(f)).attrs["name"] == s


def test_sequencing_round_trips_as_sequencing():
    e = parse_expr("free_var %x: float32; nn.relu(%x); ref(%x); %x")
    assert astext(e) == "free_var %x: float32;\nnn.relu(%x);\nref(%x);\n%x"


def test_pattern_variables_named_like_others_are_renamed():
    x = var("x")
    y = var("x")
    m = Match(x, [Clause(PatternVar(y), Tuple([x, y])), Clause(PatternWildcard(), x)])
    text = astext(Function([x], m))
    assert "%x1 => {" in text
    assert kiln.structural_equal(parse_expr(text), Function([x], m))


def test_parse_twice_gives_distinct_but_equal_programs():
    text = (PROGRAMS / "lists.rly").read_text()
    a, b = parse(text), parse(text)
    assert kiln.structural_equal(a, b)
    assert a["main"] is not b["main"]


def test_nested_functions_keep_one_graph_counter_per_definition():
    text = astext(parse((PROGRAMS / "closures.rly").read_text()))
    main = text[text.index("def @main"):]
    assert "%0 = equal(%k, 0);" in main and "%3 = %both(%x);" in main


def test_unused_let_of_a_python_name_round_trips():
    x = var("x")
    e = Function([x], Let(Var(""), x, Let(Var("_", kiln.scalar_type("int32")), x, x)))
    back = parse_expr(astext(e))
    assert kiln.structural_equal(back, e)


TVM_FUSED = """\
#[version = "0.0.5"]
def @main(%data: Tensor[(1, 3, 8, 8), float32] /* ty=Tensor[(1, 3, 8, 8), float32] */, \
%weight: Tensor[(4, 3, 3, 3), float32] /* ty=Tensor[(4, 3, 3, 3), float32] */) \
-> Tensor[(1, 4, 8, 8), float32] {
  %2 = fn (%p0: Tensor[(1, 3, 8, 8), float32], %p1: Tensor[(4, 3, 3, 3), float32], \
Primitive=1, hash="5c4b2a3c0e8a1b2d") -> Tensor[(1, 4, 8, 8), float32] {
    %0 = nn.conv2d(%p0, %p1, padding=[1, 1, 1, 1], channels=4, kernel_size=[3, 3]) \
/* ty=Tensor[(1, 4, 8, 8), float32] */;
    %1 = nn.relu(%0) /* ty=Tensor[(1, 4, 8, 8), float32] */;
    multiply(%1, 2f /* ty=float32 */) /* ty=Tensor[(1, 4, 8, 8), float32] */
  } /* ty=fn (Tensor[(1, 3, 8, 8), float32], Tensor[(4, 3, 3, 3), float32]) -> \
Tensor[(1, 4, 8, 8), float32] */;
  %2(%data, %weight) /* ty=Tensor[(1, 4, 8, 8), float32] */
}
"""


def test_tvm_printed_fused_program_with_type_comments():
    mod = parse(TVM_FUSED)
    fused = mod["main"].body.op
    assert isinstance(fused, Function) and fused.attrs["Primitive"] == 1
    text = round_trip(mod)
    assert "Primitive=1, hash=\"5c4b2a3c0e8a1b2d\") -> Tensor[(1, 4, 8, 8), float32] {" in text
    # Printed with its types, it is TVM's text again (kiln leaves out the comments that TVM
    # put on parameters and on inline constants).
    want = TVM_FUSED.replace(" /* ty=Tensor[(1, 3, 8, 8), float32] */,", ",")
    want = want.replace(" /* ty=Tensor[(4, 3, 3, 3), float32] */)", ")")
    want = want.replace("2f /* ty=float32 */", "2f")
    assert astext(kiln.infer_types(mod)) == want


def tvm_metadata(arrays):
    """A metadata section in TVM's node format (tvm.ir.save_json), written independently."""
    import base64
    import json
    import struct

    codes = {"i": 0, "u": 1, "f": 2, "b": 1}
    blobs = []
    for a in arrays:
        bits = 1 if a.dtype == np.bool_ else a.dtype.itemsize * 8
        head = struct.pack("<QQiii", 0xDD5E40F096B4A13F, 0, 1, 0, a.ndim)
        head += struct.pack("<BBH", codes[a.dtype.kind], bits, 1)
        head += struct.pack(f"<{a.ndim}q", *a.shape) + struct.pack("<q", a.nbytes)
        blobs.append(base64.b64encode(head + a.astype(a.dtype.newbyteorder("<")).tobytes()))
    consts = [{"type_key": "relay.Constant", "attrs": {"data": str(i), "span": "0"}}
              for i in range(len(arrays))]
    nodes = [{"type_key": ""},
             {"type_key": "Map", "keys": ["relay.Constant"], "data": [2]},
             {"type_key": "Array", "data": list(range(3, 3 + len(arrays)))}, *consts]
    return json.dumps({"root": 1, "nodes": nodes, "b64ndarrays": [b.decode() for b in blobs],
                       "attrs": {"tvm_version": "0.8.0"}}, indent=2)


def test_metadata_in_tvms_node_format_is_read():
    arrays = [np.arange(6, dtype="float32").reshape(2, 3), np.array([True, False]),
              np.array(-3, "int64"), np.zeros((0, 2), "float16")]
    refs = ", ".join(f"meta[relay.Constant][{i}]" for i in range(len(arrays)))
    text = f'#[version = "0.0.5"]\ndef @main() {{\n  ({refs})\n}}\n#[metadata]\n'
    mod = parse(text + tvm_metadata(arrays))
    for a, c in zip(arrays, mod["main"].body.fields):
        assert c.data.dtype == a.dtype and c.data.shape == a.shape
        np.testing.assert_array_equal(c.data, a)
    bad = text + tvm_metadata(arrays).replace('"data": "0"', '"data": "9"')
    with pytest.raises(kiln.ParseError, match="missing tensor"):
        parse(bad)
