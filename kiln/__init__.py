"""kiln: a deep-learning compiler in Python (Relay's language, DLVM's compiler).

    mod = kiln.parse(text)              # Relay text → IRModule
    mod = kiln.infer_types(mod)         # every expression gets .checked_type
    print(kiln.astext(mod))             # Relay text again
    out = kiln.interpret(mod, x)        # run @main with the reference interpreter
    exe = kiln.build(mod)               # compile to machine code; exe(x), exe.save(path)
    kiln.tune(mod, log="m.tunelog")     # search kernel schedules; kiln.build(..., tuning_log=)
"""

import logging as _logging
from typing import TYPE_CHECKING as _TYPE_CHECKING

from kiln import op, train, transform
from kiln.ad import grad
from kiln.errors import Error, EvalError, InternalError, ParseError, TypeCheckError
from kiln.eval import Closure, ConstructorValue, RefValue, interpret
from kiln.frontend import Tensor, script
from kiln.infer import infer_types
from kiln.ir import *  # noqa: F403
from kiln.ir import __all__ as _ir_all
from kiln.quant import quantize  # the function (kiln/quant/) is kiln.quantize
from kiln.runtime import Executable, build, load
from kiln.target import Target
from kiln.text import astext, parse, parse_expr, parse_type
from kiln.transform import optimize
from kiln.tune import tune  # the function (kiln/tune/tuner.py) stands for the package's name

__all__ = [
    "Closure",
    "ConstructorValue",
    "Error",
    "EvalError",
    "Executable",
    "InternalError",
    "ParseError",
    "RefValue",
    "Target",
    "Tensor",
    "TypeCheckError",
    "astext",
    "build",
    "grad",
    "infer_types",
    "interpret",
    "load",
    "op",
    "optimize",
    "parse",
    "parse_expr",
    "parse_type",
    "quantize",
    "script",
    "train",
    "transform",
    "tune",
    *_ir_all,
]
__version__ = "0.1.0"

# kiln logs through the "kiln" logger tree and leaves configuring it to the application
# (the `kiln` command's -v/-q do): without a handler of its own nothing reaches stderr.
_logging.getLogger("kiln").addHandler(_logging.NullHandler())


if _TYPE_CHECKING:
    from kiln import distributed as distributed


def __getattr__(name: str) -> object:
    # kiln.distributed on first use only (it is the one part of kiln that uses PyTorch)
    if name == "distributed":
        import importlib

        return importlib.import_module("kiln.distributed")
    raise AttributeError(f"module 'kiln' has no attribute {name!r}")
