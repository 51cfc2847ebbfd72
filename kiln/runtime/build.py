"""kiln.build: from a Level-1 module to something that runs, and the `Executable` it makes.

    exe = kiln.build(mod, target="llvm", opt_level=3, params=weights)
    y = exe(x)                 # numpy in, numpy out
    exe.inputs, exe.outputs    # names, shapes, dtypes (kiln/runtime/named_io.py)
    exe.run(None, {"input.1": x})   # by name, as ONNX Runtime: a list of the outputs
    print(exe.stats())         # kernels, arena bytes, compile time, cache hits
    exe.save("model.kiln")     # kiln.load("model.kiln") runs it again without compiling

Two pipelines of named passes run under the current `PassContext`, each timed: bind the
weights and optimize (`kiln.optimize`: Level 1, ends with fusion), then the back end
(kiln/runtime/backend.py: lower-to-ssa, plan-memory, lower-kernels, compile). Then an
executor is chosen (kiln/runtime/executor.py). Kernels of symbolic shape are compiled on
first use by the same Level-3 passes: once for every size where that costs little, else for
each shape met (`ShapeCompiler`).
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager as ContextManager
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.errors import Error
from kiln.ir.expr import Expr
from kiln.ir.module import IRModule
from kiln.runtime.backend import lower, specialize_kernel
from kiln.runtime.compiler import KernelSet, check_target, resolve_target
from kiln.runtime.executor import Executor, choose_executor
from kiln.runtime.inputs import bind_arguments, fresh_outputs, quick_bind, static_signature
from kiln.runtime.kernel import KernelFunction
from kiln.runtime.named_io import (
    ValueInfo,
    declared_names,
    input_infos,
    order_feed,
    output_infos,
    select_outputs,
)
from kiln.ssa.ir import KernelDecl, Program
from kiln.ssa.memory import MemoryPlan
from kiln.target import Target
from kiln.transform.pass_manager import PassContext, PassInfo, PassInstrument

if TYPE_CHECKING:
    from kiln.runtime.profile import Profile


@dataclass(frozen=True)
class ExecutableStats:
    """What building (or loading) made, and what it cost."""

    kernels: int  # compiled kernels (static shapes)
    dynamic_kernels: int  # kernels of symbolic shape, compiled per shape when first run
    specializations: int  # of those, compiled so far
    functions: int
    arena_bytes: int  # memory the planner gives the frames' arenas, all functions together
    intermediate_bytes: int  # the planned tensors added up: what they would take unshared
    heap_bytes: int  # tensors that leave their frame and get their own memory
    constant_bytes: int
    optimize_seconds: float
    lower_seconds: float  # SSA, memory planning and loop IR
    compile_seconds: float  # kernels to machine code (or evaluator)
    load_seconds: float  # reading a saved executable (0 when built)
    cache_hits: int
    backend: str  # "native" or "evaluator"
    executor: str
    # kernels of symbolic shape compiled at run time: once for every size (symbolic), or
    # for one concrete shape (GEMM-like ones, and those whose lowering needs constants)
    symbolic_compiles: int = 0
    shape_compiles: int = 0

    def __str__(self) -> str:
        ratio = (f" ({self.arena_bytes / self.intermediate_bytes:.1%})"
                 if self.intermediate_bytes else "")
        lines = [
            f"kernels           {self.kernels} compiled ({self.backend}), "
            f"{self.dynamic_kernels} of symbolic shape ({self.specializations} specialized: "
            f"{self.symbolic_compiles} compiled for every size, {self.shape_compiles} for "
            "one shape)",
            f"functions         {self.functions}, run by the {self.executor} executor",
            f"arena             {self.arena_bytes} bytes for {self.intermediate_bytes} bytes of "
            f"intermediates{ratio}; {self.heap_bytes} bytes allocated per result",
            f"constants         {self.constant_bytes} bytes",
        ]
        if self.load_seconds:
            lines.append(f"load              {self.load_seconds:.3f} s")
        else:
            lines.append(f"optimize          {self.optimize_seconds:.3f} s")
            lines.append(f"lower             {self.lower_seconds:.3f} s")
            lines.append(f"compile           {self.compile_seconds:.3f} s "
                         f"({self.cache_hits} cache hits)")
        return "\n".join(lines)


SYMBOLIC_KERNELS = "KILN_SYMBOLIC_KERNELS"


class ShapeCompiler:
    """What the VM asks for a kernel of symbolic shape at concrete input shapes.

    A kernel that can be (kiln/runtime/backend.py, `symbolic_kernel`: elementwise and
    injective groups, reductions, softmax, layer norm, copies) is compiled once per
    `size_pattern` with its sizes as run-time arguments, and each new shape gets a
    `BoundKernel` of it (no compilation); the others (GEMM, convolution, batch matmul, or a
    lowering that depends on the sizes) are compiled per concrete shape. The VM keeps what
    it gets in its bounded LRU cache (``KILN_MAX_SPECIALIZATIONS``); this keeps the symbolic
    kernels, as many at most. ``symbolic_compiles`` and ``shape_compiles`` count the kernels
    compiled each way (cache misses), ``bound`` the shapes served by a symbolic kernel.
    """

    def __init__(self, target: Target | str, opt_level: int) -> None:
        from kiln.runtime.vm import max_specializations

        self.target, self.opt_level = target, opt_level
        self.symbolic_compiles = 0
        self.shape_compiles = 0
        self.bound = 0
        self._generic: OrderedDict[tuple[str, Any], KernelFunction] = OrderedDict()
        self._failed: set[tuple[str, Any]] = set()  # (kernel, size pattern): per shape
        self._limit = max_specializations()
        self._lock = threading.Lock()
        # KILN_SYMBOLIC_KERNELS=0: every kernel specialized per shape (for comparisons)
        self.enabled = os.environ.get(SYMBOLIC_KERNELS, "1").strip() != "0"

    def __call__(self, decl: KernelDecl, shapes: tuple[tuple[int, ...], ...]) -> KernelFunction:
        from kiln.runtime.symbolic import BoundKernel

        generic: KernelFunction | None = None
        if self.enabled and resolve_target(self.target) is not None:  # not the evaluator
            with self._lock:
                generic = self._symbolic(decl, shapes)
        if generic is None:
            self.shape_compiles += 1
            return specialize_kernel(decl, shapes, self.target, self.opt_level)
        self.bound += 1
        dims = "_".join("x".join(str(d) for d in s) for s in shapes)
        return BoundKernel(generic, _dims_of(generic, shapes), f"{decl.name}__{dims}")


    def _symbolic(self, decl: KernelDecl,
                  shapes: tuple[tuple[int, ...], ...]) -> KernelFunction | None:
        """A symbolic kernel of ``decl`` that fits ``shapes``: one compiled already, else a
        new one (sizes told apart by position first, then by value), else None."""
        from kiln.runtime.backend import fits, output_sizes, size_pattern, symbolic_kernel

        hit = next((key for key in self._generic
                    if key[0] == decl.name and fits(key[1], shapes)), None)
        if hit is not None:
            self._generic.move_to_end(hit)
            return self._generic[hit]
        by_value = size_pattern(decl, shapes)
        if (decl.name, by_value) in self._failed:
            return None
        # the sizes told apart by position, then by value, then with those equal to a
        # static size of the results kept (a reshape's, which stand-ins would not type)
        fixed = size_pattern(decl, shapes, fixed=output_sizes(decl))
        for pattern in dict.fromkeys((size_pattern(decl, shapes, distinct=True), by_value,
                                      fixed)):
            fn = symbolic_kernel(decl, pattern, self.target, self.opt_level)
            if fn is not None:
                self.symbolic_compiles += 1
                self._generic[(decl.name, pattern)] = fn
                while len(self._generic) > self._limit:
                    self._generic.popitem(last=False)
                return fn
        self._failed.add((decl.name, by_value))
        return None


def _dims_of(generic: KernelFunction, shapes: tuple[tuple[int, ...], ...]) -> tuple[int, ...]:
    """The values of a symbolic kernel's dims at input ``shapes``."""
    from kiln.loops.ir import Var as LVar

    k = generic.kernel
    value: dict[int, int] = {}
    for b, shape in zip(k.inputs, shapes):
        for d, n in zip(b.shape, shape):
            if isinstance(d, LVar):
                value.setdefault(id(d), int(n))
    if any(id(d) not in value for d in k.dims):
        raise Error(f"kernel {k.name}: its inputs do not give every size it takes")
    return tuple(value[id(d)] for d in k.dims)


def make_specializer(target: Target | str, opt_level: int) -> ShapeCompiler:
    """Compiles a kernel of symbolic shape for concrete input shapes (`ShapeCompiler`)."""
    return ShapeCompiler(target, opt_level)


class Executable:
    """A compiled program: call it like a function of @main's parameters, or run it on
    inputs by name (`run`, `run_named`) as an ONNX Runtime session."""

    def __init__(self, program: Program, kernels: KernelSet, plan: MemoryPlan, *,
                 target: Target | str = "llvm", opt_level: int = 3,
                 timings: Mapping[str, float] = {}, executor: str | None = None,
                 threads: int | None = None, input_names: Mapping[str, str] | None = None,
                 output_names: Sequence[str] | None = None) -> None:
        self._threads: int | None = None
        self.set_threads(threads)
        self.program = program
        self.kernels = kernels
        self.plan = plan
        self.target = target
        self.opt_level = opt_level
        self._timings = dict(timings)
        # where the machine code came from: "built" here, or by kiln.load "file" (the
        # file's own, its seal trusted), "rebuilt" (made again from its loop IR) or
        # "evaluator" (none: the loop IR is evaluated)
        self.code_source = "built"
        main = program.main
        self._names = [p.hint for p in main.params]
        self._types = [p.type for p in main.params]
        self._signature = static_signature(self._types)
        # The user's names (`input_names`: parameter name -> name; `output_names`: one for
        # the result, or one per field of its tuple); defaults where there are none.
        self._inputs = input_infos(list(zip(self._names, self._types)), input_names or {})
        self._outputs, self._whole_result = output_infos(main.ret_type, output_names)
        self._param_of = {i.name: n for i, n in zip(self._inputs, self._names)}
        # kernels of symbolic shape, compiled as the VM meets their shapes
        self.shape_compiler = make_specializer(target, opt_level)
        self.executor: Executor = choose_executor(program, kernels, self.shape_compiler,
                                                  executor)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run @main: arrays (or tuples, ADT values, ...) in, results out.

        Arguments are checked against @main's parameter types first; one result comes back
        as an array, a tuple as a Python tuple, an ADT value as a `kiln.ConstructorValue`.
        """
        values = None
        if self._signature is not None and not kwargs:
            values = quick_bind(self._signature, args)
        if values is None:
            values = bind_arguments(self._names, self._types, self.program.entry, args,
                                    self._by_parameter(kwargs), self.program)
        return self._execute(values)

    def _execute(self, values: list[Any]) -> Any:
        if self._threads is None:
            return fresh_outputs(self.executor.run(values))
        from kiln.codegen.threads import run_threads

        with run_threads(self._threads):
            return fresh_outputs(self.executor.run(values))

    def _by_parameter(self, kwargs: Mapping[str, Any]) -> Mapping[str, Any]:
        """Keyword arguments with inputs given by their names (``input.1``) renamed to the
        parameters' (``input_1``)."""
        if all(k in self._names or k not in self._param_of for k in kwargs):
            return kwargs
        out: dict[str, Any] = {}
        for key, value in kwargs.items():
            param = key if key in self._names else self._param_of.get(key, key)
            if param in out:
                raise Error(f"input {key!r} is given twice (as {key!r} and as %{param})")
            out[param] = value
        return out

    @property
    def inputs(self) -> list[ValueInfo]:
        """The inputs in order: name, shape and dtype of each (ONNX Runtime's
        ``session.get_inputs()``)."""
        return list(self._inputs)

    @property
    def outputs(self) -> list[ValueInfo]:
        """The outputs in order (ONNX Runtime's ``session.get_outputs()``)."""
        return list(self._outputs)

    def run(self, output_names: Sequence[str] | Mapping[str, Any] | None = None,
            input_feed: Mapping[str, Any] | None = None) -> list[Any]:
        """Run on inputs by name, as ONNX Runtime's ``session.run(output_names, input_feed)``:
        the outputs named in ``output_names`` (None: all of them), as a list in that order.
        ``exe.run(feed)`` is ``exe.run(None, feed)``."""
        if input_feed is None and isinstance(output_names, Mapping):
            output_names, input_feed = None, output_names
        if isinstance(output_names, Mapping):
            raise Error("exe.run takes the output names first, then the inputs: "
                        "exe.run(None, {name: value})")
        picked = select_outputs(output_names, self._outputs)
        # (the inputs' names, not the parameters', in what a wrong value's error says)
        values = bind_arguments([i.name for i in self._inputs], self._types, self.program.entry,
                                order_feed(input_feed or {}, self._inputs), {}, self.program)
        results = self._split(self._execute(values))
        return [results[i] for i in picked]

    def run_named(self, input_feed: Mapping[str, Any],
                  output_names: Sequence[str] | None = None) -> dict[str, Any]:
        """Run on inputs by name; the outputs (those of ``output_names``, else all) by name."""
        picked = select_outputs(output_names, self._outputs)
        return dict(zip((self._outputs[i].name for i in picked),
                        self.run([self._outputs[i].name for i in picked], input_feed)))

    def named_outputs(self, result: Any) -> dict[str, Any]:
        """What a call (``exe(x)``) returned, by output name."""
        return dict(zip((o.name for o in self._outputs), self._split(result)))

    def _split(self, result: Any) -> list[Any]:
        return [result] if self._whole_result else list(result)

    @property
    def threads(self) -> int | None:
        """The threads a parallel loop of this executable may use; None: the process's
        count (``KILN_NUM_THREADS``, else every core; `kiln.codegen.set_num_threads`)."""
        return self._threads

    def set_threads(self, n: int | None) -> None:
        """Run this executable's parallel loops on at most ``n`` threads (1: serially;
        None: the process's count). Results do not depend on it. The count is applied
        for the length of each call: calls running at the same time from several Python
        threads share one count (the last one set), which changes how fast they run,
        never what they compute."""
        if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
            raise Error(f"the number of threads must be a positive integer or None, not {n!r}")
        self._threads = n

    @property
    def signature(self) -> str:
        from kiln.text.printer import type_text

        params = ", ".join(f"%{n}: {type_text(t)}" for n, t in zip(self._names, self._types))
        return f"@{self.program.entry}({params}) -> {type_text(self.program.main.ret_type)}"

    def stats(self) -> ExecutableStats:
        """Kernels, memory, and time spent building."""
        t = self._timings
        dynamic = sum(1 for k in self.program.kernels.values() if not k.is_static)
        return ExecutableStats(
            kernels=len(self.kernels.functions),
            dynamic_kernels=dynamic,
            specializations=int(getattr(self.executor, "specializations", 0)),
            functions=len(self.program.functions),
            arena_bytes=self.plan.arena_bytes,
            intermediate_bytes=self.plan.intermediate_bytes,
            heap_bytes=self.plan.heap_bytes,
            constant_bytes=sum(int(c.nbytes) for c in self.program.constants),
            optimize_seconds=t.get("optimize", 0.0),
            lower_seconds=t.get("lower", 0.0),
            compile_seconds=self.kernels.compile_seconds,
            load_seconds=t.get("load", 0.0),
            cache_hits=self.kernels.cache_hits,
            backend=self.kernels.backend,
            executor=getattr(self.executor, "name", type(self.executor).__name__),
            symbolic_compiles=self.shape_compiler.symbolic_compiles,
            shape_compiles=self.shape_compiler.shape_compiles,
        )

    def profile(self, *args: Any, repeat: int | None = None, **kwargs: Any) -> Profile:
        """Where the time of a call on these arguments goes: per kernel, its calls, time,
        share, FLOPs and GFLOP/s, fused operators and source location (kiln/runtime/profile.py).

        ``repeat`` profiled runs (default: about half a second's worth, 3 to 200), after one
        warm-up; `print` the result for a table, or read its ``rows``.
        """
        from kiln.runtime.profile import profile_executable

        if repeat is not None and (isinstance(repeat, bool) or not isinstance(repeat, int)
                                   or repeat < 1):
            raise Error(f"repeat must be a positive integer, got {repeat!r}")
        values = bind_arguments(self._names, self._types, self.program.entry, args,
                                self._by_parameter(kwargs), self.program)
        if self._threads is None:
            return profile_executable(self, values, repeat)
        from kiln.codegen.threads import run_threads

        with run_threads(self._threads):
            return profile_executable(self, values, repeat)

    def save(self, path: str | Path, *, key: bytes | None = None) -> None:
        """Write the executable to one file: `kiln.load` runs it without compiling. The
        file is sealed with ``key`` (32 bytes) or, by default, this user's local key
        (kiln/trust.py), which is what lets `kiln.load` use its machine code as it is."""
        from kiln.runtime.artifact import save

        save(self, path, key=key)

    def __repr__(self) -> str:
        return (f"<kiln.Executable {self.signature}: {len(self.kernels.functions)} kernels, "
                f"{self.kernels.backend}>")


def build(mod: IRModule | Expr, target: Target | str = "llvm", opt_level: int = 3,
          params: Mapping[str, Any] | None = None, *, executor: str | None = None,
          threads: int | None = None, tuning_log: str | Path | None = None) -> Executable:
    """Optimize, fuse, lower and compile ``mod`` (its ``@main``) into an `Executable`.

    ``params`` binds weights (parameters of @main by name) as constants first. ``target`` is
    a `kiln.Target` or a spec for one — ``"llvm"`` (this machine), ``"llvm -mcpu=znver3"``,
    ``"llvm -mattr=-avx512f"``, ``"aarch64-linux-gnu"`` (built here, run elsewhere: see
    ``kiln export``) — or ``"evaluator"`` (the loop-IR interpreter: exact and slow, for
    tests); schedules, micro-kernel tiles and vector widths follow the target. ``executor``
    picks one by name (``"vm"``) instead of the first that accepts the program; ``threads``
    caps the threads its parallel loops use (`Executable.set_threads`; the schedules come
    from the target's cores, so the machine code is the same for every count). The passes
    run in the current `PassContext`: its instruments, disabled passes and debug checks apply
    to the back end's passes too. ``tuning_log`` (default: the file ``KILN_TUNING_LOG``
    names, if set) is a log of `kiln.tune`: each kernel whose key it has an entry for on
    this Target is built with the best schedule found (kiln/tune/log.py).
    """
    if isinstance(mod, Expr):
        mod = IRModule.from_expr(mod)
    if not isinstance(mod, IRModule):
        raise Error(f"kiln.build takes an IRModule, not {type(mod).__name__}")
    input_names: dict[str, str] = {}
    output_names = None
    if "main" in mod:
        main = mod["main"]
        input_names, output_names = declared_names(main.attrs, [p.name_hint for p in main.params])
    check_target(target)
    if isinstance(opt_level, bool) or not isinstance(opt_level, int) or not 0 <= opt_level <= 4:
        raise Error(f"opt_level must be an integer from 0 to 4, got {opt_level!r}")
    machine = resolve_target(target)
    timing = _StepTiming()
    outer = PassContext.current()
    with PassContext(outer.opt_level, outer.required_pass, outer.disabled_pass, outer.config,
                     [*outer.instruments, timing], outer.debug), \
            _tuned(tuning_log, machine):
        low = lower(mod, target if machine is None else machine, opt_level, params)
    timings = {"optimize": timing.optimize, "lower": timing.backend}
    plan, kernels = low.plan, low.kernels
    if plan is None or kernels is None:
        what = "plan-memory" if plan is None else "compile"
        raise Error(f"kiln.build needs the {what} pass, which the PassContext disables")
    timings["lower"] -= kernels.compile_seconds
    return Executable(low.program, kernels, plan,
                      target=target if machine is None else machine, opt_level=opt_level,
                      timings=timings, executor=executor, threads=threads,
                      input_names=input_names, output_names=output_names)


def _tuned(tuning_log: str | Path | None, machine: Target | None) -> ContextManager[Any]:
    """The schedule overrides of the tuning log (``KILN_TUNING_LOG`` when none is given and
    no enclosing scope sets them, as `kiln.tune` does for its candidates)."""
    from kiln.loops.tunable import current_overrides, overrides_scope

    if tuning_log is None:
        env = os.environ.get("KILN_TUNING_LOG")
        if not env or current_overrides() is not None:
            return nullcontext()
        tuning_log = env
    if machine is None:  # the evaluator: its kernels are scheduled for this machine
        machine = Target.host()
    from kiln.tune.log import overrides_from_log

    return overrides_scope(overrides_from_log(tuning_log, machine))


class _StepTiming(PassInstrument):
    """Seconds spent in kiln.optimize and in the back end (the two outermost pipelines)."""

    def __init__(self) -> None:
        self.optimize = self.backend = 0.0
        self._start: dict[str, float] = {}

    def run_before_pass(self, mod: object, info: PassInfo) -> None:
        if info.name in ("optimize", "backend"):
            self._start[info.name] = time.perf_counter()

    def run_after_pass(self, mod: object, info: PassInfo) -> None:
        if info.name in self._start:
            setattr(self, info.name, time.perf_counter() - self._start.pop(info.name))
