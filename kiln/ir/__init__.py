"""Level 1: kiln's functional IR (Relay's expressions, types, ADTs and modules)."""

from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    TypeData,
)
from kiln.ir.attrs import Attrs
from kiln.ir.equal import structural_equal, structural_hash
from kiln.ir.expr import (
    Call,
    Clause,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Match,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
    Tuple,
    TupleGetItem,
    Var,
    as_expr,
    const,
    if_,
    let,
    tuple_,
    var,
)
from kiln.ir.module import IRModule
from kiln.ir.ty import (
    ANY,
    AnyDim,
    FuncType,
    GlobalTypeVar,
    IncompleteType,
    RefType,
    SymDim,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
    scalar_type,
    tensor_type,
)

__all__ = [name for name in dir() if not name.startswith("_")]
