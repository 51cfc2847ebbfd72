"""Linear algebra: nn.dense, nn.batch_matmul and nn.bias_add."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kiln.errors import TypeCheckError
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr
from kiln.ir.ty import TensorType, Type
from kiln.loops import oplib
from kiln.loops.compute import Tensor, compute, reduce
from kiln.loops.ir import Binary, Cast, Const
from kiln.loops.ir import Expr as LExpr
from kiln.op import grad_helpers as gh
from kiln.op.common import (
    as_array,
    check_dims_equal,
    normalize_axis,
    require_dtype,
    require_rank,
    same_dtype,
    shape_str,
    tensor_args,
    unify_dim,
)
from kiln.op.grad_helpers import call
from kiln.op.registry import Attr, OpPattern, register


def _accumulator(dtype: str) -> str:
    # numpy's float16 products are slow and lose precision; accumulate them in float32.
    return "float32" if dtype == "float16" else dtype


class DenseAttrs(Attrs):
    __slots__ = ()
    units: int | None
    out_dtype: str


def _dense_relation(arg_types: Sequence[Type], attrs: DenseAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "weight"))
    if args is None:
        return None
    data, weight = args
    same_dtype(args, ("data", "weight"))
    require_dtype(data, "data", "numeric")
    if data.ndim < 1:
        raise TypeCheckError("data must have at least one dimension, but is a scalar")
    require_rank(weight, "weight (units, in)", 2)
    units, k = weight.shape
    check_dims_equal(
        data.shape[-1],
        k,
        f"data of shape {shape_str(data.shape)} and weight of shape {shape_str(weight.shape)} "
        f"disagree on the reduction dimension: the last dimension of data is "
        f"{data.shape[-1]} but dimension 1 of weight is {k}",
    )
    if attrs.units is not None:
        check_dims_equal(
            attrs.units,
            units,
            f"units={attrs.units} but weight of shape {shape_str(weight.shape)} has "
            f"{units} units (dimension 0)",
        )
        units = unify_dim(units, attrs.units)
    return TensorType((*data.shape[:-1], units), attrs.out_dtype or data.dtype)


def _dense(arrays: list[np.ndarray], attrs: DenseAttrs) -> np.ndarray:
    x, w = np.asarray(arrays[0]), np.asarray(arrays[1])
    out = attrs.out_dtype or x.dtype.name
    acc = _accumulator(out)
    return as_array(np.matmul(x.astype(acc), w.astype(acc).T), out)


def _in_dtype(c: Call, g: Expr) -> Expr:
    """The adjoint in the dtype of the inputs (it has the result's, which out_dtype may change)."""
    source = gh.dtype(c.args[0])
    return g if gh.dtype(c) == source else call("cast", g, dtype=source)


def _dense_grad(c: Call, g: Expr) -> list[Expr | None]:
    data, weight = c.args
    g = _in_dtype(c, g)
    ddata = call("nn.dense", g, call("transpose", weight))  # g @ weight
    # the weight's: g.T @ data, summed over every leading dimension of the data (its rows),
    # as one product whose transposed operand the GEMM's packing reads in place
    # (transpose_a): transposing the activations first took longer than the product (a
    # 1024x1024 transpose 8 ms against 5 ms for the GEMM, one thread), its reads 4 KiB
    # apart
    units, k = gh.static_shape(weight, "nn.dense")
    rows = int(np.prod(gh.static_shape(data, "nn.dense")[:-1], dtype=np.int64))
    product = call("nn.batch_matmul", call("reshape", g, newshape=[1, rows, units]),
                   call("reshape", data, newshape=[1, rows, k]), transpose_a=True,
                   transpose_b=False)
    return [ddata, call("reshape", product, newshape=[units, k])]


def _dense_lower(inputs: list, attrs: DenseAttrs, out_type: Type) -> Tensor:
    from kiln.loops import int8_kernels as int8  # 8-bit inputs, int32 out
    from kiln.loops import linear_kernels as fast  # float32: packed GEMM / dot products

    out = oplib.out_tensor_type(out_type)
    x, w = inputs
    if x.dtype == out.dtype and fast.usable(x.dtype, x.shape, w.shape):
        return fast.dense(x, w, out.static_shape, out.dtype)
    if int8.usable(x.dtype, w.dtype, out.dtype, x.shape, w.shape):
        return int8.dense(x, w, out.static_shape)
    k = x.shape[-1]

    def body(o: tuple, r: tuple) -> LExpr:
        a, b = x(*o[:-1], r[0]), w(o[-1], r[0])
        acc = _accumulator(out.dtype)
        if a.dtype != acc:
            a, b = Cast(acc, a), Cast(acc, b)
        return Binary("mul", a, b)

    acc = _accumulator(out.dtype)
    fin = None if acc == out.dtype else (lambda v, o: Cast(out.dtype, v))
    return reduce(out.static_shape, out.dtype, (k,), "add", body,
                  oplib.dtype_const(0, acc), fin, acc)


dense = register(
    "nn.dense",
    inputs=("data", "weight"),
    attrs_type=DenseAttrs,
    attrs=(
        Attr("units", None, kind="int", optional=True, doc="output size; checked against weight"),
        Attr("out_dtype", "", kind="dtype", doc="result dtype; '': that of data"),
    ),
    relation=_dense_relation,
    compute=_dense,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="data @ weight.T for weight of shape (units, in): a fully connected layer.",
    gradient=_dense_grad,
    lower=_dense_lower,
)


class BatchMatmulAttrs(Attrs):
    __slots__ = ()
    out_dtype: str
    transpose_a: bool
    transpose_b: bool


def _batch_matmul_relation(arg_types: Sequence[Type], attrs: BatchMatmulAttrs) -> Type | None:
    args = tensor_args(arg_types, ("x", "y"))
    if args is None:
        return None
    x, y = args
    same_dtype(args, ("x", "y"))
    require_dtype(x, "x", "numeric")
    require_rank(x, "x", 3)
    require_rank(y, "y", 3)
    bx, *mk = x.shape
    by, *kn = y.shape
    m, kx = reversed(mk) if attrs.transpose_a else mk
    n, ky = kn if attrs.transpose_b else reversed(kn)
    if bx == 1:
        batch = by
    elif by == 1:
        batch = bx
    else:
        check_dims_equal(
            bx,
            by,
            f"x of shape {shape_str(x.shape)} and y of shape {shape_str(y.shape)} have "
            f"different batch sizes {bx} and {by} (they must be equal, or one must be 1)",
        )
        batch = unify_dim(bx, by)
    check_dims_equal(
        kx,
        ky,
        f"x of shape {shape_str(x.shape)} and y of shape {shape_str(y.shape)} disagree on the "
        f"reduction dimension: {kx} in x but {ky} in y (transpose_a={attrs.transpose_a}, "
        f"transpose_b={attrs.transpose_b})",
    )
    return TensorType((batch, m, n), attrs.out_dtype or x.dtype)


def _batch_matmul(arrays: list[np.ndarray], attrs: BatchMatmulAttrs) -> np.ndarray:
    x, y = np.asarray(arrays[0]), np.asarray(arrays[1])
    out = attrs.out_dtype or x.dtype.name
    acc = _accumulator(out)
    a = x.astype(acc)
    b = y.astype(acc)
    if attrs.transpose_a:
        a = a.swapaxes(1, 2)
    if attrs.transpose_b:
        b = b.swapaxes(1, 2)
    return as_array(np.matmul(a, b), out)


def _batch_matmul_grad(c: Call, g: Expr) -> list[Expr | None]:
    # out = A @ B with A = x or x^T and B = y or y^T; dA = g @ B^T and dB = A^T @ g, each
    # written as one batch_matmul with the transposes folded into its flags.
    x, y = c.args
    attrs = BatchMatmulAttrs.view(c.attrs)
    ta, tb = attrs.transpose_a, attrs.transpose_b
    g = _in_dtype(c, g)

    def bmm(p: Expr, q: Expr, transpose_a: bool, transpose_b: bool) -> Expr:
        return call("nn.batch_matmul", p, q, transpose_a=transpose_a, transpose_b=transpose_b)

    dx = bmm(y, g, tb, True) if ta else bmm(g, y, False, not tb)
    dy = bmm(g, x, True, ta) if tb else bmm(x, g, not ta, False)
    out = gh.tensor_type(c)
    return [gh.unbroadcast(dx, x, _with_batch(x, out)), gh.unbroadcast(dy, y, _with_batch(y, out))]


def _with_batch(arg: Expr, out: TensorType) -> TensorType:
    """The type ``arg``'s adjoint has before a broadcast batch dimension is summed away."""
    t = gh.tensor_type(arg)
    return TensorType((out.shape[0], *t.shape[1:]), t.dtype)


def _batch_matmul_lower(inputs: list, attrs: BatchMatmulAttrs, out_type: Type) -> Tensor:
    from kiln.loops import int8_kernels as int8  # 8-bit inputs, int32 out
    from kiln.loops import linear_kernels as fast  # float32: packed GEMM

    out = oplib.out_tensor_type(out_type)
    x, y = inputs
    ta, tb = bool(attrs.transpose_a), bool(attrs.transpose_b)
    if x.dtype == out.dtype and fast.usable(x.dtype, x.shape, y.shape):
        return fast.batch_matmul(x, y, out.static_shape, out.dtype, ta, tb)
    if int8.usable(x.dtype, y.dtype, out.dtype, x.shape, y.shape):
        return int8.batch_matmul(x, y, out.static_shape, ta, tb)
    k = x.shape[1] if ta else x.shape[2]
    acc = _accumulator(out.dtype)
    batch = out.static_shape[0]

    def body(o: tuple, r: tuple) -> LExpr:
        b, i, j = o
        bx = b if x.shape[0] == batch else Const(0)
        by = b if y.shape[0] == batch else Const(0)
        a = x(bx, r[0], i) if ta else x(bx, i, r[0])
        c = y(by, j, r[0]) if tb else y(by, r[0], j)
        return Binary("mul", oplib.convert(a, acc), oplib.convert(c, acc))

    fin = None if acc == out.dtype else (lambda v, o: Cast(out.dtype, v))
    return reduce(out.static_shape, out.dtype, (k,), "add", body,
                  oplib.dtype_const(0, acc), fin, acc)


batch_matmul = register(
    "nn.batch_matmul",
    inputs=("x", "y"),
    attrs_type=BatchMatmulAttrs,
    attrs=(
        Attr("out_dtype", "", kind="dtype", doc="result dtype; '': that of x"),
        Attr("transpose_a", False, kind="bool", doc="x is (batch, k, m)"),
        Attr("transpose_b", True, kind="bool", doc="y is (batch, n, k)"),
    ),
    relation=_batch_matmul_relation,
    compute=_batch_matmul,
    pattern=OpPattern.OUT_ELEMWISE_FUSABLE,
    doc="Matrix products of a batch of matrices (y transposed by default, as in TVM).",
    gradient=_batch_matmul_grad,
    lower=_batch_matmul_lower,
)


class BiasAddAttrs(Attrs):
    __slots__ = ()
    axis: int


def _bias_add_relation(arg_types: Sequence[Type], attrs: BiasAddAttrs) -> Type | None:
    args = tensor_args(arg_types, ("data", "bias"))
    if args is None:
        return None
    data, bias = args
    same_dtype(args, ("data", "bias"))
    require_dtype(data, "data", "numeric")
    axis = normalize_axis(attrs.axis, data.ndim)
    require_rank(bias, "bias", 1)
    check_dims_equal(
        bias.shape[0],
        data.shape[axis],
        f"bias of shape {shape_str(bias.shape)} does not match dimension {axis} of data of "
        f"shape {shape_str(data.shape)} (size {data.shape[axis]})",
    )
    return data


def _bias_add(arrays: list[np.ndarray], attrs: BiasAddAttrs) -> np.ndarray:
    x, b = np.asarray(arrays[0]), np.asarray(arrays[1])
    axis = normalize_axis(attrs.axis, x.ndim)
    shape = [1] * x.ndim
    shape[axis] = b.shape[0]
    return as_array(x + b.reshape(shape), x.dtype.name)


def _bias_add_grad(c: Call, g: Expr) -> list[Expr | None]:
    return [g, gh.sum_over_rows(g, c, BiasAddAttrs.view(c.attrs).axis)]


def _bias_add_lower(inputs: list, attrs: BiasAddAttrs, out: Type) -> Tensor:
    data, bias = inputs
    axis = attrs.axis % data.ndim
    return compute(data.shape, data.dtype,
                   lambda *i: Binary("add", data(*i), bias(i[axis])))


bias_add = register(
    "nn.bias_add",
    inputs=("data", "bias"),
    attrs_type=BiasAddAttrs,
    attrs=(Attr("axis", 1, kind="int", doc="the axis of data the bias runs along"),),
    relation=_bias_add_relation,
    compute=_bias_add,
    pattern=OpPattern.BROADCAST,
    doc="A 1-D bias added along one axis of data.",
    gradient=_bias_add_grad,
    lower=_bias_add_lower,
)

__all__ = ["batch_matmul", "bias_add", "dense"]
