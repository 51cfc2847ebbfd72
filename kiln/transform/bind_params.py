"""Binding model weights: parameters of @main given by name become constants."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.ir.expr import Constant, Expr, Function, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import rewrite
from kiln.ir.ty import TensorType


def _check(v: Var, value: Any, entry: str) -> Constant:
    ty = v.type_annotation
    array = np.asarray(value)
    if isinstance(ty, TensorType):
        shape_ok = array.ndim == len(ty.shape) and all(
            not isinstance(d, int) or d == n for d, n in zip(ty.shape, array.shape)
        )
        if array.dtype.name != ty.dtype or not shape_ok:
            raise Error(
                f"params[{v.name_hint!r}] for @{entry} must be {ty}, but is an array of "
                f"shape {array.shape} and dtype {array.dtype.name}"
            )
    return Constant(array)


def bind_params(mod: IRModule, params: Mapping[str, Any], entry: str = "main") -> IRModule:
    """``mod`` with the parameters of ``@entry`` named in ``params`` replaced by constants.

    The bound parameters disappear from ``@entry``'s signature; passes can then fold them.
    """
    fn = mod[entry]
    names = {p.name_hint for p in fn.params}
    unknown = sorted(set(params) - names)
    if unknown:
        raise Error(f"@{entry} has no parameter named {', '.join(repr(n) for n in unknown)}")
    consts: dict[Var, Constant] = {
        p: _check(p, params[p.name_hint], entry) for p in fn.params if p.name_hint in params
    }
    if not consts:
        return mod

    def replace(e: Expr) -> Expr | None:
        return consts.get(e) if isinstance(e, Var) else None

    body = rewrite(fn.body, replace)
    kept = tuple(p for p in fn.params if p not in consts)
    new = Function(kept, body, fn.ret_type, fn.type_params, fn.attrs, span=fn.span)
    return mod.with_function(entry, new)
