"""The SSA program by hand: the printer's text, and the verifier rejecting broken programs."""

import numpy as np
import pytest

import kiln
from kiln.ir.ty import FuncType, TensorType
from kiln.ssa import (
    UNIT,
    BlockArg,
    Builder,
    Function,
    KernelDecl,
    Program,
    Target,
    problems,
    verify,
)
from kiln.ssa.printer import program_text

F2 = TensorType((2,), "float32")
BOOL = TensorType((), "bool")
I32 = TensorType((), "int32")


def diamond() -> Program:
    """@main(%x, %c): if %c then neg(%x) else %x; the kernel writes an alloc."""
    prog = Program()
    prog.kernels["neg"] = KernelDecl("neg", (F2,), (F2,), ops=("negative",))
    prog.constants.append(np.ones(2, "float32"))
    fn = Function("main", [BlockArg(F2, "x"), BlockArg(BOOL, "c")], F2)
    x, c = fn.params
    b = Builder(fn)
    then, other = fn.add_block("then"), fn.add_block("else")
    join = fn.add_block("join", [BlockArg(F2, "r")])
    b.cond_br(c, then, [], other, [])
    b.position(then)
    out = b.emit("alloc", [], F2, offset=0)
    b.emit("kernel", [x, out], UNIT, kernel="neg", num_inputs=1)
    b.br(join, [out])
    b.position(other)
    k = b.emit("const", [], F2, index=0)
    b.br(join, [k])
    b.position(join)
    b.ret(join.params[0])
    fn.arena_bytes = 64
    prog.add_function(fn)
    return prog


def test_a_hand_built_program_verifies_and_prints():
    prog = diamond()
    assert problems(prog) == []
    assert verify(prog) is prog
    assert program_text(prog) == """\
kernel @neg: (Tensor[(2), float32]) -> (Tensor[(2), float32])  // negative
const #0: Tensor[(2), float32]

func @main: (Tensor[(2), float32], bool) -> Tensor[(2), float32] {  // arena 64 bytes
'entry(%x: Tensor[(2), float32], %c: bool):
  cond_br %c, 'then, 'else
'then:
  %0 = alloc: Tensor[(2), float32] @arena+0
  kernel @neg(%x) -> (%0)
  br 'join(%0)
'else:
  %2 = const #0: Tensor[(2), float32]
  br 'join(%2)
'join(%r: Tensor[(2), float32]):
  ret %r
}
"""


def test_str_of_a_program_is_its_text():
    prog = diamond()
    assert str(prog) == program_text(prog)


def blocks(prog):
    return {b.name: b for b in prog.main.blocks}


def assert_rejected(prog, fragment):
    found = problems(prog)
    assert any(fragment in p for p in found), found
    with pytest.raises(kiln.InternalError, match="malformed"):
        verify(prog)


def test_a_block_without_terminator_is_rejected():
    prog = diamond()
    blocks(prog)["else"].terminator = None
    assert_rejected(prog, "no terminator")


def test_a_use_not_dominated_by_its_definition_is_rejected():
    prog = diamond()
    bs = blocks(prog)
    alloc = bs["then"].instrs[0]
    bs["else"].terminator.targets[0].args = [alloc]  # defined in 'then, used in 'else
    assert_rejected(prog, "not dominated")


def test_a_use_before_its_definition_in_one_block_is_rejected():
    prog = diamond()
    then = blocks(prog)["then"]
    then.instrs.reverse()  # the kernel now reads the alloc before it is made
    assert_rejected(prog, "not dominated")


def test_branch_arguments_must_match_the_target_parameters():
    prog = diamond()
    bs = blocks(prog)
    bs["else"].terminator.targets[0].args = []
    assert_rejected(prog, "passes 0 arguments")
    prog = diamond()
    bs = blocks(prog)
    bs["else"].terminator.targets[0].args = [prog.main.params[1]]
    assert_rejected(prog, "passes a bool")


def test_operand_types_must_agree_with_the_kernel():
    prog = diamond()
    kernel = blocks(prog)["then"].instrs[1]
    kernel.operands[0] = prog.main.params[1]
    assert_rejected(prog, "operand 0 of kernel @neg")


def test_cond_br_needs_a_bool_scalar():
    prog = diamond()
    prog.main.entry.terminator.operands = [prog.main.params[0]]
    assert_rejected(prog, "cond_br needs a bool scalar")


def test_return_type_must_agree():
    prog = diamond()
    blocks(prog)["join"].terminator.operands = [prog.main.params[1]]
    assert_rejected(prog, "ret of a bool")


def test_nothing_branches_to_the_entry_block():
    prog = diamond()
    bs = blocks(prog)
    bs["join"].terminator = None
    bs["join"].terminate(kiln.ssa.Terminator("br", (), [Target(prog.main.entry,
                                                              list(prog.main.params))]))
    assert_rejected(prog, "goes to the entry block")


def test_a_value_of_another_function_is_rejected():
    prog = diamond()
    other = Function("other", [BlockArg(F2, "y")], F2)
    Builder(other).ret(prog.main.params[0])
    prog.add_function(other)
    assert_rejected(prog, "not defined in this function")


def test_calls_agree_with_the_callee():
    prog = diamond()
    callee = Function("twice", [BlockArg(I32, "n")], I32)
    Builder(callee).ret(callee.params[0])
    prog.add_function(callee)
    fn = Function("caller", [BlockArg(F2, "x")], I32)
    b = Builder(fn)
    r = b.emit("call", [fn.params[0]], I32, func="twice")
    b.ret(r)
    prog.add_function(fn)
    assert_rejected(prog, "argument 0 of @twice is Tensor[(2), float32], expected int32")
    r.attrs["func"] = "nowhere"
    assert_rejected(prog, "no function @nowhere")


def test_closures_agree_with_their_function():
    prog = diamond()
    callee = Function("add", [BlockArg(I32, "a"), BlockArg(I32, "b")], I32)
    Builder(callee).ret(callee.params[1])
    prog.add_function(callee)
    fn = Function("make", [BlockArg(I32, "a")], FuncType((I32,), I32))
    b = Builder(fn)
    clo = b.emit("make_closure", [fn.params[0]], FuncType((I32,), I32), func="add")
    b.ret(clo)
    prog.add_function(fn)
    assert problems(prog) == []
    clo.type = FuncType((I32, I32), I32)
    assert_rejected(prog, "a closure fn (int32) -> int32 typed fn (int32, int32) -> int32")


def test_an_alloc_past_the_arena_is_rejected():
    prog = diamond()
    prog.main.arena_bytes = 4
    assert_rejected(prog, "past the arena")


def test_an_unknown_constant_is_rejected():
    prog = diamond()
    blocks(prog)["else"].instrs[0].attrs["index"] = 7
    assert_rejected(prog, "constant #7 is not in the table")


def test_instructions_must_be_known():
    with pytest.raises(kiln.InternalError, match="unknown instruction"):
        kiln.ssa.Instr("add", [], UNIT)
    with pytest.raises(kiln.InternalError, match="unknown terminator"):
        kiln.ssa.Terminator("jump")


def test_a_terminated_block_takes_no_more_instructions():
    prog = diamond()
    b = Builder(prog.main, blocks(prog)["join"])
    with pytest.raises(kiln.InternalError, match="already terminated"):
        b.emit("tuple", [], UNIT)


def test_get_field_of_a_tuple_instruction_is_its_field():
    fn = Function("f", [BlockArg(F2, "x"), BlockArg(I32, "n")], I32)
    b = Builder(fn)
    t = b.tuple(fn.params)
    assert b.get_field(t, 1) is fn.params[1]
    assert len(fn.entry.instrs) == 1
