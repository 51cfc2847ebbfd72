"""Loss functions in kiln IR, and `with_loss`: a model's @main turned into a loss function.

    loss_mod = kiln.train.with_loss(mod, "cross_entropy")   # @main(inputs..., weights..., %target)

`cross_entropy` is ``torch.nn.functional.cross_entropy`` over (batch, classes) logits with
integer class labels (mean over the batch); `mse` is ``torch.nn.functional.mse_loss`` (mean).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kiln.errors import Error
from kiln.infer import infer_types
from kiln.ir.expr import Expr, Function, Var, const
from kiln.ir.module import IRModule
from kiln.ir.ty import TensorType, TupleType, tensor_type
from kiln.op import cast, equal, mean, negative, nn, reshape, sum_

LOSSES = ("cross_entropy", "mse")


def cross_entropy(logits: Expr, labels: Expr, classes: int, batch: int,
                  label_dtype: str) -> Expr:
    """Mean over the batch of ``-log_softmax(logits)[i, labels[i]]``."""
    columns = const(np.arange(classes, dtype=label_dtype).reshape(1, classes))
    one_hot = cast(equal(reshape(labels, newshape=[batch, 1]), columns), dtype="float32")
    return negative(mean(sum_(nn.log_softmax(logits) * one_hot, axis=[1])))


def mse(prediction: Expr, target: Expr) -> Expr:
    """Mean of the squared differences."""
    d = prediction - target
    return mean(d * d)


def with_loss(model: IRModule | Function, loss: str | Callable[[Expr, Var], Expr],
              target: TensorType | None = None, *, keep_output: bool = False) -> IRModule:
    """A module whose @main takes ``model``'s parameters and a last one, ``%target``, and
    returns the loss of ``model``'s result against it (with the result beside it when
    ``keep_output``: ``(loss, output)``, the Step's `outputs`).

    ``loss`` is "cross_entropy" (``target``: int64 labels of shape (batch,)), "mse"
    (``target``: the output's type), or a function ``(output, target_var) -> loss`` (then
    give ``target``'s type).
    """
    if isinstance(model, IRModule):
        mod = model if model.is_typed else infer_types(model)
        fn = mod["main"]
    elif isinstance(model, Function):
        mod = None
        fn = model if model.checked_type_ is not None else infer_types(model)
    else:
        raise Error(f"with_loss takes an IRModule or a Function, not {type(model).__name__}")
    assert isinstance(fn, Function)
    out_type = fn.body.checked_type
    if isinstance(out_type, TupleType) or not isinstance(out_type, TensorType):
        raise Error(f"with_loss needs a model returning one tensor; this one returns {out_type}")
    if any(p.name_hint == "target" for p in fn.params):
        raise Error("the model already has a parameter named %target")
    shape = out_type.static_shape if out_type.is_static else None
    if loss == "cross_entropy":
        if shape is None or len(shape) != 2:
            raise Error(f"cross_entropy needs (batch, classes) logits; the model returns "
                        f"{out_type}")
        t = target or tensor_type((shape[0],), "int64")
        if t.dtype not in ("int32", "int64") or t.static_shape != (shape[0],):
            raise Error(f"cross_entropy's labels must be int32 or int64 of shape "
                        f"({shape[0]},), not {t}")
        y = Var("target", t)
        value = cross_entropy(fn.body, y, shape[1], shape[0], t.dtype)
    elif loss == "mse":
        t = target or out_type
        y = Var("target", t)
        value = mse(fn.body, y)
    elif callable(loss):
        if target is None:
            raise Error("with_loss with a loss function of your own needs the target's type")
        y = Var("target", target)
        value = loss(fn.body, y)
    else:
        raise Error(f"unknown loss {loss!r}; kiln.train has {', '.join(LOSSES)} "
                    "(or give a function)")
    body: Expr = value
    if keep_output:
        from kiln.ir.expr import Tuple

        body = Tuple((value, fn.body))
    new = Function((*fn.params, y), body)
    out = IRModule.from_expr(new, mod) if mod is not None else IRModule.from_expr(new)
    return infer_types(out)


__all__ = ["LOSSES", "cross_entropy", "mse", "with_loss"]
