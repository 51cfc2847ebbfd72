"""Fused groups lowered to one kernel each, against the reference interpreter.

Besides agreeing with `kiln.interpret`, a fused kernel must compute its injective and
elementwise parts inline: no intermediate buffer (a local allocation other than an
operator's own accumulators), and a reduction's or an extern's elementwise consumers applied
as its epilogue, while the value is fresh.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import kiln
from kiln import op
from kiln.ir.expr import Tuple, TupleGetItem
from kiln.loops.ir import Allocate, For, IfThenElse, Kernel, LetStmt, Seq, Stmt
from kiln.loops.lower import lower_primitive

from .helpers import Case, arg, check_alone, check_fused, program

nn = op.nn


def _statements(kernel: Kernel) -> list[Stmt]:
    out: list[Stmt] = []
    stack: list[Stmt] = [kernel.body]
    while stack:
        s = stack.pop()
        out.append(s)
        match s:
            case For(body=b) | LetStmt(body=b) | Allocate(body=b):
                stack.append(b)
            case Seq(stmts=ss):
                stack.extend(ss)
            case IfThenElse(then_case=t, else_case=e):
                stack.extend(x for x in (t, e) if x is not None)
    return out


def _locals(kernel: Kernel) -> list[str]:
    return sorted(s.buffer.name for s in _statements(kernel) if isinstance(s, Allocate))


def _intermediates(kernel: Kernel) -> list[str]:
    """Materialized intermediate tensors (the lowering driver names them t0, t1, ...)."""
    return [n for n in _locals(kernel) if n[0] == "t" and n[1:].isdigit()]


def _one_kernel(case: Case) -> Kernel:
    kernels = check_fused(case)
    assert len(kernels) == 1, [k.attrs["ops"] for k in kernels]
    return kernels[0]


def test_elementwise_chain_into_a_reduction() -> None:
    case = Case(lambda x, b: op.sum(op.multiply(op.exp(op.subtract(x, b)), op.tanh(x)), axis=[1]),
                [arg(2, 5), arg(5)])
    k = _one_kernel(case)
    assert k.attrs["ops"] == ("subtract", "exp", "tanh", "multiply", "sum")
    assert _locals(k) == ["acc"]


@pytest.mark.parametrize("activation", [nn.relu, op.tanh, lambda y: nn.leaky_relu(y, alpha=0.2)])
def test_dense_bias_activation_epilogue(activation) -> None:  # noqa: ANN001
    case = Case(lambda x, w, b: activation(nn.bias_add(nn.dense(x, w), b, axis=-1)),
                [arg(2, 5), arg(3, 5), arg(3)])
    k = _one_kernel(case)
    assert k.attrs["ops"][:2] == ("nn.dense", "nn.bias_add")
    assert _intermediates(k) == []  # scratch of the packed GEMM is fine


def test_conv2d_bias_relu_add_epilogue() -> None:
    case = Case(lambda x, w, b, r: op.add(nn.relu(nn.bias_add(nn.conv2d(x, w, padding=1), b)), r),
                [arg(1, 2, 4, 4), arg(3, 2, 3, 3), arg(3), arg(1, 3, 4, 4)])
    k = _one_kernel(case)
    assert k.attrs["ops"] == ("nn.conv2d", "nn.bias_add", "nn.relu", "add")
    assert _intermediates(k) == []


def test_batch_matmul_epilogue() -> None:
    case = Case(lambda x, y, s: op.multiply(nn.batch_matmul(x, y), s),
                [arg(2, 3, 4), arg(2, 2, 4), arg(1, 1, 2)])
    assert _intermediates(_one_kernel(case)) == []


def test_diamond_is_inlined() -> None:
    def diamond(x):  # noqa: ANN001, ANN202
        e = op.exp(x)
        return op.add(op.multiply(e, op.tanh(e)), op.sigmoid(e))

    k = _one_kernel(Case(diamond, [arg(2, 3)]))
    assert _locals(k) == []


def test_injective_ops_are_inlined() -> None:
    def injective(a, b, i):  # noqa: ANN001, ANN202
        joined = op.concatenate(Tuple([op.exp(a), nn.relu(b)]), axis=1)
        flipped = op.strided_slice(op.transpose(joined), begin=[4], end=[-10], strides=[-2])
        picked = op.take(flipped, i, axis=1, mode="wrap")
        return op.multiply(op.reshape(picked, newshape=[-1]), kiln.const(2.0))

    case = Case(injective, [arg(2, 2), arg(2, 3), arg(3, dtype="int32", low=-4, high=4)])
    assert _intermediates(check_alone(case)) == []
    check_fused(case)


def test_tuple_results_of_one_kernel() -> None:
    def tuples(x, g, b, m, v):  # noqa: ANN001, ANN202
        e = op.exp(x)
        parts = op.split(op.add(e, x), indices_or_sections=[1], axis=1)
        normed = nn.batch_norm(op.reshape(e, newshape=[2, 3, 1]), g, b, m, v)
        return Tuple([e, TupleGetItem(parts, 1), parts, TupleGetItem(normed, 0)])

    case = Case(tuples, [arg(2, 3), arg(3), arg(3), arg(3), arg(3, low=0.5, high=2)])
    k = check_alone(case)
    assert len(k.outputs) == 5
    assert _intermediates(k) == []


def test_a_reduction_read_across_rows_is_materialized_once() -> None:
    # x - mean(x) reads the mean at other indices than it writes: one local buffer for it.
    case = Case(lambda x: op.subtract(x, op.mean(x, axis=[1], keepdims=True)), [arg(2, 3)])
    k = check_alone(case)
    assert _intermediates(k) == ["t0"]
    check_fused(case)


def test_reduction_results_shared_by_outputs_are_computed_once() -> None:
    case = Case(lambda x: Tuple([op.max(x, axis=[0]), op.exp(op.max(x, axis=[0]))]), [arg(3, 2)])
    check_alone(case)


@pytest.mark.parametrize("extern", [
    lambda x: nn.softmax(x),
    lambda x: nn.log_softmax(x, axis=0),
    lambda x: op.cast(op.argmax(x, axis=[1]), dtype="float32"),
    lambda x: nn.layer_norm(x, op.ones_like(op.sum(x, axis=[0])),
                            op.zeros_like(op.sum(x, axis=[0]))),
], ids=["softmax", "log_softmax", "argmax", "layer_norm"])
def test_extern_epilogue(extern) -> None:  # noqa: ANN001
    case = Case(lambda x: nn.relu(op.add(extern(x), kiln.const(0.25))), [arg(2, 3)])
    k = check_alone(case)
    assert _intermediates(k) == []


def test_integer_division_in_a_group_and_its_check() -> None:
    def build(a, b):  # noqa: ANN001, ANN202
        return nn.relu(op.add(op.floor_mod(a, b), op.divide(a, b)))

    ok = Case(build, [arg(2, 3, dtype="int32", low=-9, high=9),
                      arg(3, dtype="int32", values=[2, -1, -3])])
    check_fused(ok)
    zero = Case(build, [arg(2, 3, dtype="int32"), arg(3, dtype="int32", values=[2, 0, 1])])
    check_fused(zero)  # the reference and the kernel both raise EvalError
    with pytest.raises(kiln.EvalError, match="division by zero"):
        from .helpers import inputs, run_kernel

        run_kernel(lower_primitive(program(zero)["main"]), inputs(zero))


def test_small_cnn_and_transformer_blocks() -> None:
    def cnn(x, w1, g, b, m, v, w2, wd, bd):  # noqa: ANN001, ANN202
        y = nn.conv2d(x, w1, padding=1)
        y = nn.relu(TupleGetItem(nn.batch_norm(y, g, b, m, v), 0))
        y = nn.max_pool2d(y, pool_size=2, strides=2)
        y = nn.relu(nn.conv2d(y, w2, padding=1, groups=2))
        y = nn.batch_flatten(nn.global_avg_pool2d(y))
        return nn.softmax(nn.bias_add(nn.dense(y, wd), bd))

    check_fused(Case(cnn, [arg(1, 2, 6, 6), arg(4, 2, 3, 3), arg(4), arg(4), arg(4),
                           arg(4, low=0.5, high=2), arg(4, 2, 3, 3), arg(3, 4), arg(3)]))

    def attention(x, wq, wk, g, b):  # noqa: ANN001, ANN202
        q = op.reshape(nn.dense(x, wq), newshape=[1, 3, 4])
        k = op.reshape(nn.dense(x, wk), newshape=[1, 3, 4])
        scores = nn.softmax(op.multiply(nn.batch_matmul(q, k), kiln.const(0.5)))
        mixed = op.reshape(nn.batch_matmul(scores, op.transpose(q, axes=[0, 2, 1])),
                           newshape=[3, 4])
        return nn.layer_norm(op.add(mixed, x), g, b)

    check_fused(Case(attention, [arg(3, 4), arg(4, 4), arg(4, 4), arg(4), arg(4)]))


def test_the_deepest_fused_chain() -> None:
    # FuseOps groups at most 256 operators; such a chain lowers to one kernel and runs.
    def chain(a):  # noqa: ANN001, ANN202
        y = a
        for k in range(255):
            y = op.sigmoid(y) if k % 2 else op.add(y, a)
        return y

    check_alone(Case(chain, [arg(2, 2)]))


# Shapes large enough for parallel loops: lowered and verified (nested parallel loops,
# bounds), not run.
LARGE = [
    Case(lambda x: nn.softmax(x), [arg(256, 256)]),
    Case(lambda x, i: op.take_grad(op.take(x, i, axis=0), x, i, axis=0),
         [arg(512, 64), arg(256, dtype="int32")]),
    Case(lambda g, x: nn.max_pool2d_grad(g, x, pool_size=3, strides=2, padding=1),
         [arg(1, 16, 56, 56), arg(1, 16, 112, 112)]),
    Case(lambda x, w: nn.relu(nn.conv2d(x, w, padding=1, strides=2)),
         [arg(1, 16, 64, 64), arg(32, 16, 3, 3)]),
    Case(lambda x: op.argmax(x, axis=[1]), [arg(512, 128)]),
    Case(lambda a, b: op.divide(a, b), [arg(256, 256, dtype="int32"), arg(256, dtype="int32")]),
    Case(lambda x, g, b: nn.layer_norm(x, g, b), [arg(256, 256), arg(256), arg(256)]),
]


@pytest.mark.parametrize("case", LARGE, ids=lambda c: c.label or "large")
def test_large_kernels_verify(case: Case) -> None:
    kernel = lower_primitive(program(case)["main"])
    kinds = {s.kind for s in _statements(kernel) if isinstance(s, For)}
    assert "parallel" in kinds


def test_integer_results_are_exact() -> None:
    # the comparison for integer results is exact; make sure a wrong one would be caught
    case = Case(lambda a: op.add(a, kiln.const(1)), [arg(3, dtype="int32")])
    with warnings.catch_warnings():
        check_alone(case)
    from .helpers import compare

    with pytest.raises(AssertionError):
        compare(np.array([1, 2], "int32"), np.array([1, 3], "int32"), 1e-5, 1e-6, "x")
