"""The converter table: one function per ATen overload, and what a converter sees of its node.

A converter is registered under the overload's name as torch prints it (``aten.relu.default``)::

    @converter("aten.addmm.default")
    def addmm(n: AtenCall, bias: Expr, a: Expr, b: Expr, beta: float, alpha: float) -> Expr:
        ...

It receives the call being converted (an `AtenCall`: the node's name, the kiln types torch
recorded for its arguments and results, helpers for constants and casts), then the node's
arguments in the order of the operator's schema, keyword-only ones included and defaults filled
in. Tensors arrive as kiln expressions, lists of tensors as lists, dtypes as kiln dtype names;
numbers, lists of ints and strings as they are. A converter returns an expression, or for an
operator with several results a list of them, `Missing` where kiln does not compute one (the
indices of ``max_pool2d_with_indices``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeGuard

import numpy as np
import torch

from kiln.errors import Error
from kiln.frontend.torch.sizes import Sources, shape_tensor, size_expr
from kiln.ir import ANY, Call, Constant, Expr, Op, SymDim, TensorType, const
from kiln.ir.ty import DTYPES, Dim
from kiln.op import cast, dyn, reshape
from kiln.op.shape import TransposeAttrs

Converter = Callable[..., Any]
CONVERTERS: dict[str, Converter] = {}


def converter(*names: str) -> Callable[[Converter], Converter]:
    """Register a function as the converter of one or more ATen overloads."""

    def register(fn: Converter) -> Converter:
        for name in names:
            if name in CONVERTERS:
                raise Error(f"two converters for {name}")  # a bug in kiln, caught at import
            CONVERTERS[name] = fn
        return fn

    return register


@dataclass(frozen=True)
class Missing:
    """A result of a multi-result ATen operator that kiln does not compute; using it is an error."""

    what: str


def kiln_dtype(dtype: torch.dtype) -> str | None:
    """kiln's name for a torch dtype (``torch.float32`` → ``"float32"``), None if kiln has none."""
    name = str(dtype).removeprefix("torch.")
    return name if name in DTYPES else None


class AtenCall:
    """One call of an ATen operator being converted: its node, result types and helpers."""

    def __init__(self, node: torch.fx.Node, where: str, types: dict[int, TensorType],
                 sizes: dict[int, tuple[Any, ...]], symbols: dict[str, str],
                 sources: Sources | None = None) -> None:
        self.node = node
        self._sources: Sources = sources if sources is not None else {}
        self.name = node.name
        self.target = str(node.target)
        self.where = where  # "node %addmm (aten.addmm.default, at model.py:12)"
        self._types = types
        self._sizes = sizes
        self._symbols = symbols

    # --- what torch recorded about the node ------------------------------------------------

    @property
    def outs(self) -> list[TensorType | None]:
        """The kiln type of each result (None for a result that is not a tensor)."""
        val = self.node.meta.get("val")
        vals = val if isinstance(val, (tuple, list)) else [val]
        return [self.type_of_value(v) if isinstance(v, torch.Tensor) else None for v in vals]

    @property
    def out(self) -> TensorType:
        """The kiln type of the (first) result."""
        t = self.outs[0]
        if t is None:
            raise self.error("its result is not a tensor")
        return t

    @property
    def out_sizes(self) -> tuple[Any, ...]:
        """The result's sizes as torch has them (ints and SymInts)."""
        val = self.node.meta["val"]
        val = val[0] if isinstance(val, (tuple, list)) else val
        return tuple(val.shape)

    def type_of_value(self, val: torch.Tensor) -> TensorType:
        """The kiln type of a torch (fake) tensor."""
        dtype = kiln_dtype(val.dtype)
        if dtype is None:
            raise self.error(f"kiln has no dtype {str(val.dtype).removeprefix('torch.')}")
        return TensorType(tuple(self.dim(d) for d in val.shape), dtype)

    def dim(self, d: Any) -> Dim:
        """A kiln dimension for a torch size: an int, a named symbol, or ``?`` for an expression."""
        if isinstance(d, int):
            return d
        as_int = d.node.maybe_as_int()
        if as_int is not None:
            return as_int
        expr = d.node.expr
        if getattr(expr, "is_Symbol", False):
            name = str(expr)
            return SymDim(self._symbols.get(name, name))
        return ANY

    def type(self, x: Expr) -> TensorType:
        """The kiln type of an argument expression."""
        t = self._types.get(id(x))
        if t is None:
            if isinstance(x, Constant):
                return x.tensor_type
            raise self.error("a converter asked for the type of an expression it built (a bug)")
        return t

    def note(self, x: Expr, t: TensorType) -> Expr:
        """Record the type of an expression a converter built, for another converter it passes
        the expression to (which will ask for it); returns ``x``."""
        self._types[id(x)] = t
        self._sizes[id(x)] = tuple(t.shape)
        return x

    def shape(self, x: Expr) -> tuple[Dim, ...]:
        return self.type(x).shape

    def rank(self, x: Expr) -> int:
        return len(self.type(x).shape)

    def dtype(self, x: Expr) -> str:
        return self.type(x).dtype

    def sizes(self, x: Expr) -> tuple[Any, ...]:
        """An argument's sizes as torch has them (ints and SymInts)."""
        s = self._sizes.get(id(x))
        return s if s is not None else tuple(self.shape(x))

    def static_shape(self, x: Expr, what: str = "this operator") -> tuple[int, ...]:
        """An argument's shape, which must be known in full."""
        shape = self.shape(x)
        dims = tuple(d for d in shape if isinstance(d, int))
        if len(dims) != len(shape):
            dims_text = ", ".join(str(d) for d in shape)
            raise self.error(f"{what} needs a static shape, but its input has shape "
                             f"({dims_text})")
        return dims

    def static_out(self, what: str = "this operator") -> tuple[int, ...]:
        """The result's shape, which must be known in full."""
        shape = self.out.shape
        dims = tuple(d for d in shape if isinstance(d, int))
        if len(dims) != len(shape):
            raise self.error(f"{what} needs a static shape, but its result has shape {shape}")
        return dims

    # --- building ---------------------------------------------------------------------------

    def size_expr(self, d: Any) -> Expr:
        """A torch size (an int or a SymInt) as an int64 scalar computed when the program runs
        (kiln/frontend/torch/sizes.py)."""
        try:
            return size_expr(d, self._sources)
        except Error as e:
            raise self.error(e.message) from None

    def shape_tensor(self, sizes: Sequence[Any]) -> Expr:
        """torch sizes as a 1-D int64 tensor (computed when the program runs if symbolic)."""
        try:
            return shape_tensor(sizes, self._sources)
        except Error as e:
            raise self.error(e.message) from None

    def error(self, message: str) -> Error:
        """A kiln.Error about this node (to raise)."""
        return Error(f"{self.where}: {message}")

    def tensor(self, value: object, dtype: str) -> Expr:
        """A tensor argument in ``dtype``: expressions cast if needed, numbers as constants."""
        if isinstance(value, Expr):
            return value if self.type(value).dtype == dtype else cast(value, dtype=dtype)
        if isinstance(value, torch.SymInt):  # a size of the inputs, computed when it runs
            size = self.size_expr(value)
            return size if dtype == "int64" else cast(size, dtype=dtype)
        if isinstance(value, torch.SymFloat | torch.SymBool):
            raise self.error(f"a symbolic size ({value}) is used as a tensor value, which kiln "
                             "cannot express; export with static shapes")
        if isinstance(value, (bool, int, float)):
            return const(np.asarray(value).astype(dtype))
        raise self.error(f"expected a tensor or a number, got {value!r}")

    def promoted(self, a: object, b: object) -> str:
        """The dtype torch computes a binary elementwise operation of ``a`` and ``b`` in."""
        result = torch.result_type(self._probe(a), self._probe(b))
        name = kiln_dtype(result)
        if name is None:
            raise self.error(f"kiln has no dtype {result}")
        return name

    def _probe(self, value: object) -> torch.Tensor | bool | int | float | complex:
        # Promotion depends on the dtype, on whether a tensor is 0-d, and on a number's kind.
        if isinstance(value, Expr):
            t = self.type(value)
            return torch.empty((0,) * min(t.ndim, 1), dtype=getattr(torch, t.dtype))
        if isinstance(value, torch.SymInt | torch.SymFloat | torch.SymBool):
            raise self.error(f"a symbolic size ({value}) is used as a tensor value, which kiln "
                             "cannot express; export with static shapes")
        if isinstance(value, (bool, int, float, complex)):
            return value
        raise self.error(f"expected a tensor or a number, got {value!r}")

    def reshape(self, x: Expr, target: Sequence[Any]) -> Expr:
        """``x`` reshaped to torch sizes ``target`` (ints and SymInts), in Relay's codes.

        A symbolic size equal to the input's size at the same position is copied (0); one
        other symbolic size is inferred (-1). More cannot be expressed.
        """
        source = self.sizes(x)
        newshape: list[int] = []
        for i, d in enumerate(target):
            if isinstance(d, int):
                newshape.append(d)
            elif i < len(source) and _same_size(source[i], d) and -1 not in newshape[i:]:
                newshape.append(0)
            elif -1 not in newshape:
                newshape.append(-1)
            else:  # the sizes computed when the program runs (torch's 0 is a size)
                return dyn.reshape(x, self.shape_tensor(target), allowzero=1)
        allowzero = 0
        if any(isinstance(d, int) and d == 0 for d in target):
            if len(newshape) != len(target) or any(not isinstance(d, int) for d in target):
                # Relay's 0 means "copy"; a real size 0 needs allowzero, which has no codes.
                raise self.error(f"cannot reshape to {list(target)}: symbolic sizes and a 0")
            allowzero = 1
        if tuple(newshape) == tuple(self.shape(x)):
            return x
        return reshape(x, newshape=newshape, allowzero=allowzero)


def _same_size(a: Any, b: Any) -> bool:
    if isinstance(a, int) or isinstance(b, int):
        return isinstance(a, int) and isinstance(b, int) and a == b
    return str(a) == str(b)


def axis(dim: int, rank: int, n: AtenCall) -> int:
    """A torch dimension index made non-negative (torch lets a scalar use 0 and -1)."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise n.error(f"dimension {dim} is out of range for a tensor of rank {rank}")
    return dim % r


def is_transpose_2d(x: Expr) -> TypeGuard[Call]:
    """Whether ``x`` is ``transpose(w, axes=[1, 0])`` (torch's ``w.t()`` before a matmul)."""
    return (isinstance(x, Call) and x.op == Op("transpose")
            and tuple(TransposeAttrs.view(x.attrs).axes or (1, 0)) == (1, 0))
