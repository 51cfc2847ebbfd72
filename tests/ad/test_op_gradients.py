"""Every differentiable operator's gradient rule against central finite differences.

The sweep walks the registry: an operator marked differentiable must have a gradient rule and
cases here. Each case draws random float64 inputs (random shapes where the operator allows),
differentiates a function calling the operator once, with a random seed for its result, and
compares with central differences of the operator's numpy reference.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.ad import grad
from kiln.testing.gradcheck import assert_close, directional_derivative, numerical_gradient

Gen = Callable[[np.random.Generator], list[Any]]


@dataclass
class Case:
    """Inputs (arrays, or tuples of arrays for tuple arguments) and attributes of one call."""

    inputs: Gen
    attrs: dict[str, Any] = field(default_factory=dict)
    eps: float = 1e-6
    rtol: float = 1e-5
    atol: float = 1e-6
    label: str = ""


def u(*shape: int, lo: float = -2.0, hi: float = 2.0) -> Callable[[np.random.Generator], Any]:
    return lambda rng: rng.uniform(lo, hi, size=shape)


def away(*shape: int, gap: float = 0.2, lo: float = -2.0, hi: float = 2.0):
    """Uniform values at least ``gap`` away from 0 (kinks of relu, abs...)."""
    def draw(rng: np.random.Generator) -> np.ndarray:
        x = rng.uniform(gap, hi, size=shape)
        return np.where(rng.random(shape) < 0.5, -x * (-lo / hi), x)
    return draw


def rshape(rng: np.random.Generator, rank: int) -> tuple[int, ...]:
    return tuple(int(d) for d in rng.integers(1, 5, size=rank))


def case(*gens: Callable[[np.random.Generator], Any], **kw: Any) -> Case:
    attrs = kw.pop("attrs", {})
    return Case(lambda rng: [g(rng) for g in gens], attrs, **kw)


def unary(lo: float = -2.0, hi: float = 2.0, gap: float = 0.0) -> list[Case]:
    """Random shapes of ranks 0 to 3."""
    out = []
    for rank in range(4):
        def gen(rng: np.random.Generator, rank: int = rank) -> list[Any]:
            shape = rshape(rng, rank)
            x = rng.uniform(lo, hi, size=shape)
            if gap:
                x = np.where(np.abs(x) < gap, gap * np.sign(x + 1e-12) + x, x)
            return [x]
        out.append(Case(gen, label=f"rank{rank}"))
    return out


BROADCAST_SHAPES = [((2, 3), (2, 3)), ((2, 3), (3,)), ((4, 1, 3), (2, 1)), ((), (2, 2)),
                    ((3, 1), (1, 4))]


def binary(lo: float = -2.0, hi: float = 2.0, rhs_lo: float | None = None,
           rhs_hi: float | None = None) -> list[Case]:
    rlo = lo if rhs_lo is None else rhs_lo
    rhi = hi if rhs_hi is None else rhs_hi
    return [
        case(u(*a, lo=lo, hi=hi), u(*b, lo=rlo, hi=rhi), label=f"{a}x{b}")
        for a, b in BROADCAST_SHAPES
    ]


def reductions(lo: float = -2.0, hi: float = 2.0) -> list[Case]:
    variants = [{}, {"axis": [0]}, {"axis": [-1], "keepdims": True}, {"axis": [0, 2]},
                {"axis": [1], "exclude": True}, {"axis": [2, 1], "keepdims": True}]
    return [case(u(2, 3, 4, lo=lo, hi=hi), attrs=v, label=str(v)) for v in variants]


def index(values: Any) -> Callable[[np.random.Generator], np.ndarray]:
    return lambda rng: np.asarray(values, "int32")


def conv_case(dshape, wshape, **attrs: Any) -> Case:
    return case(u(*dshape), u(*wshape), attrs=attrs, label=str(attrs))


def pool_cases(extra: dict[str, Any]) -> list[Case]:
    variants = [
        {"pool_size": 2, "strides": 2},
        {"pool_size": 3, "strides": 2, "padding": 1},
        {"pool_size": (2, 3), "strides": (1, 2), "padding": (1, 0, 0, 1), "ceil_mode": True},
        {"pool_size": 2, "dilation": 2, "padding": 1},
    ]
    return [case(u(2, 2, 7, 6), attrs={**v, **extra}, label=str(v)) for v in variants]


def positive_var(rng: np.random.Generator) -> np.ndarray:
    return rng.uniform(0.5, 2.0, size=(3,))


CASES: dict[str, list[Case]] = {
    "exp": unary(),
    "log": unary(0.2, 3.0),
    "sqrt": unary(0.2, 3.0),
    "rsqrt": unary(0.2, 3.0),
    "tanh": unary(),
    "sigmoid": unary(),
    "erf": unary(),
    "sin": unary(),
    "cos": unary(),
    "negative": unary(),
    "abs": unary(gap=0.1),
    "add": binary(),
    "subtract": binary(),
    "multiply": binary(),
    "divide": binary(rhs_lo=0.5, rhs_hi=2.0),
    "power": binary(0.3, 2.0),
    "maximum": binary(),
    "minimum": binary(),
    "where": [
        case(lambda rng: rng.random((2, 3)) < 0.5, u(2, 3), u(2, 3)),
        case(lambda rng: rng.random((3,)) < 0.5, u(2, 1), u(1, 3), label="broadcast"),
    ],
    "clip": [case(away(3, 4, gap=0.05), attrs={"a_min": -1.0, "a_max": 1.5})],
    "cast": [
        case(u(2, 3), attrs={"dtype": "float64"}),
        # through float32 and back: rounding limits the precision of differences
        case(u(2, 3), attrs={"dtype": "float32"}, eps=1e-3, rtol=1e-3, atol=1e-4),
    ],
    "zeros_like": [case(u(2, 3))],
    "ones_like": [case(u(3,))],
    "full": [case(u(), attrs={"shape": (2, 3)})],
    "full_like": [case(u(2, 3), u())],
    "nn.relu": unary(gap=0.05),
    "copy": unary(),
    "layout_transform": [case(u(1, 8, 2, 3), attrs={"src_layout": "NCHW",
                                                    "dst_layout": "NCHW4c"}),
                         case(u(1, 2, 3, 2, 2), attrs={"src_layout": "NCHW2c",
                                                    "dst_layout": "NHWC"})],
    "nn.leaky_relu": [case(away(3, 4, gap=0.05), attrs={"alpha": 0.1})],
    "nn.softmax": [case(u(2, 5)), case(u(3, 4, 2), attrs={"axis": 1})],
    "nn.log_softmax": [case(u(2, 5)), case(u(3, 4, 2), attrs={"axis": 0})],
    "nn.conv2d": [
        conv_case((2, 3, 6, 5), (4, 3, 3, 3)),
        # stride 1, one group: the adjoints are convolutions themselves (uneven padding and
        # kernel, a 1x1 kernel)
        conv_case((2, 3, 6, 5), (4, 3, 3, 2), padding=(2, 0, 1, 1)),
        conv_case((1, 3, 4, 4), (2, 3, 1, 1)),
        # strided, one group: the weight's adjoint is a convolution dilated by the stride, the
        # data's one of the adjoint spread out by it (ResNet's 1x1 downsampling; a 7x7
        # stride-2 stem; an odd size whose spread adjoint runs past the data; mixed strides)
        conv_case((2, 3, 6, 6), (4, 3, 1, 1), strides=2),
        conv_case((1, 2, 9, 9), (2, 2, 7, 7), strides=2, padding=3),
        conv_case((1, 2, 5, 5), (3, 2, 1, 1), strides=2),
        conv_case((1, 2, 7, 6), (2, 2, 3, 2), strides=(3, 1), padding=(2, 1, 0, 0)),
        conv_case((1, 2, 7, 7), (3, 2, 3, 3), strides=2, padding=(1, 0, 2, 1)),
        conv_case((2, 4, 6, 6), (4, 2, 3, 2), groups=2, dilation=(2, 1), padding=1),
        conv_case((1, 3, 5, 6), (3, 1, 3, 3), groups=3, strides=(2, 1), padding=1),
    ],
    "nn.contrib_conv2d_NCHWc": [
        conv_case((1, 2, 5, 4, 2), (3, 2, 3, 3, 2, 2), padding=1, data_layout="NCHW2c",
                  kernel_layout="OIHW2i2o"),
        conv_case((1, 2, 5, 5, 2), (2, 2, 2, 3, 1, 3), strides=(2, 1), padding=(1, 0, 0, 1),
                  groups=2, data_layout="NCHW2c", kernel_layout="OIHW1i3o", out_layout="NCHW"),
    ],
    "nn.conv2d_transpose": [
        conv_case((2, 4, 3, 3), (4, 2, 3, 3)),
        conv_case((1, 4, 3, 4), (4, 1, 3, 2), strides=2, padding=1, output_padding=(1, 0),
                  groups=2),
        conv_case((1, 2, 4, 3), (2, 3, 2, 3), dilation=(1, 2), padding=(0, 1, 1, 0)),
    ],
    "nn.conv2d_backward_weight": [
        case(u(2, 4, 3, 3), u(2, 3, 5, 5), attrs={"kernel_size": (3, 3)}),
        case(u(1, 4, 4, 2), u(1, 2, 6, 5), label="strided, grouped",
             attrs={"kernel_size": (2, 3), "strides": 2, "groups": 2, "padding": (1, 0)}),
    ],
    "nn.dense": [
        case(u(3, 4), u(5, 4)),
        case(u(2, 3, 4), u(2, 4), label="rank 3"),
        case(u(4), u(3, 4), label="rank 1"),
    ],
    "nn.batch_matmul": [
        case(u(2, 3, 4), u(2, 5, 4)),
        case(u(2, 4, 3), u(2, 4, 5), attrs={"transpose_a": True, "transpose_b": False}),
        case(u(1, 3, 4), u(2, 4, 5), attrs={"transpose_b": False}, label="batch 1 x 2"),
        case(u(3, 4, 3), u(1, 5, 4), attrs={"transpose_a": True}, label="batch 3 x 1"),
    ],
    "nn.bias_add": [case(u(2, 3, 4), u(3)), case(u(2, 3), u(3), attrs={"axis": -1})],
    "nn.batch_norm": [
        case(u(2, 3, 2, 2), u(3), u(3), u(3), positive_var),
        case(u(4, 3), u(3), u(3), u(3), positive_var, attrs={"axis": -1, "center": False}),
        case(u(2, 2, 3), u(3), u(3), u(3), positive_var, attrs={"axis": 2, "scale": False}),
        case(u(2, 3, 2, 2), u(3), u(3), u(3), positive_var,
             attrs={"training": True, "momentum": 0.3}, label="training"),
        case(u(5, 3), u(3), u(3), u(3), positive_var,
             attrs={"axis": -1, "training": True, "center": False}, label="training axis -1"),
        case(u(2, 3, 2), u(2), u(2), u(2), u(2, lo=0.5, hi=2.0),
             attrs={"axis": 2, "training": True, "scale": False}, label="training no scale"),
    ],
    "nn.layer_norm": [
        case(u(2, 5), u(5), u(5)),
        case(u(2, 3, 4), u(3), u(3), attrs={"axis": 1, "center": False}),
        case(u(3, 4), u(3), u(3), attrs={"axis": 0, "scale": False}),
    ],
    "nn.dropout": [case(u(2, 3), attrs={"rate": 0.3})],
    "nn.dropout_train": [case(u(3, 4), lambda rng: np.array([5, 1], np.int64),
                              attrs={"rate": 0.3}),
                         case(u(2, 3, 2), lambda rng: np.array([9, 4], np.int64),
                              attrs={"rate": 0.5, "stream": 2}, label="stream 2")],
    "nn.max_pool2d": pool_cases({}),
    "nn.avg_pool2d": pool_cases({}) + pool_cases({"count_include_pad": True})[1:3],
    "nn.avg_pool2d_grad": [
        case(u(2, 2, 3, 3), u(2, 2, 6, 6), attrs={"pool_size": 2, "strides": 2}),
        case(u(1, 2, 4, 3), u(1, 2, 7, 6), attrs={"pool_size": 3, "strides": 2, "padding": 1}),
    ],
    "nn.global_avg_pool2d": [case(u(2, 3, 4, 5))],
    "nn.global_max_pool2d": [case(u(2, 3, 4, 5))],
    "nn.pad": [
        case(u(2, 3), u(), attrs={"pad_width": ((1, 2), (0, 1))}),
        case(u(2, 3, 4), u(), attrs={"pad_width": ((0, 0), (2, 1), (1, 3)), "pad_mode": "edge"}),
        case(u(3, 4), u(), attrs={"pad_width": ((2, 1), (1, 2)), "pad_mode": "reflect"}),
    ],
    "nn.batch_flatten": [case(u(2, 3, 4))],
    "sum": reductions(),
    "mean": reductions(),
    "prod": reductions(0.5, 1.5),
    "max": reductions(),
    "min": reductions(),
    "reshape": [case(u(2, 3, 4), attrs={"newshape": (6, -1)}),
                case(u(6), attrs={"newshape": (-4, 2, 3)})],
    "transpose": [case(u(2, 3, 4)), case(u(2, 3, 4), attrs={"axes": (1, -1, 0)})],
    "expand_dims": [case(u(2, 3), attrs={"axis": 1, "num_newaxis": 2})],
    "squeeze": [case(u(2, 1, 3, 1)), case(u(1, 3, 1), attrs={"axis": [0]})],
    "concatenate": [
        case(lambda rng: (rng.uniform(-1, 1, (2, 1)), rng.uniform(-1, 1, (2, 3))),
             attrs={"axis": 1}),
        case(lambda rng: tuple(rng.uniform(-1, 1, (k, 2)) for k in (1, 2, 3))),
    ],
    "stack": [case(lambda rng: (rng.uniform(-1, 1, (2, 3)), rng.uniform(-1, 1, (2, 3))),
                   attrs={"axis": 1})],
    "split": [case(u(6, 2), attrs={"indices_or_sections": 3}),
              case(u(2, 7), attrs={"indices_or_sections": (2, 5), "axis": 1})],
    "dyn.reshape": [
        case(u(2, 3, 4), index([6, -1])),
        case(u(2, 3, 4), index([0, 4, 3])),
    ],
    "dyn.broadcast_to": [
        case(u(3, 1), index([2, 3, 4])),
        case(u(2, 3), index([2, 3])),
    ],
    "take": [
        case(u(5, 3), index([[0, 4], [4, 2]]), attrs={"axis": 0}),
        case(u(3, 4), index([11, 0, 11, 5])),
        case(u(2, 5, 3), index([[7, -1], [2, 2]]), attrs={"axis": 1, "mode": "wrap"}),
        case(u(2, 5, 3), index([[9, 1], [0, 3]]), attrs={"axis": 1, "batch_dims": 1}),
    ],
    "strided_slice": [
        case(u(4, 5), attrs={"begin": [1, 0], "end": [3, 5], "strides": [1, 2]}),
        case(u(4, 5), attrs={"begin": [4], "end": [0], "strides": [-2], "axes": [1]}),
        case(u(3, 4), attrs={"begin": [1, 1], "end": [-1, 2], "slice_mode": "size"}),
    ],
    "broadcast_to": [case(u(3, 1), attrs={"shape": (2, 3, 4)})],
    "tile": [case(u(2, 3), attrs={"reps": (2, 1, 2)}), case(u(2, 1, 3), attrs={"reps": (2,)})],
    "collapse_sum_like": [case(u(2, 3, 4), u(3, 1))],
    "broadcast_to_like": [case(u(3, 1), u(2, 3, 4))],
    "reshape_like": [case(u(2, 6), u(3, 4))],
    "take_grad": [case(u(2, 2, 3), u(5, 3), index([[0, 4], [4, 2]]), attrs={"axis": 0}),
                  case(u(3), u(3, 4), index([11, 0, 11]))],
    "strided_slice_grad": [case(u(2, 3), u(4, 5),
                                attrs={"begin": [1, 0], "end": [3, 5], "strides": [1, 2]})],
}


def _build(name: str, inputs: list[Any], attrs: dict[str, Any]) -> tuple[kiln.Function, list]:
    """A function of one parameter per input array calling the operator; its leaf arrays."""
    params, args, leaves = [], [], []
    for i, value in enumerate(inputs):
        parts = list(value) if isinstance(value, tuple) else [value]
        vs = []
        for j, part in enumerate(parts):
            a = np.asarray(part)
            v = kiln.var(f"in{i}_{j}", shape=a.shape, dtype=a.dtype.name)
            params.append(v)
            leaves.append(a)
            vs.append(v)
        args.append(kiln.Tuple(tuple(vs)) if isinstance(value, tuple) else vs[0])
    return kiln.Function(params, kiln.op.get(name)(*args, **attrs)), leaves


def _reference(name: str, inputs: list[Any], attrs: dict[str, Any]) -> Callable[..., Any]:
    """The operator's numpy reference as a function of the leaf arrays."""
    opdef = kiln.op.get(name)
    normalized = opdef.normalize_attrs(attrs)

    def f(*leaves: np.ndarray) -> Any:
        rest = list(leaves)
        arrays = []
        for value in inputs:
            n = len(value) if isinstance(value, tuple) else 1
            taken, rest = rest[:n], rest[n:]
            arrays.append(tuple(taken) if isinstance(value, tuple) else taken[0])
        return opdef.compute(arrays, normalized)

    return f


def _normal(rng: np.random.Generator, like: np.ndarray) -> np.ndarray:
    return rng.standard_normal(np.shape(like)).astype(np.asarray(like).dtype)


def _params() -> list[Any]:
    out = []
    for name, cases in CASES.items():
        for i, c in enumerate(cases):
            out.append(pytest.param(name, c, id=f"{name}-{c.label or i}"))
    return out


@pytest.mark.parametrize(("name", "c"), _params())
def test_gradient_against_finite_differences(name: str, c: Case) -> None:
    rng = np.random.default_rng(abs(hash(name)) % 2**32)
    inputs = c.inputs(rng)
    fn, leaves = _build(name, inputs, c.attrs)
    typed = kiln.infer_types(fn)
    wrt = [i for i, a in enumerate(leaves) if a.dtype.kind == "f"]
    f = _reference(name, inputs, c.attrs)
    out = f(*leaves)
    seed = (tuple(_normal(rng, o) for o in out) if isinstance(out, tuple) else _normal(rng, out))
    g = grad(typed, mode="first_order", wrt=wrt, keeping=(), seedable=True)
    grads = kiln.interpret(kiln.IRModule.from_expr(g), *leaves, seed)
    for i, gi in zip(wrt, grads, strict=True):
        what = f"d/d input {i} of {name}"
        assert np.shape(gi) == leaves[i].shape, what
        if leaves[i].size <= 60:
            expected = numerical_gradient(f, leaves, i, seed, c.eps)
            assert_close(gi, expected, c.rtol, c.atol, what)
        else:
            for _ in range(3):
                d = rng.standard_normal(leaves[i].shape)
                dirs: list[Any] = [None] * len(leaves)
                dirs[i] = d
                expected_dd = directional_derivative(f, leaves, dirs, seed, c.eps)
                assert_close(np.sum(gi * d), expected_dd, c.rtol, c.atol * 10, what)


# Straight-through estimators: finite differences of a rounding are 0 almost everywhere, so
# these are checked against their definition instead (tests/op/test_qnn_quantize.py).
STRAIGHT_THROUGH = {"qnn.quantize"}


def test_every_differentiable_operator_has_a_gradient_and_a_check() -> None:
    missing_rule = [o.name for o in kiln.op.all_ops() if o.differentiable and o.gradient is None]
    assert not missing_rule, f"differentiable operators without a gradient rule: {missing_rule}"
    unchecked = [o.name for o in kiln.op.all_ops() if o.differentiable and o.name not in CASES
                 and o.name not in STRAIGHT_THROUGH]
    assert not unchecked, f"differentiable operators the sweep does not check: {unchecked}"
    stale = [n for n in CASES if not kiln.op.get(n).differentiable]
    assert not stale, f"cases for operators marked non-differentiable: {stale}"


def test_integer_and_comparison_operators_are_not_differentiable() -> None:
    names = ["equal", "not_equal", "less", "less_equal", "greater", "greater_equal",
             "logical_and", "logical_or", "logical_not", "argmax", "argmin", "all", "any",
             "floor", "ceil", "round", "sign", "mod", "floor_divide", "floor_mod", "arange"]
    for name in names:
        assert not kiln.op.get(name).differentiable, name
