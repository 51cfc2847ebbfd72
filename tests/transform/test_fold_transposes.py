"""fold-transposes: each row against the reference interpreter, the rows that must not fire,
every permutation through take and squeeze, and PyTorch's exported attention."""

import itertools

import numpy as np
import pytest

import kiln
from kiln.infer import infer_types
from kiln.ir.expr import Call
from kiln.ir.traverse import post_order
from kiln.transform.fold_transposes import FoldTransposes
from kiln.transform.graph_normal_form import ToGraphNormalForm
from kiln.transform.pass_manager import PassContext, typed
from kiln.transform.simplify_expr import SimplifyExpr


def run(mod: kiln.IRModule) -> kiln.IRModule:
    with PassContext(debug=True):  # the driver checks each rewrite keeps its type
        return FoldTransposes()(mod)


def program(params: str, body: str) -> kiln.IRModule:
    return kiln.parse(f"def @main({params}) {{ {body} }}")


def args_of(mod: kiln.IRModule, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.standard_normal(p.checked_type.shape).astype(p.checked_type.dtype)
            for p in typed(mod)["main"].params]


def same_values(a: kiln.IRModule, b: kiln.IRModule) -> None:
    args = args_of(a)
    np.testing.assert_array_equal(kiln.interpret(b, *args), kiln.interpret(a, *args))


X = "%x: Tensor[(2, 3, 4, 5), float32]"
AB = "%a: Tensor[(3, 4, 5), float32], %b: Tensor[(3, 6, 5), float32]"

CASES = [
    # a transpose that moves only axes of size 1 is a reshape
    ("%x: Tensor[(2, 1, 4), float32]", "transpose(%x, axes=[1, 0, 2])",
     "reshape(%x, newshape=[1, 2, 4])"),
    # an empty tensor: the 0 in the new shape is a size, not "copy"
    ("%x: Tensor[(0, 1, 4), float32]", "transpose(%x, axes=[1, 0, 2])",
     "reshape(%x, newshape=[1, 0, 4], allowzero=1)"),
    # squeeze first
    ("%x: Tensor[(2, 1, 3), float32]", "squeeze(transpose(%x, axes=[1, 2, 0]), axis=[0])",
     "transpose(squeeze(%x, axis=[1]), axes=[1, 0])"),
    # take from x, transpose what is left (or nothing)
    ("%x: Tensor[(3, 4, 5), float32]", "take(transpose(%x, axes=[2, 0, 1]), 1, axis=0)",
     "take(%x, 1, axis=2)"),
    ("%x: Tensor[(3, 4, 5), float32]",
     'take(transpose(%x, axes=[1, 2, 0]), 2, axis=1, mode="wrap")',
     'transpose(take(%x, 2, axis=2, mode="wrap"), axes=[1, 0])'),
    # a swap of the last two axes leaves through a reshape of the leading ones ...
    (X, "reshape(transpose(%x, axes=[0, 1, 3, 2]), newshape=[6, 5, 4])",
     "transpose(reshape(%x, newshape=[6, 4, 5]), axes=[0, 2, 1])"),
    # ... and through a scaling by one number, on either side
    (X, "multiply(transpose(%x, axes=[0, 1, 3, 2]), 0.5f)",
     "transpose(multiply(%x, 0.5f), axes=[0, 1, 3, 2])"),
    (X, "divide(2f, transpose(%x, axes=[0, 1, 3, 2]))",
     "transpose(divide(2f, %x), axes=[0, 1, 3, 2])"),
    # into batch_matmul's flags
    (AB, "nn.batch_matmul(%a, transpose(%b, axes=[0, 2, 1]), transpose_b=False)",
     "nn.batch_matmul(%a, %b, transpose_b=True)"),
    ("%a: Tensor[(3, 5, 4), float32], %b: Tensor[(3, 6, 5), float32]",
     "nn.batch_matmul(transpose(%a, axes=[0, 2, 1]), %b)",
     "nn.batch_matmul(%a, %b, transpose_a=True)"),
    ("%a: Tensor[(3, 5, 4), float32], %b: Tensor[(3, 5, 6), float32]",
     "nn.batch_matmul(transpose(%a, axes=[0, 2, 1]), transpose(%b, axes=[0, 2, 1]))",
     "nn.batch_matmul(%a, %b, transpose_a=True, transpose_b=False)"),
    # the three together: a scaled kᵀ, reshaped to 3-D, in a matmul
    ("%q: Tensor[(6, 7, 8), float32], %k: Tensor[(2, 3, 7, 8), float32]",
     "nn.batch_matmul(%q, reshape(multiply(transpose(%k, axes=[0, 1, 3, 2]), 0.25f), "
     "newshape=[6, 8, 7]), transpose_b=False)",
     "nn.batch_matmul(%q, reshape(multiply(%k, 0.25f), newshape=[6, 7, 8]), "
     "transpose_b=True)"),
]


@pytest.mark.parametrize("params, before, expected", CASES)
def test_rows(params, before, expected):
    mod = program(params, before)
    out = run(mod)
    assert kiln.structural_equal(out, program(params, expected)), kiln.astext(out)
    same_values(mod, out)


KEPT = [
    # axes longer than 1 change places: a real transpose
    ("%x: Tensor[(2, 3, 4), float32]", "transpose(%x, axes=[1, 0, 2])"),
    # an index with dimensions of its own
    ("%x: Tensor[(3, 4, 5), float32], %i: Tensor[(2), int32]",
     "take(transpose(%x, axes=[2, 0, 1]), %i, axis=0)"),
    # a reshape that mixes the swapped axes with others
    ("%x: Tensor[(2, 3, 4), float32]", "reshape(transpose(%x, axes=[0, 2, 1]), newshape=[2, 12])"),
    # a scaling by several numbers (per row of the transpose)
    ("%x: Tensor[(3, 4), float32], %c: Tensor[(3), float32]",
     "multiply(transpose(%x), %c)"),
    # batch axis moved: not a flag
    ("%a: Tensor[(3, 4, 5), float32], %b: Tensor[(6, 3, 5), float32]",
     "nn.batch_matmul(%a, transpose(%b, axes=[1, 0, 2]))"),
]


@pytest.mark.parametrize("params, before", KEPT)
def test_rows_that_must_not_fire(params, before):
    mod = program(params, before)
    assert kiln.structural_equal(run(mod), mod), kiln.astext(run(mod))


def test_a_constant_of_several_numbers_stays_put():
    x = kiln.var("x", shape=(3, 4))
    c = kiln.const(np.arange(3, dtype="float32"))
    mod = kiln.IRModule.from_expr(
        kiln.Function([x], kiln.op.multiply(kiln.op.transpose(x), c)))
    assert kiln.structural_equal(run(mod), mod)


SHAPE = (2, 1, 3, 1)


@pytest.mark.parametrize("perm", list(itertools.permutations(range(4))))
def test_every_permutation_through_take_and_squeeze(perm):
    x = kiln.var("x", shape=SHAPE)
    t = kiln.op.transpose(x, axes=list(perm))
    out_shape = [SHAPE[a] for a in perm]
    exprs = [kiln.op.take(t, kiln.const(np.array(i, "int32")), axis=axis)
             for axis in range(4) for i in range(out_shape[axis])]
    exprs.append(kiln.op.squeeze(t, axis=[a for a in range(4) if out_shape[a] == 1]))
    mod = kiln.IRModule.from_expr(kiln.Function([x], kiln.tuple_(*exprs)))
    out = run(mod)
    arg = np.arange(6, dtype="float32").reshape(SHAPE)
    want = kiln.interpret(mod, arg)
    got = kiln.interpret(out, arg)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    # no take or squeeze reads a transpose any more
    for node in post_order(out["main"]):
        if isinstance(node, Call) and getattr(node.op, "name", "") in ("take", "squeeze"):
            arg0 = node.args[0]
            assert not (isinstance(arg0, Call) and getattr(arg0.op, "name", "") == "transpose")


def test_pytorch_attention_exported_to_onnx():
    """nn.MultiheadAttention through ONNX: q, k and v read the projection in place, kᵀ is
    batch_matmul's flag, and the result is torch's."""
    torch = pytest.importorskip("torch")
    from kiln.frontend import from_onnx
    from kiln.testing import torch_models

    torch.manual_seed(0)

    class Attention(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.mha = torch.nn.MultiheadAttention(32, 4)

        def forward(self, x):
            return self.mha(x, x, x, need_weights=False)[0]

    twin = Attention().eval()
    x = np.random.default_rng(1).standard_normal((7, 1, 32)).astype("float32")
    mod, params = from_onnx(torch_models.onnx_model(twin, x))
    simplified = infer_types(SimplifyExpr()(ToGraphNormalForm()(typed(mod))))
    folded = infer_types(run(simplified))
    before, after = transposes(simplified), transposes(folded)
    assert max(rank for rank, _ in before) == 5  # the packed q/k/v, transposed whole
    assert max(rank for rank, _ in after) < 5
    assert len(after) < len(before)
    matmuls = [n for n in post_order(folded["main"])
               if isinstance(n, Call) and getattr(n.op, "name", "") == "nn.batch_matmul"]
    assert len(matmuls) == 2
    assert any(n.attrs["transpose_b"] for n in matmuls)  # q·kᵀ reads k as it is
    exe = kiln.build(mod, params=params)
    want = torch_models.run_torch(twin, x)
    assert torch_models.max_error(np.asarray(exe(x)), want) < 1e-5


def transposes(mod: kiln.IRModule) -> list[tuple[int, tuple[int, ...]]]:
    """(rank, shape) of the input of every transpose in @main."""
    return [(len(n.args[0].checked_type.shape), tuple(n.args[0].checked_type.shape))
            for n in post_order(mod["main"])
            if isinstance(n, Call) and getattr(n.op, "name", "") == "transpose"]
