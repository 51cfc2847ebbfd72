"""Level 2: the SSA program — DLVM's functions of basic blocks, with a VM's runtime instructions.

A `Program` holds global `Function`s, the `KernelDecl`s they call (each a fused primitive
function of Level 1, lowered to one loop-IR kernel), a constant table (the weights), and the
ADTs whose values it builds. A function is a list of `Block`s, the first its entry; a block
has parameters (`BlockArg`s: DLVM's block arguments, which take the place of phi nodes), a
list of `Instr`s and one `Terminator`. Every instruction is a value of a Level-1 type (unit,
``()``, when it produces nothing useful).

Instructions are generic — an opcode, operands and attributes, as MLIR's operations are — and
`INSTRUCTIONS` says what each opcode means:

    %0 = const #3 : Tensor[(64), float32]          an entry of the constant table
    %1 = alloc : Tensor[(1, 64), float32] @arena+0  a tensor; the memory planner sets its offset
    kernel @fused_nn_dense_add(%x, %0) -> (%1)     run a kernel: inputs, then outputs to fill
    %2 = kernel_dyn @fused_add(%a, %b) : T         a kernel of symbolic shapes: the VM
                                                     specializes it and allocates its results
    %3 = tuple(%1, %2)    %4 = get_field %3, 0
    %5 = construct Cons(%h, %t) : List[int32]      %6 = get_tag %5    %7 = adt_field %5, Cons, 1
    %8 = make_closure @f(%captured...) : fn (...)  %9 = invoke_closure %8(%args...)
    %10 = call @g(%args...)
    %11 = ref_new %v   %12 = ref_read %11   %13 = ref_write %11, %v

Terminators: ``br 'bb(args)``, ``cond_br %c, 'then(args), 'else(args)`` (a scalar bool),
``switch %adt [Cons: 'bb1, Nil: 'bb2] default 'bb3`` (on the constructor), ``ret %v`` and
``fail "message"`` (a ``match?`` that no clause matched).

The program is built once (kiln/ssa/from_relay.py, or by hand in tests) and then annotated
in place: the memory planner sets each `alloc`'s offset and each function's arena size.
Values, blocks and instructions compare by identity.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from kiln.errors import InternalError
from kiln.ir.adt import Constructor
from kiln.ir.expr import Function as RelayFunction
from kiln.ir.ty import TensorType, TupleType, Type, TypeVar
from kiln.loops.ir import Kernel

UNIT = TupleType(())


class Value:
    """Something an instruction can use: a block argument or an instruction's result."""

    __slots__ = ("type", "hint")

    def __init__(self, type: Type, hint: str = "") -> None:  # noqa: A002 - DLVM's word
        self.type = type
        self.hint = hint


class BlockArg(Value):
    """A parameter of a block (the function's parameters are the entry block's)."""

    __slots__ = ("block",)

    def __init__(self, type: Type, hint: str = "", block: Block | None = None) -> None:  # noqa: A002
        super().__init__(type, hint)
        self.block = block

    def __repr__(self) -> str:
        return f"BlockArg(%{self.hint or '?'}: {self.type})"


@dataclass(frozen=True)
class InstrInfo:
    """What an opcode is: its attributes and whether it has effects the optimizer must keep."""

    attrs: tuple[str, ...]
    effect: bool = False
    doc: str = ""


INSTRUCTIONS: dict[str, InstrInfo] = {
    "const": InstrInfo(("index",), doc="an entry of the constant table"),
    "alloc": InstrInfo(("offset",), doc="a tensor of static shape; offset in the frame's arena "
                                        "(None: its own memory)"),
    "kernel": InstrInfo(("kernel", "num_inputs"), effect=True,
                        doc="run a kernel on inputs, filling the output operands"),
    "kernel_dyn": InstrInfo(("kernel",), doc="run a kernel of symbolic shapes; returns results"),
    "host": InstrInfo(("operator", "op_attrs"), doc="an operator whose result's shape is data, run "
                      "by the VM on the arrays (op_attrs: [name, value] pairs; kiln/op/dyn.py)"),
    "view": InstrInfo((), doc="the operand's tensor under another static shape of as many "
                      "elements (a reshape), in the same memory; attribute kernel: the copy "
                      "it stands for, run instead where the view would leave its frame"),
    "tuple": InstrInfo((), doc="a tuple of the operands"),
    "get_field": InstrInfo(("index",), doc="a field of a tuple"),
    "construct": InstrInfo(("ctor",), doc="an ADT value"),
    "get_tag": InstrInfo((), doc="the constructor index of an ADT value (int32)"),
    "adt_field": InstrInfo(("ctor", "index"), doc="a field of an ADT value built by ctor"),
    "make_closure": InstrInfo(("func",), doc="a closure of a global over captured values"),
    "invoke_closure": InstrInfo((), effect=True, doc="call a closure (operand 0) on arguments"),
    "call": InstrInfo(("func",), effect=True, doc="call a global function"),
    "ref_new": InstrInfo((), effect=True, doc="a new reference cell"),
    "ref_read": InstrInfo((), effect=True, doc="the value in a reference cell"),
    "ref_write": InstrInfo((), effect=True, doc="store into a reference cell; gives ()"),
}

TERMINATORS = frozenset(["br", "cond_br", "switch", "ret", "fail"])


class Instr(Value):
    """An instruction; the value it produces is the instruction itself."""

    __slots__ = ("op", "operands", "attrs", "block")

    def __init__(self, op: str, operands: Sequence[Value], type: Type = UNIT,  # noqa: A002
                 attrs: dict[str, Any] | None = None, hint: str = "") -> None:
        if op not in INSTRUCTIONS:
            raise InternalError(f"SSA: unknown instruction {op!r}")
        super().__init__(type, hint)
        self.op = op
        self.operands = list(operands)
        self.attrs = dict(attrs or {})
        self.block: Block | None = None

    def __repr__(self) -> str:
        return f"Instr({self.op}, {len(self.operands)} operands: {self.type})"


@dataclass(eq=False)
class Target:
    """A branch destination: a block and the values passed to its parameters."""

    block: Block
    args: list[Value] = field(default_factory=list)


class Terminator:
    """The last statement of a block: where control goes next."""

    __slots__ = ("op", "operands", "targets", "attrs", "block")

    def __init__(self, op: str, operands: Sequence[Value] = (),
                 targets: Sequence[Target] = (), attrs: dict[str, Any] | None = None) -> None:
        if op not in TERMINATORS:
            raise InternalError(f"SSA: unknown terminator {op!r}")
        self.op = op
        self.operands = list(operands)
        self.targets = list(targets)
        self.attrs = dict(attrs or {})
        self.block: Block | None = None

    def uses(self) -> Iterator[Value]:
        """Operands, then the arguments passed to each target."""
        yield from self.operands
        for t in self.targets:
            yield from t.args

    def __repr__(self) -> str:
        return f"Terminator({self.op})"


class Block:
    """A basic block: parameters, instructions, and one terminator."""

    __slots__ = ("name", "params", "instrs", "terminator")

    def __init__(self, name: str, params: Sequence[BlockArg] = ()) -> None:
        self.name = name
        self.params: list[BlockArg] = []
        self.instrs: list[Instr] = []
        self.terminator: Terminator | None = None
        for p in params:
            self.add_param(p)

    def add_param(self, p: BlockArg) -> BlockArg:
        p.block = self
        self.params.append(p)
        return p

    def append(self, instr: Instr) -> Instr:
        if self.terminator is not None:
            raise InternalError(f"SSA: block '{self.name} is already terminated")
        instr.block = self
        self.instrs.append(instr)
        return instr

    def terminate(self, term: Terminator) -> Terminator:
        if self.terminator is not None:
            raise InternalError(f"SSA: block '{self.name} is already terminated")
        term.block = self
        self.terminator = term
        return term

    @property
    def successors(self) -> list[Block]:
        return [t.block for t in self.terminator.targets] if self.terminator else []

    def __repr__(self) -> str:
        return f"Block('{self.name})"


class Function:
    """A global function of the SSA program: blocks, the first one its entry."""

    __slots__ = ("name", "ret_type", "blocks", "type_params", "arena_bytes", "_names")

    def __init__(self, name: str, params: Sequence[BlockArg], ret_type: Type,
                 type_params: Sequence[str] = ()) -> None:
        self.name = name
        self.ret_type = ret_type
        self.type_params = tuple(type_params)
        self.blocks: list[Block] = [Block("entry", params)]
        self.arena_bytes = 0  # set by the memory planner
        # block names taken, and the (count, last block) they were read at (see add_block)
        self._names: tuple[set[str], tuple[int, int]] = (set(), (0, 0))

    @property
    def entry(self) -> Block:
        return self.blocks[0]

    @property
    def params(self) -> list[BlockArg]:
        return self.entry.params

    def add_block(self, hint: str = "bb", params: Sequence[BlockArg] = ()) -> Block:
        names, seen = self._names
        if seen != (len(self.blocks), id(self.blocks[-1])):  # changed another way: read again
            names = {b.name for b in self.blocks}
        name, n = hint, len(self.blocks)
        while name in names:
            name = f"{hint}{n}"
            n += 1
        b = Block(name, params)
        self.blocks.append(b)
        names.add(name)
        self._names = (names, (len(self.blocks), id(b)))
        return b

    def instructions(self) -> Iterator[Instr]:
        for b in self.blocks:
            yield from b.instrs

    def __repr__(self) -> str:
        return f"Function(@{self.name}, {len(self.blocks)} blocks)"


@dataclass(frozen=True, eq=False)
class KernelDecl:
    """A kernel the program calls: a fused primitive function and, once lowered, its loop IR.

    ``inputs`` and ``outputs`` are the flattened tensor types of the kernel's buffers (tuple
    parameters are passed field by field, and the constants the function held are passed
    after its parameters). ``func`` is the typed primitive function (Level 1) with those
    constants made parameters. Once the `lower-kernels` pass has lowered it (every shape
    static), a new declaration holds its loop IR as ``kernel`` and no longer the function; a
    kernel of symbolic shape keeps its function, and is lowered by the same passes for each
    concrete shape it meets at run time (kiln/runtime/backend.py, `specialize_kernel`).
    ``location`` is where its work was written, for profiles and messages: ``file:line:col``
    of the first operator call of the fused function that has a source span (None when none
    has: an ONNX import, a program built in Python).
    """

    name: str
    inputs: tuple[TensorType, ...]
    outputs: tuple[TensorType, ...]
    func: RelayFunction | None = None
    kernel: Kernel | None = None
    ops: tuple[str, ...] = ()
    location: str | None = None

    @property
    def is_static(self) -> bool:
        return all(t.is_static for t in (*self.inputs, *self.outputs))


@dataclass(eq=False)
class Program:
    """Functions, kernels, constants and ADT constructors: what an executor runs."""

    functions: dict[str, Function] = field(default_factory=dict)
    kernels: dict[str, KernelDecl] = field(default_factory=dict)
    constants: list[np.ndarray] = field(default_factory=list)
    constructors: dict[str, Constructor] = field(default_factory=dict)
    entry: str = "main"
    # The type parameters of each ADT, in order (``List`` → ``(A,)``): a ``TypeCall``'s
    # arguments instantiate them in the constructors' field types.
    adt_params: dict[str, tuple[TypeVar, ...]] = field(default_factory=dict)

    def add_function(self, fn: Function) -> Function:
        if fn.name in self.functions:
            raise InternalError(f"SSA: function @{fn.name} is defined twice")
        self.functions[fn.name] = fn
        return fn

    def add_constant(self, data: np.ndarray) -> int:
        self.constants.append(data)
        return len(self.constants) - 1

    def copy(self) -> Program:
        """A program with fresh functions, blocks and instructions (the same kernels and
        constants), for a pass that annotates instructions: the input stays as it was."""
        out = Program(dict(), dict(self.kernels), list(self.constants),
                      dict(self.constructors), self.entry, dict(self.adt_params))
        for fn in self.functions.values():
            out.functions[fn.name] = _copy_function(fn)
        return out

    def adt_constructors(self, adt: str) -> list[Constructor]:
        """The constructors of an ADT, in their declaration order (their tags)."""
        return [c for c in self.constructors.values() if c.belong_to.name == adt]

    def tag_of(self, ctor: str) -> int:
        c = self.constructors[ctor]
        return self.adt_constructors(c.belong_to.name).index(c)

    @property
    def main(self) -> Function:
        return self.functions[self.entry]

    def __str__(self) -> str:
        from kiln.ssa.printer import program_text

        return program_text(self)


def _copy_function(fn: Function) -> Function:
    new: dict[Value, Value] = {}
    blocks: dict[Block, Block] = {}
    params = [BlockArg(p.type, p.hint) for p in fn.params]
    new.update(zip(fn.params, params))
    out = Function(fn.name, params, fn.ret_type, fn.type_params)
    out.arena_bytes = fn.arena_bytes
    out.blocks[0].name = fn.entry.name
    blocks[fn.entry] = out.blocks[0]
    for b in fn.blocks[1:]:
        nb = Block(b.name, [BlockArg(p.type, p.hint) for p in b.params])
        new.update(zip(b.params, nb.params))
        out.blocks.append(nb)
        blocks[b] = nb
    # Instructions first, operands after: a use may come before its definition in block order.
    for b in fn.blocks:
        for ins in b.instrs:
            new[ins] = blocks[b].append(Instr(ins.op, (), ins.type, ins.attrs, ins.hint))
    for b in fn.blocks:
        for ins in b.instrs:
            new[ins].operands = [new[v] for v in ins.operands]  # type: ignore[attr-defined]
        t = b.terminator
        if t is not None:
            blocks[b].terminate(Terminator(
                t.op, [new[v] for v in t.operands],
                [Target(blocks[x.block], [new[v] for v in x.args]) for x in t.targets], t.attrs))
    return out


def unit_type(t: Type) -> bool:
    return isinstance(t, TupleType) and not t.fields


def flatten_tensor_types(t: Type) -> list[TensorType] | None:
    """The tensors of a tensor or (nested) tuple of tensors, in order; None for other types."""
    out: list[TensorType] = []
    stack = [t]
    while stack:
        x = stack.pop()
        if isinstance(x, TupleType):
            stack.extend(reversed(x.fields))
        elif isinstance(x, TensorType):
            out.append(x)
        else:
            return None
    return out
