"""The printer writes TVM's style: graph names for dataflow, TVM's literal and attribute forms.

The expected texts are written by hand from TVM's printer conventions, not copied from output.
"""

import textwrap

import numpy as np

import kiln
from kiln import (
    Call,
    Clause,
    Constructor,
    Function,
    GlobalTypeVar,
    GlobalVar,
    If,
    IncompleteType,
    IRModule,
    Let,
    Match,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    RefCreate,
    RefRead,
    RefWrite,
    TensorType,
    Tuple,
    TupleGetItem,
    TypeCall,
    TypeData,
    TypeVar,
    Var,
    const,
    scalar_type,
    var,
)
from kiln.op import get
from kiln.text import astext, parse, parse_expr, type_text

add, multiply, relu, dense = get("add"), get("multiply"), get("nn.relu"), get("nn.dense")
i32, f32 = scalar_type("int32"), scalar_type("float32")


def expect(obj, text, **kw):
    want = textwrap.dedent(text).strip("\n")
    got = astext(obj, **kw)
    assert got.rstrip("\n") == want, "\n" + got


def test_dataflow_gets_graph_names_and_the_result_is_inline():
    x = var("x", shape=(1, 4))
    w = var("w", shape=(8, 4))
    h = relu(dense(x, w, units=8))
    mod = IRModule({"main": Function([x, w], add(h, h))})
    expect(
        mod,
        """
        #[version = "0.0.5"]
        def @main(%x: Tensor[(1, 4), float32], %w: Tensor[(8, 4), float32]) {
          %0 = nn.dense(%x, %w, units=8);
          %1 = nn.relu(%0);
          add(%1, %1)
        }
        """,
    )


def test_operator_attributes_only_when_not_default():
    x, w = var("x"), var("w")
    conv = get("nn.conv2d")(x, w, strides=[1, 1], padding=[1, 1, 1, 1], channels=4,
                            data_layout="NCHW", out_dtype="float32")
    clip = get("clip")(conv, a_min=-1.5, a_max=6.0)
    expect(
        Function([x, w], clip),
        """
        fn (%x, %w) {
          %0 = nn.conv2d(%x, %w, padding=[1, 1, 1, 1], channels=4, out_dtype="float32");
          clip(%0, a_min=-1.5f, a_max=6f)
        }
        """,
    )


def test_let_with_annotation_prints_the_value_inline():
    x = var("x", i32)
    y = var("y", TensorType((2,), "float32"))
    body = Let(y, const(np.zeros(2, "float32")), Tuple([x, y]))
    expect(
        Function([x], Let(var("z"), add(x, x), body)),
        """
        fn (%x: int32) {
          let %z = add(%x, %x);
          let %y: Tensor[(2), float32] = meta[relay.Constant][0];
          (%x, %y)
        }
        #[metadata]
        {
          "kiln_metadata": 1,
          "relay.Constant": [
            {"dtype": "float32", "shape": [2], "data": "AAAAAAAAAAA="}
          ]
        }
        """,
    )


def test_function_attributes_type_params_and_nested_scopes():
    a = TypeVar("A")
    x = var("x", a)
    p = var("p", shape=(3,))
    prim = Function([p], relu(relu(p)), TensorType((3,), "float32"), attrs={"Primitive": 1})
    y = var("y", shape=(3,))
    mod = IRModule({
        "id": Function([x], x, a, [a]),
        "main": Function([y], Call(prim, [Call(GlobalVar("id"), [y])])),
    })
    expect(
        mod,
        """
        #[version = "0.0.5"]
        def @id[A](%x: A) -> A {
          %x
        }

        def @main(%y: Tensor[(3), float32]) {
          %1 = fn (%p: Tensor[(3), float32], Primitive=1) -> Tensor[(3), float32] {
            %0 = nn.relu(%p);
            nn.relu(%0)
          };
          %2 = @id(%y);
          %1(%2)
        }
        """,
    )


def test_a_node_shared_by_both_branches_is_named_before_the_if():
    x, c = var("x", f32), var("c", scalar_type("bool"))
    shared = multiply(x, x)
    inner = add(x, const(1.0))
    expect(
        Function([x, c], If(c, add(shared, inner), relu(shared))),
        """
        fn (%x: float32, %c: bool) {
          %0 = multiply(%x, %x);
          if (%c) {
            %1 = add(%x, 1f);
            add(%0, %1)
          } else {
            nn.relu(%0)
          }
        }
        """,
    )


def test_condition_and_match_data_are_named_and_clauses_are_braced():
    lst, a = GlobalTypeVar("List"), TypeVar("A")
    cons = Constructor("Cons", (a, TypeCall(lst, (a,))), lst)
    nil = Constructor("Nil", (), lst)
    td = TypeData(lst, (a,), (cons, nil))
    b = TypeVar("B")
    xs = var("xs", TypeCall(lst, (b,)))
    h, t = var("h"), var("t")
    m = Match(Tuple([xs, xs]), [
        Clause(PatternTuple([PatternConstructor(cons, [PatternVar(h), PatternWildcard()]),
                             PatternVar(t)]), Call(cons, [h, t])),
        Clause(PatternWildcard(), Call(nil, [])),
    ], complete=False)
    mod = IRModule({"f": Function([xs], m, TypeCall(lst, (b,)), [b])}, [td])
    expect(
        mod,
        """
        #[version = "0.0.5"]
        type List[A] {
          Cons(A, List[A]),
          Nil,
        }

        def @f[B](%xs: List[B]) -> List[B] {
          %0 = (%xs, %xs);
          match? (%0) {
            (Cons(%h, _), %t) => {
              Cons(%h, %t)
            },
            _ => {
              Nil
            },
          }
        }
        """,
    )


def test_scalar_literals_in_tvm_forms():
    values = [
        const(3), const(-7, "int64"), const(5, "int16"), const(-2, "int8"), const(True),
        const(np.float32(0.1)), const(np.float32(1e-5)), const(np.float32(-0.0)),
        const(np.float32(16777216.0)), const(np.float16(0.1)), const(0.1, "float64"),
        const(np.float32(3.4028235e38)),
    ]
    expect(
        Tuple(values),
        "(3, -7i64, 5i16, -2i8, True, 0.1f, 1e-05f, -0f, 16777216f, 0.1f16, 0.1f64, "
        "3.4028235e+38f)",
    )


def test_constants_without_a_literal_go_to_the_metadata_section():
    values = [const(7, "uint8"), const(np.float32("inf")), const(np.array([1, 2], "int32"))]
    text = astext(Tuple(values))
    assert text.startswith(
        "(meta[relay.Constant][0], meta[relay.Constant][1], meta[relay.Constant][2])\n"
        "#[metadata]\n"
    )
    back = parse_expr(text)
    assert kiln.structural_equal(back, Tuple(values))


def test_names_are_made_valid_and_unique():
    names = ["x", "x", "", "0x", "let", "a b", "True", "inff", "x1"]
    params = [Var(n) for n in names]
    expect(
        Function(params, Tuple(params)),
        """
        fn (%x, %x1, %v, %v0x, %let_, %a_b, %True, %vinff, %x11) {
          (%x, %x1, %v, %v0x, %let_, %a_b, %True, %vinff, %x11)
        }
        """,
    )


def test_type_variable_names_avoid_dtypes_and_clashes():
    outer, inner = TypeVar("A"), TypeVar("A")
    weird = TypeVar("float32")
    x = var("x", outer)
    y = var("y", inner)
    z = var("z", weird)
    fn = Function([x], Function([y, z], Tuple([x, y]), type_params=[inner, weird]),
                  type_params=[outer])
    expect(
        fn,
        """
        fn [A](%x: A) {
          fn [A1, Tfloat32](%y: A1, %z: Tfloat32) {
            (%x, %y)
          }
        }
        """,
    )


def test_free_variables_are_declared_first():
    x = var("x", shape=(2, 2))
    expect(relu(x), "free_var %x: Tensor[(2, 2), float32];\nnn.relu(%x)")


def test_sequencing_and_parenthesized_lets():
    x = var("x", f32)
    v = var("v")
    shared_let = Let(v, relu(x), add(v, v))
    body = Let(Var("_"), RefCreate(x), Tuple([shared_let, shared_let]))
    expect(
        Function([x], body),
        """
        fn (%x: float32) {
          ref(%x);
          %0 = (
            let %v = nn.relu(%x);
            add(%v, %v)
          );
          (%0, %0)
        }
        """,
    )


def test_references_and_projections():
    x = var("x")
    r = RefCreate(x)
    fields = [RefWrite(r, RefRead(r)), TupleGetItem(x, 1), TupleGetItem(const(2), 0)]
    expect(
        Function([x], Tuple(fields)),
        """
        fn (%x) {
          %0 = ref(%x);
          %1 = ref_read(%0);
          %2 = ref_write(%0, %1);
          %3 = %x.1;
          %4 = (2).0;
          (%2, %3, %4)
        }
        """,
    )


def test_checked_types_are_shown_as_comments():
    x = Var("x", f32)
    call = Call(get("add").op, (x, x), get("add").normalize_attrs({}), checked_type_=f32)
    outer = Call(get("nn.relu").op, (call,), checked_type_=f32)
    fn = Function([x], outer)
    expect(
        fn,
        """
        fn (%x: float32) {
          %0 = add(%x, %x) /* ty=float32 */;
          nn.relu(%0) /* ty=float32 */
        }
        """,
    )
    expect(fn, "fn (%x: float32) {\n  %0 = add(%x, %x);\n  nn.relu(%0)\n}", show_types=False)


def test_strings_and_lists_in_attributes():
    x = var("x")
    f = Function([x], x, attrs={"Compiler": 'a "q"\n\\', "sizes": (1, (2, 3), ()),
                                "none": None, "flag": False, "eps": 1e-05})
    expect(
        f,
        r"""
        fn (%x, Compiler="a \"q\"\n\\", sizes=[1, [2, 3], []], none=None, flag=False, eps=1e-05f) {
          %x
        }
        """,
    )
    assert kiln.structural_equal(parse_expr(astext(f)), f)


def test_types():
    a = TypeVar("A")
    lst = GlobalTypeVar("List")
    assert type_text(TensorType((1, "n", None), "float16")) == "Tensor[(1, n, ?), float16]"
    assert type_text(TensorType((5,), "int8")) == "Tensor[(5), int8]"
    assert type_text(i32) == "int32"
    assert type_text(kiln.TupleType([i32])) == "(int32,)"
    assert type_text(kiln.FuncType([a], TypeCall(lst, [a]), [a])) == "fn [A](A) -> List[A]"
    assert type_text(kiln.RefType(kiln.TupleType([]))) == "ref(())"
    assert type_text(IncompleteType()) == "_"
    assert str(TypeCall(lst, [])) == "List"


def test_empty_and_constructor_free_types():
    mod = IRModule({}, [TypeData(GlobalTypeVar("Void"), (), ())])
    expect(mod, '#[version = "0.0.5"]\ntype Void {\n}')
    assert astext(IRModule({})) == '#[version = "0.0.5"]\n'


def test_text_of_a_parsed_tvm_style_program_is_the_program():
    text = textwrap.dedent(
        """\
        #[version = "0.0.5"]
        def @main(%x: Tensor[(1, 3), float32], %y: Tensor[(1, 3), float32]) -> (float32,) {
          %0 = add(%x, %y);
          %1 = nn.relu(%0);
          %2 = (%1, %0);
          %3 = %2.0;
          multiply(%3, %1)
        }
        """
    )
    assert astext(parse(text)) == text
