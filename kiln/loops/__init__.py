"""Level 3: the loop IR, its verifier, printer and reference evaluator, and lowering."""

from kiln.loops.evaluate import evaluate
from kiln.loops.ir import (
    FMA,
    Allocate,
    Binary,
    Broadcast,
    Buffer,
    Cast,
    Check,
    Const,
    DotProduct,
    Expr,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Load,
    Prefetch,
    Select,
    Seq,
    Stmt,
    Store,
    TileProduct,
    Unary,
    Var,
)
from kiln.loops.verify import verify

__all__ = [
    "FMA", "Allocate", "Binary", "Broadcast", "Buffer", "Cast", "Check", "Const", "DotProduct",
    "Expr", "For",
    "IfThenElse", "Kernel", "LetStmt", "Load", "Prefetch", "Select", "Seq", "Stmt", "Store",
    "TileProduct",
    "Unary", "Var",
    "evaluate", "verify",
]
