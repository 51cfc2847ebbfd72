"""infer-type: type inference as a pass (every expression gets its checked type)."""

from __future__ import annotations

from kiln.infer import infer_types
from kiln.ir.module import IRModule
from kiln.transform.pass_manager import PassContext, module_pass


@module_pass("infer-type", opt_level=0)
def InferType(mod: IRModule, ctx: PassContext) -> IRModule:
    """Infer and check the type of every expression."""
    return infer_types(mod)
