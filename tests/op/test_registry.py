"""The operator table as a whole: coverage by oracle tests, schemas, builders, patterns."""

from __future__ import annotations

import importlib
import pkgutil

import pytest

import kiln
import kiln.op
from kiln.ir.ty import IncompleteType
from kiln.op import OpPattern

from . import helpers

# Attributes an operator cannot do without, for the tests that build every operator.
REQUIRED_ATTRS = {
    "reshape": {"newshape": [1]},
    "expand_dims": {"axis": 0},
    "split": {"indices_or_sections": 1},
    "strided_slice": {"begin": [0], "end": [1]},
    "broadcast_to": {"shape": [1]},
    "tile": {"reps": [1]},
    "zeros": {"shape": [1]},
    "ones": {"shape": [1]},
    "full": {"shape": [1]},
    "clip": {"a_min": 0.0, "a_max": 1.0},
    "cast": {"dtype": "int32"},
    "nn.max_pool2d": {"pool_size": [1, 1]},
    "nn.avg_pool2d": {"pool_size": [1, 1]},
    "nn.pad": {"pad_width": [(0, 0)]},
    "strided_slice_grad": {"begin": [0], "end": [1]},
    "nn.max_pool2d_grad": {"pool_size": [1, 1]},
    "nn.avg_pool2d_grad": {"pool_size": [1, 1]},
    "layout_transform": {"src_layout": "NCHW", "dst_layout": "NCHW4c"},
    "fixed_point_multiply": {"multiplier": 1, "shift": 0},
    "nn.contrib_conv2d_NCHWc": {"data_layout": "NCHW8c", "kernel_layout": "OIHW8i8o"},
    "nn.dense_int8_packed": {"units": 1, "k": 1},
    "nn.dense_int8_tiled": {"units": 1, "k": 1},
    "nn.conv2d_int8_packed": {"channels": 1, "kernel_size": (1, 1), "out_dtype": "int32"},
    "nn.conv2d_int8_tiled": {"channels": 1, "kernel_size": (1, 1), "out_dtype": "int32"},
}


def test_every_operator_has_an_oracle_test() -> None:
    package = importlib.import_module(__package__)
    for module in pkgutil.iter_modules(package.__path__):
        if module.name.startswith("test_"):
            importlib.import_module(f"{__package__}.{module.name}")
    missing = sorted(op.name for op in kiln.op.all_ops() if op.name not in helpers.COVERED)
    assert not missing, f"operators without an oracle test: {missing}"


@pytest.mark.parametrize("opdef", kiln.op.all_ops(), ids=lambda o: o.name)
def test_operator_definition_is_complete(opdef) -> None:
    assert opdef.doc and "\n" not in opdef.doc, "one line of documentation"
    assert isinstance(opdef.pattern, OpPattern)
    assert callable(opdef.relation) and callable(opdef.compute)
    assert len(set(opdef.inputs)) == len(opdef.inputs)
    for attr in opdef.attrs:
        if attr.default is not kiln.op.REQUIRED and attr.default is not None:
            checked = attr.check(attr.default, opdef.name)  # a default passes its own checks
            if attr.convert is None:
                assert checked == attr.default


@pytest.mark.parametrize("opdef", [o for o in kiln.op.all_ops() if o.inputs], ids=lambda o: o.name)
def test_relations_wait_for_unknown_arguments(opdef) -> None:
    attrs = opdef.normalize_attrs(REQUIRED_ATTRS.get(opdef.name, {}))
    args = [IncompleteType() for _ in opdef.inputs]
    if opdef.needs_values:
        assert opdef.relation(args, attrs, [None] * len(args)) is None
    else:
        assert opdef.relation(args, attrs) is None


def test_builders_make_calls() -> None:
    x = kiln.var("x", shape=(2, 3))
    call = kiln.op.nn.leaky_relu(x, alpha=0.1)
    assert call.op == kiln.Op("nn.leaky_relu") and call.args == (x,)
    assert call.attrs["alpha"] == 0.1
    assert kiln.op.sum(x, axis=1).attrs["axis"] == (1,)
    assert kiln.op.max(x).op == kiln.Op("max") and kiln.op.abs(x).op == kiln.Op("abs")
    assert kiln.op.round(x).op == kiln.Op("round") and kiln.op.all(x).op == kiln.Op("all")
    both = kiln.op.concatenate([x, x], axis=1)
    assert isinstance(both.args[0], kiln.Tuple) and len(both.args[0].fields) == 2


def test_builders_reject_unknown_or_bad_attributes() -> None:
    x = kiln.var("x", shape=(2, 3))
    with pytest.raises(kiln.Error, match="no attribute 'axes'.*did you mean 'axis'"):
        kiln.op.sum(x, axes=[1])
    with pytest.raises(kiln.Error, match="no attribute 'slope'"):
        kiln.op.nn.leaky_relu(x, slope=0.1)
    with pytest.raises(kiln.Error, match="must be an integer"):
        kiln.op.nn.softmax(x, axis="last")
    with pytest.raises(kiln.Error, match="takes 2 argument"):
        kiln.op.add(x)


# TVM's C++ attribute defaults, which the text format leaves out when a value equals them.
TVM_DEFAULTS = {
    ("nn.leaky_relu", "alpha"): 0.25,
    ("nn.softmax", "axis"): -1,
    ("nn.log_softmax", "axis"): -1,
    ("nn.bias_add", "axis"): 1,
    ("nn.batch_matmul", "transpose_b"): True,
    ("nn.conv2d", "padding"): (0, 0),
    ("nn.conv2d", "strides"): (1, 1),
    ("nn.conv2d", "groups"): 1,
    ("nn.conv2d", "out_dtype"): "",
    ("nn.max_pool2d", "padding"): (0, 0),
    ("nn.avg_pool2d", "count_include_pad"): False,
    ("nn.batch_norm", "epsilon"): 1e-5,
    ("nn.layer_norm", "axis"): -1,
    ("nn.dropout", "rate"): 0.5,
    ("nn.pad", "pad_mode"): "constant",
    ("take", "mode"): "clip",
    ("strided_slice", "slice_mode"): "end",
    ("reshape", "allowzero"): 0,
    ("expand_dims", "num_newaxis"): 1,
    ("sum", "keepdims"): False,
    ("argmax", "select_last_index"): False,
    ("concatenate", "axis"): 0,
}


@pytest.mark.parametrize(("op", "attr"), TVM_DEFAULTS)
def test_attribute_defaults_are_tvms(op: str, attr: str) -> None:
    assert kiln.op.get(op).attr(attr).default == TVM_DEFAULTS[op, attr]


# Fusion patterns as TVM registers them (TOpPattern).
TVM_PATTERNS = {
    "exp": OpPattern.ELEMWISE,
    "add": OpPattern.BROADCAST,
    "less": OpPattern.BROADCAST,
    "where": OpPattern.BROADCAST,
    "cast": OpPattern.ELEMWISE,
    "reshape": OpPattern.INJECTIVE,
    "take": OpPattern.INJECTIVE,
    "sum": OpPattern.COMM_REDUCE,
    "argmax": OpPattern.COMM_REDUCE,
    "nn.conv2d": OpPattern.OUT_ELEMWISE_FUSABLE,
    "nn.contrib_conv2d_NCHWc": OpPattern.OUT_ELEMWISE_FUSABLE,
    "nn.dense": OpPattern.OUT_ELEMWISE_FUSABLE,
    "nn.max_pool2d": OpPattern.OUT_ELEMWISE_FUSABLE,
    "nn.softmax": OpPattern.OPAQUE,
    "nn.batch_norm": OpPattern.OPAQUE,
    "nn.dropout": OpPattern.OPAQUE,
    "nn.bias_add": OpPattern.BROADCAST,
    "nn.relu": OpPattern.ELEMWISE,
    "nn.pad": OpPattern.INJECTIVE,
    "broadcast_to": OpPattern.BROADCAST,
}


@pytest.mark.parametrize("op", TVM_PATTERNS)
def test_fusion_patterns_are_tvms(op: str) -> None:
    assert kiln.op.get(op).pattern == TVM_PATTERNS[op]


NOT_DIFFERENTIABLE = [
    "equal",
    "not_equal",
    "less",
    "less_equal",
    "greater",
    "greater_equal",
    "logical_and",
    "logical_or",
    "logical_not",
    "argmax",
    "argmin",
    "floor",
    "ceil",
    "round",
    "sign",
    "zeros",
    "ones",
    "arange",
    "mod",
    "floor_divide",
    "floor_mod",
]


def test_differentiability_flags() -> None:
    for name in NOT_DIFFERENTIABLE:
        assert not kiln.op.get(name).differentiable, name
    # zeros_like and ones_like read only their argument's shape: their gradient is zero, not
    # undefined. full and full_like pass their fill value to every element.
    for name in ["add", "exp", "nn.conv2d", "nn.dense", "sum", "reshape", "take", "where",
                 "zeros_like", "ones_like", "full", "full_like"]:
        assert kiln.op.get(name).differentiable, name
