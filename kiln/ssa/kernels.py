"""The kernels of an SSA program: one per distinct fused primitive function.

Fusion leaves each operator group as a ``Primitive=1`` function. Before it becomes a kernel,
every non-scalar constant it holds (a weight, after `params=` binding) is made a parameter:
the constant goes to the program's constant table and is passed to the kernel like any
other input. Two layers that differ only in their weights then share one kernel — ResNet's
repeated blocks compile once — and the machine code holds no weights. Scalar constants
stay in the kernel, where the code generator folds them.

Functions equal up to renaming (`structural_equal`) share a kernel, named after the
operators it runs (``fused_nn_conv2d_add_nn_relu``, TVM's convention). A kernel whose types
are all static is lowered to loop IR by `lower_kernels`; one of symbolic shape is lowered by
the VM for each concrete shape it meets (`specialize`).
"""

from __future__ import annotations

import re

from kiln.errors import Error, InternalError
from kiln.infer import infer_types
from kiln.ir.attrs import Attrs
from kiln.ir.equal import structural_equal
from kiln.ir.expr import Call, Constant, Expr, Function, Op, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import post_order, rewrite
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.loops.ir import Kernel
from kiln.loops.lower import lower_primitive
from kiln.ssa.ir import KernelDecl, Program, flatten_tensor_types


def _typed(fn: Function) -> Function:
    """``fn`` (closed, parameters annotated) with checked types."""
    return infer_types(IRModule.from_expr(fn))["main"]


def _ops(fn: Function) -> tuple[str, ...]:
    return tuple(n.op.name for n in post_order(fn.body)
                 if isinstance(n, Call) and isinstance(n.op, Op))


def param_tensor_types(t: Type, what: str) -> list[TensorType]:
    """A kernel parameter's tensors: a tensor, or a tuple of tensors passed field by field."""
    if isinstance(t, TensorType):
        return [t]
    if isinstance(t, TupleType) and all(isinstance(f, TensorType) for f in t.fields):
        return list(t.fields)  # type: ignore[arg-type]
    raise Error(f"{what} has type {t}; a kernel takes tensors and tuples of tensors")


class KernelTable:
    """Kernel declarations of one program, made as primitive functions are met."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.by_key: dict[object, list[tuple[Function, KernelDecl]]] = {}
        self.by_id: dict[int, tuple[KernelDecl, list[Constant]]] = {}

    def get(self, fn: Function) -> tuple[KernelDecl, list[Constant]]:
        """The kernel computing primitive function ``fn``, and the constants to pass it after
        ``fn``'s own arguments."""
        done = self.by_id.get(id(fn))
        if done is not None:
            return done
        lifted, consts, ops = _lift_constants(fn)
        # A cheap key first; structural equality only among functions that share it.
        key = (ops, tuple(p.checked_type for p in fn.params), tuple(c.tensor_type for c in consts))
        same = (d for other, d in self.by_key.get(key, []) if structural_equal(other, lifted))
        decl = next(same, None)
        if decl is None:
            decl = self._declare(lifted)
            self.by_key.setdefault(key, []).append((lifted, decl))
        self.by_id[id(fn)] = (decl, consts)
        return decl, consts

    def _declare(self, lifted: Function) -> KernelDecl:
        typed = _typed(lifted) if lifted.checked_type_ is None else lifted
        inputs: list[TensorType] = []
        for p in typed.params:
            inputs += param_tensor_types(p.checked_type, f"kernel parameter %{p.name_hint}")
        ret = typed.checked_type.ret_type  # type: ignore[attr-defined]
        outputs = flatten_tensor_types(ret)
        if outputs is None:
            raise Error(f"a fused function returns {ret}; kernels return tensors")
        ops = _ops(typed)
        decl = KernelDecl(self._name(ops), tuple(inputs), tuple(outputs), typed, None, ops)
        self.program.kernels[decl.name] = decl
        return decl

    def _name(self, ops: tuple[str, ...]) -> str:
        parts = list(dict.fromkeys(re.sub(r"\W", "_", o) for o in ops)) or ["copy"]
        base = "fused_" + "_".join(parts)
        if len(base) > 60:
            base = base[:60].rstrip("_")
        name, n = base, 1
        while name in self.program.kernels:
            name = f"{base}_{n}"
            n += 1
        return name


def _lift_constants(fn: Function) -> tuple[Function, list[Constant], tuple[str, ...]]:
    """``fn`` with its non-scalar constants made parameters; the constants; its operators."""
    nodes = post_order(fn.body)
    ops = tuple(n.op.name for n in nodes if isinstance(n, Call) and isinstance(n.op, Op))
    consts = [n for n in nodes if isinstance(n, Constant) and n.data.ndim > 0]
    if not consts:
        return fn, [], ops
    fresh = {id(c): Var(f"c{i}", c.tensor_type) for i, c in enumerate(consts)}
    body = rewrite(fn.body, lambda e: fresh.get(id(e)) if isinstance(e, Constant) else None)
    params = tuple(Var(p.name_hint, p.checked_type) for p in fn.params)
    renamed = dict(zip(fn.params, params))
    body = rewrite(body, lambda e: renamed.get(e) if isinstance(e, Var) else None)
    lifted = Function((*params, *(fresh[id(c)] for c in consts)), body, None, (),
                      Attrs(Primitive=1), span=fn.span)
    return lifted, consts, ops


def lower_kernels(program: Program, only: set[str] | None = None) -> list[Kernel]:
    """Lower every static kernel of ``program`` to loop IR (kept in its declaration)."""
    out = []
    for decl in program.kernels.values():
        if only is not None and decl.name not in only:
            continue
        if decl.kernel is None and decl.is_static:
            if decl.func is None:
                raise InternalError(f"kernel @{decl.name} has neither a function nor loop IR")
            decl.kernel = lower_primitive(decl.func, decl.name)
        if decl.kernel is not None:
            out.append(decl.kernel)
    return out


def specialize(decl: KernelDecl, shapes: tuple[tuple[int, ...], ...]) -> Kernel:
    """Loop IR for a kernel of symbolic shape, at the concrete input shapes given."""
    if decl.func is None:
        raise InternalError(f"kernel @{decl.name} has no function to specialize")
    fn = decl.func
    it = iter(shapes)
    params = []
    for p in fn.params:
        t = p.checked_type
        if isinstance(t, TupleType):
            nt: Type = TupleType(tuple(TensorType(next(it), f.dtype)  # type: ignore[attr-defined]
                                       for f in t.fields))
        else:
            nt = TensorType(next(it), t.dtype)  # type: ignore[attr-defined]
        params.append(Var(p.name_hint, nt))
    mapping: dict[Expr, Expr] = dict(zip(fn.params, params))
    body = rewrite(fn.body, lambda e: mapping.get(e) if isinstance(e, Var) else None)
    concrete = _typed(Function(tuple(params), body, None, (), Attrs(Primitive=1)))
    dims = "_".join("x".join(str(d) for d in s) for s in shapes)
    return lower_primitive(concrete, f"{decl.name}__{dims}")
