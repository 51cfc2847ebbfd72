"""The kernels of an SSA program: one per distinct fused primitive function.

Fusion leaves each operator group as a ``Primitive=1`` function. Before it becomes a kernel,
every non-scalar constant it holds (a weight, after `params=` binding) is made a parameter:
the constant goes to the program's constant table and is passed to the kernel like any
other input. Two layers that differ only in their weights then share one kernel — ResNet's
repeated blocks compile once — and the machine code holds no weights. Scalar constants
stay in the kernel, where the code generator folds them.

Functions equal up to renaming (`structural_equal`) share a kernel, named after the
operators it runs (``fused_nn_conv2d_add_nn_relu``, TVM's convention). A kernel whose types
are all static is lowered to loop IR by `lower_kernels` (the `lower-kernels` pass); one of
symbolic shape is made static for each concrete shape the VM meets (`specialize_decl`) and
then lowered by the same pass.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace

from kiln.errors import Error, InternalError
from kiln.infer import infer_types
from kiln.ir.attrs import Attrs
from kiln.ir.equal import structural_equal
from kiln.ir.expr import Call, Constant, Expr, Function, Op, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import post_order, rewrite
from kiln.ir.ty import FuncType, TensorType, TupleType, Type
from kiln.loops.ir import Kernel
from kiln.loops.lower import lower_primitive
from kiln.loops.schedule import current_weight_bytes, weights_scope
from kiln.ssa.ir import Instr, KernelDecl, Program, flatten_tensor_types
from kiln.target import Target


def _typed(fn: Function) -> Function:
    """``fn`` (closed, parameters annotated) with checked types."""
    return infer_types(IRModule.from_expr(fn))["main"]


def _ops(fn: Function) -> tuple[str, ...]:
    return tuple(n.op.name for n in post_order(fn.body)
                 if isinstance(n, Call) and isinstance(n.op, Op))


def source_location(fn: Function) -> str | None:
    """``file:line:col`` of the first operator call of ``fn`` (in evaluation order) that has
    a source span, or None when none has."""
    for n in post_order(fn.body):
        if isinstance(n, Call) and isinstance(n.op, Op) and n.span is not None:
            return str(n.span)
    return None


def param_tensor_types(t: Type, what: str) -> list[TensorType]:
    """A kernel parameter's tensors: a tensor, or a tuple of tensors passed field by field."""
    if isinstance(t, TensorType):
        return [t]
    if isinstance(t, TupleType):
        fields = [f for f in t.fields if isinstance(f, TensorType)]
        if len(fields) == len(t.fields):
            return fields
    raise Error(f"{what} has type {t}; a kernel takes tensors and tuples of tensors")


class KernelTable:
    """Kernel declarations of one program, made as primitive functions are met (their
    constants still inside: the `lift-constants` pass takes them out)."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.by_key: dict[object, list[KernelDecl]] = {}
        self.by_id: dict[int, KernelDecl] = {}

    def get(self, fn: Function) -> KernelDecl:
        """The kernel computing primitive function ``fn``."""
        done = self.by_id.get(id(fn))
        if done is not None:
            return done
        decl = _share(self.by_key, fn, lambda: self._declare(fn))
        self.by_id[id(fn)] = decl
        return decl

    def _declare(self, fn: Function) -> KernelDecl:
        typed = _typed(fn) if fn.checked_type_ is None else fn
        decl = declaration(self._name(_ops(typed)), typed)
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


def _share(table: dict[object, list[KernelDecl]], fn: Function,
           make: Callable[[], KernelDecl]) -> KernelDecl:
    """The declaration in ``table`` of a function equal to ``fn`` up to renaming, or a new one
    from ``make``. A cheap key first; structural equality only among functions sharing it."""
    key = (_ops(fn), tuple(p.checked_type for p in fn.params))
    for decl in table.get(key, []):
        if decl.func is not None and structural_equal(decl.func, fn):
            return decl
    decl = make()
    table.setdefault(key, []).append(decl)
    return decl


def _ret_type(typed: Function) -> Type:
    t = typed.checked_type
    if not isinstance(t, FuncType):
        raise InternalError(f"a primitive function is typed {t}")
    return t.ret_type


def declaration(name: str, typed: Function, location: str | None = None) -> KernelDecl:
    """The declaration of kernel ``name`` computing typed primitive function ``typed``,
    written at ``location`` (default: the source span of its first operator call)."""
    inputs: list[TensorType] = []
    for p in typed.params:
        inputs += param_tensor_types(p.checked_type, f"kernel parameter %{p.name_hint}")
    ret = _ret_type(typed)
    outputs = flatten_tensor_types(ret)
    if outputs is None:
        raise Error(f"a fused function returns {ret}; kernels return tensors")
    return KernelDecl(name, tuple(inputs), tuple(outputs), typed, None, _ops(typed),
                      location if location is not None else source_location(typed))


def constants_as_params(fn: Function) -> tuple[Function, list[Constant]]:
    """Primitive function ``fn``, typed, with its non-scalar constants made parameters (after
    its own), and those constants: what `lower_primitive` needs of a function with weights."""
    consts = [n for n in post_order(fn.body) if isinstance(n, Constant) and n.data.ndim > 0]
    if not consts:
        return fn, []
    fresh = {id(c): Var(f"c{i}", c.tensor_type) for i, c in enumerate(consts)}
    body = rewrite(fn.body, lambda e: fresh.get(id(e)) if isinstance(e, Constant) else None)
    params = tuple(Var(p.name_hint, p.checked_type) for p in fn.params)
    renamed = dict(zip(fn.params, params))
    body = rewrite(body, lambda e: renamed.get(e) if isinstance(e, Var) else None)
    lifted = Function((*params, *(fresh[id(c)] for c in consts)), body, None, (),
                      Attrs(Primitive=1), span=fn.span)
    return _typed(lifted), consts


def lift_constants(program: Program) -> Program:
    """``program`` with every non-scalar constant of its kernels (a weight, after `params=`
    binding) passed to the kernel from the constant table instead; kernels that then agree
    up to renaming merge into one (ResNet's repeated blocks compile once).

    Each kernel instruction gets the constants as inputs after its own, through `const`
    instructions at the start of its function's entry block (which dominates every use).
    """
    out = program.copy()
    table: dict[object, list[KernelDecl]] = {}
    lifted: dict[str, tuple[KernelDecl, list[Constant]]] = {}
    for name, decl in program.kernels.items():
        if decl.func is None:
            table_decl = decl
            consts: list[Constant] = []
        else:
            fn, consts = constants_as_params(decl.func)
            table_decl = _share(table, fn,
                                lambda: declaration(name, fn, decl.location))  # noqa: B023
        lifted[name] = (table_decl, consts)
    out.kernels = {d.name: d for d, _ in lifted.values()}
    index = {id(data): i for i, data in enumerate(out.constants)}
    for func in out.functions.values():
        entry = func.entry
        loaded: dict[int, Instr] = {}
        for ins in list(func.instructions()):
            if ins.op not in ("kernel", "kernel_dyn"):
                continue
            decl, consts = lifted[ins.attrs["kernel"]]
            values = []
            for c in consts:
                if id(c) not in loaded:
                    if id(c.data) not in index:
                        index[id(c.data)] = out.add_constant(c.data)
                    load = Instr("const", (), c.tensor_type, {"index": index[id(c.data)]})
                    load.block = entry
                    entry.instrs.insert(len(loaded), load)
                    loaded[id(c)] = load
                values.append(loaded[id(c)])
            n = ins.attrs.get("num_inputs", len(ins.operands))
            ins.operands = [*ins.operands[:n], *values, *ins.operands[n:]]
            ins.attrs["kernel"] = decl.name
            if ins.op == "kernel":
                ins.attrs["num_inputs"] = n + len(values)
    return out


def lower_kernels(program: Program, target: Target | None = None) -> Program:
    """``program`` with each static kernel lowered to loop IR, scheduled for ``target`` (None:
    the lowering's target scope, else this machine): a new declaration holding the loop IR
    replaces the one holding the function. The schedules know how many bytes the program's
    constants (its weights) take (`weights_scope`; an enclosing scope's where there is one,
    as `kiln.tune` sets for one kernel of a model): whether they stay in the cores' caches
    from call to call decides how a product with a constant operand is split."""
    kernels = dict(program.kernels)
    weights = current_weight_bytes()  # kiln.tune's, for one site of a model
    if weights is None:
        weights = sum(int(c.nbytes) for c in program.constants)
    with weights_scope(weights):
        for name, decl in program.kernels.items():
            if decl.kernel is None and decl.is_static:
                if decl.func is None:
                    raise InternalError(f"kernel @{decl.name} has neither a function nor "
                                        "loop IR")
                kernels[name] = replace(decl, func=None,
                                        kernel=lower_primitive(decl.func, decl.name, target))
    return replace(program, kernels=kernels)


def loop_kernels(program: Program) -> list[Kernel]:
    """The loop IR of every lowered kernel of ``program``."""
    return [d.kernel for d in program.kernels.values() if d.kernel is not None]


def specialize_decl(decl: KernelDecl, shapes: tuple[tuple[int, ...], ...]) -> KernelDecl:
    """A kernel of symbolic shape made static: its function typed at the input ``shapes``."""
    if decl.func is None:
        raise InternalError(f"kernel @{decl.name} has no function to specialize")
    fn = decl.func
    it = iter(shapes)
    params = []
    for p in fn.params:
        nt: Type
        t = p.checked_type
        if isinstance(t, TupleType):
            fields = param_tensor_types(t, f"kernel parameter %{p.name_hint}")
            nt = TupleType(tuple(TensorType(next(it), f.dtype) for f in fields))
        elif isinstance(t, TensorType):
            nt = TensorType(next(it), t.dtype)
        else:
            raise InternalError(f"kernel @{decl.name} has a parameter of type {t}")
        params.append(Var(p.name_hint, nt))
    mapping: dict[Expr, Expr] = dict(zip(fn.params, params))
    body = rewrite(fn.body, lambda e: mapping.get(e) if isinstance(e, Var) else None)
    concrete = _typed(Function(tuple(params), body, None, (), Attrs(Primitive=1)))
    inputs: list[TensorType] = []
    for p in concrete.params:
        inputs += param_tensor_types(p.checked_type, f"kernel parameter %{p.name_hint}")
    outputs = flatten_tensor_types(_ret_type(concrete))
    if outputs is None:
        raise InternalError(f"kernel @{decl.name} no longer returns tensors at {shapes}")
    dims = "_".join("x".join(str(d) for d in s) for s in shapes)
    return KernelDecl(f"{decl.name}__{dims}", tuple(inputs), tuple(outputs), concrete, None,
                      decl.ops, decl.location)
