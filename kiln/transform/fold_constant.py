"""fold-constant: evaluate at compile time what depends only on constants.

An operator call whose arguments are all constants (or tuples of constants) is replaced by
its value, computed by the operator's numpy reference as the interpreter would (TVM ran its
interpreter on such calls). A projection of a tuple of known fields, an ``if`` with a
constant condition, and a let binding a constant (substituted into its body) fold too, so
whole constant subgraphs and let chains collapse. ``shape_of`` of a tensor whose type has a
static shape folds to that shape, whatever the tensor is.

What is not folded:

- calls that fail (an integer division by zero): the failure is left for run time;
- calls of operators registered as effectful (kiln has none yet);
- calls that would *create* a large tensor from little: a result of more than
  `MAX_CREATED_ELEMENTS` elements that is also larger than all its constant inputs together.
  ``zeros(shape=[4096, 4096])`` stays a 64 MB-saving one-line call, while
  ``transpose(%weight_constant)`` and ``add(%c1, %c2)`` fold at any size (TVM folds both
  kinds; kiln keeps the program small instead);
- the bodies of fused kernels (``Primitive=1``), as TVM left them.

The result keeps the exact dtype and shape the operator's type relation gives; a numpy
reference that disagrees with its relation is reported as a bug.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.ir.adt import Constructor
from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    If,
    Let,
    Op,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.op import registry
from kiln.transform.effects import op_effect
from kiln.transform.pass_manager import PassContext, function_pass, is_primitive

MAX_CREATED_ELEMENTS = 1 << 16  # 64 Ki elements: 256 KiB of float32


# --- constant values: a Constant, or a tuple of constant values ----------------------------


def is_constant_value(e: Expr) -> bool:
    """True for a Constant or a (nested) tuple of Constants."""
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, Tuple):
            stack.extend(x.fields)
        elif not isinstance(x, Constant):
            return False
    return True


def _tree_map(e: Expr, leaf, node):  # noqa: ANN001, ANN202
    """Fold a constant value bottom-up, with an explicit stack (tuples may nest deeply)."""
    done: dict[int, Any] = {}
    stack: list[tuple[Expr, bool]] = [(e, False)]
    while stack:
        x, ready = stack.pop()
        if isinstance(x, Constant):
            done[id(x)] = leaf(x)
        elif not ready:
            stack.append((x, True))
            stack.extend((f, False) for f in x.fields)  # type: ignore[attr-defined]
        else:
            done[id(x)] = node(tuple(done[id(f)] for f in x.fields))  # type: ignore[attr-defined]
    return done[id(e)]


def _value_type(e: Expr) -> Type:
    return _tree_map(e, lambda c: c.tensor_type, TupleType)


def _numpy_value(e: Expr) -> Any:
    return _tree_map(e, lambda c: c.data, tuple)


def _elements(value: Any) -> int:
    """Elements in a (possibly nested) tuple of arrays."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, (tuple, list)):
            stack.extend(v)
        else:
            total += int(np.asarray(v).size)
    return total


def _as_constant(value: Any, ty: Type, op: str) -> Expr:
    """The folded value as an expression, checked against the type the relation gave (a
    dimension the relation left unknown, ``?`` — argwhere's count — is the value's own)."""
    if isinstance(ty, TupleType):
        if not isinstance(value, (tuple, list)) or len(value) != len(ty.fields):
            raise InternalError(f"the numpy reference of {op} returned {type(value).__name__}, "
                                f"but its type relation says {ty}")
        return Tuple(tuple(_as_constant(v, t, op) for v, t in zip(value, ty.fields)))
    array = np.asarray(value)
    if not isinstance(ty, TensorType) or array.dtype.name != ty.dtype or (
        array.ndim != len(ty.shape)
        or any(isinstance(d, int) and d != a for a, d in zip(array.shape, ty.shape))
    ):
        raise InternalError(f"the numpy reference of {op} returned an array of dtype "
                            f"{array.dtype.name} and shape {array.shape}, but its type relation "
                            f"says {ty}")
    return Constant(array)


# --- the rules -------------------------------------------------------------------------------


def _fold_shape_of(call: Call) -> Expr | None:
    """``shape_of(%x)`` of a tensor whose type has a static shape: that shape."""
    t = call.args[0].checked_type_ if len(call.args) == 1 else None
    if not isinstance(t, TensorType) or not t.is_static:
        return None
    dtype = str(call.attrs.get("dtype", "int32"))
    return Constant(np.array(t.static_shape, dtype=dtype))


def _fold_call(call: Call) -> Expr | None:
    if isinstance(call.op, Op) and call.op.name == "shape_of":
        return _fold_shape_of(call)
    if not isinstance(call.op, Op) or not all(is_constant_value(a) for a in call.args):
        return None
    name = call.op.name
    opdef = registry.lookup(name)
    if opdef is None or op_effect(name) or len(call.args) != opdef.num_inputs:
        return None  # unknown or effectful operators, wrong arity: left to the type checker
    try:
        attrs = opdef.normalize_attrs(call.attrs)
        arg_types = tuple(_value_type(a) for a in call.args)
        if opdef.needs_values:
            values = tuple(a.data if isinstance(a, Constant) else None for a in call.args)
            ty = opdef.relation(arg_types, attrs, values)
        else:
            ty = opdef.relation(arg_types, attrs)
    except Error:
        return None  # ill-typed: the type checker will say so
    if ty is None:
        return None
    args = [_numpy_value(a) for a in call.args]
    try:
        with np.errstate(all="ignore"):
            out = opdef.compute(args, attrs)
    except Exception:  # noqa: BLE001 - a call that fails fails at run time, not now
        return None
    created = _elements(out)
    if created > MAX_CREATED_ELEMENTS and created > sum(_elements(a) for a in args):
        return None
    return _as_constant(out, ty, name)


def _trivially_pure(e: Expr) -> bool:
    return isinstance(e, (Var, GlobalVar, Constant, Constructor, Op, Function)) or (
        is_constant_value(e)
    )


def _fold_projection(e: TupleGetItem) -> Expr | None:
    t = e.tuple_value
    if not isinstance(t, Tuple) or not 0 <= e.index < len(t.fields):
        return None
    others = t.fields[: e.index] + t.fields[e.index + 1 :]
    return t.fields[e.index] if all(_trivially_pure(f) for f in others) else None


def _fold_if(e: If) -> Expr | None:
    c = e.cond
    if isinstance(c, Constant) and c.data.shape == () and c.data.dtype == np.bool_:
        return e.true_branch if bool(c.data) else e.false_branch
    return None


def _fold_let(e: Let) -> Expr | None:
    # The variable was replaced by its constant value in the body (see _fold).
    return e.body if is_constant_value(e.value) else None


RULES = {
    Call: _fold_call,
    TupleGetItem: _fold_projection,
    If: _fold_if,
    Let: _fold_let,
}


def _not_kernel(e: Expr) -> bool:
    return not (isinstance(e, Function) and is_primitive(e))


def fold(root: Expr) -> Expr:
    """``root`` with its constant parts folded."""
    # A let's value is complete before its body is visited, and the body is where its
    # variable first occurs: a let-bound constant is known before any use of the variable.
    order = post_order(root, gate=_not_kernel)  # fused kernels are not entered
    lets_of_value: dict[int, list[Var]] = {}
    for node in order:
        if isinstance(node, Let):
            lets_of_value.setdefault(id(node.value), []).append(node.var)
    known: dict[Var, Expr] = {}
    done: dict[int, Expr] = {}
    for node in order:
        if isinstance(node, Var):
            out: Expr = known.get(node, node)
        elif isinstance(node, Function) and is_primitive(node):
            out = node
        else:
            out = with_children(node, [done[id(k)] for k in children(node)])
            rule = RULES.get(type(out))
            folded = rule(out) if rule is not None else None  # type: ignore[operator]
            if folded is not None:
                out = folded
        done[id(node)] = out
        if id(node) in lets_of_value and is_constant_value(out):
            for v in lets_of_value[id(node)]:
                known[v] = out
    return done[id(root)]


@function_pass("fold-constant", opt_level=2)
def FoldConstant(func: Function, mod: IRModule, ctx: PassContext) -> Function:
    """Evaluate operator calls on constants, constant projections, ifs and lets."""
    new = fold(func)
    assert isinstance(new, Function)
    return new
