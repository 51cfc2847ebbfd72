"""The back end: from the fused Level-1 module to compiled kernels, as named passes.

`kiln.build` runs two pipelines under one `PassContext`: Level 1's (`kiln.optimize`, ending
in fusion) and this one. Every step below is a registered pass, so the context's
instruments (timing, `DumpIR`), ``disabled_pass`` and debug checks (after each back-end pass
the SSA verifier, and the loop-IR bounds verifier on every lowered kernel) apply to it, and
`kiln build --list-passes` / ``--dump-after NAME`` see it:

    eta-expand, lambda-lift, infer-type   Level 1: a higher-order module made first order
                                          (skipped, as a group, for a first-order module)
    lower-to-ssa      Level 2  the SSA program: a function per global, a kernel per fused function
    lift-constants    Level 2  kernels' weights passed from the constant table; equal kernels merge
    plan-memory       Level 2  arena offsets for the tensors that stay inside their frame
    lower-kernels     Level 3  each static kernel's primitive function to loop IR, scheduled
                               for the Target
    decompose-math    Level 3  exp, log, tanh, erf ... become core loop-IR arithmetic, the
                               one approximation the evaluator and every code generator run
    compile           Level 3  loop IR to machine code for the Target (or the evaluator)

A back-end pass takes and gives a `Lowered`: the SSA program (whose `KernelDecl`s hold loop
IR once lowered), the memory plan, the compiled kernels, and what they are made for. Passes
never change their input: `plan-memory` annotates a copy of the program, `lower-kernels`
makes new declarations.

A kernel of symbolic shape is not lowered at build time: at run time the VM asks for the
shapes it meets, and gets `symbolic_kernel` (compiled once for every size of a pattern, its
sizes passed at run time; kiln/loops/generalize.py) or, for GEMM-like kernels and those
whose lowering needs constant sizes, `specialize_kernel`; both run the same Level-3 passes
(`KERNEL_PIPELINE`) on that one kernel.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from kiln.errors import Error, InternalError
from kiln.ir.module import IRModule
from kiln.loops.decompose_math import decompose_math, has_transcendentals
from kiln.loops.printer import kernel_text
from kiln.loops.schedule import target_scope
from kiln.loops.verify import verify as verify_kernel
from kiln.runtime.compiler import KernelSet, compile_kernels, resolve_target
from kiln.runtime.kernel import KernelFunction
from kiln.ssa.from_relay import is_first_order, lower_first_order
from kiln.ssa.ir import KernelDecl, Program
from kiln.ssa.kernels import lift_constants, lower_kernels, specialize_decl
from kiln.ssa.memory import MemoryPlan, plan_memory
from kiln.ssa.verify import problems
from kiln.target import Target
from kiln.transform.eta_expand import EtaExpand
from kiln.transform.pass_manager import (
    LoweredIR,
    Pass,
    PassContext,
    PassInfo,
    Sequential,
    get_pass,
    module_pass,
)


@dataclass(frozen=True, eq=False)
class Lowered(LoweredIR):
    """The program on its way to machine code: what every back-end pass takes and gives."""

    program: Program
    target: Target | str = "llvm"  # a kiln.Target, a spec for one, or "evaluator"
    opt_level: int = 3
    plan: MemoryPlan | None = None  # set by plan-memory
    kernels: KernelSet | None = None  # set by compile

    def verify(self, pass_name: str) -> None:
        found = problems(self.program)
        if found:
            raise InternalError(f"pass {pass_name} produced a malformed SSA program: {found[0]}")
        for decl in self.program.kernels.values():
            if decl.kernel is not None:
                try:
                    verify_kernel(decl.kernel)
                except InternalError as e:
                    raise InternalError(f"pass {pass_name} produced a kernel that fails the "
                                        f"loop-IR verifier: {e.message}") from None

    @property
    def machine(self) -> Target:
        """What kernels are scheduled for: the target (this machine for the evaluator)."""
        return resolve_target(self.target) or Target.host()

    def text(self) -> str:
        parts = [str(self.program).rstrip()]
        if self.plan is not None:
            parts.append(f"// {self.plan}")
        parts += [kernel_text(d.kernel) for d in self.program.kernels.values()
                  if d.kernel is not None]
        if self.kernels is not None:
            parts.append(f"// {len(self.kernels.functions)} kernels compiled "
                         f"({self.kernels.backend}, {self.kernels.cache_hits} cache hits)")
        return "\n\n".join(parts) + "\n"


def _lowered(x: Any, name: str) -> Lowered:
    if not isinstance(x, Lowered):
        raise Error(f"pass {name} works on the lowered program; it must run after lower-to-ssa")
    return x


# --- the passes -----------------------------------------------------------------------------


class ToFirstOrder(Sequential):
    """eta-expand (constructors as values become functions), lambda-lift (local functions
    become globals, closures stubs), infer-type — only for a module that needs it."""

    def __init__(self) -> None:
        super().__init__([EtaExpand(expand_constructor=True, expand_global_var=False),
                          get_pass("lambda-lift"), get_pass("infer-type")], name="to-first-order")

    def transform(self, mod: Any, ctx: PassContext) -> Any:
        if isinstance(mod, IRModule) and is_first_order(mod):
            return mod if mod.is_typed else ctx.run_pass(get_pass("infer-type"), mod)
        return super().transform(mod, ctx)


class LowerToSSA(Pass):
    """Lower the fused module to the SSA program: a function per global, a kernel per fusion.

    One SSA function per global function, one kernel declaration per distinct primitive
    function (its weights lifted into the program's constant table, kiln/ssa/kernels.py).
    """

    def __init__(self, target: Any = "llvm", opt_level: int = 3, entry: str = "main") -> None:
        self.info = PassInfo("lower-to-ssa", 0, doc=(LowerToSSA.__doc__ or "").strip(), level=2)
        self.target, self.opt_level, self.entry = target, opt_level, entry

    def transform(self, mod: Any, ctx: PassContext) -> Any:
        if not isinstance(mod, IRModule):
            raise Error("pass lower-to-ssa takes the functional IR (an IRModule)")
        return Lowered(lower_first_order(mod, self.entry), self.target, self.opt_level)


@module_pass("lift-constants", level=2)
def lift_constants_pass(x: Any, ctx: PassContext) -> Lowered:
    """Pass kernels their weights from the constant table; merge kernels that then agree.

    Kernels equal up to renaming once their weights are parameters share one declaration:
    ResNet's repeated blocks compile once, and no machine code holds a weight.
    """
    low = _lowered(x, "lift-constants")
    return replace(low, program=lift_constants(low.program))


@module_pass("plan-memory", level=2)
def plan_memory_pass(x: Any, ctx: PassContext) -> Lowered:
    """Give each frame one arena: tensors whose lifetimes do not overlap share memory."""
    low = _lowered(x, "plan-memory")
    program = low.program.copy()
    return replace(low, program=program, plan=plan_memory(program))


@module_pass("lower-kernels", level=3)
def lower_kernels_pass(x: Any, ctx: PassContext) -> Lowered:
    """Lower each kernel of static shape to loop IR, scheduled for the target."""
    low = _lowered(x, "lower-kernels")
    return replace(low, program=lower_kernels(low.program, low.machine))


@module_pass("decompose-math", level=3)
def decompose_math_pass(x: Any, ctx: PassContext) -> Lowered:
    """Rewrite exp, log, tanh, sigmoid, erf, sin and cos into core loop-IR arithmetic.

    The one approximation (kiln/loops/decompose_math.py) that the loop evaluator and every
    code generator then run, so tests on the evaluator check what the machine code computes.
    """
    low = _lowered(x, "decompose-math")
    kernels = dict(low.program.kernels)
    for name, decl in kernels.items():
        if decl.kernel is not None and has_transcendentals(decl.kernel):
            kernels[name] = replace(decl, kernel=decompose_math(decl.kernel))
    return replace(low, program=replace(low.program, kernels=kernels))


@module_pass("compile", level=3)
def compile_pass(x: Any, ctx: PassContext) -> Lowered:
    """Compile every lowered kernel to machine code for the target (cached on disk).

    The "evaluator" target runs the loop IR in the loop-IR interpreter instead.
    """
    low = _lowered(x, "compile")
    loops = [d.kernel for d in low.program.kernels.values() if d.kernel is not None]
    return replace(low, kernels=compile_kernels(loops, low.target, low.opt_level))


# --- the pipelines --------------------------------------------------------------------------

# After kiln.optimize; each name is a registered pass (to-first-order is a group of three).
BACKEND_PIPELINE = ("to-first-order", "lower-to-ssa", "lift-constants", "plan-memory",
                    "lower-kernels", "decompose-math", "compile")
# What a kernel of symbolic shape runs, for each concrete shape, once specialized.
KERNEL_PIPELINE = ("lower-kernels", "decompose-math", "compile")


def backend_pipeline(target: Target | str = "llvm", opt_level: int = 3,
                     upto: str | None = None) -> Sequential:
    """The back-end passes, in order, making code for ``target`` (stopping after ``upto``)."""
    passes: list[Pass] = []
    for name in BACKEND_PIPELINE:
        passes.append(LowerToSSA(target, opt_level) if name == "lower-to-ssa" else get_pass(name))
        if name == upto:
            break
    else:
        if upto is not None:
            raise Error(f"{upto!r} is not a back-end pass ({', '.join(BACKEND_PIPELINE)})")
    return Sequential(passes, name="backend")


def lower(mod: IRModule, target: Target | str = "llvm", opt_level: int = 3,
          params: Mapping[str, Any] | None = None, upto: str | None = None) -> Lowered:
    """``mod`` through `kiln.optimize` and the back end (up to pass ``upto``), in the current
    `PassContext`, every kernel scheduled for ``target``: what `kiln.build` compiles."""
    from kiln.transform.pipeline import optimize

    with target_scope(resolve_target(target) or Target.host()):
        optimized = optimize(mod, opt_level=opt_level, params=params)
        low = PassContext.current().run_pass(backend_pipeline(target, opt_level, upto),
                                             optimized)
    if not isinstance(low, Lowered):
        raise Error("kiln.build needs the lower-to-ssa pass, which the PassContext disables")
    return low


def pipeline_steps() -> list[tuple[str, int, str]]:
    """Every pass `kiln.build` runs, in order: (name, IR level, first doc line)."""
    from kiln.transform.pipeline import standard_pipeline

    def doc(p: Pass) -> str:
        return p.info.doc.splitlines()[0] if p.info.doc else ""

    out = []
    for p in [*standard_pipeline().passes, *backend_pipeline().passes]:
        inner = p.passes if isinstance(p, ToFirstOrder) else [p]
        out += [(q.info.name, q.info.level, doc(q)) for q in inner]
    return out


def specialize_kernel(decl: KernelDecl, shapes: tuple[tuple[int, ...], ...],
                      target: Target | str, opt_level: int) -> KernelFunction:
    """A kernel of symbolic shape made for concrete input ``shapes`` by the Level-3 passes."""
    concrete = specialize_decl(decl, shapes)
    low = Lowered(Program(kernels={concrete.name: concrete}), target, opt_level)
    ctx = PassContext.current()
    for name in KERNEL_PIPELINE:
        low = ctx.run_pass(get_pass(name), low)
    if low.kernels is None:
        raise Error(f"kernel @{decl.name} has symbolic shapes, and compiling it needs the "
                    "compile pass, which the PassContext disables")
    return low.kernels.functions[concrete.name]


# Operators whose kernels are specialized per concrete shape, never made symbolic: their
# tiling (GEMM micro-kernels, convolution blocking) needs constant extents.
SPECIALIZED_OPS = ("dense", "matmul", "conv", "attention")

SizePattern = tuple[tuple[int | str, ...], ...]


def size_pattern(decl: KernelDecl, shapes: tuple[tuple[int, ...], ...],
                 distinct: bool = False, fixed: frozenset[int] = frozenset()) -> SizePattern:
    """What a symbolic kernel compiled for ``shapes`` depends on: each symbolic dimension of
    the inputs given as 0 or 1 (broadcasting and empty tensors lower differently), else as
    the name of a size (``s0``, ``s1``, ...): one per class of equal sizes, or with
    ``distinct`` one per position (a kernel whose types allow it then serves shapes where
    those sizes differ too). Sizes in ``fixed`` are given as themselves too."""
    classes: dict[object, str] = {}
    out = []
    for i, (ty, shape) in enumerate(zip(decl.inputs, shapes)):
        row: list[int | str] = []
        for j, (d, n) in enumerate(zip(ty.shape, shape)):
            if isinstance(d, int) or n in (0, 1) or n in fixed:
                row.append(int(n))
            else:
                key = (i, j) if distinct else int(n)
                row.append(classes.setdefault(key, f"s{len(classes)}"))
        out.append(tuple(row))
    return tuple(out)


def output_sizes(decl: KernelDecl) -> frozenset[int]:
    """The static sizes of ``decl``'s results and the products of those of each result: an
    input size equal to one may be fixed by the computation (a reshape of ``(?, ?, ?)`` to
    ``(?, ?, 2, 16)`` types only where the input's last size is 32), which stand-in sizes
    would not type."""
    out: set[int] = set()
    for t in decl.outputs:
        sizes: set[int] = set()
        for d in t.shape:
            if isinstance(d, int) and d > 1:
                sizes |= {d} | {d * p for p in sizes}
        out |= sizes
    return frozenset(out)


def fits(pattern: SizePattern, shapes: tuple[tuple[int, ...], ...]) -> bool:
    """Whether a symbolic kernel compiled for ``pattern`` computes the kernel at ``shapes``:
    its 0s and 1s where they are, every size named alike equal and neither 0 nor 1."""
    seen: dict[str, int] = {}
    for row, shape in zip(pattern, shapes):
        if len(row) != len(shape):
            return False
        for x, n in zip(row, shape):
            if isinstance(x, int):
                if x != n:
                    return False
            elif n in (0, 1) or seen.setdefault(x, n) != n:
                return False
    return True


def symbolic_kernel(decl: KernelDecl, pattern: SizePattern, target: Target | str,
                    opt_level: int) -> KernelFunction | None:
    """``decl`` compiled once for every shape of ``pattern`` (`size_pattern`), its symbolic
    sizes passed at run time (kiln/loops/generalize.py); None where it must be specialized
    per shape instead: a GEMM-like operator (`SPECIALIZED_OPS`), or a lowering that depends
    on the sizes other than through loop extents and buffer shapes."""
    from kiln.loops.collapse import axes_kept
    from kiln.loops.generalize import STAND_INS_A, STAND_INS_B, generalize
    from kiln.loops.ir import Var as LVar

    if any(w in op for op in decl.ops for w in SPECIALIZED_OPS):
        return None
    names = sorted({x for row in pattern for x in row if isinstance(x, str)})
    if not names or len(names) > len(STAND_INS_A):
        return None
    index = {n: k for k, n in enumerate(names)}
    lowered = []
    for stand_ins in (STAND_INS_A, STAND_INS_B):
        shapes = tuple(tuple(stand_ins[index[x]] if isinstance(x, str) else x for x in row)
                       for row in pattern)
        try:
            concrete = specialize_decl(decl, shapes)
        except Error:
            return None  # the stand-in sizes do not type (a size fixed by the computation)
        low = Lowered(Program(kernels={concrete.name: concrete}), target, opt_level)
        ctx = PassContext.current()
        with axes_kept():  # loop extents that are sizes, not products of them
            for name in KERNEL_PIPELINE[:-1]:
                low = ctx.run_pass(get_pass(name), low)
        k = low.program.kernels[concrete.name].kernel
        if k is None:
            return None
        lowered.append(k)
    dims = {(STAND_INS_A[k], STAND_INS_B[k]): LVar(n) for k, n in enumerate(names)}
    label = "_".join("x".join(str(x) for x in row) for row in pattern)
    generic = generalize(lowered[0], lowered[1], dims, f"{decl.name}__sym_{label}")
    if generic is None:
        return None
    decl_generic = replace(decl, name=generic.name, func=None, kernel=generic)
    low = PassContext.current().run_pass(
        get_pass(KERNEL_PIPELINE[-1]),
        Lowered(Program(kernels={generic.name: decl_generic}), target, opt_level))
    if low.kernels is None:
        raise Error(f"kernel @{decl.name} has symbolic shapes, and compiling it needs the "
                    "compile pass, which the PassContext disables")
    return low.kernels.functions[generic.name]


def _register() -> None:
    from kiln.transform.pass_manager import register_pass

    register_pass("to-first-order", ToFirstOrder)
    register_pass("lower-to-ssa", LowerToSSA)


_register()
