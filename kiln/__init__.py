"""kiln: a deep-learning compiler in Python (Relay's language, DLVM's compiler)."""

from kiln.errors import Error, EvalError, InternalError, ParseError, TypeCheckError
from kiln.ir import *  # noqa: F403
from kiln.ir import __all__ as _ir_all

__all__ = ["Error", "EvalError", "InternalError", "ParseError", "TypeCheckError", *_ir_all]
__version__ = "0.1.0"
