"""A static SSA program as one native entry point: LLVM IR that calls its kernels directly.

The whole-program native executor (kiln/runtime/native.py) runs an SSA program with one call
from Python: this module turns the program into an LLVM module whose entry function calls
every kernel, branch and loop itself. It takes *static* programs only — every value a
tensor of static shape or a tuple of them; instructions ``const``, ``alloc``, ``kernel``,
``tuple``, ``get_field`` and ``call``; terminators ``br``, ``cond_br`` and ``ret``; and a call
graph without cycles (self tail calls are already loops: ``br`` back to a loop header).
Anything else raises `NotStatic`, and the VM runs the program instead.

Calling convention of the entry (``i32 @<symbol>(ptr ctx, ptr ins, ptr outs, ptr stack)``):

- ``ctx``: a table of pointers, first the data of each constant, then the address of each
  kernel (``i32 k(ptr args)``, in the order of `ProgramCode.kernels`). Machine code holds
  neither addresses nor weights, so it is cached by content and saved as it is.
- ``ins``/``outs``: the data pointers of @main's arguments and of the result arrays the
  caller allocated (tuples flattened, in order).
- ``stack``: `ProgramCode.stack_bytes` of 64-byte-aligned scratch memory, private to the call
  (concurrent calls each pass their own).
- It returns 0, or ``(k + 1) << 16 | status`` when kernel k of the table failed with
  ``status`` (its `Check` messages stay in Python).

Memory. Each SSA function has a frame at a fixed place in the stack: its arena (the memory
plan's offsets, kiln/ssa/memory.py) first, then a slot for every tensor the planner left
unplanned (``alloc @heap``), for each parameter of a non-entry block, a staging copy of
those, and the results of each ``call``. A callee's frame lies after its caller's (the call
graph has no cycles, so the stack size is a constant). Tuples exist only at compile time:
a value is the list of its tensors' pointers. Branch arguments are copied into the target
block's parameter slots (through the staging slots when an argument is itself one of those
parameters); ``ret`` copies its value into the caller's result pointers. A kernel only ever
writes allocated slots, never an argument or a constant.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from itertools import count

from kiln.ir.ty import TensorType, Type
from kiln.ssa.analysis import reverse_post_order
from kiln.ssa.ir import Block, BlockArg, Function, Instr, Program, Value, flatten_tensor_types
from kiln.ssa.memory import tensor_bytes

ALIGN = 64
_PLACEHOLDER = "@__kiln_program_entry__"
_OPS = frozenset(["const", "alloc", "kernel", "tuple", "get_field", "view", "call"])
_TERMS = frozenset(["br", "cond_br", "ret"])
STATUS_SHIFT = 16


class NotStatic(Exception):
    """The program uses something the native entry point does not do (the VM runs it)."""


@dataclass
class ProgramCode:
    """A program's entry point as LLVM IR, and what calling it needs."""

    symbol: str
    text: str
    kernels: tuple[str, ...]  # the kernel table of ``ctx``, in order
    num_constants: int
    inputs: tuple[TensorType, ...]  # @main's parameters, flattened
    outputs: tuple[TensorType, ...]  # @main's result, flattened
    stack_bytes: int
    frames: dict[str, int] = field(default_factory=dict)  # frame bytes of each function
    call_sites: int = 0  # kernel and function calls in the code: its size, roughly
    # the entry point that writes results in place (see `emit_program`), or None
    direct_symbol: str | None = None
    direct_text: str | None = None


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def _leaves(t: Type, what: str) -> list[TensorType]:
    flat = flatten_tensor_types(t)
    if flat is None:
        raise NotStatic(f"{what} is not a tensor or a tuple of tensors")
    for x in flat:
        if not x.is_static:
            raise NotStatic(f"{what} has a symbolic shape")
    return flat


def _check_function(fn: Function) -> list[str]:
    """The functions ``fn`` calls; `NotStatic` if it is not static."""
    callees: list[str] = []
    for p in fn.params:
        _leaves(p.type, f"a parameter of @{fn.name}")
    _leaves(fn.ret_type, f"the result of @{fn.name}")
    for b in fn.blocks:
        for p in b.params:
            _leaves(p.type, f"a parameter of block '{b.name} of @{fn.name}")
        for ins in b.instrs:
            if ins.op not in _OPS:
                raise NotStatic(f"@{fn.name} uses {ins.op}")
            _leaves(ins.type, f"a value of @{fn.name}")
            if ins.op == "call":
                callees.append(ins.attrs["func"])
        t = b.terminator
        if t is None or t.op not in _TERMS:
            raise NotStatic(f"@{fn.name} ends a block with {t.op if t else 'nothing'}")
        if any(tgt.block is fn.entry for tgt in t.targets):
            raise NotStatic(f"@{fn.name} branches back to its entry block")
        if t.op == "cond_br":
            c = t.operands[0].type
            if not (isinstance(c, TensorType) and c.shape == () and c.dtype == "bool"):
                raise NotStatic(f"@{fn.name} branches on a value that is not a bool scalar")
    return callees


def _call_order(program: Program) -> list[str]:
    """The functions reachable from the entry, callees before callers; cycles: `NotStatic`."""
    callees: dict[str, list[str]] = {}
    order: list[str] = []
    state: dict[str, int] = {}  # 1: on the walk's path, 2: done
    stack: list[tuple[str, int]] = [(program.entry, 0)]
    while stack:
        name, i = stack.pop()
        if i == 0:
            if name not in program.functions:
                raise NotStatic(f"@{name} is not a function of the program")
            state[name] = 1
            callees[name] = _check_function(program.functions[name])
        if i < len(callees[name]):
            stack.append((name, i + 1))
            callee = callees[name][i]
            s = state.get(callee)
            if s == 1:
                raise NotStatic(f"@{name} calls @{callee} recursively (not a loop)")
            if s is None:
                stack.append((callee, 0))
        else:
            state[name] = 2
            order.append(name)
    return order


def _invariant_params(fn: Function) -> dict[BlockArg, Value]:
    """Block parameters that only ever receive one value from outside, or themselves (a
    loop's weights passed round and round): each stands for that value, with no slot and no
    copy. That value is defined before the loop, so nothing in the loop overwrites it."""
    incoming: dict[BlockArg, set[Value]] = {}
    for b in fn.blocks:
        if b.terminator is None:
            continue
        for tgt in b.terminator.targets:
            for p, a in zip(tgt.block.params, tgt.args):
                incoming.setdefault(p, set()).add(a)
    alias: dict[BlockArg, Value] = {}

    def resolve(v: Value) -> Value:
        while isinstance(v, BlockArg) and v in alias:
            v = alias[v]
        return v

    changed = True
    while changed:
        changed = False
        for p, values in incoming.items():
            if p in alias or p.block is fn.entry:
                continue
            others = {resolve(v) for v in values} - {p}
            if len(others) == 1:
                alias[p] = others.pop()
                changed = True
    return {p: resolve(p) for p in alias}


class _Layout:
    """Where a function's frame puts each slot."""

    def __init__(self, fn: Function) -> None:
        self.slots: dict[Value, list[int]] = {}  # heap allocs, block params, call results
        self.staging: dict[Block, list[int]] = {}
        self.alias = _invariant_params(fn)
        off = _aligned(fn.arena_bytes)

        def take(t: Type) -> list[int]:
            nonlocal off
            out = []
            for leaf in _leaves(t, "a slot"):
                out.append(off)
                off += _aligned(tensor_bytes(leaf))
            return out

        for b in fn.blocks:
            for ins in b.instrs:
                if (ins.op == "alloc" and ins.attrs.get("offset") is None) or ins.op == "call":
                    self.slots[ins] = take(ins.type)
            if b is not fn.entry and b.params:
                kept = [p for p in b.params if p not in self.alias]
                for p in kept:
                    self.slots[p] = take(p.type)
                self.staging[b] = [o for p in kept for o in take(p.type)]
        self.frame_bytes = off


class _FunctionEmitter:
    def __init__(self, program: Program, fn: Function, layout: _Layout,
                 kernel_index: dict[str, int], direct: dict[Value, int] | None = None) -> None:
        self.program = program
        self.fn = fn
        self.layout = layout
        self.kernel_index = kernel_index
        self.direct = direct or {}  # allocations that are result j itself (`emit_program`)
        self.outs: list[str] = []
        self.alloc_of: dict[str, Instr] = {}  # pointer -> the alloc it names
        self.returned: list[str] | None = None  # the pointers the (one) ret copies out
        self.rets = 0
        self.num_constants = len(program.constants)
        self.n = count()
        self.head: list[str] = []  # the LLVM entry block
        self.body: list[str] = []
        self.values: dict[Value, list[str]] = {}
        self.sizes: dict[str, int] = {}  # pointer -> bytes of its tensor
        self.writable: set[str] = set()
        self.param_slots: dict[Block, list[str]] = {}
        self.staging: dict[Block, list[str]] = {}
        self.max_kernel_args = 0
        self.call_sites = 0

    def tmp(self) -> str:
        return f"%t{next(self.n)}"

    def slot(self, offset: int, t: TensorType) -> str:
        name = self.tmp()
        self.head.append(f"  {name} = getelementptr inbounds i8, ptr %frame, i64 {offset}")
        self.sizes[name] = tensor_bytes(t)
        return name

    def copy(self, dst: str, src: str) -> None:
        n = self.sizes[dst]
        if dst != src and n:
            self.body.append(f"  call void @llvm.memcpy.p0.p0.i64(ptr {dst}, ptr {src}, "
                             f"i64 {n}, i1 false)")

    def emit(self) -> str:
        fn, lay = self.fn, self.layout
        args: list[str] = []
        for i, p in enumerate(fn.params):
            leaves = []
            for j, t in enumerate(_leaves(p.type, "a parameter")):
                name = f"%a{i}.{j}"
                self.sizes[name] = tensor_bytes(t)
                leaves.append(name)
            self.values[p] = leaves
            args += leaves
        outs = []
        for j, t in enumerate(_leaves(fn.ret_type, "a result")):
            name = f"%o{j}"
            self.sizes[name] = tensor_bytes(t)
            outs.append(name)
        self.outs = outs
        for b in fn.blocks:
            if b in lay.staging:
                ps: list[str] = []
                kept = [p for p in b.params if p not in lay.alias]
                for p in kept:
                    leaves = [self.slot(o, t) for o, t in zip(lay.slots[p], _leaves(p.type, ""))]
                    self.values[p] = leaves
                    ps += leaves
                self.param_slots[b] = ps
                types = [t for p in kept for t in _leaves(p.type, "")]
                self.staging[b] = [self.slot(o, t) for o, t in zip(lay.staging[b], types)]
        order = reverse_post_order(fn)
        labels = {b: f"b{i}" for i, b in enumerate(fn.blocks)}
        self.body.append(f"  br label %{labels[order[0]]}")
        for b in order:
            self.body.append(f"{labels[b]}:")
            for p in b.params:
                if p in lay.alias:  # its value is defined before the loop: seen already
                    self.values[p] = self.values[lay.alias[p]]
            for ins in b.instrs:
                self.instr(ins)
            self.terminator(b, labels, outs)
        params = ", ".join(["ptr noalias %ctx", "ptr %frame"] + [f"ptr {a}" for a in args + outs])
        head = [f'define internal i32 @"f.{fn.name}"({params}) {{', "entry:"]
        if self.max_kernel_args:
            head.append(f"  %kargs = alloca [{self.max_kernel_args} x ptr], align 8")
        return "\n".join(head + self.head + self.body + ["}"])

    def instr(self, ins: Instr) -> None:
        a = ins.attrs
        match ins.op:
            case "const":
                p, name = self.tmp(), self.tmp()
                self.head.append(f"  {p} = getelementptr ptr, ptr %ctx, i64 {a['index']}")
                self.head.append(f"  {name} = load ptr, ptr {p}, align 8")
                self.sizes[name] = tensor_bytes(ins.type)
                self.values[ins] = [name]
            case "alloc":
                offset = a.get("offset")
                t = ins.type
                assert isinstance(t, TensorType)
                if ins in self.direct:  # the caller's result array itself
                    name = self.outs[self.direct[ins]]
                else:
                    name = self.slot(offset if offset is not None else self.layout.slots[ins][0],
                                     t)
                self.values[ins] = [name]
                self.alloc_of[name] = ins
                self.writable.add(name)
            case "tuple":
                self.values[ins] = [x for v in ins.operands for x in self.values[v]]
            case "view":  # the operand's memory: its pointer, never written through
                self.values[ins] = list(self.values[ins.operands[0]])
            case "get_field":
                src = ins.operands[0]
                fields = src.type.fields  # type: ignore[attr-defined]
                i = a["index"]
                start = sum(len(_leaves(f, "")) for f in fields[:i])
                self.values[ins] = self.values[src][start: start + len(_leaves(fields[i], ""))]
            case "kernel":
                self.kernel(ins)
            case "call":
                self.call(ins)

    def kernel(self, ins: Instr) -> None:
        name = ins.attrs["kernel"]
        decl = self.program.kernels[name]
        ptrs = [x for v in ins.operands for x in self.values[v]]
        n_in = len(decl.inputs)
        if len(ptrs) != n_in + len(decl.outputs):
            raise NotStatic(f"kernel {name} is called with tuples it does not flatten to")
        for p in ptrs[n_in:]:
            if p not in self.writable:
                raise NotStatic(f"kernel {name} writes a value that is not an allocation")
        self.values[ins] = []
        self.call_sites += 1
        self.max_kernel_args = max(self.max_kernel_args, len(ptrs))
        k = self.kernel_index.setdefault(name, len(self.kernel_index))
        for j, p in enumerate(ptrs):
            slot = self.tmp()
            self.body.append(f"  {slot} = getelementptr [{len(ptrs)} x ptr], ptr %kargs, "
                             f"i64 0, i64 {j}")
            self.body.append(f"  store ptr {p}, ptr {slot}, align 8")
        fp, f, st = self.tmp(), self.tmp(), self.tmp()
        self.body.append(f"  {fp} = getelementptr ptr, ptr %ctx, i64 {self.num_constants + k}")
        self.body.append(f"  {f} = load ptr, ptr {fp}, align 8")
        self.body.append(f"  {st} = call i32 {f}(ptr %kargs)")
        self.check(st, k + 1)

    def check(self, status: str, site: int | None) -> None:
        bad, code = self.tmp(), self.tmp()
        i = next(self.n)
        self.body.append(f"  {bad} = icmp ne i32 {status}, 0")
        self.body.append(f"  br i1 {bad}, label %fail{i}, label %ok{i}, !prof !0")
        self.body.append(f"fail{i}:")
        if site is None:
            self.body.append(f"  ret i32 {status}")
        else:
            self.body.append(f"  {code} = or i32 {status}, {site << STATUS_SHIFT}")
            self.body.append(f"  ret i32 {code}")
        self.body.append(f"ok{i}:")

    def call(self, ins: Instr) -> None:
        callee = ins.attrs["func"]
        ptrs = [x for v in ins.operands for x in self.values[v]]
        t = ins.type
        outs = [self.slot(o, leaf) for o, leaf in zip(self.layout.slots[ins], _leaves(t, ""))]
        self.values[ins] = outs
        self.call_sites += 1
        frame = self.tmp()
        self.body.append(f"  {frame} = getelementptr inbounds i8, ptr %frame, i64 "
                         f"{self.layout.frame_bytes}")
        args = ", ".join(["ptr %ctx", f"ptr {frame}"] + [f"ptr {p}" for p in ptrs + outs])
        st = self.tmp()
        self.body.append(f'  {st} = call i32 @"f.{callee}"({args})')
        self.check(st, None)

    def branch_to(self, target: Block, args: list[Value], labels: dict[Block, str]) -> None:
        alias = self.layout.alias
        src = [x for p, v in zip(target.params, args) if p not in alias for x in self.values[v]]
        dst = self.param_slots.get(target, [])
        if len(src) != len(dst):
            raise NotStatic(f"a branch to '{target.name} passes tuples it does not flatten to")
        own = set(dst)
        if any(s in own and s != d for s, d in zip(src, dst)):
            stage = self.staging[target]
            for s, m in zip(src, stage):
                self.copy(m, s)
            src = stage
        for s, d in zip(src, dst):
            self.copy(d, s)
        self.body.append(f"  br label %{labels[target]}")

    def terminator(self, b: Block, labels: dict[Block, str], outs: list[str]) -> None:
        t = b.terminator
        assert t is not None
        match t.op:
            case "br":
                self.branch_to(t.targets[0].block, t.targets[0].args, labels)
            case "cond_br":
                c = self.values[t.operands[0]][0]
                byte, bit = self.tmp(), self.tmp()
                self.body.append(f"  {byte} = load i8, ptr {c}, align 1")
                self.body.append(f"  {bit} = icmp ne i8 {byte}, 0")
                edges = []
                for tgt in t.targets:
                    if tgt.args:
                        edges.append(f"e{next(self.n)}")
                    else:
                        edges.append(labels[tgt.block])
                self.body.append(f"  br i1 {bit}, label %{edges[0]}, label %{edges[1]}")
                for tgt, edge in zip(t.targets, edges):
                    if tgt.args:
                        self.body.append(f"{edge}:")
                        self.branch_to(tgt.block, tgt.args, labels)
            case "ret":
                self.rets += 1
                self.returned = list(self.values[t.operands[0]])
                for d, s in zip(outs, self.returned):
                    self.copy(d, s)
                self.body.append("  ret i32 0")


# Results at least this large (bytes, all together) get an entry point that writes them in
# place (`emit_program`); smaller ones cost less to copy than a second entry costs to build.
DIRECT_MIN_BYTES = 1 << 16


def emit_program(program: Program, triple: str = "", data_layout: str = "") -> ProgramCode:
    """The native entry point of ``program`` as LLVM IR; `NotStatic` when it has none.

    The entry copies @main's results into the caller's arrays at its ``ret``, after every
    kernel has read its inputs, so a result array may be one of the inputs (donation). Where
    results are large, a second entry (``direct_symbol``, its own module ``direct_text``)
    lets the kernels that make them write the caller's arrays directly instead — each
    result that is an allocation of @main returned in one place — saving the copy (4 MiB
    for a 1024² product); its caller must pass result arrays that overlap nothing.
    """
    order = _call_order(program)
    for decl in program.kernels.values():
        if not decl.is_static:
            raise NotStatic(f"kernel {decl.name} has symbolic shapes")
    layouts = {name: _Layout(program.functions[name]) for name in order}
    kernel_index: dict[str, int] = {}
    text, symbol, needs, sites, main_emitter = _module(program, order, layouts, kernel_index,
                                                       {}, triple, data_layout)
    if len(kernel_index) >= 1 << (31 - STATUS_SHIFT):
        raise NotStatic("the program has more kernels than the status code can name")
    main = program.main
    inputs = tuple(t for p in main.params for t in _leaves(p.type, "an argument"))
    outputs = tuple(_leaves(main.ret_type, "the result"))
    direct = _direct_results(main_emitter)
    direct_symbol = direct_text = None
    if sum(tensor_bytes(outputs[j]) for j in direct.values()) >= DIRECT_MIN_BYTES:
        direct_text, direct_symbol, _, _, _ = _module(program, order, layouts, kernel_index,
                                                      direct, triple, data_layout)
    return ProgramCode(symbol, text, tuple(kernel_index), len(program.constants), inputs,
                       outputs, needs[program.entry],
                       {n: layouts[n].frame_bytes for n in order}, sites,
                       direct_symbol, direct_text)


def _direct_results(main: _FunctionEmitter) -> dict[Value, int]:
    """The allocations of @main that can be its results' arrays: returned by its only
    ``ret``, each at one place."""
    if main.rets != 1 or main.returned is None:
        return {}
    out: dict[Value, int] = {}
    for j, p in enumerate(main.returned):
        ins = main.alloc_of.get(p)
        if ins is not None and main.returned.count(p) == 1:
            out[ins] = j
    return out


def _module(program: Program, order: list[str], layouts: dict[str, _Layout],
            kernel_index: dict[str, int], direct: dict[Value, int], triple: str,
            data_layout: str) -> tuple[str, str, dict[str, int], int, _FunctionEmitter]:
    """(LLVM text, entry symbol, stack bytes per function, call sites, @main's emitter) of
    one entry point; ``direct``: @main's allocations that are result arrays."""
    needs: dict[str, int] = {}
    texts = []
    sites = 0
    emitter = None
    for name in order:  # callees first
        fn = program.functions[name]
        lay = layouts[name]
        callees = {ins.attrs["func"] for ins in fn.instructions() if ins.op == "call"}
        needs[name] = lay.frame_bytes + max((needs[c] for c in callees), default=0)
        emitter = _FunctionEmitter(program, fn, lay, kernel_index,
                                   direct if name == program.entry else None)
        texts.append(emitter.emit())
        sites += emitter.call_sites
    assert emitter is not None  # the entry is last
    body = "\n\n".join(texts)
    main = program.main
    inputs = tuple(t for p in main.params for t in _leaves(p.type, "an argument"))
    outputs = tuple(_leaves(main.ret_type, "the result"))
    args = ", ".join(["ptr %ctx", "ptr %stack"]
                     + [f"ptr %i{j}" for j in range(len(inputs))]
                     + [f"ptr %r{j}" for j in range(len(outputs))])
    entry = [f"define i32 {_PLACEHOLDER}(ptr %ctx, ptr %ins, ptr %outs, ptr %stack) {{",
             "entry:"]
    for j in range(len(inputs)):
        entry.append(f"  %pi{j} = getelementptr ptr, ptr %ins, i64 {j}")
        entry.append(f"  %i{j} = load ptr, ptr %pi{j}, align 8")
    for j in range(len(outputs)):
        entry.append(f"  %pr{j} = getelementptr ptr, ptr %outs, i64 {j}")
        entry.append(f"  %r{j} = load ptr, ptr %pr{j}, align 8")
    entry += [f'  %s = call i32 @"f.{program.entry}"({args})', "  ret i32 %s", "}"]
    text = "\n".join([
        "declare void @llvm.memcpy.p0.p0.i64(ptr, ptr, i64, i1)",
        "", body, "", "\n".join(entry), "", "!0 = !{!\"branch_weights\", i32 1, i32 1048575}",
        ""])
    # The symbol names the program's code, not the machine it is compiled for (the target
    # is the cache key's and the saved library's business).
    symbol = "kiln_program_" + hashlib.sha256(text.encode()).hexdigest()[:24]
    text = text.replace(_PLACEHOLDER, "@" + symbol)
    header = []
    if triple:
        header.append(f'target triple = "{triple}"')
    if data_layout:
        header.append(f'target datalayout = "{data_layout}"')
    return "\n".join(header + [text]), symbol, needs, sites, emitter


__all__ = ["NotStatic", "ProgramCode", "emit_program"]
