"""The training step as one Level-1 function: loss, gradients and optimizer update.

From a loss function ``f(x..., w..., frozen...)`` (a scalar loss, or a tuple whose field 0 is
the loss) and the indices of its trainable parameters, `step_function` builds

    fn (%x..., %w..., %frozen..., %state..., %lr, %step) {
      let %r = <first-order gradient of f with respect to %w, keeping f's value>;
      ... clipping by global norm, then the optimizer's update of each %w ...
      (loss, (new %w...), (new %state...), [(new stats...),] grad_norm, outputs)
    }                                                   /* norm: NaN without clipping */

an ordinary dataflow program, so kiln.build fuses and compiles all of it at once (the update
of a weight fuses with the last kernel of its gradient where fusion allows: the results read
the gradient's let chain directly, not through projections of its result tuple, which fusion
cannot see through). The weights and
the state come back as results in the order they came in; the Step (kiln/train/step.py) makes
each result write the buffer of the input it replaces. The running statistics of batch norms
in training mode that are parameters of f (kiln/train/buffers.py) are not differentiated: f
is made to return their new values too, which come back in their own tuple (absent without
any; `StepLayout.stats` says which parameters they update).

`gradient_function` builds the first half alone — ``(loss, grads..., [stats...,] outputs)`` — and
`update_function` the second — ``(new %w..., new %state..., grad_norm)`` from ``%w, %grad,
%state, %lr, %step`` — so that a data-parallel wrapper can all-reduce the
gradients between the two (`Step(..., split=True)`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kiln.ad.grad import grad
from kiln.errors import Error
from kiln.infer import infer_types
from kiln.ir.expr import Expr, Function, Let, Tuple, TupleGetItem, Var, const
from kiln.ir.module import IRModule
from kiln.ir.ty import TensorType, TupleType, tensor_type
from kiln.op import reshape
from kiln.train.buffers import find_buffers, with_statistics
from kiln.train.clip import clip_by_global_norm, global_norm
from kiln.train.optimizers import Optimizer


@dataclass(frozen=True)
class StepLayout:
    """Where things are in the step program's parameters and results."""

    num_inputs: int  # the loss function's own parameters, trainable and frozen ones included
    trainable: tuple[int, ...]  # of those, the trained ones
    num_state: int  # state tensors, after the loss function's parameters
    has_outputs: bool  # whether f returns more than the loss (returned as the last result)
    # the parameters that are running statistics, returned updated (after the state or grads)
    stats: tuple[int, ...] = ()


def _scalar(name: str) -> Var:
    t = tensor_type((), "float32")
    return Var(name, t, checked_type_=t)


def _loss_type_check(fn: Function) -> bool:
    """Whether ``fn`` returns a tuple (loss first); a `kiln.Error` unless the loss is a
    float32 scalar."""
    result = fn.body.checked_type
    loss = result.fields[0] if isinstance(result, TupleType) and result.fields else result
    if not (isinstance(loss, TensorType) and loss.dtype == "float32"
            and loss.is_static and loss.static_shape in ((), (1,))):
        raise Error(f"a training step needs a loss function returning a float32 scalar (or a "
                    f"tuple whose first field is one); this one returns {result}")
    return isinstance(result, TupleType)


@dataclass(frozen=True)
class _Gradient:
    """The first-order gradient function of a loss function, taken apart: its let chain,
    and the loss function's value, the gradients, its other outputs (None when it returns
    only the loss) and the new running statistics as expressions in the chain's scope."""

    fn: Function
    lets: tuple[Let, ...]
    loss: Expr
    grads: list[Expr]
    outputs: Expr | None
    new_stats: list[Expr]
    stats: tuple[int, ...]  # the parameters the statistics update

    def body(self, result: Expr) -> Expr:
        """``result`` in the scope of the gradient's let chain."""
        for let in reversed(self.lets):
            result = Let(let.var, let.value, result)
        return result


def _field(e: Expr, i: int) -> Expr:
    """Field ``i`` of a tuple: the field itself of a tuple literal (so that fusion sees the
    value's producer), else a projection."""
    return e.fields[i] if isinstance(e, Tuple) else TupleGetItem(e, i)


def _differentiate(fn: Function, mod: IRModule | None, trainable: Sequence[int]) -> _Gradient:
    """The first-order gradient of ``fn`` with respect to ``trainable`` (see `_Gradient`)."""
    is_tuple = _loss_type_check(fn)
    stats = find_buffers(fn).stats
    own = len(fn.body.checked_type.fields) if is_tuple else 1  # type: ignore[attr-defined]
    if stats:
        fn = _typed(with_statistics(fn, tuple(stats)), mod)
    g = grad(fn, mod=mod, mode="first_order", wrt=tuple(trainable),
             of=0 if is_tuple or stats else None, keeping=None)
    lets: list[Let] = []
    tail = g.body
    while isinstance(tail, Let):
        lets.append(tail)
        tail = tail.body
    if not (isinstance(tail, Tuple) and len(tail.fields) == 2):
        # not the first-order form's (value, (grads...)) literal: bind and project it
        r = Var("r", tail.checked_type, checked_type_=tail.checked_type)
        lets.append(Let(r, tail, r))
        tail = r
    value = _field(tail, 0)
    grads_tuple = _field(tail, 1)
    grads = [_field(grads_tuple, i) for i in range(len(trainable))]
    outputs: Expr | None = None
    if is_tuple:
        rest = tuple(_field(value, i) for i in range(1, own))
        outputs = rest[0] if len(rest) == 1 else Tuple(rest)
    new_stats = [_field(value, own + k) for k in range(len(stats))]
    loss = _field(value, 0) if is_tuple or stats else value
    # the loss is () or (1,): the step returns a scalar
    return _Gradient(g, tuple(lets), reshape(loss, newshape=[]), grads, outputs, new_stats,
                     tuple(i for i, _ in stats))


def _state_vars(fn: Function, trainable: Sequence[int], opt: Optimizer) -> list[list[Var]]:
    out = []
    for i in trainable:
        p = fn.params[i]
        t = p.checked_type
        out.append([Var(f"{p.name_hint}_{slot}", t, checked_type_=t) for slot in opt.slots])
    return out


def _check_trainable(fn: Function, trainable: Sequence[int]) -> None:
    for i in trainable:
        p = fn.params[i]
        t = p.checked_type
        if not (isinstance(t, TensorType) and t.dtype == "float32" and t.is_static):
            raise Error(f"%{p.name_hint} cannot be trained: it is {t}; kiln.train trains "
                        "float32 tensors of static shape")


def step_function(fn: Function, trainable: Sequence[int], opt: Optimizer, *,
                  clip_grad_norm: float | None = None,
                  mod: IRModule | None = None) -> tuple[Function, StepLayout]:
    """The whole training step of loss function ``fn`` as one function (see the module
    docstring), and where its parameters and results are."""
    fn = _typed(fn, mod)
    _check_trainable(fn, trainable)
    d = _differentiate(fn, mod, trainable)
    g, outputs, new_stats = d.fn, d.outputs, d.new_stats
    state = _state_vars(fn, trainable, opt)
    lr, step = _scalar("lr"), _scalar("step")
    grads, norm = _clipped(d.grads, clip_grad_norm)
    new_params: list[Expr] = []
    new_state: list[Expr] = []
    for i, gi, si in zip(trainable, grads, state):
        p, s = opt.update(g.params[i], gi, si, lr, step)
        new_params.append(p)
        new_state.extend(s)
    results: list[Expr] = [d.loss, Tuple(tuple(new_params)), Tuple(tuple(new_state))]
    if new_stats:
        results.append(Tuple(tuple(new_stats)))
    results.append(norm)
    if outputs is not None:
        results.append(outputs)
    flat_state = [v for vs in state for v in vs]
    out = Function((*g.params, *flat_state, lr, step), d.body(Tuple(tuple(results))))
    layout = StepLayout(len(fn.params), tuple(trainable), len(flat_state), outputs is not None,
                        d.stats)
    return _typed(out, mod), layout


def gradient_function(fn: Function, trainable: Sequence[int], *,
                      mod: IRModule | None = None) -> tuple[Function, StepLayout]:
    """The first half of a split step: ``(loss, (grads...)[, (new stats...)][, outputs])``
    from the loss function's parameters."""
    fn = _typed(fn, mod)
    _check_trainable(fn, trainable)
    d = _differentiate(fn, mod, trainable)
    results: list[Expr] = [d.loss, Tuple(tuple(d.grads))]
    if d.new_stats:
        results.append(Tuple(tuple(d.new_stats)))
    if d.outputs is not None:
        results.append(d.outputs)
    out = Function(d.fn.params, d.body(Tuple(tuple(results))))
    layout = StepLayout(len(fn.params), tuple(trainable), 0, d.outputs is not None, d.stats)
    return _typed(out, mod), layout


def update_function(params: Sequence[Var], opt: Optimizer, *,
                    clip_grad_norm: float | None = None) -> Function:
    """The second half of a split step: ``fn (%w..., %grad..., %state..., %lr, %step)
    { ((new %w...), (new %state...), grad_norm) }``; the norm (and the clipping) is of the
    gradients it is given, which a data-parallel wrapper has summed over its processes."""
    ws = [Var(p.name_hint, p.checked_type, checked_type_=p.checked_type) for p in params]
    gs = [Var(f"{p.name_hint}_grad", p.checked_type, checked_type_=p.checked_type)
          for p in params]
    state = [[Var(f"{p.name_hint}_{slot}", p.checked_type, checked_type_=p.checked_type)
              for slot in opt.slots] for p in params]
    lr, step = _scalar("lr"), _scalar("step")
    grads, norm = _clipped(list(gs), clip_grad_norm)
    new_params: list[Expr] = []
    new_state: list[Expr] = []
    for w, gi, si in zip(ws, grads, state):
        p, s = opt.update(w, gi, si, lr, step)
        new_params.append(p)
        new_state.extend(s)
    flat_state = [v for vs in state for v in vs]
    body = Tuple((Tuple(tuple(new_params)), Tuple(tuple(new_state)), norm))
    return _typed(Function((*ws, *gs, *flat_state, lr, step), body), None)


def _clipped(grads: list[Expr], max_norm: float | None) -> tuple[list[Expr], Expr]:
    """The gradients clipped to ``max_norm`` and their global norm before; without clipping
    the gradients as they are and NaN (the norm costs a pass over every gradient: only a
    step that clips computes it)."""
    if max_norm is None:
        return grads, const(float("nan"))
    norm = global_norm(grads)
    return clip_by_global_norm(grads, norm, max_norm), norm


def _typed(fn: Function, mod: IRModule | None) -> Function:
    out = infer_types(fn, mod)
    assert isinstance(out, Function)
    return out


__all__ = ["StepLayout", "gradient_function", "step_function", "update_function"]
