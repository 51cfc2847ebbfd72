"""The operator sweep in machine code: every operator, compiled alone and in fused groups.

The programs are the lowering sweep's (tests/loops/op_cases.py: every operator of the
registry on several shapes, dtypes and attribute settings, with their edge cases). Each is
lowered to one kernel holding the whole function, compiled, run, and compared with the loop
evaluator on the same kernel and with `kiln.interpret` on the program; then the program is
optimized and fused, and run with every fused primitive function compiled. Tolerances are
the cases' own (rtol 1e-5 for float32 by default): the transcendental approximations are
within a few ulp (kiln/loops/decompose_math.py), far inside them. Every case runs for this
machine and for a narrower CPU of its architecture (AVX2 on an AVX-512 host).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest

import kiln
from kiln.codegen import KernelLibrary, compile_kernels
from kiln.ir.expr import Function
from kiln.loops.evaluate import evaluate
from kiln.loops.ir import Kernel
from kiln.loops.schedule import target_scope
from kiln.target import Target

from ..loops.helpers import (
    KernelInterpreter,
    _flatten,
    _shape_of,
    _unflatten,
    compare,
    inputs,
    lower_with_weights,
    program,
    reference,
)
from ..loops.op_cases import CASES

# This machine, and a narrower CPU of its architecture (on an AVX-512 host: AVX2 width, other
# GEMM tiles), so that both kinds of schedule are checked wherever the suite runs.
_HOST = Target.host()
TARGETS = [_HOST, *([Target.parse("llvm -mattr=-avx512f")] if _HOST.has("avx512f") else
                    [Target.parse("llvm -mattr=-avx2")] if _HOST.has("avx2") else [])]
_PARAMS = [pytest.param(name, k, t, id=f"{name}-{k}-{t.vector_bits}bit")
           for name, cases in CASES.items() for k in range(len(cases)) for t in TARGETS]


def _arrays(kernel: Kernel, args: Any) -> list[np.ndarray]:
    return [np.array(a, order="C") for a in _flatten(tuple(args))]


def run_native(lib: KernelLibrary, kernel: Kernel, args: Any) -> list[np.ndarray]:
    outs = [np.empty(b.shape, b.dtype) for b in kernel.outputs]
    lib[kernel.name](*_arrays(kernel, args), *outs)
    return outs


class NativeInterpreter(KernelInterpreter):
    """The reference interpreter with each fused primitive function run as machine code."""

    def run_primitive(self, fn: Function, args: list[Any]) -> Any:
        entry = self.kernels.get(id(fn))
        if entry is None:
            kernel, self.weights[id(fn)] = lower_with_weights(fn, f"fused{len(self.kernels)}")
            entry = self.kernels[id(fn)] = kernel
            self.libraries[id(fn)] = compile_kernels([kernel], self.target)
        outs = run_native(self.libraries[id(fn)], entry, [*args, *self.weights[id(fn)]])
        return _unflatten(outs, _shape_of(fn.checked_type.ret_type))  # type: ignore[attr-defined]

    def __init__(self, mod: kiln.IRModule, target: Target) -> None:
        super().__init__(mod)
        self.target = target
        self.libraries: dict[int, KernelLibrary] = {}


@pytest.mark.parametrize(("name", "k", "target"), _PARAMS)
def test_compiled_operator_agrees(name: str, k: int, target: Target) -> None:
    case = CASES[name][k]
    mod = program(case)
    arrays = inputs(case)
    with warnings.catch_warnings(), target_scope(target):
        warnings.simplefilter("ignore", RuntimeWarning)
        expected = reference(mod, arrays)
        kernel, weights = lower_with_weights(mod["main"], "case")
        kernel_args = [*arrays, *weights]
        lib = compile_kernels([kernel], target)
        try:
            got: Any = _unflatten(run_native(lib, kernel, kernel_args), expected)
        except kiln.EvalError as e:
            got = e
        compare(got, expected, case.rtol, case.atol, f"{case.label} (one compiled kernel)")
        if not isinstance(got, kiln.EvalError):  # the same kernel in the loop evaluator
            evaluated = evaluate(kernel, *_arrays(kernel, kernel_args))
            compare(tuple(_flatten(got)), tuple(evaluated), case.rtol, case.atol,
                    f"{case.label} (compiled vs evaluated)")
        fused = kiln.infer_types(kiln.optimize(mod))
        interp = NativeInterpreter(fused, target)
        try:
            got = interp.call(interp.global_closure("main"), list(arrays))
        except kiln.EvalError as e:
            got = e
        compare(got, expected, case.rtol, case.atol, f"{case.label} (fused, compiled)")
