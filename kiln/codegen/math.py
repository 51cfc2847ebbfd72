"""Transcendental functions for code that reaches LLVM without the decompose-math pass.

The approximations themselves live in the loop IR (kiln/loops/decompose_math.py), where the
evaluator and the code generator share them; `ExprEmitter` expands a transcendental call it
meets by that rewrite. This module only serves arith.py's entry for a float32 value already
in LLVM: it emits the same decomposed arithmetic for it.
"""

from __future__ import annotations

from llvmlite import ir

from kiln.codegen.llvmtypes import ModuleContext, lanes_of
from kiln.loops.decompose_math import expand
from kiln.loops.ir import Var


def emit_float32(mc: ModuleContext, b: ir.IRBuilder, op: str, x: ir.Value) -> ir.Value:
    """``op(x)`` for a float32 scalar or vector ``x``, as decompose-math's arithmetic."""
    from kiln.codegen.emit_expr import ExprEmitter  # emit_expr → arith → this module

    v = Var("x", "float32", lanes_of(x.type))
    return ExprEmitter(mc, b, {id(v): x}, {}).emit(expand(op, v), {})
