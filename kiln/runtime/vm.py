"""The VM: runs an SSA program in Python, calling compiled kernels for all tensor work.

It runs everything the language has — ADTs, closures, references, recursion of any depth,
symbolic shapes — which is what the whole-program native executor leaves to it. Each SSA
function is first turned into a compact form: every value gets a register index, and each
instruction becomes a small Python closure over those indices (a `call` or
`invoke_closure` stays data, since it switches frames). Frames live on an explicit stack, so
recursion is bounded by memory rather than Python's stack; a call whose result the next
statement returns is a tail call and replaces its frame, so tail recursion runs in constant
space even across functions (``@is_even``/``@is_odd``). The kernels of a straight stretch of
a block, with only reference moves between them, run as one native call (a chain:
kiln/runtime/chains.py).

Values: numpy arrays (tensors), Python tuples, `kiln.ConstructorValue`, `kiln.RefValue` and
`VMClosure`. A frame allocates its function's arena once, and each planned ``alloc`` is a view
into it; the planner guarantees that those views never leave the frame. A `kernel_dyn`
(symbolic shapes) is specialized to the concrete input shapes on first use and cached.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from kiln.errors import Error, EvalError, InternalError
from kiln.eval.values import ConstructorValue, RefValue
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.runtime.aligned import frozen_constant
from kiln.runtime.chains import chain_end, chain_step
from kiln.runtime.chains import users as chain_users
from kiln.runtime.host_ops import host_step
from kiln.runtime.kernel import KernelFunction
from kiln.runtime.pointers import DATA_OFFSET, data_pointer
from kiln.runtime.symbolic import BoundKernel
from kiln.ssa.ir import Function, Instr, KernelDecl, Program, Value
from kiln.ssa.memory import check_alloc, check_frame

Specializer = Callable[[KernelDecl, tuple[tuple[int, ...], ...]], KernelFunction]


@dataclass(frozen=True, eq=False)
class VMClosure:
    """A function value of the VM: a global and the values it captured."""

    func: str
    captured: tuple[Any, ...]

    def __repr__(self) -> str:
        return f"<closure @{self.func}/{len(self.captured)} captured>"


_STEP, _CALL, _INVOKE = 0, 1, 2
_BR, _COND_BR, _SWITCH, _RET, _FAIL = range(5)


class _Block:
    __slots__ = ("params", "steps", "term")

    def __init__(self) -> None:
        self.params: list[int] = []
        self.steps: list[tuple[Any, ...]] = []
        self.term: tuple[Any, ...] = ()


class _Code:
    """One SSA function in the VM's form."""

    __slots__ = ("name", "nregs", "params", "blocks", "arena_bytes")

    def __init__(self, name: str) -> None:
        self.name = name
        self.nregs = 0
        self.params: list[int] = []
        self.blocks: list[_Block] = []
        self.arena_bytes = 0


# Arenas a VM keeps per function for its next frames once a frame has returned (a frame's
# views of its arena never leave it): a fresh arena is fresh memory, which the kernels fault
# in page by page at every call (a training step's 4-layer encoder: 214 ms a step in the VM
# against 112 in the native executor, most of it page faults)
SPARE_ARENAS = 2


class _Frame:
    __slots__ = ("code", "regs", "block", "ip", "dest", "arena", "base", "raw")

    def __init__(self, code: _Code, args: list[Any] | tuple[Any, ...],
                 spare: list[np.ndarray] | None = None) -> None:
        self.code = code
        regs: list[Any] = [None] * code.nregs
        for r, a in zip(code.params, args):
            regs[r] = a
        self.regs = regs
        self.block = 0
        self.ip = 0
        self.dest = -1  # the caller's register for our result
        self.arena: np.ndarray | None = None
        self.base = 0  # the arena's address (kernel chains take it)
        self.raw: np.ndarray | None = None  # the arena's allocation, to hand on when done
        if code.arena_bytes:
            raw = None
            if spare:
                try:
                    raw = spare.pop()
                except IndexError:  # another thread's frame took it
                    pass
            if raw is None:
                raw = np.empty(code.arena_bytes + 64, np.uint8)
            self.raw = raw
            start = data_pointer(raw)
            skip = (-start) % 64
            self.arena = raw[skip: skip + code.arena_bytes]
            self.base = start + skip


MAX_SPECIALIZATIONS = "KILN_MAX_SPECIALIZATIONS"


def max_specializations() -> int:
    """How many kernels of symbolic shape one VM keeps compiled for the concrete shapes it
    met (``KILN_MAX_SPECIALIZATIONS``, default 64): a new shape beyond that evicts the least
    recently used one, which is compiled again (from the disk cache) if its shape returns.
    Symbolic kernels bound to a shape (no code of their own) are kept as many, apart."""
    text = os.environ.get(MAX_SPECIALIZATIONS, "").strip()
    if not text:
        return 64
    try:
        n = int(text)
    except ValueError:
        n = 0
    if n < 1:
        raise Error(f"{MAX_SPECIALIZATIONS}={text!r}: want a positive number of kernels")
    return n


def _check_outputs(decl: KernelDecl, shapes: tuple[tuple[int, ...], ...],
                   f: KernelFunction) -> None:
    """Refuse results of a kernel of symbolic shape beyond the allocation limit."""
    inputs = ", ".join("(" + ", ".join(map(str, s)) + ")" for s in shapes)
    for i, b in enumerate(f.kernel.outputs):
        try:
            check_alloc(f"kernel @{decl.name} on inputs of shapes {inputs}", f"its output {i}",
                        b.shape, b.dtype)
        except Error as e:
            raise EvalError(e.message) from None


def _rebuild(t: Type, flat: list[np.ndarray]) -> Any:
    """The (nested) tuple of type ``t`` made of the flat arrays, in order."""
    if not isinstance(t, TupleType):
        return flat[0]
    it = iter(flat)
    stack: list[tuple[Type, bool]] = [(t, False)]
    made: list[Any] = []
    while stack:
        ty, ready = stack.pop()
        if isinstance(ty, TupleType):
            if ready:
                n = len(ty.fields)
                fields = tuple(made[len(made) - n:]) if n else ()
                del made[len(made) - n:]
                made.append(fields)
            else:
                stack.append((ty, True))
                stack.extend((f, False) for f in reversed(ty.fields))
        else:
            made.append(next(it))
    return made[0]


class VM:
    """Runs the functions of one SSA program."""

    def __init__(self, program: Program, kernels: dict[str, KernelFunction],
                 specialize: Specializer | None = None, *, checked: bool = False) -> None:
        self.program = program
        self.kernels = kernels
        self.specialize = specialize
        # kernels of symbolic shape for the shapes met, least recently used first: those
        # compiled for one shape, and symbolic kernels bound to one (`BoundKernel`: no code of
        # their own, so they do not take the places of compiled ones)
        self._dynamic: OrderedDict[tuple[str, tuple[tuple[int, ...], ...]], KernelFunction] = \
            OrderedDict()
        self._bound: OrderedDict[tuple[str, tuple[tuple[int, ...], ...]], KernelFunction] = \
            OrderedDict()
        self._max_dynamic = max_specializations()
        self.specialized = 0  # ever compiled (evicted ones included)
        # Kernels take registers unchecked unless the program reads references (a reference
        # passed in is shared state whose contents the boundary leaves as they are) or came
        # from a file whose seal does not count (``checked``: see kiln/runtime/artifact.py).
        self._checked = checked
        self._trusted = not checked and not any(
            ins.op == "ref_read" for fn in program.functions.values()
            for blk in fn.blocks for ins in blk.instrs)
        self._lock = threading.Lock()
        # per function, arenas of returned frames (`_frame`); list.pop and append are atomic,
        # so VM runs on several threads never share one
        self._spare: dict[str, list[np.ndarray]] = {}
        self.constants = [frozen_constant(c) for c in program.constants]  # aligned.py
        self.chained = 0  # kernel instructions run in chains (kiln/runtime/chains.py)
        self.codes: dict[str, _Code] = {}
        for name, fn in program.functions.items():
            self.codes[name] = self._compile(fn)

    # --- turning SSA into steps --------------------------------------------------------------

    def _compile(self, fn: Function) -> _Code:
        code = _Code(fn.name)
        reg: dict[Value, int] = {}

        def r(v: Value) -> int:
            i = reg.get(v)
            if i is None:
                i = reg[v] = len(reg)
            return i

        index = {b: i for i, b in enumerate(fn.blocks)}
        for b in fn.blocks:
            for p in b.params:
                r(p)
            for ins in b.instrs:
                r(ins)
        code.params = [r(p) for p in fn.params]
        check_frame(fn)  # sizes beyond the allocation limit are refused before any call
        code.arena_bytes = fn.arena_bytes
        users = chain_users(fn)
        for b in fn.blocks:
            blk = _Block()
            blk.params = [r(p) for p in b.params]
            t = b.terminator
            if t is None:
                raise InternalError(f"VM: block '{b.name} of @{fn.name} has no terminator")
            instrs = b.instrs
            k = 0
            while k < len(instrs):
                ins = instrs[k]
                end = self._chain_end(instrs, k)
                if end > k:  # a run with kernels to call in one native call
                    blk.steps.append((_STEP, self._chain(instrs[k:end], r, users)))
                    k = end
                    continue
                tail = (k == len(instrs) - 1 and t.op == "ret" and t.operands[0] is ins)
                k += 1
                args = [r(v) for v in ins.operands]
                if ins.op == "call":
                    blk.steps.append((_CALL, r(ins), ins.attrs["func"], args, tail))
                elif ins.op == "invoke_closure":
                    blk.steps.append((_INVOKE, r(ins), args[0], args[1:], tail))
                else:
                    blk.steps.append((_STEP, self._step(ins, r(ins), args)))
            match t.op:
                case "br":
                    tgt = t.targets[0]
                    blk.term = (_BR, index[tgt.block], [r(a) for a in tgt.args])
                case "cond_br":
                    yes, no = t.targets
                    blk.term = (_COND_BR, r(t.operands[0]), index[yes.block],
                                [r(a) for a in yes.args], index[no.block],
                                [r(a) for a in no.args])
                case "switch":
                    cases = {c: index[tgt.block] for c, tgt in zip(t.attrs["cases"], t.targets)}
                    default = index[t.targets[-1].block] if t.attrs.get("has_default") else -1
                    blk.term = (_SWITCH, r(t.operands[0]), cases, default)
                case "ret":
                    blk.term = (_RET, r(t.operands[0]))
                case "fail":
                    blk.term = (_FAIL, str(t.attrs.get("message", "")))
            code.blocks.append(blk)
        code.nregs = len(reg)
        return code

    def _chainable(self, ins: Instr) -> bool:
        """Whether kernel instruction ``ins`` can go in a chain (kiln/runtime/chains.py):
        machine code of fixed shapes, on the trusted path."""
        if not self._trusted:
            return False
        f = self.kernels.get(ins.attrs["kernel"])
        from kiln.codegen.library import CompiledKernel  # here: the VM runs without LLVM

        return isinstance(f, CompiledKernel) and not f.kernel.is_symbolic

    def _chain_end(self, instrs: list[Instr], start: int) -> int:
        if not self._trusted:
            return start
        return chain_end(instrs, start, self._chainable)

    def _chain(self, run: list[Instr], r: Callable[[Value], int],
               uses: dict[Value, list[Instr | None]]) -> Callable[[list[Any], _Frame], None]:
        self.chained += sum(ins.op == "kernel" for ins in run)
        return chain_step(run, self.kernels, self.constants, r, uses,
                          lambda ins: self._step(ins, r(ins), [r(v) for v in ins.operands]))

    def _step(self, ins: Instr, dest: int, args: list[int]) -> Callable[[list[Any], _Frame], None]:
        a = ins.attrs
        match ins.op:
            case "kernel":
                f = self.kernels.get(a["kernel"])
                if f is None:
                    raise InternalError(f"VM: kernel @{a['kernel']} was not compiled")
                from kiln.codegen.library import CompiledKernel

                if isinstance(f, CompiledKernel) and self._trusted:
                    # every register is right by construction (see _trusted): no check
                    entry, args_type = f.unchecked()
                    fail = f.fail
                    if DATA_OFFSET is None:
                        def step(regs: list[Any], fr: _Frame) -> None:
                            status = entry(args_type(*[data_pointer(regs[i]) for i in args]))
                            if status:
                                fail(status)
                        return step
                    # data_pointer inlined: an array's data pointer read from its object
                    at, off = ctypes.c_void_p.from_address, DATA_OFFSET

                    def step(regs: list[Any], fr: _Frame) -> None:
                        status = entry(args_type(*[at(id(regs[i]) + off).value for i in args]))
                        if status:
                            fail(status)
                    return step

                if self._checked:  # a program from a file kiln does not trust
                    name = a["kernel"]

                    def step(regs: list[Any], fr: _Frame) -> None:
                        try:
                            f(*[regs[i] for i in args])
                        except InternalError as e:  # its arguments are the file's fault
                            raise EvalError(f"the program passes kernel @{name} arguments it "
                                            f"does not take: {e.message}") from None
                    return step

                def step(regs: list[Any], fr: _Frame) -> None:
                    f(*[regs[i] for i in args])
                return step
            case "alloc":
                t = ins.type
                if not isinstance(t, TensorType):
                    raise InternalError(f"VM: alloc of a {t}")
                shape = t.static_shape
                dtype = np.dtype(t.dtype)
                offset = a.get("offset")
                if offset is None:
                    def step(regs: list[Any], fr: _Frame) -> None:
                        regs[dest] = np.empty(shape, dtype)
                    return step
                make = np.ndarray  # a view of the arena at the offset, in one call

                def step(regs: list[Any], fr: _Frame) -> None:
                    # An alloc with an offset is planned into its frame, which has an arena.
                    regs[dest] = make(shape, dtype, fr.arena, offset)
                return step
            case "const":
                value = self.constants[a["index"]]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = value
                return step
            case "kernel_dyn":
                decl = self.program.kernels[a["kernel"]]
                rtype = ins.type

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = self._run_dynamic(decl, rtype, [regs[i] for i in args])
                return step
            case "host":
                run = host_step(a["operator"], a["op_attrs"], ins.type)

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = run([regs[i] for i in args])
                return step
            case "tuple":
                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = tuple([regs[i] for i in args])
                return step
            case "get_field":
                src, i = args[0], a["index"]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = regs[src][i]
                return step
            case "view":  # the operand's array under the new shape, sharing its memory
                src, vshape = args[0], ins.type.static_shape  # type: ignore[attr-defined]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = regs[src].reshape(vshape)
                return step
            case "construct":
                ctor = self.program.constructors[a["ctor"]]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = ConstructorValue(ctor, tuple([regs[i] for i in args]))
                return step
            case "get_tag":
                tags = {c.name: np.asarray(self.program.tag_of(c.name), np.int32)
                        for c in self.program.constructors.values()}
                src = args[0]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = tags[regs[src].constructor.name]
                return step
            case "adt_field":
                src, i = args[0], a["index"]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = regs[src].fields[i]
                return step
            case "make_closure":
                func = a["func"]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = VMClosure(func, tuple([regs[i] for i in args]))
                return step
            case "ref_new":
                src = args[0]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = RefValue(regs[src])
                return step
            case "ref_read":
                src = args[0]

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[dest] = regs[src].value
                return step
            case "ref_write":
                ref, val = args

                def step(regs: list[Any], fr: _Frame) -> None:
                    regs[ref].value = regs[val]
                    regs[dest] = ()
                return step
        raise InternalError(f"VM: no rule for the instruction {ins.op}")

    def _run_dynamic(self, decl: KernelDecl, rtype: Type, inputs: list[Any]) -> Any:
        shapes = tuple(tuple(x.shape) for x in inputs)
        key = (decl.name, shapes)
        cache = self._dynamic
        f = cache.get(key)
        if f is None:
            cache = self._bound
            f = cache.get(key)
        if f is not None:
            try:
                cache.move_to_end(key)
            except KeyError:  # evicted by another thread meanwhile: f still runs
                pass
        else:
            if self.specialize is None:
                raise InternalError(f"VM: kernel @{decl.name} has symbolic shapes and no "
                                    "compiler to specialize it")
            with self._lock:
                f = self._dynamic.get(key)
                if f is None:
                    f = self._bound.get(key)
                if f is None:
                    f = self.specialize(decl, shapes)
                    _check_outputs(decl, shapes, f)
                    cache = self._bound if isinstance(f, BoundKernel) else self._dynamic
                    cache[key] = f
                    self.specialized += 1
                    while len(cache) > self._max_dynamic:
                        cache.popitem(last=False)
        outs = [np.empty(b.shape, b.dtype) for b in f.kernel.outputs]
        f(*inputs, *outs)
        return _rebuild(rtype, outs)

    @property
    def specializations(self) -> int:
        """How many kernels were compiled for concrete shapes at run time (at most
        `max_specializations` of them are kept)."""
        return self.specialized

    # --- running -------------------------------------------------------------------------------

    def run(self, name: str, args: list[Any] | tuple[Any, ...]) -> Any:
        """Call global function ``name`` on VM values."""
        code = self.codes.get(name)
        if code is None:
            raise InternalError(f"VM: no function @{name}")
        return self._loop(self._frame(code, args))

    def _frame(self, code: _Code, args: list[Any] | tuple[Any, ...]) -> _Frame:
        """A frame of ``code``, on an arena a returned frame left (`SPARE_ARENAS`) if any."""
        return _Frame(code, args, self._spare.get(code.name) if code.arena_bytes else None)

    def _done(self, frame: _Frame) -> None:
        """``frame`` has returned: its arena may serve the function's next frame."""
        if frame.raw is not None:
            spare = self._spare.setdefault(frame.code.name, [])
            if len(spare) < SPARE_ARENAS:
                spare.append(frame.raw)

    def call_closure(self, closure: VMClosure, args: list[Any]) -> Any:
        return self.run(closure.func, [*closure.captured, *args])

    def _loop(self, frame: _Frame) -> Any:
        codes = self.codes
        stack: list[_Frame] = []
        while True:
            block = frame.code.blocks[frame.block]
            regs = frame.regs
            steps = block.steps
            ip = frame.ip
            n = len(steps)
            switched = False
            while ip < n:
                s = steps[ip]
                ip += 1
                if s[0] == _STEP:
                    s[1](regs, frame)
                    continue
                if s[0] == _CALL:
                    _, dest, func, argr, tail = s
                    callee = codes[func]
                    args = [regs[i] for i in argr]
                else:
                    _, dest, cr, argr, tail = s
                    c = regs[cr]
                    if not isinstance(c, VMClosure):
                        raise InternalError(f"VM: invoking a {type(c).__name__}, not a closure")
                    callee = codes[c.func]
                    args = [*c.captured, *[regs[i] for i in argr]]
                new = self._frame(callee, args)
                if tail:
                    new.dest = frame.dest  # our caller receives the callee's result
                else:
                    frame.ip = ip
                    new.dest = dest
                    stack.append(frame)
                frame = new
                switched = True
                break
            if switched:
                continue
            t = block.term
            kind = t[0]
            if kind == _BR:
                _, target, argr = t
                vals = [regs[i] for i in argr]
                for p, v in zip(frame.code.blocks[target].params, vals):
                    regs[p] = v
                frame.block, frame.ip = target, 0
            elif kind == _COND_BR:
                _, c, yes, yes_args, no, no_args = t
                target, argr = (yes, yes_args) if regs[c] else (no, no_args)
                vals = [regs[i] for i in argr]
                for p, v in zip(frame.code.blocks[target].params, vals):
                    regs[p] = v
                frame.block, frame.ip = target, 0
            elif kind == _SWITCH:
                _, vr, cases, default = t
                v = regs[vr]
                target = cases.get(v.constructor.name, default)
                if target < 0:
                    raise InternalError(f"VM: switch in @{frame.code.name} has no case for "
                                        f"{v.constructor.name}")
                frame.block, frame.ip = target, 0
            elif kind == _RET:
                value = regs[t[1]]
                self._done(frame)
                if not stack:
                    return value
                dest = frame.dest
                frame = stack.pop()
                frame.regs[dest] = value
            else:
                raise EvalError(t[1])
