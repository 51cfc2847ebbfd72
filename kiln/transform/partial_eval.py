"""partial-evaluate: Relay's online partial evaluator.

The evaluator is an interpreter whose values are partially static (`PV`): what is known at
compile time is computed, and everything else is *residualized* — emitted as let-bound code
that computes it at run time. It follows the design of Relay's partial evaluator
(TVM's ``partial_eval.cc``):

- static values are tensors, tuples, constructor values, closures (a function with the values
  of its free variables), global functions, constructors, and references, whose contents live
  in a static store;
- an operator call on static tensors is computed with the operator's numpy reference (one that
  fails is left to fail at run time, if it is ever reached); an ``if`` on a static condition
  takes its branch; a ``match`` on a static value takes its clause;
- a call of a known closure or global function is inlined under the policy below; anything
  else is residual code, in evaluation order.

**Inlining policy.** A call of a known function is inlined unless that function is already
being inlined further out on the current path (recursion) and one of these holds:

1. its arguments carry the same static information as an active call of it (no progress);
2. control flow has become unknown since the innermost active call (a residual ``if`` or
   ``match`` lies between them) *and* no argument is smaller than in every active call
   (the size of a static value: its nodes, plus the value of a non-negative integer scalar);
3. the fuel is spent: at most ``partial-evaluate.fuel`` calls (default 10,000; set it in
   ``PassContext(config=...)``) are inlined per global function.

So recursion on a static counter or a static list unrolls completely (up or down), recursion
on dynamic arguments stops at the first recursive call, and rule 2 makes every chain of
unrolling under unknown control flow finite; fuel bounds the rest (a program that loops
forever under static control flow, and programs whose unrolling would be too large).

**Effects.** References are tracked in a static store. Every ``ref``, ``ref_write`` and every
``ref_read`` whose value is not known stays in the residual program, in order, so the residual
program performs the same effects; a read whose value the store knows becomes that value. The
store forgets, conservatively: inside a residual function body (it runs later), after a residual
branch (the references written in it), and after unknown code runs (a call not inlined, a
write through an unknown reference), the contents of every reference that has *escaped* — whose
atom reached residual code other than its own reads and writes in the function that created it.
The cleanup afterwards removes references that are only ever written (see
`partial_eval_cleanup`), so a reference used only statically disappears.

Graph form (shared nodes) is evaluated once per invocation, like the interpreter does. A node
first evaluated inside a residual branch is evaluated again where it is used after the branch;
if it has effects, whether they happened depends on the branch taken, which graph form leaves
undefined, and the pass reports a `kiln.Error` (as a-normal-form does): bind it with a let.

Not handled (limits): calls of ``Primitive`` functions are kept, never evaluated; a static
tensor, however large, is embedded as a constant where residual code needs it; a dead operator
call is removed even if it would have failed at run time (as dead-code elimination does);
the store forgets conservatively (every reference written in a residual branch, every escaped
reference at each unknown call), so some reads that could be folded stay.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.eval.interpreter import apply_op
from kiln.ir.adt import Constructor
from kiln.ir.expr import (
    Call,
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
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import Visit, free_vars, trampoline
from kiln.ir.ty import FuncType, Type, TypeVar, substitute
from kiln.transform.partial_eval_branches import BranchRules, check_reevaluation
from kiln.transform.partial_eval_cleanup import cleanup
from kiln.transform.partial_eval_values import (
    PV,
    UNIT_ATOM,
    Frame,
    KeyTable,
    SClosure,
    Scope,
    SCtor,
    SCtorFn,
    SGlobal,
    SRef,
    STensor,
    Store,
    STuple,
    dynamic,
    match_types,
    residual_type,
)
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass, typed

DEFAULT_FUEL = 10_000


@module_pass("partial-evaluate", opt_level=1)
def PartialEvaluate(mod: IRModule, ctx: PassContext) -> IRModule:
    """Evaluate what is statically known and residualize the rest (Relay's partial evaluator)."""
    fuel = ctx.config.get("partial-evaluate.fuel", DEFAULT_FUEL)
    if isinstance(fuel, bool) or not isinstance(fuel, int) or fuel < 0:
        raise Error(f"config partial-evaluate.fuel must be a non-negative integer, not {fuel!r}")
    return partial_evaluate(mod, fuel)


def partial_evaluate(mod: IRModule, fuel: int = DEFAULT_FUEL) -> IRModule:
    """The module with every global function partially evaluated (see the module docstring)."""
    if not isinstance(mod, IRModule):
        raise Error(f"partial_evaluate takes an IRModule, not {type(mod).__name__}")
    tmod = typed(mod)
    pe = PartialEvaluator(tmod, fuel)
    funcs: dict[GlobalVar, Function] = {}
    for gv, fn in tmod.functions.items():
        funcs[gv] = mod[gv.name] if is_primitive(fn) else cleanup(pe.residualize(fn))
    return IRModule(funcs, mod.type_definitions)


class _Active:
    """The calls of one function being inlined on the current path, innermost last."""

    __slots__ = ("entries", "keys")

    def __init__(self) -> None:
        # (static key of the arguments, smallest sizes seen on the path, control depth)
        self.entries: list[tuple[tuple[int, ...], tuple[int, ...], int]] = []
        self.keys: dict[tuple[int, ...], int] = {}

    def push(self, key: tuple[int, ...], sizes: tuple[int, ...], depth: int) -> None:
        if self.entries:
            sizes = tuple(min(a, b) for a, b in zip(self.entries[-1][1], sizes))
        self.entries.append((key, sizes, depth))
        self.keys[key] = self.keys.get(key, 0) + 1

    def pop(self) -> None:
        key = self.entries.pop()[0]
        self.keys[key] -= 1
        if not self.keys[key]:
            del self.keys[key]


class PartialEvaluator(BranchRules):
    """Partially evaluates the global functions of one type-checked module."""

    def __init__(self, mod: IRModule, fuel: int) -> None:
        self.mod = mod
        self.max_fuel = fuel
        self.fuel = fuel
        self.keys = KeyTable()
        self.store = Store()
        self.scopes: list[Scope] = []
        self.active: dict[int, _Active] = {}
        self.control_depth = 0  # residual branches and function bodies entered
        self.memo_log: list[tuple[Frame, int]] = []
        self.forgotten_in: dict[Scope, list[tuple[Frame, int]]] = {}  # see after_branches
        self.globals: dict[str, PV] = {}
        self.captures: dict[int, list[Var]] = {}

    def residualize(self, fn: Function) -> Function:
        """``fn`` partially evaluated with unknown arguments."""
        self.fuel = self.max_fuel
        self.memo_log.clear()
        params = tuple(Var(p.name_hint, p.checked_type, span=p.span) for p in fn.params)
        frame = Frame({p: dynamic(q) for p, q in zip(fn.params, params)}, {})
        tvars = frozenset(fn.type_params)
        body = trampoline(self.residual_body(id(fn), fn, frame, tvars))
        return Function(params, body, fn.ret_type, fn.type_params, fn.attrs, span=fn.span)

    # --- values -------------------------------------------------------------------------------

    def tensor(self, data: np.ndarray, atom: Expr | None = None) -> PV:
        return PV(STensor(data, self.keys), atom)

    def make_tuple(self, fields: list[PV]) -> PV:
        key = self.keys("(", *(f.key for f in fields))
        return PV(STuple(tuple(fields), key), None if fields else UNIT_ATOM, self.scope)

    def make_ctor(self, ctor: Constructor, fields: list[PV], ty: Type, fr: Frame) -> PV:
        key = self.keys("c", ctor.belong_to.name, ctor.name, *(f.key for f in fields))
        return PV(SCtor(ctor, tuple(fields), key), None, self.scope,
                  residual_type(ty, fr.tsub, self.scope.tvars))

    def from_value(self, value: Any) -> PV:
        """A static value from an operator's result: an array or a tuple of them."""
        if isinstance(value, np.ndarray):
            return self.tensor(value)
        if isinstance(value, tuple):
            return self.make_tuple([self.from_value(v) for v in value])
        raise InternalError(f"an operator returned a {type(value).__name__}")

    def closure(self, fn: Function, fr: Frame, self_var: Var | None = None) -> PV:
        fvs = self.captures.get(id(fn))
        if fvs is None:
            fvs = self.captures[id(fn)] = free_vars(fn)
        env: dict[Var, PV] = {}
        for v in fvs:
            if v in fr.env:
                env[v] = fr.env[v]
            elif v is not self_var:
                raise InternalError(f"partial-evaluate: %{v.name_hint} has no value", fn.span)
        name = self_var.name_hint if self_var is not None else "fn"
        pv = PV(SClosure(fn, env, fr.tsub, self.keys("fn", id(fn)), name), None, self.scope)
        if self_var is not None:
            env[self_var] = pv  # a let-bound function sees itself
        return pv

    def global_value(self, name: str) -> PV:
        pv = self.globals.get(name)
        if pv is None:
            pv = PV(SGlobal(name, self.mod[name], self.keys("@", name)), GlobalVar(name))
            self.globals[name] = pv
        return pv

    def remember(self, fr: Frame, e: Expr, pv: PV) -> None:
        fr.memo[id(e)] = pv
        self.memo_log.append((fr, id(e)))

    # --- evaluation ---------------------------------------------------------------------------

    def leaf(self, e: Expr, fr: Frame) -> PV | None:
        """The value of a variable or constant without a generator (they are most nodes)."""
        if type(e) is Var:
            pv = fr.env.get(e)
            if pv is None:
                raise InternalError(f"partial-evaluate: %{e.name_hint} has no value", e.span)
            return pv
        if type(e) is Constant:
            return self.tensor(e.data, e)
        return None

    def pe(self, e: Expr, fr: Frame, hint: str = "") -> Visit:
        """The partially static value of ``e`` (a generator, run by `trampoline`)."""
        pv = fr.memo.get(id(e))
        if pv is not None:
            return pv
        if id(e) in fr.forgotten:
            check_reevaluation(e, fr.forgotten[id(e)])
        match e:
            case Var():
                pv = fr.env.get(e)
                if pv is None:
                    raise InternalError(f"partial-evaluate: %{e.name_hint} has no value", e.span)
                return pv
            case Constant():
                return self.tensor(e.data, e)
            case GlobalVar():
                return self.global_value(e.name)
            case Constructor():
                return PV(SCtorFn(e, self.keys("C", e.belong_to.name, e.name)), e)
            case Function():
                pv = self.closure(e, fr)
            case Tuple():
                fields = []
                for f in e.fields:
                    field = self.leaf(f, fr)
                    fields.append(field if field is not None else (yield self.pe(f, fr)))
                pv = self.make_tuple(fields)
            case TupleGetItem():
                t = yield self.pe(e.tuple_value, fr)
                if isinstance(t.static, STuple):
                    pv = t.static.fields[e.index]
                else:
                    atom = yield self.reify(t)
                    pv = dynamic(self.scope.push(TupleGetItem(atom, e.index), hint))
            case Let():
                pv = yield from self.pe_let(e, fr)
            case Call():
                pv = yield from self.pe_call(e, fr, hint)
            case If():
                pv = yield from self.pe_if(e, fr, hint)
            case Match():
                pv = yield from self.pe_match(e, fr, hint)
            case RefCreate():
                pv = yield from self.pe_ref_create(e, fr, hint)
            case RefRead():
                pv = yield from self.pe_ref_read(e, fr, hint)
            case RefWrite():
                pv = yield from self.pe_ref_write(e, fr)
            case _:
                raise InternalError(f"partial-evaluate met an unexpected {type(e).__name__}",
                                    e.span)
        self.remember(fr, e, pv)
        return pv

    def pe_let(self, e: Let, fr: Frame) -> Visit:
        # A let chain is walked in a loop: A-normal-form chains are thousands deep.
        chain = []
        body: Expr = e
        while isinstance(body, Let) and id(body) not in fr.memo:
            value = body.value
            if isinstance(value, Function) and id(value) not in fr.memo:
                pv = self.closure(value, fr, body.var)
                self.remember(fr, value, pv)
            else:
                pv = yield self.pe(value, fr, body.var.name_hint)
            fr.env[body.var] = pv
            chain.append(body)
            body = body.body
        result = yield self.pe(body, fr)
        for node in chain:
            self.remember(fr, node, result)
        return result

    def pe_call(self, e: Call, fr: Frame, hint: str) -> Visit:
        f = None if isinstance(e.op, (Op, Constructor)) else (yield self.pe(e.op, fr))
        args = []
        for a in e.args:
            pv = self.leaf(a, fr)
            args.append(pv if pv is not None else (yield self.pe(a, fr)))
        if isinstance(e.op, Op):
            return (yield from self.call_op(e, e.op, args, hint))
        if isinstance(e.op, Constructor):
            return self.make_ctor(e.op, args, e.checked_type, fr)
        assert f is not None
        return (yield from self.apply(f, args, e, fr, hint))

    def call_op(self, e: Call, op: Op, args: list[PV], hint: str) -> Visit:
        tensors = [a.static for a in args if isinstance(a.static, STensor)]
        if len(tensors) == len(args):
            try:
                out = apply_op(e, [t.data for t in tensors])
            except InternalError:
                raise
            except Error:
                out = None  # it fails at run time, if that code is ever reached
            if out is not None:
                return self.from_value(out)
        atoms = []
        for a in args:
            atoms.append((yield self.reify(a)))
        return dynamic(self.scope.push(Call(Op(op.name), tuple(atoms), e.attrs, span=e.span), hint))

    def apply(self, f: PV, args: list[PV], call: Call, fr: Frame, hint: str) -> Visit:
        """A call of the function value ``f``: inlined when known and allowed, else residual."""
        s = f.static
        if isinstance(s, SCtorFn):
            return self.make_ctor(s.ctor, args, call.checked_type, fr)
        pure = False
        if isinstance(s, (SClosure, SGlobal)):
            fn = s.func
            pure = is_primitive(fn)  # a fused kernel: kept as a call, and it has no effects
            if not pure and self.may_inline(_identity(s), args):
                base = s.tsub if isinstance(s, SClosure) else {}
                env = s.env if isinstance(s, SClosure) else {}
                tsub = self.instantiate(fn, base, call, fr)
                return (yield from self.inline(s, env, tsub, args))
        fatom = yield self.reify(f)
        atoms = []
        for a in args:
            atoms.append((yield self.reify(a)))
        pv = dynamic(self.scope.push(Call(fatom, tuple(atoms), span=call.span), hint))
        if not pure:
            self.store.unknown_effect()
        return pv

    def may_inline(self, ident: int, args: list[PV]) -> bool:
        """The inlining policy of the module docstring."""
        if self.fuel <= 0:
            return False
        active = self.active.get(ident)
        if active is None or not active.entries:
            return True
        if tuple(a.key for a in args) in active.keys:
            return False
        _, smallest, depth = active.entries[-1]
        if depth == self.control_depth:
            return True
        return any(a.size < m for a, m in zip(args, smallest))

    def instantiate(self, fn: Function, base: dict[Type, Type], call: Call, fr: Frame
                    ) -> dict[Type, Type]:
        """The substitution for an inlined polymorphic function's type parameters."""
        if not fn.type_params:
            return base
        tsub = dict(base)
        tvars: frozenset[TypeVar] = frozenset(fn.type_params)
        allowed = self.scope.tvars
        fty = fn.checked_type
        assert isinstance(fty, FuncType)  # the module is type-checked
        ret = fty.ret_type
        pairs = [(ret, call.checked_type)]
        pairs += [(p.checked_type, a.checked_type) for p, a in zip(fn.params, call.args)]
        for pattern, actual in pairs:
            match_types(pattern, substitute(actual, fr.tsub), tvars, allowed, tsub)
        return tsub

    def inline(self, s: SClosure | SGlobal, env: dict[Var, PV], tsub: dict[Type, Type],
               args: list[PV]) -> Visit:
        fn = s.func
        frame_env = dict(env)
        frame_env.update(zip(fn.params, args))
        active = self.active.setdefault(_identity(s), _Active())
        active.push(tuple(a.key for a in args), tuple(a.size for a in args), self.control_depth)
        self.fuel -= 1
        try:
            return (yield self.pe(fn.body, Frame(frame_env, tsub)))
        finally:
            active.pop()

    # --- references ---------------------------------------------------------------------------

    def own_use(self, ref: SRef) -> None:
        """A read or write of ``ref`` here; outside its own function it escapes."""
        if ref.level != self.scope.level:
            self.store.escape(ref)

    def pe_ref_create(self, e: RefCreate, fr: Frame, hint: str) -> Visit:
        value = yield self.pe(e.value, fr)
        atom = yield self.reify(value)
        ref = SRef(self.scope.level, 0)
        ref.key = self.keys("ref", id(ref))
        pv = PV(ref, self.scope.push(RefCreate(atom, span=e.span), hint or "r"))
        self.store.set(ref, value)
        return pv

    def pe_ref_read(self, e: RefRead, fr: Frame, hint: str) -> Visit:
        r = yield self.pe(e.ref, fr)
        s = r.static
        if isinstance(s, SRef):
            self.own_use(s)
            known = self.store.get(s)
            if known is not None:
                return known
            pv = dynamic(self.scope.push(RefRead(r.atom, span=e.span), hint))
            self.store.set(s, pv)  # until something changes it, the cell holds what was read
            return pv
        atom = yield self.reify(r)
        return dynamic(self.scope.push(RefRead(atom, span=e.span), hint))

    def pe_ref_write(self, e: RefWrite, fr: Frame) -> Visit:
        r = yield self.pe(e.ref, fr)
        value = yield self.pe(e.value, fr)
        s = r.static
        if isinstance(s, SRef):
            self.own_use(s)
            vatom = yield self.reify(value)
            self.scope.push(RefWrite(r.atom, vatom, span=e.span), "w")
            self.store.set(s, value)
        else:
            ratom = yield self.reify(r)
            vatom = yield self.reify(value)
            self.scope.push(RefWrite(ratom, vatom, span=e.span), "w")
            self.store.unknown_effect()  # it may write any escaped reference
        return self.make_tuple([])

    # --- reification: residual code for a value -----------------------------------------------

    def reify(self, pv: PV) -> Visit:
        """An atom of residual code whose value is ``pv``."""
        if pv.atom is not None:
            if isinstance(pv.static, SRef):
                self.store.escape(pv.static)
            return pv.atom
        s = pv.static
        match s:
            case STensor():
                pv.atom = Constant(s.data)
            case STuple():
                atoms = []
                for f in s.fields:
                    atoms.append((yield self.reify(f)))
                pv.atom = self.home(pv).push(Tuple(tuple(atoms)), "t")
            case SCtor():
                atoms = []
                for f in s.fields:
                    atoms.append((yield self.reify(f)))
                call = Call(s.ctor, tuple(atoms))
                pv.atom = self.home(pv).push(call, s.ctor.name.lower(), pv.ty)
            case SClosure():
                yield from self.residual_closure(pv, s)
            case _:
                raise InternalError(f"partial-evaluate cannot reify {pv!r}")
        return pv.atom

    def home(self, pv: PV) -> Scope:
        """The scope a static value was made in, where its residual code is bound."""
        if pv.scope is None or not pv.scope.open:
            raise InternalError("partial-evaluate: a static value outlived its scope")
        return pv.scope

    def residual_closure(self, pv: PV, s: SClosure) -> Visit:
        fn = s.func
        home = self.home(pv)
        if is_primitive(fn):
            pv.atom = home.push(fn, "kernel")
            return
        fvar = Var(s.name)
        pv.atom = fvar  # set first: the body may call itself
        tvars = home.tvars | frozenset(fn.type_params)
        params = tuple(Var(p.name_hint, residual_type(p.checked_type, s.tsub, tvars))
                       for p in fn.params)
        env = dict(s.env)
        env.update((p, dynamic(q)) for p, q in zip(fn.params, params))
        body = yield from self.residual_body(_identity(s), fn, Frame(env, s.tsub), tvars)
        ret = residual_type(fn.ret_type, s.tsub, tvars)
        home.bind(fvar, Function(params, body, ret, fn.type_params, fn.attrs, span=fn.span))

    def residual_body(self, ident: int, fn: Function, frame: Frame,
                      tvars: frozenset[TypeVar]) -> Visit:
        """The body of a residual function: it runs later, so the store starts empty."""
        scope = Scope(Scope.new_level(), tvars)
        self.scopes.append(scope)
        mark = self.store.mark()
        self.store.forget_all()
        self.control_depth += 1
        active = self.active.setdefault(ident, _Active())
        unknown = (0,) * len(fn.params)
        active.push(unknown, unknown, self.control_depth)
        try:
            result = yield self.pe(fn.body, frame)
            atom = yield self.reify(result)
        finally:
            active.pop()
            self.control_depth -= 1
            self.store.rollback(mark)
            self.forgotten_in.pop(scope, None)
            self.scopes.pop()
        return scope.close(atom)


def _identity(s: SClosure | SGlobal) -> int:
    """What recursion is detected on: a closure (not its code: each closure made by
    ``@compose`` is a different function), or a global function."""
    return id(s) if isinstance(s, SClosure) else id(s.func)
