"""Passes: the pass manager and one pass per file (see pass_manager.py)."""

from kiln.transform.bind_params import bind_params
from kiln.transform.infer_type import InferType
from kiln.transform.pass_manager import (
    DumpIR,
    FunctionPass,
    ModulePass,
    Pass,
    PassContext,
    PassInfo,
    PassInstrument,
    PassTimingInstrument,
    Sequential,
    function_pass,
    get_pass,
    list_passes,
    module_pass,
    typed,
)

__all__ = [
    "DumpIR",
    "FunctionPass",
    "InferType",
    "ModulePass",
    "Pass",
    "PassContext",
    "PassInfo",
    "PassInstrument",
    "PassTimingInstrument",
    "Sequential",
    "bind_params",
    "function_pass",
    "get_pass",
    "list_passes",
    "module_pass",
    "typed",
]
