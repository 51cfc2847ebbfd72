"""Small programs for every operator, for the lowering sweep (tests/loops/test_op_lowering.py).

``CASES[name]`` lists programs calling the operator ``name``: several shapes (random ones,
drawn from a fixed seed, for the elementwise and broadcasting operators), dtypes, and
attribute settings, including the edges the lowerings handle specially (padding, ceil mode,
negative strides, empty axes, NaN, integer division by 0 and by -1). Shapes stay tiny: the
loop-IR evaluator runs every element in Python.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import kiln
from kiln import op
from kiln.ir.expr import Tuple, TupleGetItem

from .helpers import Arg, Case, arg

nn = op.nn
CASES: dict[str, list[Case]] = {}

_rng = np.random.default_rng(20240605)


def add(name: str, build: Callable[..., kiln.Expr], *args: Arg, label: str = "",
        rtol: float = 1e-5, atol: float = 1e-6) -> None:
    """One case of operator ``name``."""
    CASES.setdefault(name, []).append(Case(build, list(args), label or name, rtol, atol))


def _shape(max_ndim: int = 3, max_dim: int = 4) -> tuple[int, ...]:
    return tuple(int(d) for d in _rng.integers(1, max_dim + 1, size=_rng.integers(0, max_ndim + 1)))


def _broadcast_pair() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Two shapes that broadcast: the second has some axes set to 1 and may be shorter."""
    a = _shape()
    b = tuple(1 if _rng.random() < 0.35 else d for d in a)
    b = b[int(_rng.integers(0, len(b) + 1)):] if b else b
    return (a, b) if _rng.random() < 0.5 else (b, a)


def ints(*shape: int, dtype: str = "int32", low: int = -9, high: int = 9,
         values: object = None) -> Arg:
    return arg(*shape, dtype=dtype, low=low, high=high, values=values)


def bools(*shape: int) -> Arg:
    return arg(*shape, dtype="bool")


# --- elementwise -------------------------------------------------------------------------------

FLOAT_UNARY = {
    "exp": (-5, 5), "log": (0.01, 10), "sqrt": (0, 10), "rsqrt": (0.01, 10), "tanh": (-5, 5),
    "sigmoid": (-20, 20), "erf": (-4, 4), "sin": (-7, 7), "cos": (-7, 7),
}
for _name, (_lo, _hi) in FLOAT_UNARY.items():
    _fn = getattr(op, _name)
    for _dt in ("float32", "float32", "float64"):
        add(_name, lambda a, f=_fn: f(a), arg(*_shape(), dtype=_dt, low=_lo, high=_hi))

# TVM types float math on integers at their dtype: float64 inside, truncated back.
for _name, (_lo, _hi) in FLOAT_UNARY.items():
    _fn = getattr(op, _name)
    _ilo = max(int(np.ceil(_lo)), 1 if _name in ("log", "rsqrt") else _lo)
    add(_name, lambda a, f=_fn: f(a), ints(2, 3, low=int(_ilo), high=min(int(_hi), 6)),
        label=f"{_name} int32")

NUMERIC_UNARY = ["negative", "abs", "floor", "ceil", "round", "sign"]
for _name in NUMERIC_UNARY:
    _fn = getattr(op, _name)
    add(_name, lambda a, f=_fn: f(a), arg(*_shape(), low=-5, high=5))
    add(_name, lambda a, f=_fn: f(a), ints(*_shape()))
    add(_name, lambda a, f=_fn: f(a), ints(2, 3, dtype="uint8", low=0, high=255))
for _name in ("floor", "ceil", "round", "sign"):
    # halves, values next to them, a large odd integer, signed zeros and NaN
    _fn = getattr(op, _name)
    add(_name, lambda a, f=_fn: f(a),
        arg(10, values=[0.5, -0.5, 2.5, -2.5, 0.49999997, -0.49999997, 8388609.0, 0.0, -0.0,
                        np.nan]))
add("logical_not", op.logical_not, bools(2, 3))
add("logical_not", op.logical_not, bools())

BINARY = {
    "add": op.add, "subtract": op.subtract, "multiply": op.multiply, "maximum": op.maximum,
    "minimum": op.minimum, "divide": op.divide, "power": op.power, "mod": op.mod,
    "floor_divide": op.floor_divide, "floor_mod": op.floor_mod, "equal": op.equal,
    "not_equal": op.not_equal, "less": op.less, "less_equal": op.less_equal,
    "greater": op.greater, "greater_equal": op.greater_equal,
}
for _name, _fn in BINARY.items():
    for _ in range(3):  # random broadcasting shapes
        _a, _b = _broadcast_pair()
        _low = 0.2 if _name == "power" else -3.0
        add(_name, _fn, arg(*_a, low=_low), arg(*_b, low=0.2 if _name in (
            "divide", "mod", "floor_divide", "floor_mod") else -3.0))
    if _name != "power":
        add(_name, _fn, ints(2, 3), ints(3, low=1, high=4))
        add(_name, _fn, ints(2, 3), ints(2, 1, low=-4, high=-1))
for _name in ("maximum", "minimum", "add"):
    add(_name, BINARY[_name], arg(4, values=[np.nan, 1, -np.inf, 2]), arg(1, values=[0.5]))
for _name in ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"):
    add(_name, BINARY[_name], bools(2, 3), bools(3))
    add(_name, BINARY[_name], arg(3, values=[np.nan, 1, 2]), arg(3, values=[np.nan, 1, 3]))
# Integer division: C's truncation, Python's floor, the minimum over -1 (numpy wraps), 0.
_dividend = ints(6, values=[-2**31, 7, -7, 7, -7, 5])
_divisor = ints(6, values=[-1, 2, 2, -2, -2, -1])
for _name in ("divide", "mod", "floor_divide", "floor_mod"):
    add(_name, BINARY[_name], _dividend, _divisor, label=f"{_name} signs")
    add(_name, BINARY[_name], ints(2, 3), ints(3, values=[1, 0, 2]), label=f"{_name} by 0")
    add(_name, BINARY[_name], ints(2, 3, dtype="uint8", low=0, high=255),
        ints(3, dtype="uint8", low=1, high=20))
    add(_name, BINARY[_name], arg(4, values=[7.5, -7.5, 1, 0]), arg(4, values=[2, 2, 0, 0]),
        label=f"{_name} float by 0")
add("nearbyint", op.nearbyint, arg(9, values=[0.5, 1.5, 2.5, -0.5, -2.5, 0.49, np.nan, -np.inf, 3]))
add("nearbyint", op.nearbyint, ints(2, 3))
for _name, _shift in (("left_shift", op.left_shift), ("right_shift", op.right_shift)):
    add(_name, _shift, ints(2, 4, dtype="int64", values=[-2**63, -5, 5, 2**62, 7, -7, 1, -1]),
        ints(4, dtype="int64", values=[-1, 3, 63, 64]))
    add(_name, _shift, ints(2, 3, dtype="uint8", low=0, high=255),
        ints(3, dtype="uint8", values=[1, 7, 9]))
add("power", op.power, ints(2, 3, low=-5, high=5), ints(3, low=0, high=7))
add("power", op.power, ints(2, 3, dtype="int8", low=-5, high=5), ints(3, dtype="int8", low=0,
                                                                       high=9))
add("power", op.power, ints(2, 3, dtype="int64", low=-5, high=5),
    ints(3, dtype="int64", values=[0, 40, 63]))
add("power", op.power, ints(2, 3), ints(3, values=[1, -1, 2]), label="negative exponent")
add("power", op.power, ints(3, dtype="uint8", low=0, high=9), ints(3, dtype="uint8", low=0,
                                                                    high=9))
for _name in ("logical_and", "logical_or"):
    add(_name, getattr(op, _name), bools(2, 3), bools(3))
    add(_name, getattr(op, _name), bools(1, 3), bools(2, 1))

for _ in range(3):
    _a, _b = _broadcast_pair()
    add("where", op.where, bools(*_b), arg(*_a), arg(*_b))
add("where", op.where, bools(3, 1), ints(1, 4), ints(3, 4))
add("where", op.where, bools(), arg(2), arg(2, 1))

add("clip", lambda a: op.clip(a, a_min=-1.0, a_max=1.5), arg(2, 3))
add("clip", lambda a: op.clip(a, a_min=-1.0, a_max=1.5), arg(3, values=[np.nan, -np.inf, 7]))
add("clip", lambda a: op.clip(a, a_min=-2.5, a_max=3.7), ints(2, 3))
add("clip", lambda a: op.clip(a, a_min=-float("inf"), a_max=float("inf")), ints(4, dtype="int32"))
add("clip", lambda a: op.clip(a, a_min=-300.0, a_max=100.0), ints(4, dtype="int8", low=-128,
                                                                  high=127))

for _src, _dst in [("float32", "int32"), ("float32", "bool"), ("int32", "float32"),
                   ("bool", "float32"), ("int32", "int8"), ("float32", "float64"),
                   ("float32", "float32"), ("int64", "bool"), ("float32", "uint8")]:
    _x = bools(2, 3) if _src == "bool" else (
        arg(2, 3, dtype=_src, low=0 if _dst == "uint8" else -3) if _src.startswith("float")
        else ints(2, 3, dtype=_src, low=-300, high=300))
    add("cast", lambda a, d=_dst: op.cast(a, dtype=d), _x)
add("cast", lambda a: op.cast(a, dtype="bool"), arg(4, values=[0.0, -0.0, np.nan, 1e-30]))

# --- creation ----------------------------------------------------------------------------------

add("zeros", lambda a: op.add(a, op.zeros((2, 3), "float32")), arg(3))
add("zeros", lambda: op.zeros((2, 3), "int32"))
add("ones", lambda a: op.add(a, op.ones((2, 3), "int32")), ints(3))
add("ones", lambda: op.ones((3,), "bool"))
add("full", lambda a: op.full(a, (2, 3), "int32"), arg(values=-2.7))
add("full", lambda a: op.full(a, (2, 3)), arg())
add("full", lambda a: op.full(a, (2,), "bool"), arg(values=0.25))
add("zeros_like", op.zeros_like, ints(2, 3, dtype="int8"))
add("zeros_like", op.zeros_like, arg(2))
add("ones_like", op.ones_like, arg(2, 3))
add("ones_like", op.ones_like, bools(2))
add("full_like", op.full_like, bools(2, 3), arg(values=0.3))
add("full_like", op.full_like, ints(2, 3), arg(values=-7.9))
add("full_like", op.full_like, arg(3), arg(dtype="float64"))
add("arange", lambda a: op.add(a, op.arange(0.5, 3.0, 0.25)), arg(10))
add("arange", lambda a: op.add(a, op.arange(7, -3, -2, dtype="int32")), ints(5))
add("arange", lambda: op.arange(5, dtype="int64"))
add("arange", lambda: op.arange(1.0, 0.0, 0.5))  # empty

# --- reductions --------------------------------------------------------------------------------

_NAN_ROWS = [1, np.nan, 3, np.nan, 5, 5, -1, 2]


def _reductions(name: str, x: Arg, int_ok: bool = True) -> None:
    f = getattr(op, name)
    add(name, lambda a: f(a, axis=[1]), arg(2, 3, 4) if x is None else x)
    add(name, lambda a: f(a, axis=[0, 2], keepdims=True), arg(2, 3, 2))
    add(name, lambda a: f(a, axis=[-1], exclude=True), arg(2, 3))
    add(name, lambda a: f(a), arg(3, 2))
    add(name, lambda a: f(a, axis=[]), arg(2, 2))
    if int_ok:
        add(name, lambda a: f(a, axis=[0]), ints(3, 2, low=-20, high=20))


for _name in ("sum", "mean", "prod", "max", "min", "argmax", "argmin"):
    _reductions(_name, None)  # type: ignore[arg-type]
add("mean", lambda a: op.mean(a, axis=[1]), arg(2, 3, dtype="float16"), rtol=1e-3, atol=1e-3)
add("sum", lambda a: op.sum(a, axis=[1]), ints(2, 3, dtype="int8", low=-100, high=100))
add("prod", lambda a: op.prod(a, axis=[1]), ints(2, 3, dtype="uint8", low=0, high=255))
add("max", lambda a: op.max(a, axis=[1]), arg(2, 4, values=_NAN_ROWS))
add("min", lambda a: op.min(a), ints(2, 3, dtype="uint8", low=0, high=200))
for _name in ("mean", "max", "min", "argmax", "argmin", "sum", "prod"):  # over no elements
    _fn = getattr(op, _name)
    add(_name, lambda a, f=_fn: f(a, axis=[1]), arg(2, 0), label=f"{_name} empty")
add("mean", lambda a: op.mean(a, axis=[1]), ints(2, 0), label="integer mean of nothing")
for _name in ("all", "any"):
    f = getattr(op, _name)
    add(_name, lambda a, f=f: f(a, axis=[0]), bools(3, 2))
    add(_name, lambda a, f=f: f(a, axis=[0, 2], keepdims=True), bools(2, 2, 3))
    add(_name, lambda a, f=f: f(a), bools(2, 3))
    add(_name, lambda a, f=f: f(a, axis=[1]), bools(2, 0))
for _name in ("argmax", "argmin"):
    f = getattr(op, _name)
    add(_name, lambda a, f=f: f(a, axis=[1]), arg(2, 4, values=_NAN_ROWS), label=f"{_name} nan")
    add(_name, lambda a, f=f: f(a, axis=[1], select_last_index=True), arg(2, 4, values=_NAN_ROWS),
        label=f"{_name} nan last")
    add(_name, lambda a, f=f: f(a, axis=[0, 2], keepdims=True, select_last_index=True),
        ints(2, 3, 3, low=0, high=2), label=f"{_name} ties last")
    add(_name, lambda a, f=f: f(a, axis=[0, 2]), ints(2, 3, 3, low=0, high=2),
        label=f"{_name} ties")

# --- shape -------------------------------------------------------------------------------------

add("reshape", lambda a: op.reshape(a, newshape=[3, 1, 2, 2]), arg(2, 3, 2))
add("reshape", lambda a: op.reshape(a, newshape=[2, 2, 3]), arg(4, 1, 3))
add("reshape", lambda a: op.reshape(a, newshape=[6, 2]), ints(4, 3))
add("reshape", lambda a: op.reshape(a, newshape=[0, 2], allowzero=1), arg(2, 0))
add("reshape", lambda a: op.reshape(a, newshape=[]), arg(1, 1))
add("reshape", lambda a: op.reshape(a, newshape=[-1]), arg(2, 3))
add("transpose", lambda a: op.transpose(a, axes=[2, 0, 1]), arg(2, 3, 4))
add("transpose", op.transpose, ints(2, 3))
add("transpose", lambda a: op.transpose(a, axes=[0]), arg(3))
add("expand_dims", lambda a: op.expand_dims(a, axis=1, num_newaxis=2), arg(2, 3))
add("expand_dims", lambda a: op.expand_dims(a, axis=-1), bools(3, 2))
add("expand_dims", lambda a: op.expand_dims(a, axis=0), arg())
add("squeeze", op.squeeze, arg(1, 3, 1, 2))
add("squeeze", lambda a: op.squeeze(a, axis=[0]), ints(1, 3, 1))
add("squeeze", op.squeeze, arg(1, 1))
add("concatenate", lambda a, b, c: op.concatenate(Tuple([a, b, c]), axis=1),
    arg(2, 1), arg(2, 0), arg(2, 3))
add("concatenate", lambda a, b: op.concatenate(Tuple([a, b]), axis=-1), ints(2, 2), ints(2, 3))
add("concatenate", lambda a: op.concatenate(Tuple([a]), axis=0), arg(3))
add("concatenate", lambda a, b, c: op.concatenate(Tuple([a, b, c]), axis=0),
    arg(1, 2), arg(2, 2), arg(1, 2))
add("concatenate", lambda a, b: op.concatenate(Tuple([a, b]), axis=0), arg(0, 2), arg(0, 2))
add("stack", lambda a, b: op.stack(Tuple([a, b]), axis=1), arg(2, 3), arg(2, 3))
add("stack", lambda a, b, c: op.stack(Tuple([a, b, c]), axis=-1), ints(2), ints(2), ints(2))
add("stack", lambda a: op.stack(Tuple([a]), axis=0), arg())
add("split", lambda a: op.split(a, indices_or_sections=[1, 3], axis=1), arg(2, 5))
add("split", lambda a: op.split(a, indices_or_sections=2, axis=0), ints(4, 2))
add("split", lambda a: TupleGetItem(op.split(a, indices_or_sections=3, axis=-1), 2), arg(2, 3))
add("split", lambda a: op.split(a, indices_or_sections=[1], axis=0), arg(3, 2))

_idx = ints
add("take", lambda a, i: op.take(a, i, axis=1), arg(2, 4), _idx(3, low=-6, high=6))
add("take", lambda a, i: op.take(a, i, axis=1, mode="wrap"), arg(2, 4), _idx(3, 2, low=-6,
                                                                              high=6))
add("take", lambda a, i: op.take(a, i), arg(2, 4), _idx(3, dtype="int64", low=-6, high=9))
add("take", lambda a, i: op.take(a, i, axis=1, mode="fast"), arg(2, 4), _idx(3, low=0, high=3))
add("take", lambda a, i: op.take(a, i, axis=1, mode="fast"), arg(2, 4), _idx(3, values=[0, 4, 1]),
    label="take fast out of range")
add("take", lambda a, i: op.take(a, i, axis=2, batch_dims=1), arg(2, 3, 4), _idx(2, 5, low=-1,
                                                                                  high=4))
add("take", lambda a, i: op.take(a, i, axis=-1, batch_dims=-1), ints(2, 3), _idx(2, 2, low=0,
                                                                                 high=2))
add("take", lambda a, i: op.take(a, i, axis=0), arg(0, 3), _idx(2, 0), label="take nothing")
add("take", lambda a, i: op.take(a, i, axis=0), arg(0, 3), _idx(2), label="take from nothing")
add("take", lambda a, i: op.take(a, i, axis=0), arg(3), _idx(dtype="uint8", low=0, high=5))
add("take_grad", lambda g, a, i: op.take_grad(g, a, i, axis=1), arg(2, 5), arg(2, 4),
    _idx(5, low=-6, high=6))
add("take_grad", lambda g, a, i: op.take_grad(g, a, i, axis=2, batch_dims=1, mode="wrap"),
    arg(2, 3, 2), arg(2, 3, 4), _idx(2, 2, low=-9, high=9))
add("take_grad", lambda g, a, i: op.take_grad(g, a, i, mode="fast"), arg(2, 3), arg(2, 4),
    _idx(2, 3, low=0, high=7))
add("take_grad", lambda g, a, i: op.take_grad(g, a, i, mode="fast"), arg(2, 3), arg(2, 4),
    _idx(2, 3, values=[0, 1, 8, 2, 3, 4]), label="take_grad fast out of range")
add("strided_slice", lambda a: op.strided_slice(a, begin=[1, -1], end=[3, 0], strides=[1, -2]),
    arg(4, 5))
add("strided_slice", lambda a: op.strided_slice(a, begin=[3], end=[3]), arg(4, 5))
add("strided_slice", lambda a: op.strided_slice(a, begin=[1], end=[2], axes=[1],
                                                slice_mode="size"), ints(4, 5))
add("strided_slice", lambda a: op.strided_slice(a, begin=[-10, 0], end=[10, 2**31 - 1],
                                                strides=[3, 2]), arg(4, 5))
add("strided_slice", lambda a: op.strided_slice(a, begin=[4], end=[-10], strides=[-1]), arg(4))
add("strided_slice_grad", lambda g, a: op.strided_slice_grad(
    g, a, begin=[1, -1], end=[3, 0], strides=[1, -2]), arg(2, 2), arg(4, 5))
add("strided_slice_grad", lambda g, a: op.strided_slice_grad(
    g, a, begin=[0, 1], end=[4, 5], strides=[3, 2]), arg(2, 2), arg(4, 5))
add("strided_slice_grad", lambda g, a: op.strided_slice_grad(g, a, begin=[3], end=[3]),
    arg(0, 5), arg(4, 5))
add("strided_slice_grad", lambda g, a: op.strided_slice_grad(
    g, a, begin=[4], end=[-10], strides=[-3]), arg(2), arg(5))
for _ in range(2):
    _a, _b = _broadcast_pair()
    _big = tuple(max(x, y) for x, y in zip((1,) * (len(_b) - len(_a)) + _a,
                                           (1,) * (len(_a) - len(_b)) + _b))
    add("broadcast_to", lambda a, s=_big: op.broadcast_to(a, shape=list(s)), arg(*_a))
add("broadcast_to", lambda a: op.broadcast_to(a, shape=[2, 3, 4]), ints(3, 1))
add("broadcast_to_like", op.broadcast_to_like, arg(3, 1), arg(2, 3, 4))
add("broadcast_to_like", op.broadcast_to_like, bools(1), bools(2))
add("collapse_sum_like", op.collapse_sum_like, arg(2, 3, 4), arg(3, 1))
add("collapse_sum_like", op.collapse_sum_like, ints(2, 3, 4), ints(1, 4))
add("collapse_sum_like", op.collapse_sum_like, arg(2, 3), arg(2, 3))
add("reshape_like", op.reshape_like, arg(2, 3, 4), arg(4, 6))
add("reshape_like", op.reshape_like, ints(6), ints(3, 1, 2))
add("tile", lambda a: op.tile(a, reps=[2, 1, 3]), arg(2, 2))
add("tile", lambda a: op.tile(a, reps=[2]), arg(2, 0))
add("tile", lambda a: op.tile(a, reps=[1, 2]), ints(3))
add("nn.batch_flatten", nn.batch_flatten, arg(2, 3, 2))
add("nn.batch_flatten", nn.batch_flatten, ints(2))
add("nn.pad", lambda a, v: nn.pad(a, ((1, 2), (0, 1)), v), arg(2, 3), arg(values=1.5))
add("nn.pad", lambda a, v: nn.pad(a, ((1, 2), (0, 1)), v), ints(2, 3), arg(values=-7.9))
add("nn.pad", lambda a: nn.pad(a, ((1, 2), (2, 1)), pad_mode="edge"), arg(2, 3))
add("nn.pad", lambda a: nn.pad(a, ((1, 2), (2, 1)), pad_mode="reflect"), arg(3, 3))
add("nn.pad", lambda a: nn.pad(a, ((0, 0), (2, 2)), pad_mode="reflect"), ints(2, 3))
add("nn.pad", lambda a: nn.pad(a, ((1, 1), (0, 0))), arg(0, 3))
add("nn.pad", lambda a: nn.pad(a, ((0, 0), (0, 0), (1, 0), (0, 1)), pad_mode="edge"),
    arg(1, 2, 2, 2))

# --- nn ----------------------------------------------------------------------------------------

add("nn.relu", nn.relu, arg(2, 3))
add("nn.relu", nn.relu, ints(4))
add("nn.leaky_relu", lambda a: nn.leaky_relu(a, alpha=0.1), arg(2, 3))
add("nn.leaky_relu", nn.leaky_relu, arg(4, dtype="float64"))
add("nn.softmax", nn.softmax, arg(2, 3))
add("nn.softmax", lambda a: nn.softmax(a, axis=0), arg(3, 2, 2))
add("nn.softmax", nn.softmax, arg(2, 3, values=[1, 2, -np.inf, -np.inf, -np.inf, 0]))
add("nn.log_softmax", lambda a: nn.log_softmax(a, axis=1), arg(2, 3, 2))
add("nn.log_softmax", nn.log_softmax, arg(3, dtype="float64"))
add("nn.bias_add", nn.bias_add, arg(2, 3, 2), arg(3))
add("nn.bias_add", lambda a, b: nn.bias_add(a, b, axis=-1), ints(2, 3), ints(3))
add("nn.dense", nn.dense, arg(2, 5), arg(3, 5))
add("nn.dense", nn.dense, arg(2, 2, 3), arg(4, 3))
add("nn.dense", lambda a, b: nn.dense(a, b, out_dtype="int32"), ints(2, 3, dtype="int8"),
    ints(2, 3, dtype="int8"))
add("nn.dense", nn.dense, arg(2, 4, dtype="float16"), arg(3, 4, dtype="float16"), rtol=2e-3,
    atol=2e-3)
add("nn.dense_packed", lambda a, b: nn.dense_packed(a, b, units=3), arg(2, 5), arg(1, 5, 8))
add("nn.dense_packed", lambda a, b: nn.dense_packed(a, b, units=5), arg(2, 2, 3), arg(2, 4, 4))
add("nn.dense_packed", lambda a, b: nn.dense_packed(a, b, units=2), arg(2, 3, dtype="float16"),
    arg(1, 3, 2, dtype="float16"), rtol=2e-3, atol=2e-3)
_W8 = np.arange(-45, 45, 6).reshape(3, 5) % 256 - 128  # an int8 weight, values across the range
for _group in (2, 4):  # the int16-pair and byte layouts: one runs the int8 GEMM, one the panels
    add("nn.dense_int8_packed", lambda a, b, g=_group: nn.dense_int8_packed(
        a, b, units=3, k=5, weight_dtype="int8", group=g), ints(2, 5, dtype="int8"),
        arg(1, -(-5 // _group) + 1, 8, dtype="int32", values=op.nn.int8_packed.pack_int8_weight(
            _W8.astype(np.int8), 8, _group)))
# 20 units of 40 inputs by 9 rows: the AMX kernel where the host has it; the plain loops else
_WD = ((np.arange(20 * 40) * 11) % 256 - 128).reshape(20, 40).astype(np.int8)
add("nn.dense_int8_tiled", lambda a, b: nn.dense_int8_tiled(a, b, units=20, k=40),
    ints(9, 40, dtype="int8", low=-128, high=127),
    arg(2, 1, 16, 16, dtype="int32", values=op.nn.int8_tiled.pack_tiled_dense_weight(_WD)))
_WC = (np.arange(-60, 75) % 256 - 128).reshape(3, 5, 3, 3)  # an int8 OIHW weight
for _group, _mr in ((4, 2), (2, 3)):  # byte and int16 lanes, panels of another tile height
    add("nn.conv2d_int8_packed", lambda a, b, g=_group: nn.conv2d_int8_packed(
        a, b, padding=1, channels=3, kernel_size=(3, 3), out_dtype="int32", group=g),
        ints(1, 5, 4, 4, dtype="int8"),
        arg(1, -(-3 // _mr), -(-5 // _group) * 9 + 1, _mr, dtype="int32",
            values=op.nn.int8_packed.pack_int8_conv_weight(_WC.astype(np.int8), 1, _mr, _group)))
_WT = ((np.arange(20 * 40 * 9) * 7) % 256 - 128).reshape(20, 40, 3, 3).astype(np.int8)
# AMX kernels where the host has them: 40 channels (words of 4 channels), 6 (of 4 taps);
# 6 channels packed by channels: a form the AMX plan would not take, the plain loops
for _c, _o, _form, _steps in ((40, 20, "channels", 9), (6, 5, "taps", 2),
                              (6, 5, "channels", 9)):
    add("nn.conv2d_int8_tiled", lambda a, b, o=_o, f=_form: nn.conv2d_int8_tiled(
        a, b, padding=1, channels=o, kernel_size=(3, 3), out_dtype="int32", form=f),
        ints(1, _c, 4, 5, dtype="uint8", low=0, high=255),
        arg(-(-_o // 16), _steps, 16, 16, dtype="int32",
            values=op.nn.int8_tiled.pack_tiled_conv_weight(_WT[:_o, :_c], _form)))
add("nn.conv2d_packed", lambda a, b: nn.conv2d_packed(a, b, padding=1, channels=3,
    kernel_size=(3, 3)), arg(1, 2, 4, 4), arg(1, 1, 18, 6))  # the GEMM's layout
add("nn.conv2d_packed", lambda a, b: nn.conv2d_packed(a, b, strides=2, groups=2, channels=4,
    kernel_size=(2, 2)), arg(1, 4, 5, 5), arg(2, 1, 9, 3))  # another layout
add("nn.conv2d_winograd", lambda a, b: nn.conv2d_winograd(a, b, padding=1, channels=3,
    kernel_size=(3, 3)), arg(1, 2, 4, 4), arg(36, 1, 2, 4))  # F(4×4, 3×3)
add("nn.conv2d_winograd", lambda a, b: nn.conv2d_winograd(a, b, channels=5,
    kernel_size=(3, 3)), arg(2, 3, 5, 6), arg(16, 2, 3, 4))  # F(2×2, 3×3)
add("nn.batch_matmul", nn.batch_matmul, arg(2, 3, 4), arg(1, 2, 4))
add("nn.batch_matmul", lambda a, b: nn.batch_matmul(a, b, transpose_a=True, transpose_b=False),
    arg(1, 4, 3), arg(2, 4, 2))
add("nn.batch_matmul", lambda a, b: nn.batch_matmul(a, b, out_dtype="int32"),
    ints(2, 3, 4, dtype="int8"), ints(2, 2, 4, dtype="int8"))
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, padding=(1, 1)), arg(1, 2, 4, 4), arg(3, 2, 3, 3))
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, padding=(1, 0, 2, 1), strides=(2, 1),
                                         dilation=(1, 2)), arg(2, 2, 5, 5), arg(2, 2, 2, 2))
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, groups=2, padding=1), arg(1, 4, 3, 3),
    arg(4, 2, 3, 3))
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, groups=3, padding=1), arg(1, 3, 3, 3),
    arg(3, 1, 3, 3), label="depthwise")
add("nn.conv2d", nn.conv2d, arg(1, 2, 3, 3, dtype="float16"), arg(2, 2, 2, 2, dtype="float16"),
    rtol=1e-2, atol=1e-2)
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, out_dtype="int32"), ints(1, 1, 3, 3, dtype="int8"),
    ints(2, 1, 2, 2, dtype="int8"))
add("layout_transform", lambda a: op.layout_transform(a, src_layout="NCHW", dst_layout="NCHW4c"),
    arg(1, 8, 2, 3))
add("layout_transform", lambda a: op.layout_transform(a, src_layout="OIHW4i2o",
                                                      dst_layout="HWOI"), ints(2, 1, 1, 2, 4, 2))
add("copy", op.copy, arg(2, 3))
add("nn.contrib_conv2d_NCHWc", lambda a, b: nn.contrib_conv2d_nchwc(
    a, b, padding=1, channels=4, kernel_size=(3, 3), data_layout="NCHW2c",
    kernel_layout="OIHW2i2o", out_layout="NCHW2c"), arg(1, 2, 4, 4, 2), arg(2, 2, 3, 3, 2, 2))
add("nn.contrib_conv2d_NCHWc", lambda a, b: nn.contrib_conv2d_nchwc(
    a, b, strides=(2, 1), padding=(1, 0, 0, 1), dilation=(1, 2), groups=2,
    data_layout="NCHW2c", kernel_layout="OIHW1i3o", out_layout="NCHW"),
    arg(1, 2, 5, 5, 2), arg(2, 2, 2, 2, 1, 3), label="grouped, strided, unblocked result")
add("nn.contrib_conv2d_NCHWc", lambda a, b: nn.contrib_conv2d_nchwc(
    a, b, out_dtype="int32", data_layout="NCHW4c", kernel_layout="OIHW4i2o",
    out_layout="NCHW2c"),
    ints(1, 1, 3, 3, 4, dtype="uint8", low=0, high=255),
    ints(1, 1, 2, 2, 4, 2, dtype="int8", low=-128, high=127))
add("fixed_point_multiply", lambda a: op.fixed_point_multiply(a, multiplier=1395864371,
                                                              shift=-3),
    ints(2, 5, values=[[0, 1, -1, 2147483647, -2147483648], [7, -7, 100000, -3, 12345]]))
add("fixed_point_multiply", lambda a: op.fixed_point_multiply(a, multiplier=2**30, shift=4),
    ints(2, 3, low=-2000, high=2000))

# TVM's other layouts and mixed quantized inputs (transposed around the NCHW reduction)
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, padding=1, strides=(2, 1), data_layout="NHWC",
                                        kernel_layout="HWIO"), arg(1, 5, 4, 2), arg(3, 2, 2, 3))
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, padding=(1, 0), kernel_layout="OHWI"),
    arg(1, 2, 4, 4), arg(3, 2, 3, 2))
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, groups=3, padding=1, data_layout="NHWC",
                                        kernel_layout="HWOI", out_layout="NCHW"),
    arg(1, 3, 3, 3), arg(2, 2, 3, 1))
add("nn.conv2d", lambda a, b: nn.conv2d(a, b, out_dtype="int32", data_layout="NHWC",
                                        kernel_layout="HWIO"),
    ints(1, 3, 3, 2, dtype="uint8", low=0, high=255), ints(2, 2, 2, 2, dtype="int8", low=-128,
                                                             high=127))
add("nn.conv2d_transpose", lambda a, b: nn.conv2d_transpose(
    a, b, padding=(1, 1), strides=(2, 2), output_padding=(1, 0)), arg(1, 2, 3, 3),
    arg(2, 3, 3, 3))
add("nn.conv2d_transpose", lambda a, b: nn.conv2d_transpose(
    a, b, groups=2, dilation=(2, 1), padding=(0, 1, 1, 0)), arg(1, 4, 3, 3), arg(4, 1, 2, 2))
add("nn.conv2d_backward_weight", lambda g, a: nn.conv2d_backward_weight(
    g, a, kernel_size=(3, 3), padding=(1, 1)), arg(2, 3, 4, 4), arg(2, 2, 4, 4))
add("nn.conv2d_backward_weight", lambda g, a: nn.conv2d_backward_weight(
    g, a, kernel_size=(2, 2), strides=(2, 2), groups=2, dilation=(1, 2)), arg(1, 4, 2, 1),
    arg(1, 2, 4, 3))
add("nn.max_pool2d", lambda a: nn.max_pool2d(a, pool_size=(2, 2)), arg(1, 2, 4, 4))
add("nn.max_pool2d", lambda a: nn.max_pool2d(a, pool_size=(3, 3), strides=(2, 2), padding=(1, 1),
                                             ceil_mode=True), arg(1, 2, 5, 4))
add("nn.max_pool2d", lambda a: nn.max_pool2d(a, pool_size=(2, 2), dilation=(2, 1),
                                             padding=(0, 1, 1, 0)), ints(1, 1, 5, 4))
add("nn.max_pool2d", lambda a: nn.max_pool2d(a, pool_size=(1, 1), padding=(1, 1)),
    arg(1, 1, 0, 2), label="max_pool2d of nothing")
add("nn.avg_pool2d", lambda a: nn.avg_pool2d(a, pool_size=(3, 3), strides=(2, 2), padding=(1, 1),
                                             ceil_mode=True), arg(1, 2, 5, 4))
add("nn.avg_pool2d", lambda a: nn.avg_pool2d(a, pool_size=(3, 3), strides=(2, 2), padding=(1, 1),
                                             ceil_mode=True, count_include_pad=True),
    arg(1, 2, 5, 4))
add("nn.avg_pool2d", lambda a: nn.avg_pool2d(a, pool_size=(2, 3), strides=(1, 2), padding=(1, 2),
                                             dilation=(2, 1), count_include_pad=True),
    ints(1, 1, 5, 6, low=-20, high=20))
add("nn.avg_pool2d", lambda a: nn.avg_pool2d(a, pool_size=(2, 2)), arg(1, 1, 3, 3,
                                                                       dtype="float16"),
    rtol=1e-3, atol=1e-3)
add("nn.max_pool2d_grad", lambda g, a: nn.max_pool2d_grad(
    g, a, pool_size=(3, 3), strides=(2, 2), padding=(1, 1), ceil_mode=True),
    arg(1, 2, 3, 3), arg(1, 2, 5, 4))
add("nn.max_pool2d_grad", lambda g, a: nn.max_pool2d_grad(g, a, pool_size=(2, 2), strides=(2, 2)),
    arg(1, 1, 2, 2), arg(1, 1, 4, 4, values=[1, 1, 2, 2, 1, 1, 2, 2, 0, 0, 0, 0, 0, 0, 0, np.nan]),
    label="max_pool2d_grad ties and nan")
add("nn.avg_pool2d_grad", lambda g, a: nn.avg_pool2d_grad(
    g, a, pool_size=(3, 3), strides=(2, 2), padding=(1, 1), ceil_mode=True),
    arg(1, 2, 3, 3), arg(1, 2, 5, 4))
add("nn.avg_pool2d_grad", lambda g, a: nn.avg_pool2d_grad(
    g, a, pool_size=(2, 3), strides=(1, 2), padding=(1, 2), dilation=(2, 1),
    count_include_pad=True), arg(1, 1, 5, 4), arg(1, 1, 5, 6))
add("nn.global_avg_pool2d", nn.global_avg_pool2d, arg(2, 2, 3, 3))
add("nn.global_avg_pool2d", nn.global_avg_pool2d, ints(2, 2, 3, 3))
add("nn.global_avg_pool2d", nn.global_avg_pool2d, arg(1, 2, 0, 3), label="global avg of nothing")
add("nn.global_max_pool2d", nn.global_max_pool2d, arg(2, 2, 3, 3))
add("nn.global_max_pool2d", nn.global_max_pool2d, ints(1, 2, 2, 3))
add("nn.global_max_pool2d", nn.global_max_pool2d, arg(2, 2, 0, 3), label="global max of nothing")
add("nn.batch_norm", nn.batch_norm, arg(2, 3, 2), arg(3), arg(3), arg(3), arg(3, low=0.1,
                                                                            high=2))
add("nn.batch_norm", lambda *a: TupleGetItem(nn.batch_norm(*a, axis=-1, center=False,
                                                           scale=False), 0),
    arg(2, 3), arg(3), arg(3), arg(3), arg(3, low=0.1, high=2))
add("nn.batch_norm", lambda *a: nn.batch_norm(*a, training=True, momentum=0.3),
    arg(2, 3, 2), arg(3), arg(3), arg(3), arg(3, low=0.1, high=2), label="batch_norm training")
add("nn.batch_norm", lambda *a: nn.batch_norm(*a, axis=-1, training=True, scale=False),
    arg(4, 3), arg(3), arg(3), arg(3), arg(3, low=0.1, high=2),
    label="batch_norm training, last axis")
add("nn.dropout_train", lambda a, k: nn.dropout_train(a, k, rate=0.4), arg(3, 5),
    ints(2, dtype="int64", values=[7, 2]))
add("nn.dropout_train", lambda a, k: nn.dropout_train(a, k, rate=0.0, stream=3), arg(4),
    ints(2, dtype="int64", values=[-1, 2**40 + 5]), label="dropout_train rate 0, wide key")
add("nn.layer_norm", nn.layer_norm, arg(2, 4), arg(4), arg(4))
add("nn.layer_norm", lambda a, g, b: nn.layer_norm(a, g, b, axis=0, center=False, epsilon=0.1),
    arg(3, 2), arg(3), arg(3))
add("nn.dropout", nn.dropout, arg(2, 3))
add("nn.dropout", lambda a: TupleGetItem(nn.dropout(a, rate=0.2), 0), arg(3, dtype="float64"))


# --- random attributes -------------------------------------------------------------------------
# Random shapes and attribute settings drawn from the fixed seed, a few per operator.


def _axes(ndim: int) -> list[int]:
    chosen = [a for a in range(ndim) if _rng.random() < 0.5]
    return [a - ndim if _rng.random() < 0.3 else a for a in chosen]


for _name in ("sum", "mean", "prod", "max", "min", "all", "any", "argmax", "argmin"):
    for _ in range(3):
        _s = _shape(max_ndim=3, max_dim=3) or (2,)
        _attrs = {"axis": _axes(len(_s)) or None, "keepdims": bool(_rng.random() < 0.5),
                  "exclude": bool(_rng.random() < 0.3)}
        if _name.startswith("arg"):
            _attrs["select_last_index"] = bool(_rng.random() < 0.5)
        _x = bools(*_s) if _name in ("all", "any") else (
            ints(*_s, low=0, high=2) if _name.startswith("arg") else arg(*_s))
        _fn = getattr(op, _name)
        add(_name, lambda a, f=_fn, at=_attrs: f(a, **at), _x, label=f"{_name} {_attrs}")

for _ in range(3):
    _s = _shape(max_ndim=4, max_dim=3) or (2,)
    _perm = [int(p) for p in _rng.permutation(len(_s))]
    add("transpose", lambda a, p=_perm: op.transpose(a, axes=p), arg(*_s), label=f"perm {_perm}")

for _ in range(4):
    _s = tuple(int(d) for d in _rng.integers(1, 6, size=2))
    _begin = [int(b) for b in _rng.integers(-6, 6, size=2)]
    _end = [int(e) for e in _rng.integers(-7, 7, size=2)]
    _strides = [int(_rng.choice([-3, -2, -1, 1, 2, 3])) for _ in range(2)]
    _attrs = {"begin": _begin, "end": _end, "strides": _strides}
    add("strided_slice", lambda a, at=_attrs: op.strided_slice(a, **at), arg(*_s),
        label=f"slice {_s} {_attrs}")


def _window(size: int, kernel: int, dilation: int, stride: int, pads: int, ceil: bool) -> int:
    room = size + pads - ((kernel - 1) * dilation + 1)
    return (room + (stride - 1 if ceil else 0)) // stride + 1 if room >= 0 else 0


for _ in range(4):  # conv2d: random geometry, grouped or depthwise
    _c = int(_rng.choice([1, 2, 4]))
    _groups = int(_rng.choice([g for g in (1, 2, _c) if _c % g == 0]))
    _o = _groups * int(_rng.integers(1, 3))
    _k = [int(v) for v in _rng.integers(1, 4, size=2)]
    _d = [int(v) for v in _rng.integers(1, 3, size=2)]
    _st = [int(v) for v in _rng.integers(1, 3, size=2)]
    _pad = [int(v) for v in _rng.integers(0, 3, size=4)]
    _hw = [(_k[i] - 1) * _d[i] + 1 + int(_rng.integers(0, 3)) for i in range(2)]
    _attrs = {"strides": _st, "dilation": _d, "padding": _pad, "groups": _groups}
    add("nn.conv2d", lambda a, b, at=_attrs: nn.conv2d(a, b, **at),
        arg(1, _c, *_hw), arg(_o, _c // _groups, *_k), label=f"conv2d {_attrs}")

for _ in range(6):  # pooling: random windows, padding, ceil mode, divisors
    _k = [int(v) for v in _rng.integers(1, 4, size=2)]
    _d = [int(v) for v in _rng.integers(1, 3, size=2)]
    _st = [int(v) for v in _rng.integers(1, 3, size=2)]
    _pad = [int(v) for v in _rng.integers(0, 2, size=4)]
    _ceil = bool(_rng.random() < 0.5)
    _hw = [(_k[i] - 1) * _d[i] + 1 + int(_rng.integers(0, 3)) for i in range(2)]
    _attrs = {"pool_size": _k, "strides": _st, "dilation": _d, "padding": _pad,
              "ceil_mode": _ceil}
    _out = [_window(_hw[i], _k[i], _d[i], _st[i], _pad[i] + _pad[i + 2], _ceil) for i in range(2)]
    _avg = {**_attrs, "count_include_pad": bool(_rng.random() < 0.5)}
    add("nn.max_pool2d", lambda a, at=_attrs: nn.max_pool2d(a, **at), arg(1, 2, *_hw),
        label=f"max_pool2d {_attrs}")
    add("nn.avg_pool2d", lambda a, at=_avg: nn.avg_pool2d(a, **at), arg(1, 2, *_hw),
        label=f"avg_pool2d {_avg}")
    add("nn.max_pool2d_grad", lambda g, a, at=_attrs: nn.max_pool2d_grad(g, a, **at),
        arg(1, 2, *_out), arg(1, 2, *_hw), label=f"max_pool2d_grad {_attrs}")
    add("nn.avg_pool2d_grad", lambda g, a, at=_avg: nn.avg_pool2d_grad(g, a, **at),
        arg(1, 2, *_out), arg(1, 2, *_hw), label=f"avg_pool2d_grad {_avg}")

for _ in range(4):  # pad: every mode, random widths
    _s = tuple(int(d) for d in _rng.integers(1, 4, size=2))
    _mode = str(_rng.choice(["constant", "edge", "reflect"]))
    _limit = [d - 1 if _mode == "reflect" else 2 for d in _s]
    _widths = tuple((int(_rng.integers(0, m + 1)), int(_rng.integers(0, m + 1))) for m in _limit)
    add("nn.pad", lambda a, v, w=_widths, m=_mode: nn.pad(a, w, v, pad_mode=m), arg(*_s),
        arg(values=0.5), label=f"pad {_mode} {_widths}")

for _ in range(4):  # take: random axis, batch_dims and mode
    _s = tuple(int(d) for d in _rng.integers(1, 4, size=3))
    _axis = int(_rng.integers(0, 3))
    _batch = int(_rng.integers(0, _axis + 1))
    _mode = str(_rng.choice(["clip", "wrap"]))
    _extra = _rng.integers(1, 3, size=int(_rng.integers(0, 2)))
    _ishape = _s[:_batch] + tuple(int(d) for d in _extra)
    _attrs = {"axis": _axis, "batch_dims": _batch, "mode": _mode}
    add("take", lambda a, i, at=_attrs: op.take(a, i, **at), arg(*_s),
        ints(*_ishape, low=-5, high=5), label=f"take {_attrs}")
