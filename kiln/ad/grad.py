"""`kiln.grad`: differentiate a function, with DLVM's gradient-declaration options.

    g = kiln.grad(mod["main"], mod=mod)                  # (value, (d/dx, d/dw)), Relay's way
    g = kiln.grad(f, mode="first_order", wrt=(1,), keeping=(), seedable=True)

Both modes return an ordinary typed `Function`: it prints as Relay text, and every pass and
executor takes it. The options mean the same in both modes:

- ``wrt``: indices of the parameters to differentiate with respect to (default: every
  floating-point parameter);
- ``of``: for a function returning a tuple, the index of the output to differentiate
  (DLVM's ``from``; default: the whole result, every output seeded);
- ``keeping``: indices of the outputs to return beside the gradients (default: the whole
  result, Relay's ``(value, gradients)``; ``()``: the gradients alone; otherwise
  ``((kept outputs...), gradients)``; a function not returning a tuple has the one output 0);
- ``seedable``: add a last parameter holding the adjoint of the differentiated output
  (otherwise the seed is ones).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from kiln.ad.common import Path, float_leaves, has_float, is_float, is_plain, project, type_at
from kiln.errors import Error
from kiln.infer import infer_types
from kiln.ir.expr import Expr, Function, Tuple, Var
from kiln.ir.module import IRModule
from kiln.ir.ty import TupleType, Type
from kiln.op.grad_helpers import call

MODES = ("higher_order", "first_order")


@dataclass(frozen=True)
class GradSpec:
    """The validated options of one differentiation."""

    fn: Function
    wrt: tuple[int, ...]
    of: int | None
    keeping: tuple[int, ...] | None
    seed: Var | None  # the seed parameter when seedable

    @property
    def result_type(self) -> Type:
        return self.fn.body.checked_type

    @property
    def output_path(self) -> tuple[int, ...]:
        """Where the differentiated output sits in the result."""
        return () if self.of is None else (self.of,)

    @property
    def output_type(self) -> Type:
        return type_at(self.result_type, self.output_path)

    def seed_leaves(self, at: Callable[[Path], Expr]) -> list[tuple[Path, Expr]]:
        """For each floating-point tensor of the differentiated output (its path in the
        result), the adjoint it is seeded with; ``at(path)`` is that tensor's forward value."""
        out = []
        for leaf in float_leaves(self.output_type):
            path = (*self.output_path, *leaf)
            if self.seed is not None:
                seed = project(self.seed, leaf)
            else:
                seed = call("ones_like", at(path))
            out.append((path, seed))
        return out

    def assemble(self, result: Expr, grads: Sequence[Expr]) -> Expr:
        """The function's value: the kept outputs of ``result`` beside the gradients."""
        gradients = Tuple(tuple(grads))
        if self.keeping is None:
            return Tuple((result, gradients))
        if not self.keeping:
            return gradients
        if isinstance(self.result_type, TupleType):
            kept = tuple(project(result, (i,)) for i in self.keeping)
        else:
            kept = tuple(result for _ in self.keeping)
        return Tuple((Tuple(kept), gradients))

    def params(self) -> tuple[Var, ...]:
        """The parameters of the gradient function."""
        return (*self.fn.params, *([self.seed] if self.seed is not None else []))


def _indices(value: object, what: str) -> tuple[int, ...] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        return (value,)
    if isinstance(value, (tuple, list, range)) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in value
    ):
        return tuple(value)
    raise Error(f"{what} must be an index or a sequence of indices, got {value!r}")


def _param_text(fn: Function, i: int) -> str:
    p = fn.params[i]
    return f"parameter {i} (%{p.name_hint}: {p.checked_type})"


def make_spec(
    fn: Function,
    wrt: object,
    of: object,
    keeping: object,
    seedable: bool,
) -> GradSpec:
    """Check the options against the function and resolve their defaults."""
    names = ", ".join(f"%{p.name_hint}" for p in fn.params) or "none"
    count = len(fn.params)
    indices = _indices(wrt, "wrt")
    if indices is None:
        indices = tuple(i for i, p in enumerate(fn.params) if _differentiable(p.checked_type))
    for i in indices:
        if not -count <= i < count:
            raise Error(
                f"wrt index {i} is out of range: the function has {count} parameter(s) ({names})"
            )
    indices = tuple(i % count for i in indices)
    if len(set(indices)) != len(indices):
        raise Error(f"wrt {list(indices)} names a parameter twice")
    for i in indices:
        t = fn.params[i].checked_type
        if not _differentiable(t):
            what = (
                "an integer or boolean tensor"
                if not has_float(t) and is_plain(t)
                else "not a floating-point tensor or a tuple of them"
            )
            raise Error(
                f"cannot differentiate with respect to {_param_text(fn, i)}: it is {what}; "
                "only floating-point parameters have gradients"
            )
    result = fn.body.checked_type
    outputs = len(result.fields) if isinstance(result, TupleType) else 1
    if of is not None:
        if isinstance(of, bool) or not isinstance(of, int):
            raise Error(f"of must be the index of an output, got {of!r}")
        if not isinstance(result, TupleType):
            raise Error(
                f"of={of} selects an output of a tuple result, but the function returns {result}"
            )
        if not -outputs <= of < outputs:
            raise Error(f"of={of} is out of range: the function returns {outputs} outputs")
        of %= outputs
    kept = _indices(keeping, "keeping")
    if kept is not None:
        for i in kept:
            if not 0 <= i < outputs:
                raise Error(
                    f"keeping index {i} is out of range: the function returns {outputs} "
                    f"output(s) (of type {result})"
                )
    if not is_plain(result):
        raise Error(
            f"kiln.grad needs a function returning tensors or tuples of tensors; this one "
            f"returns {result}"
        )
    output = type_at(result, () if of is None else (of,))
    if not float_leaves(output):
        raise Error(
            f"nothing to differentiate: the differentiated output has type {output}, "
            "which holds no floating-point tensor"
        )
    seed = Var("seed", output, checked_type_=output) if seedable else None
    return GradSpec(fn, indices, of, kept, seed)


def _differentiable(t: Type) -> bool:
    if isinstance(t, TupleType):
        return bool(t.fields) and all(_differentiable(f) for f in t.fields)
    return is_float(t)


def grad(
    fn: Function,
    mod: IRModule | None = None,
    mode: str = "higher_order",
    wrt: int | Sequence[int] | None = None,
    of: int | None = None,
    keeping: int | Sequence[int] | None = None,
    seedable: bool = False,
) -> Function:
    """The gradient function of ``fn`` (a typed Function; ``mod`` holds its globals and ADTs).

    ``mode`` is "higher_order" (Relay's algorithm: the whole language) or "first_order"
    (DLVM's adjoint code generation: dataflow programs). See the module docstring for the
    options. The result is type-checked.
    """
    from kiln.ad import first_order, higher_order

    if not isinstance(fn, Function):
        raise Error(f"kiln.grad differentiates a Function, not {type(fn).__name__}")
    if mode not in MODES:
        raise Error(f"unknown mode {mode!r}; kiln.grad has modes {', '.join(MODES)}")
    if mod is not None and not mod.is_typed:
        mod = infer_types(mod)
    if fn.checked_type_ is None:
        fn = infer_types(fn, mod)
    spec = make_spec(fn, wrt, of, keeping, seedable)
    if mode == "first_order":
        out = first_order.differentiate(spec)
    else:
        out = higher_order.differentiate(spec, mod)
    return infer_types(out, mod)
