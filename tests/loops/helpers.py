"""Running lowered kernels against the reference interpreter.

A `Case` is a small program — a function of typed parameters built with kiln's operator
builders — and how to make its inputs. `check_alone` lowers the whole function as one kernel
(every call in it fused into one loop nest) and runs it with the loop-IR evaluator;
`check_fused` runs `kiln.optimize` first and then the optimized program, with each fused
primitive function replaced by its kernel. Both compare with `kiln.interpret` on the original
program: exactly for integer and bool results, to a tight tolerance for floats. A program the
reference rejects with `kiln.EvalError` must fail the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import kiln
from kiln.eval.interpreter import Interpreter
from kiln.eval.values import Closure
from kiln.ir.expr import Call, Function, Op
from kiln.ir.traverse import post_order
from kiln.loops.ir import Kernel
from kiln.loops.lower import lower_primitive
from kiln.runtime.kernel import EvaluatedKernel
from kiln.ssa.kernels import constants_as_params

from ..op.helpers import rand


@dataclass(frozen=True)
class Arg:
    """One parameter: its shape and dtype, and the range of its random values (or the values)."""

    shape: tuple[int, ...]
    dtype: str = "float32"
    low: float = -3.0
    high: float = 3.0
    values: Any = None

    def make(self, rng: np.random.Generator) -> np.ndarray:
        if self.values is not None:
            return np.asarray(self.values, dtype=self.dtype).reshape(self.shape)
        return rand(rng, self.shape, self.dtype, self.low, self.high)


def arg(*shape: int, dtype: str = "float32", low: float = -3.0, high: float = 3.0,
        values: Any = None) -> Arg:
    return Arg(tuple(shape), dtype, low, high, values)


@dataclass(frozen=True)
class Case:
    """A program ``build(*params)`` over parameters described by ``args``."""

    build: Callable[..., kiln.Expr]
    args: Sequence[Arg]
    label: str = ""
    rtol: float = 1e-5
    atol: float = 1e-6
    extra: dict = field(default_factory=dict)


def program(case: Case) -> kiln.IRModule:
    params = [kiln.var(f"a{i}", shape=a.shape, dtype=a.dtype) for i, a in enumerate(case.args)]
    return kiln.infer_types(kiln.IRModule.from_expr(kiln.Function(params, case.build(*params))))


def inputs(case: Case, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [a.make(rng) for a in case.args]


def reference(mod: kiln.IRModule, arrays: Sequence[np.ndarray]) -> Any:
    """The interpreter's result, or the EvalError it raised."""
    try:
        return kiln.interpret(mod, *arrays)
    except kiln.EvalError as e:
        return e


def _flatten(value: Any) -> list[np.ndarray]:
    out: list[np.ndarray] = []
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, tuple):
            stack.extend(reversed(v))
        else:
            out.append(np.asarray(v))
    return out


def lower_with_weights(fn: Function, name: str = "kernel") -> tuple[Kernel, list[np.ndarray]]:
    """The kernel of ``fn`` with its non-scalar constants made parameters (as the back end's
    lift-constants pass does), and those constants: pass them after the arguments."""
    lifted, consts = constants_as_params(fn)
    return lower_primitive(lifted, name), [c.data for c in consts]


def run_kernel(kernel: Kernel, args: Sequence[Any]) -> list[np.ndarray]:
    """Run a kernel on (possibly tuple) arguments; its output arrays."""
    arrays = _flatten(tuple(args))
    arrays = [np.array(a, order="C") for a in arrays]  # (ascontiguousarray makes 0-d 1-d)
    outs = [np.empty(b.shape, b.dtype) for b in kernel.outputs]
    EvaluatedKernel(kernel)(*arrays, *outs)
    return outs


def _unflatten(outs: list[np.ndarray], like: Any) -> Any:
    it = iter(outs)

    def build(v: Any) -> Any:  # result values are shallow: tuples of tensors, rarely nested
        if isinstance(v, tuple):
            return tuple(build(x) for x in v)
        return next(it)

    return build(like)


def compare(got: Any, expected: Any, rtol: float, atol: float, what: str) -> None:
    if isinstance(expected, kiln.EvalError):
        assert isinstance(got, kiln.EvalError), f"{what}: the reference raised {expected}"
        return
    assert not isinstance(got, Exception), f"{what}: raised {got}, reference gave a value"
    gs, es = _flatten(got), _flatten(expected)
    assert len(gs) == len(es), f"{what}: {len(gs)} results, expected {len(es)}"
    for k, (g, e) in enumerate(zip(gs, es)):
        where = f"{what}, result {k}"
        assert g.dtype == e.dtype and g.shape == e.shape, (
            f"{where}: {g.dtype}{list(g.shape)}, expected {e.dtype}{list(e.shape)}")
        if e.dtype.kind in "biu":
            np.testing.assert_array_equal(g, e, err_msg=where)
        else:
            np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, equal_nan=True, err_msg=where)


def check_alone(case: Case, seed: int = 0) -> Kernel:
    """Lower the case's whole function to one kernel, run it, compare with the interpreter."""
    mod = program(case)
    arrays = inputs(case, seed)
    expected = reference(mod, arrays)
    kernel, weights = lower_with_weights(mod["main"], "case")
    try:
        outs: Any = _unflatten(run_kernel(kernel, [*arrays, *weights]), expected)
    except kiln.EvalError as e:
        outs = e
    compare(outs, expected, case.rtol, case.atol, f"{case.label or 'case'} (one kernel)")
    return kernel


class KernelInterpreter(Interpreter):
    """The reference interpreter, with every call of a fused primitive function run by its
    kernel (calls are intercepted where they are evaluated, tail calls included)."""

    def __init__(self, mod: kiln.IRModule) -> None:
        super().__init__(mod)
        self.kernels: dict[int, Kernel] = {}
        self.weights: dict[int, list[np.ndarray]] = {}  # each kernel's lifted constants

    def eval_call(self, e: Call, fr: Any, tail: bool):  # noqa: ANN201 (a trampoline generator)
        if not isinstance(e.op, Op):
            f = yield self.eval(e.op, fr)
            if isinstance(f, Closure) and f.func.attrs.get("Primitive"):
                args = []
                for a in e.args:
                    args.append((yield self.eval(a, fr)))
                return self.run_primitive(f.func, args)
        return (yield from super().eval_call(e, fr, tail))

    def run_primitive(self, fn: Function, args: list[Any]) -> Any:
        kernel = self.kernels.get(id(fn))
        if kernel is None:
            kernel, self.weights[id(fn)] = lower_with_weights(fn, f"fused{len(self.kernels)}")
            self.kernels[id(fn)] = kernel
        outs = run_kernel(kernel, [*args, *self.weights[id(fn)]])
        return _unflatten(outs, _shape_of(fn.checked_type.ret_type))  # type: ignore[attr-defined]


def _shape_of(t: Any) -> Any:
    """A nested tuple of placeholders with the structure of a (tuple) type."""
    from kiln.ir.ty import TupleType

    if isinstance(t, TupleType):
        return tuple(_shape_of(f) for f in t.fields)
    return None


def check_fused(case: Case, seed: int = 0, opt_level: int = 3) -> list[Kernel]:
    """Optimize and fuse the case's program, run it with kernels, compare with the interpreter."""
    mod = program(case)
    arrays = inputs(case, seed)
    expected = reference(mod, arrays)
    fused = kiln.infer_types(kiln.optimize(mod, opt_level=opt_level))
    interp = KernelInterpreter(fused)
    try:
        got: Any = interp.call(interp.global_closure("main"), list(arrays))
    except kiln.EvalError as e:
        got = e
    compare(got, expected, case.rtol, case.atol, f"{case.label or 'case'} (fused)")
    primitives = sum(1 for n in post_order(fused["main"])
                     if isinstance(n, Function) and n.attrs.get("Primitive"))
    if not isinstance(expected, kiln.EvalError):
        assert len(interp.kernels) == primitives, "a fused function did not run as a kernel"
    return list(interp.kernels.values())
