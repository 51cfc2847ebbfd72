"""Level 2: the SSA program (DLVM's functions of basic blocks with block arguments), its
verifier, printer, dominance and liveness analyses, memory planner, and lowering from Level 1.

    program = kiln.ssa.lower_module(kiln.optimize(mod))   # verified
    print(program)                                         # DLVM-style text
    plan = kiln.ssa.plan_memory(program)                   # arena offsets for static tensors
"""

from kiln.ssa.analysis import DominatorTree, Liveness, predecessors, reverse_post_order
from kiln.ssa.builder import Builder
from kiln.ssa.from_relay import lower_module
from kiln.ssa.ir import (
    INSTRUCTIONS,
    UNIT,
    Block,
    BlockArg,
    Function,
    Instr,
    KernelDecl,
    Program,
    Target,
    Terminator,
    Value,
)
from kiln.ssa.kernels import lower_kernels
from kiln.ssa.memory import MemoryPlan, plan_memory
from kiln.ssa.printer import function_text, program_text
from kiln.ssa.verify import problems, verify

__all__ = [
    "INSTRUCTIONS", "UNIT", "Block", "BlockArg", "Builder", "DominatorTree", "Function", "Instr",
    "KernelDecl", "Liveness", "MemoryPlan", "Program", "Target", "Terminator", "Value",
    "function_text", "lower_kernels", "lower_module", "plan_memory", "predecessors",
    "problems", "program_text", "reverse_post_order", "verify",
]
