"""Normalization and dropout at inference: batch norm from the running statistics, layer norm
over one or more trailing axes, group norm, and dropout as the identity.

Training-mode batch norm (``_native_batch_norm_legit_functional``, what ``torch.export`` gives
for a ``BatchNorm`` of a module in train mode) becomes ``nn.batch_norm(..., training=True)``
with torch's momentum; its updated running statistics (results 3 and 4, which torch writes
back into the buffers) are that call's results 1 and 2, which `kiln.train.Step` writes back
into the running statistics' arrays.

Dropout of rate p > 0 with ``train=True`` becomes ``nn.dropout_train(x, %key, rate=p)`` with
a key parameter of its own (``%<node>_key``, int64 of shape (2,)), which the importer appends
to @main's parameters after the weights and leaves out of the params it returns: a
`kiln.train.Step` fills it before each step from its seed and the step count. Its masks are
kiln's counter hash, not torch's random generator: the same rate and scale, other elements.
Dropout of rate 0 is the identity in either mode; ``feature_dropout`` (whole channels) in
training mode has no converter.
"""

from __future__ import annotations

from collections.abc import Sequence
from math import prod

import numpy as np

from kiln.frontend.torch.registry import AtenCall, Missing, converter
from kiln.ir import Expr, TensorType, Var, const
from kiln.op import add, mean, multiply, nn, reshape, rsqrt, subtract


def _or_filled(n: AtenCall, v: Expr | None, size: int, value: float) -> tuple[Expr, bool]:
    """An optional affine vector, or a constant stand-in (and whether it was given)."""
    if v is not None:
        return v, True
    return const(np.full((size,), value, dtype=n.out.dtype)), False


def _batch_norm(n: AtenCall, x: Expr, weight: Expr | None, bias: Expr | None, mean: Expr,
                var: Expr, eps: float, **mode: object) -> Expr:
    """kiln's nn.batch_norm of torch's arguments (``mode``: training and momentum)."""
    channels = n.shape(mean)[0]
    if not isinstance(channels, int):
        raise n.error("batch norm needs a static number of channels")
    gamma, scale = _or_filled(n, weight, channels, 1.0)
    beta, center = _or_filled(n, bias, channels, 0.0)
    return nn.batch_norm(x, gamma, beta, mean, var, axis=1, epsilon=float(eps), center=center,
                         scale=scale, **mode)


@converter("aten._native_batch_norm_legit_no_training.default")
def batch_norm(n: AtenCall, x: Expr, weight: Expr | None, bias: Expr | None, mean: Expr,
               var: Expr, _momentum: float, eps: float) -> list[Expr | Missing]:
    out = _batch_norm(n, x, weight, bias, mean, var, eps)
    return [out[0], Missing("saved mean of batch norm"), Missing("saved inverse std of batch norm")]


@converter("aten._native_batch_norm_legit_functional.default")
def batch_norm_functional(n: AtenCall, x: Expr, weight: Expr | None, bias: Expr | None,
                          mean: Expr, var: Expr, training: bool, momentum: float,
                          eps: float) -> list[Expr | Missing]:
    """Batch norm of a module in train mode: the batch's statistics, and the running ones
    updated (results 3 and 4)."""
    if not training:
        out = batch_norm(n, x, weight, bias, mean, var, momentum, eps)
        return [*out, mean, var]
    out = _batch_norm(n, x, weight, bias, mean, var, eps, training=True,
                      momentum=float(momentum))
    return [out[0], Missing("saved mean of batch norm"),
            Missing("saved inverse std of batch norm"), out[1], out[2]]


@converter("aten._native_batch_norm_legit.no_stats")
def batch_norm_no_stats(n: AtenCall, x: Expr, weight: Expr | None, bias: Expr | None,
                        _training: bool, _momentum: float, eps: float) -> list[Expr | Missing]:
    """Batch norm from the batch's own statistics, with no running statistics to update: what
    ``nn.InstanceNorm2d`` (without ``track_running_stats``) does in either mode."""
    y = normalize(n, x, [0, *range(2, n.rank(x))], weight, bias, eps)
    return [y, Missing("saved mean of batch norm"), Missing("saved inverse std of batch norm")]


def normalize(n: AtenCall, x: Expr, axes: list[int], weight: Expr | None, bias: Expr | None,
              eps: float) -> Expr:
    """``(x - mean) / sqrt(var + eps)`` over ``axes``, then a per-channel (axis 1) affine map."""
    centered = subtract(x, mean(x, axis=axes, keepdims=True))
    var = mean(multiply(centered, centered), axis=axes, keepdims=True)
    y = multiply(centered, rsqrt(add(var, const(float(eps), n.out.dtype))))
    along = [-1] + [1] * (n.rank(x) - 2)
    if weight is not None:
        y = multiply(y, reshape(weight, newshape=along))
    if bias is not None:
        y = add(y, reshape(bias, newshape=along))
    return y


def _layer_norm(n: AtenCall, x: Expr, shape: Sequence[int], weight: Expr | None,
                bias: Expr | None, eps: float) -> Expr:
    k = len(shape)
    size = prod(shape)
    gamma, scale = _or_filled(n, weight, size, 1.0)
    beta, center = _or_filled(n, bias, size, 0.0)
    attrs = dict(axis=-1, epsilon=float(eps), center=center, scale=scale)
    if k == 1:
        return nn.layer_norm(x, gamma, beta, **attrs)
    # Statistics over k trailing axes: flatten them into one, normalize, and unflatten.
    lead = [0] * (n.rank(x) - k)  # 0 copies a leading dimension, symbolic or not
    flat = reshape(x, newshape=[*lead, size])
    if weight is not None:
        gamma = reshape(gamma, newshape=[size])
    if bias is not None:
        beta = reshape(beta, newshape=[size])
    return reshape(nn.layer_norm(flat, gamma, beta, **attrs), newshape=[*lead, *shape])


@converter("aten.native_layer_norm.default")
def native_layer_norm(n: AtenCall, x: Expr, shape: Sequence[int], weight: Expr | None,
                      bias: Expr | None, eps: float) -> list[Expr | Missing]:
    out = _layer_norm(n, x, shape, weight, bias, eps)
    return [out, Missing("mean of layer norm"), Missing("inverse std of layer norm")]


@converter("aten.layer_norm.default")
def layer_norm(n: AtenCall, x: Expr, shape: Sequence[int], weight: Expr | None = None,
               bias: Expr | None = None, eps: float = 1e-5, _cudnn: bool = True) -> Expr:
    return _layer_norm(n, x, shape, weight, bias, eps)


@converter("aten.native_group_norm.default")
def group_norm(n: AtenCall, x: Expr, weight: Expr | None, bias: Expr | None, batch: int,
               channels: int, _hw: int, groups: int, eps: float) -> list[Expr | Missing]:
    # Normalize each (sample, group) over its channels and positions: a layer norm of the
    # data viewed as (N, groups, rest), then the per-channel affine transform.
    shape = n.static_shape(x, "group_norm")
    rest = prod(shape[1:]) // groups
    ones, _ = _or_filled(n, None, rest, 1.0)
    zeros, _ = _or_filled(n, None, rest, 0.0)
    flat = reshape(x, newshape=[shape[0], groups, rest])
    y = reshape(nn.layer_norm(flat, ones, zeros, axis=-1, epsilon=float(eps), center=False,
                              scale=False), newshape=list(shape))
    along = [channels] + [1] * (len(shape) - 2)
    if weight is not None:
        y = multiply(y, reshape(weight, newshape=along))
    if bias is not None:
        y = add(y, reshape(bias, newshape=along))
    return [y, Missing("mean of group norm"), Missing("inverse std of group norm")]


# A dropout key: a parameter the importer adds (kiln/frontend/torch/importer.py), filled by
# kiln.train.Step before each step.
KEY_TYPE = TensorType((2,), "int64")


def _dropout_train(n: AtenCall, x: Expr, p: float) -> Expr:
    if not 0.0 < p < 1.0:
        raise n.error(f"dropout in training mode needs a rate in [0, 1); got {p}")
    return nn.dropout_train(x, Var(f"{n.name}_key", KEY_TYPE), rate=float(p))


@converter("aten.dropout.default")
def dropout(n: AtenCall, x: Expr, p: float, train: bool | None) -> Expr:
    return _dropout_train(n, x, p) if train and p else x


@converter("aten.feature_dropout.default")
def feature_dropout(n: AtenCall, x: Expr, p: float, train: bool | None) -> Expr:
    if train and p:
        raise n.error("dropout of whole channels in training mode has no kiln converter; call "
                      "model.eval() before importing")
    return x


@converter("aten.native_dropout.default")
def native_dropout(n: AtenCall, x: Expr, p: float, train: bool | None) -> list[Expr | Missing]:
    y = _dropout_train(n, x, p) if (train or train is None) and p else x
    return [y, Missing("mask of dropout")]
