"""Building SSA functions: an insertion point and one method per instruction.

    b = Builder(fn)                       # appends to fn's entry block
    s = b.emit("call", [x], ty, func="g")
    then, other = fn.add_block("then"), fn.add_block("else")
    b.cond_br(c, then, [], other, [])
    b.position(then)

Small simplifications happen as instructions are made, so that lowering can be direct:
``get_field`` of a ``tuple`` instruction is the field itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kiln.errors import InternalError
from kiln.ir.ty import TupleType, Type
from kiln.ssa.ir import UNIT, Block, Function, Instr, Target, Terminator, Value

SwitchCase = tuple[str, Block]  # a constructor's name and its block (Builder has a tuple method)

class Builder:
    """Appends instructions to a current block of one function."""

    def __init__(self, fn: Function, block: Block | None = None) -> None:
        self.fn = fn
        self.block = block if block is not None else fn.entry

    def position(self, block: Block) -> None:
        self.block = block

    @property
    def terminated(self) -> bool:
        return self.block.terminator is not None

    def emit(self, op: str, operands: Sequence[Value], type: Type = UNIT,  # noqa: A002
             hint: str = "", **attrs: Any) -> Instr:
        return self.block.append(Instr(op, operands, type, attrs, hint))

    # --- instructions that simplify as they are built ------------------------------------------

    def tuple(self, fields: Sequence[Value], hint: str = "") -> Value:
        return self.emit("tuple", fields, TupleType(tuple(f.type for f in fields)), hint)

    def get_field(self, t: Value, index: int, hint: str = "") -> Value:
        if isinstance(t, Instr) and t.op == "tuple":
            return t.operands[index]
        if not isinstance(t.type, TupleType) or not 0 <= index < len(t.type.fields):
            raise InternalError(f"SSA: get_field {index} of a value of type {t.type}")
        return self.emit("get_field", [t], t.type.fields[index], hint, index=index)

    # --- terminators -------------------------------------------------------------------------

    def br(self, block: Block, args: Sequence[Value] = ()) -> None:
        self.block.terminate(Terminator("br", (), [Target(block, list(args))]))

    def cond_br(self, cond: Value, then: Block, then_args: Sequence[Value],
                other: Block, other_args: Sequence[Value]) -> None:
        targets = [Target(then, list(then_args)), Target(other, list(other_args))]
        self.block.terminate(Terminator("cond_br", [cond], targets))

    def switch(self, value: Value, cases: Sequence[SwitchCase],
               default: Block | None = None) -> None:
        targets = [Target(b) for _, b in cases]
        if default is not None:
            targets.append(Target(default))
        attrs = {"cases": [c for c, _ in cases], "has_default": default is not None}
        self.block.terminate(Terminator("switch", [value], targets, attrs))

    def ret(self, value: Value) -> None:
        self.block.terminate(Terminator("ret", [value]))

    def fail(self, message: str) -> None:
        self.block.terminate(Terminator("fail", (), (), {"message": message}))
