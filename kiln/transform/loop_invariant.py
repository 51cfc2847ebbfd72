"""loop-invariant-code-motion: compute once, before a loop, what its iterations all share.

kiln writes loops as recursive functions — a global ``def @loop(%i, %n, %acc, %w)`` or a
let-bound local ``fn`` that calls itself with the next iteration's values. A parameter is
*invariant* when every self-call passes it back unchanged (``%n`` and ``%w`` above), and an
expression is invariant when it is pure, cannot fail, and reads only invariant parameters,
the function's free variables, constants, and let-bound invariant values. An RNN cell's
``transpose(%w)`` is the typical case: computed on every step, always with the same value.

Each loop with invariant expressions (DLVM's LICM, adapted to a functional IR) is split in
two. The loop itself gains one parameter per hoisted expression, which it uses in place of
the expression and passes unchanged in its self-calls; an entry function keeps the original
name and signature, computes the hoisted values from its arguments once, and calls the loop:

    def @loop(%i, %n, %acc, %w) { @loop_licm(%i, %n, %acc, %w, transpose(%w)) }
    def @loop_licm(%i, %n, %acc, %w, %h0) { ... %h0 ... @loop_licm(.., %w, %h0) ... }

A local loop ``let %f = fn (..) {..}`` becomes ``let %f = fn (..) { let %f_licm = fn
(.., %h0) {..}; %f_licm(.., e0) }``. Callers are untouched, and a reference to the loop that
is not a self-call still reaches the entry function, so it stays correct. Only operator calls
and calls of primitive functions (both pure) are hoisted, never calls of closures or
globals, nor reference reads or writes, so no effect is moved, repeated or dropped. Hoisting
is speculative — an expression may be computed although the loop would not have reached it
— so operators that can fail at run time (integer division, `take` in "fast" mode,
reductions over possibly empty axes, shapes only known at run time) stay where they are.
"""

from __future__ import annotations

from collections.abc import Callable

from kiln.errors import InternalError
from kiln.ir.adt import Constructor, pattern_vars
from kiln.ir.dtype import dtype_of
from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    Let,
    Match,
    Op,
    Tuple,
    TupleGetItem,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, free_vars, post_order, with_children
from kiln.ir.ty import TensorType, TupleType
from kiln.text._gc import gc_paused
from kiln.transform.dominators import is_primitive_function
from kiln.transform.pass_manager import PassContext, module_pass, typed


def _types_of(call: Call) -> list[TensorType | None]:
    """The tensor types of a call's result and arguments (tuples flattened); None: not known."""
    out: list[TensorType | None] = []
    stack = [call.checked_type_, *(a.checked_type_ for a in call.args)]
    while stack:
        t = stack.pop()
        if isinstance(t, TupleType):
            stack.extend(t.fields)
        else:
            out.append(t if isinstance(t, TensorType) else None)
    return out


def _integer(call: Call) -> bool:
    t = call.checked_type_
    return not isinstance(t, TensorType) or dtype_of(t.dtype).is_integer


def _maybe_empty(call: Call) -> bool:
    return any(t is None or 0 in t.shape for t in _types_of(call))


def _always(call: Call) -> bool:
    return True


# Operators that can raise at run time, and when: these are never computed speculatively.
MAY_FAIL: dict[str, Callable[[Call], bool]] = {
    "divide": _integer,
    "mod": _integer,
    "floor_divide": _integer,
    "floor_mod": _integer,
    "power": _integer,
    "take": lambda c: c.attrs.get("mode") == "fast" or _maybe_empty(c),
    "arange": _always,
    "max": _maybe_empty,
    "min": _maybe_empty,
    "argmax": _maybe_empty,
    "argmin": _maybe_empty,
    "mean": _maybe_empty,
    "nn.global_avg_pool2d": _maybe_empty,
    "nn.global_max_pool2d": _maybe_empty,
}


def _static(call: Call) -> bool:
    """Whether every shape around the call is known, so that no shape can clash at run time."""
    return all(t is not None and all(isinstance(d, int) for d in t.shape)
               for t in _types_of(call))


def _safe_op_call(call: Call) -> bool:
    name = call.op.name  # type: ignore[attr-defined]
    check = MAY_FAIL.get(name)
    return _static(call) and (check is None or not check(call))


def _safe_call(call: Call) -> bool:
    """A call that is pure and cannot fail: an operator, or a kernel made of such calls."""
    if isinstance(call.op, Op):
        return _safe_op_call(call)
    if is_primitive_function(call.op):
        return all(_safe_op_call(e) for e in post_order(call.op)
                   if isinstance(e, Call) and isinstance(e.op, Op))
    return False


def _own_scope(body: Expr) -> list[Expr]:
    """Nodes of ``body`` children first, without entering nested functions."""
    return post_order(body, gate=lambda e: not isinstance(e, Function))


def _is_self_call(e: Expr, self_ref: Expr, arity: int) -> bool:
    if not isinstance(e, Call) or len(e.args) != arity:
        return False
    return e.op is self_ref or (isinstance(self_ref, GlobalVar) and e.op == self_ref)


def _bound(fn: Function, everything: list[Expr]) -> set[int]:
    """Variables bound in ``fn`` (whose body's nodes are ``everything``), by id."""
    bound = {id(p) for p in fn.params}
    for e in everything:
        if isinstance(e, Let):
            bound.add(id(e.var))
        elif isinstance(e, Function):
            bound.update(id(p) for p in e.params)
        elif isinstance(e, Match):
            bound.update(id(v) for c in e.clauses for v in pattern_vars(c.lhs))
    return bound


class _Loop:
    """What of a recursive function's body is invariant, and what of it is worth hoisting."""

    def __init__(self, fn: Function, everything: list[Expr], self_calls: list[Call]) -> None:
        self.fn = fn
        self.everything = everything
        self.self_calls = self_calls
        fixed = {id(p) for k, p in enumerate(fn.params)
                 if all(c.args[k] is p for c in self_calls)}
        bound = _bound(fn, everything)
        self.order = _own_scope(fn.body)
        self.let_value = {id(e.var): e.value for e in self.order if isinstance(e, Let)}
        self.inv: dict[int, bool] = {}  # invariant
        self.work: dict[int, bool] = {}  # holds an operator call: worth computing once
        for e in self.order:
            self.inv[id(e)], self.work[id(e)] = self._classify(e, fixed, bound)

    def _classify(self, e: Expr, fixed: set[int], bound: set[int]) -> tuple[bool, bool]:
        inv, work = self.inv, self.work
        match e:
            case Var():
                value = self.let_value.get(id(e))
                if value is not None:
                    return inv.get(id(value), False), work.get(id(value), False)
                return id(e) in fixed or id(e) not in bound, False
            case Constant() | GlobalVar() | Constructor() | Op():
                return True, False
            case Call(op=op) if isinstance(op, Op) or is_primitive_function(op):
                return all(inv.get(id(a), False) for a in e.args) and _safe_call(e), True
            case Tuple() | TupleGetItem():
                kids = children(e)
                return (all(inv.get(id(k), False) for k in kids),
                        any(work.get(id(k), False) for k in kids))
        return False, False

    def hoisted(self) -> list[Expr]:
        """The invariant computations whose values the varying part of the loop uses."""
        inv, work = self.inv, self.work
        used = {id(self.fn.body)}
        for e in self.order:
            if isinstance(e, Function):
                used.update(id(v) for v in free_vars(e))
            elif not inv[id(e)]:
                kids = children(e)
                # A let's value is used through its variable.
                used.update(id(k) for k in (kids[1:] if isinstance(e, Let) else kids))
        chosen = set()
        for e in self.order:
            if isinstance(e, Let):
                value = id(e.value)
                if id(e.var) in used and inv[value] and work[value]:
                    chosen.add(value)
            elif not isinstance(e, Var) and inv[id(e)] and work[id(e)] and id(e) in used:
                chosen.add(id(e))
        return [e for e in self.order if id(e) in chosen]

    def outside(self, hoisted: list[Expr], params: tuple[Var, ...]) -> list[Expr]:
        """The hoisted expressions written over the entry function's ``params``."""
        out: dict[int, Expr] = {id(p): q for p, q in zip(self.fn.params, params)}
        for e in self.order:
            if not self.inv[id(e)] or id(e) in out:
                continue
            if isinstance(e, Var):
                value = self.let_value.get(id(e))
                out[id(e)] = e if value is None else out[id(value)]
            else:
                out[id(e)] = with_children(e, [out.get(id(k), k) for k in children(e)])
        return [out[id(e)] for e in hoisted]

    def inside(self, hoisted: list[Expr], extra: list[Var], loop_ref: Expr) -> Expr:
        """The loop's body: hoisted values read from ``extra``, self-calls to ``loop_ref``."""
        replaced: dict[int, Expr] = {id(e): v for e, v in zip(hoisted, extra)}
        dropped = set()
        for e in self.order:
            if isinstance(e, Let) and self.inv[id(e.value)] and self.work[id(e.value)]:
                dropped.add(id(e))  # pure and now unused, or its variable is replaced
                if id(e.value) in replaced:
                    replaced[id(e.var)] = replaced[id(e.value)]
        redirect = {id(c) for c in self.self_calls}
        done: dict[int, Expr] = {}
        for e in self.everything:
            if id(e) in replaced:
                done[id(e)] = replaced[id(e)]
            elif id(e) in dropped:
                done[id(e)] = done[id(e.body)]  # type: ignore[attr-defined]
            elif id(e) in redirect:
                args = tuple(done[id(a)] for a in e.args) + tuple(extra)  # type: ignore
                done[id(e)] = Call(loop_ref, args, e.attrs, span=e.span)  # type: ignore
            else:
                done[id(e)] = with_children(e, [done[id(k)] for k in children(e)])
        return done[id(self.fn.body)]


def hoist_invariants(
    fn: Function, self_ref: Expr, loop_ref: Expr, everything: list[Expr] | None = None
) -> tuple[Function, Function] | None:
    """Split the recursive ``fn`` (called ``self_ref``) into an entry and a loop (``loop_ref``).

    Returns ``(entry, loop)``, or None when ``fn`` is not a loop or has nothing to hoist.
    ``everything``, when given, is ``post_order(fn.body)``.
    """
    if fn.type_params or is_primitive_function(fn):
        return None
    if everything is None:
        everything = post_order(fn.body)
    arity = len(fn.params)
    self_calls = [e for e in everything if _is_self_call(e, self_ref, arity)]
    if not self_calls:
        return None
    loop = _Loop(fn, everything, self_calls)  # type: ignore[arg-type]
    hoisted = loop.hoisted()
    if not hoisted:
        return None
    extra = []
    for k, e in enumerate(hoisted):
        if e.checked_type_ is None:
            raise InternalError("loop-invariant-code-motion needs the types of what it hoists")
        extra.append(Var(f"h{k}", e.checked_type_))
    params = tuple(Var(p.name_hint, p.type_annotation or p.checked_type_) for p in fn.params)
    body = loop.inside(hoisted, extra, loop_ref)
    inner = Function(fn.params + tuple(extra), body, fn.ret_type, (), fn.attrs, span=fn.span)
    call: Expr = Call(loop_ref, params + tuple(loop.outside(hoisted, params)), span=fn.span)
    if isinstance(loop_ref, Var):
        call = Let(loop_ref, inner, call)
    return Function(params, call, fn.ret_type, (), fn.attrs, span=fn.span), inner


def _local_loops(fn: Function) -> tuple[Function, list[Expr] | None]:
    """``fn`` with LICM applied to its let-bound recursive functions, innermost first.

    Also returns ``post_order(fn.body)`` when ``fn`` is returned unchanged.
    """
    order = post_order(fn)
    if not any(isinstance(e, Let) and isinstance(e.value, Function) for e in order):
        return fn, order[:-1]
    done: dict[int, Expr] = {}
    for e in order:
        new = with_children(e, [done[id(k)] for k in children(e)])
        if isinstance(new, Let) and isinstance(new.value, Function):
            loop_ref = Var(f"{new.var.name_hint}_licm")
            split = hoist_invariants(new.value, new.var, loop_ref)
            if split is not None:
                new = Let(new.var, split[0], new.body, span=new.span)
        done[id(e)] = new
    out = done[id(fn)]
    assert isinstance(out, Function)
    return out, None


@module_pass("loop-invariant-code-motion", opt_level=2)
def LoopInvariantCodeMotion(mod: IRModule, ctx: PassContext) -> IRModule:
    """Hoist pure loop-invariant computations out of recursive (loop) functions."""
    mod = typed(mod)
    names = {gv.name for gv in mod.functions}
    funcs: dict[GlobalVar, Function] = {}
    with gc_paused():  # many small objects and no cycles: the collector only costs time
        for gv, fn in mod.functions.items():
            _hoist_global(gv, fn, names, funcs)
    return IRModule(funcs, mod.type_definitions)


def _hoist_global(
    gv: GlobalVar, fn: Function, names: set[str], funcs: dict[GlobalVar, Function]
) -> None:
    """Put ``@gv``, its loops hoisted, into ``funcs`` (with its loop function, if split)."""
    if is_primitive_function(fn):
        funcs[gv] = fn
        return
    fn, order = _local_loops(fn)
    name, k = f"{gv.name}_licm", 1
    while name in names:
        name, k = f"{gv.name}_licm{k}", k + 1
    split = hoist_invariants(fn, gv, GlobalVar(name), order)
    if split is None:
        funcs[gv] = fn
        return
    names.add(name)
    funcs[gv], funcs[GlobalVar(name)] = split
