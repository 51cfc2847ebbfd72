"""eta-expand: turn global functions and constructors used as values into explicit functions.

``@map(@double, %xs)`` becomes ``@map(fn (%a: Tensor[...]) -> Tensor[...] { @double(%a) },
%xs)`` and ``@foldr(Cons, Nil, %xs)`` becomes ``@foldr(fn (%a, %b) { Cons(%a, %b) }, ...)``.
After it, every function value in the program is a function literal, which is what lambda
lifting and defunctionalization (and a VM building closures) want. A global or constructor
in call position is left alone.

The new parameters carry the types inference gave the value; a polymorphic global or
constructor becomes a polymorphic function (``fn [A](%a: A) -> A { @id(%a) }``).

`EtaExpand(expand_constructor=True, expand_global_var=True)` chooses what to expand. TVM's
`EtaExpand` had the same two options, both off by default; kiln turns both on by default so
that the pass does something when run by name.
"""

from __future__ import annotations

from kiln.ir.adt import Constructor
from kiln.ir.expr import Call, Expr, Function, GlobalVar, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.ir.ty import FuncType, Type, TypeVar, substitute
from kiln.transform.pass_manager import (
    ModulePass,
    Pass,
    PassContext,
    PassInfo,
    is_primitive,
    register_pass,
    typed,
)


def expansion(e: GlobalVar | Constructor, annotate: bool = True) -> Function:
    """``fn (%a, ...) { e(%a, ...) }`` with the type ``e`` has (or, unannotated, monomorphic)."""
    ty = e.checked_type
    assert isinstance(ty, FuncType)
    if isinstance(e, GlobalVar):
        callee: Expr = GlobalVar(e.name, span=e.span)
    else:
        callee = Constructor(e.name, e.inputs, e.belong_to, span=e.span)
    if not annotate:
        params = tuple(Var("a") for _ in ty.arg_types)
        return Function(params, Call(callee, params, span=e.span), span=e.span)
    fresh: dict[Type, Type] = {tv: TypeVar(tv.name) for tv in ty.type_params}
    params = tuple(Var("a", substitute(t, fresh)) for t in ty.arg_types)
    return Function(params, Call(callee, params, span=e.span), substitute(ty.ret_type, fresh),
                    tuple(fresh.values()), span=e.span)  # type: ignore[arg-type]


def eta_expand_function(fn: Function, kinds: tuple[type, ...], annotate: bool = True) -> Function:
    """``fn`` (typed) with the globals/constructors of the given kinds used as values expanded.

    ``annotate=False`` leaves the new parameters unannotated, so that inference gives each
    expansion the one monomorphic type its context needs.
    """

    def value(e: Expr, rebuilt: Expr) -> Expr:
        # One expansion per use: uses of one node may be at different types.
        return expansion(e, annotate) if isinstance(e, kinds) else rebuilt  # type: ignore

    def kernel(e: Expr) -> bool:
        return isinstance(e, Function) and is_primitive(e) and e is not fn

    done: dict[int, Expr] = {}
    for node in post_order(fn, gate=lambda e: not kernel(e)):
        if kernel(node):
            done[id(node)] = node  # fused kernels are left as they are
            continue
        kids = children(node)
        new = [value(k, done[id(k)]) for k in kids]
        if isinstance(node, Call):
            new[0] = done[id(kids[0])]  # the callee is not a value
        done[id(node)] = with_children(node, new)
    out = done[id(fn)]
    assert isinstance(out, Function)
    return out


def EtaExpand(expand_constructor: bool = True, expand_global_var: bool = True) -> Pass:
    """Expand global functions and constructors used as values into function literals."""
    kinds = (Constructor,) * expand_constructor + (GlobalVar,) * expand_global_var

    def run(mod: IRModule, ctx: PassContext) -> IRModule:
        if not kinds:
            return mod
        mod = typed(mod)
        funcs = {gv: fn if is_primitive(fn) else eta_expand_function(fn, kinds)
                 for gv, fn in mod.functions.items()}
        return IRModule(funcs, mod.type_definitions)

    return ModulePass(PassInfo("eta-expand", 1, doc=(EtaExpand.__doc__ or "").strip()), run)


register_pass("eta-expand", EtaExpand)
