"""defunctionalization: make a higher-order program first-order (Reynolds, 1972).

Function values become data. For each function type ``fn (A) -> B`` the program uses as a
value, the pass defines an ADT with one constructor per function that can flow there, whose
fields are the variables that function captures, and a global ``@apply`` that takes such a
value and the arguments and dispatches on the constructor:

    def @main(%k: float32, %xs: List[float32]) { @map(fn (%x) { %x * %k }, %xs) }
becomes
    type Fn0 { Fn0_lambda(float32) }
    def @apply0(%f: Fn0, %a: float32) -> float32 { match (%f) { Fn0_lambda(%k) => %a * %k } }
    def @map_0(%f: Fn0, %xs: List[float32]) -> List[float32] { ... @apply0(%f, %head) ... }
    def @main(%k: float32, %xs: List[float32]) { @map_0(Fn0_lambda(%k), %xs) }

Every function literal becomes a constructor call, every call of a function value a call of
the ``@apply`` of its type, and every function type in annotations, global signatures and ADT
fields the corresponding ADT, so closures passed to globals, returned, stored in tuples, in
references or in ADTs (``List[fn (A) -> B]``) all work. A recursive let-bound function
rebuilds itself from its captured fields inside its clause. Globals and constructors used as
values are first turned into function literals (eta-expansion).

Polymorphic higher-order globals (``@map[A, B]``) are specialized first, one copy per
instance they are called at (``@map_0``), because each instance needs its own ``@apply``;
polymorphic globals that merely pass function values around (``@length[A]`` on a list of
closures) stay generic. Fused kernels (``Primitive=1``) called directly are left alone.

Rejected with a `kiln.Error`: polymorphic function values that no single instance can
replace (a function literal with type parameters, a polymorphic global or constructor used
as a value at several types), polymorphic recursion (unboundedly many instances), ADTs whose
fields are functions of their type parameters (``type Lazy[A] { Thunk(fn () -> A) }``), a
polymorphic higher-order ``@main``, and fused kernels used as values.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.errors import Error, InternalError, TypeCheckError
from kiln.infer import infer_types
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    TypeData,
    pattern_children,
)
from kiln.ir.expr import (
    Call,
    Clause,
    Expr,
    Function,
    GlobalVar,
    Let,
    Match,
    Op,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, free_vars, post_order, rewrite, with_children
from kiln.ir.ty import (
    FuncType,
    GlobalTypeVar,
    Type,
    TypeCall,
    TypeVar,
    substitute,
    type_children,
    with_type_children,
)
from kiln.transform.eta_expand import eta_expand_function
from kiln.transform.inline import fresh_copy, global_refs
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass, typed

MAX_SPECIALIZATIONS = 1000


def _infer(mod: IRModule, step: str) -> IRModule:
    try:
        return infer_types(mod)
    except TypeCheckError as e:
        raise Error(f"defunctionalization: {step}, the program no longer type-checks: "
                    f"{e.message}") from None


def _has_type_var(t: Type | None) -> bool:
    stack = [t] if t is not None else []
    while stack:
        x = stack.pop()
        if isinstance(x, TypeVar) or (isinstance(x, FuncType) and x.type_params):
            return True
        stack.extend(type_children(x))
    return False


def _has_poly_function(t: Type) -> bool:
    """Whether a function type that mentions type variables occurs in ``t``."""
    stack = [t]
    while stack:
        x = stack.pop()
        if isinstance(x, FuncType) and _has_type_var(x):
            return True
        stack.extend(type_children(x))
    return False


# --- step 1: specialize polymorphic higher-order globals ---------------------------------------


def _needs_specialization(mod: IRModule) -> set[str]:
    """Polymorphic globals whose body handles function values of their type variables."""
    graph = {gv.name: global_refs(fn) for gv, fn in mod.functions.items()}
    poly = {gv.name for gv, fn in mod.functions.items() if fn.type_params}
    needs = set()
    for name in poly:
        fn = mod[name]
        for node in post_order(fn.body):
            if isinstance(node, (GlobalVar, Constructor, Op)):
                continue  # callees: their types are not values
            if node.checked_type_ is not None and _has_poly_function(node.checked_type_):
                needs.add(name)
                break
    changed = True
    while changed:  # calling one that needs it makes a polymorphic global need it too
        changed = False
        for name in poly - needs:
            if graph[name] & needs:
                needs.add(name)
                changed = True
    return needs


def _match(pattern: Type, concrete: Type, params: tuple[TypeVar, ...], out: dict) -> None:
    """Bind the type variables ``params`` of ``pattern`` to the parts of ``concrete``."""
    stack = [(pattern, concrete)]
    while stack:
        p, c = stack.pop()
        if isinstance(p, TypeVar) and p in params:
            out.setdefault(p, c)
            continue
        if type(p) is not type(c) or (isinstance(c, FuncType) and c.type_params):
            continue
        kp, kc = type_children(p), type_children(c)
        if len(kp) == len(kc):
            stack.extend(zip(kp, kc))


class _Specializer:
    """Copies of polymorphic higher-order globals, one per instance, until none is missing."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.funcs: dict[str, Function] = {gv.name: fn for gv, fn in mod.functions.items()}
        self.tdefs = mod.type_definitions
        self.specs: dict[tuple, str] = {}
        self.pending: list[str] = []

    def instance(self, tm: IRModule, call: Call) -> str:
        name = call.op.name  # type: ignore[attr-defined]
        generic = tm[name]
        ft = generic.checked_type
        assert isinstance(ft, FuncType)
        sigma: dict[Type, Type] = {}
        for p, a in zip(ft.arg_types, call.args):
            _match(p, a.checked_type, ft.type_params, sigma)
        _match(ft.ret_type, call.checked_type, ft.type_params, sigma)
        if any(tv not in sigma or _has_type_var(sigma[tv]) for tv in ft.type_params):
            raise Error(f"defunctionalization: cannot tell at which types @{name} is called "
                        "here (the call is itself polymorphic); only monomorphic instances of "
                        "polymorphic higher-order functions can be specialized", call.span)
        key = (name, tuple(sigma[tv] for tv in ft.type_params))
        spec = self.specs.get(key)
        if spec is None:
            if len(self.specs) >= MAX_SPECIALIZATIONS:
                raise Error(f"defunctionalization: @{name} needs more than "
                            f"{MAX_SPECIALIZATIONS} specialized copies (polymorphic recursion?)")
            spec = _fresh(f"{name}_{len(self.specs)}", self.funcs)
            self.specs[key] = spec
            self.funcs[spec] = _specialize(generic, sigma)
            self.pending.append(spec)
        return spec

    def run(self) -> IRModule:
        mod = self.mod
        first = mod if mod.is_typed else _infer(mod, "after eta-expansion")
        needs = _needs_specialization(first)
        if not needs:
            return first
        if "main" in needs:
            raise Error("defunctionalization: @main is polymorphic and higher-order; give its "
                        "parameters concrete types")
        self.pending = [n for n, fn in self.funcs.items() if n not in needs]
        tm = first
        while self.pending:
            todo, self.pending = self.pending, []
            for name in todo:
                self.funcs[name] = self.redirect(tm, tm[name], needs)
            if self.pending:
                tm = _infer(IRModule(self.funcs, self.tdefs), "after specialization")
        for name in needs:
            del self.funcs[name]
        return IRModule(self.funcs, self.tdefs)

    def redirect(self, tm: IRModule, fn: Function, needs: set[str]) -> Function:
        done: dict[int, Expr] = {}
        for node in post_order(fn):
            out = with_children(node, [done[id(k)] for k in children(node)])
            if isinstance(node, Call) and isinstance(node.op, GlobalVar) and node.op.name in needs:
                assert isinstance(out, Call)  # with_children rebuilds a node as its own kind
                out = Call(GlobalVar(self.instance(tm, node)), out.args, span=node.span)
            done[id(node)] = out
        new = done[id(fn)]
        assert isinstance(new, Function)
        return new


def _specialize(generic: Function, sigma: dict[Type, Type]) -> Function:
    def retype(t: Type | None) -> Type | None:
        return None if t is None else substitute(t, sigma)

    ft = generic.checked_type
    assert isinstance(ft, FuncType)
    params = tuple(Var(p.name_hint, substitute(t, sigma), span=p.span)
                   for p, t in zip(generic.params, ft.arg_types))
    body = fresh_copy(generic.body, dict(zip(generic.params, params)), retype=retype)
    return Function(params, body, substitute(ft.ret_type, sigma), (), generic.attrs,
                    span=generic.span)


def _fresh(base: str, taken: object) -> str:
    name, n = base, 0
    while name in taken:  # type: ignore[operator]
        n += 1
        name = f"{base}_{n}"
    return name


# --- step 2: function values become data -------------------------------------------------------


@dataclass
class _FnType:
    """The ADT standing for one function type, and its @apply."""

    ft: FuncType
    header: TypeCall
    apply: GlobalVar
    params: tuple[Var, ...]
    ctors: list[Constructor] = field(default_factory=list)
    clauses: list[Clause] = field(default_factory=list)


class _Defunctionalizer:
    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.taken: set[str] = {gv.name for gv in mod.functions}
        self.taken |= {h.name for h in mod.type_definitions} | set(mod.constructors)
        self.fn_types: dict[FuncType, _FnType] = {}
        self.vars: dict[Var, Var] = {}
        self.ctors: dict[str, Constructor] = {}
        self.tdefs = [self.convert_type_data(td) for td in mod.type_definitions.values()]

    def name(self, base: str) -> str:
        name = _fresh(base, self.taken)
        self.taken.add(name)
        return name

    def fn_type(self, ft: FuncType) -> _FnType:
        info = self.fn_types.get(ft)
        if info is None:
            if _has_type_var(ft):
                raise Error(f"defunctionalization: the polymorphic function type {ft} has no "
                            "single data representation; function values must be monomorphic")
            k = len(self.fn_types)
            header = TypeCall(self.name_header(k), ())
            info = _FnType(ft, header, GlobalVar(self.name(f"apply{k}")), ())
            self.fn_types[ft] = info
            info.params = tuple(Var("a", self.conv(t)) for t in ft.arg_types)
        return info

    def name_header(self, k: int) -> GlobalTypeVar:
        return GlobalTypeVar(self.name(f"Fn{k}"))

    def conv(self, t: Type | None) -> Type | None:
        """``t`` with every function type replaced by its ADT."""
        if t is None:
            return None
        out: dict[int, Type] = {}
        stack: list[tuple[Type, bool]] = [(t, False)]
        while stack:
            x, ready = stack.pop()
            if id(x) in out:
                continue
            if isinstance(x, FuncType):
                out[id(x)] = self.fn_type(x).header
                continue
            kids = type_children(x)
            if kids and not ready:
                stack.append((x, True))
                stack.extend((k, False) for k in kids)
                continue
            out[id(x)] = with_type_children(x, [out[id(k)] for k in kids])
        return out[id(t)]

    def convert_type_data(self, td: TypeData) -> TypeData:
        ctors = []
        for c in td.constructors:
            if any(_has_poly_function(t) for t in c.inputs):
                raise Error(f"defunctionalization: constructor {c.name} of type "
                            f"{td.header.name} holds a function of the type's parameters; "
                            "such ADTs would need one copy per instance, which kiln does not "
                            "make", c.span)
            new = Constructor(c.name, tuple(self.conv(t) for t in c.inputs),  # type: ignore
                              c.belong_to, span=c.span)
            self.ctors[c.name] = new
            ctors.append(new)
        return TypeData(td.header, td.type_vars, tuple(ctors), span=td.span)

    def var(self, v: Var) -> Var:
        nv = self.vars.get(v)
        if nv is None:
            ann = self.conv(v.type_annotation)
            nv = v if ann is v.type_annotation else Var(v.name_hint, ann, span=v.span)
            self.vars[v] = nv
        return nv

    def pattern(self, p: Pattern) -> Pattern:
        done: dict[int, Pattern] = {}
        stack: list[tuple[Pattern, bool]] = [(p, False)]
        while stack:
            q, ready = stack.pop()
            kids = pattern_children(q)
            if kids and not ready:
                stack.append((q, True))
                stack.extend((k, False) for k in kids)
                continue
            match q:
                case PatternVar():
                    done[id(q)] = PatternVar(self.var(q.var), span=q.span)
                case PatternConstructor():
                    done[id(q)] = PatternConstructor(self.ctors.get(q.constructor.name,
                                                                    q.constructor),
                                                     tuple(done[id(k)] for k in kids), span=q.span)
                case PatternTuple():
                    done[id(q)] = PatternTuple(tuple(done[id(k)] for k in kids), span=q.span)
                case _:
                    done[id(q)] = q
        return done[id(p)]

    # --- expressions ----------------------------------------------------------------------------

    def function(self, fn: Function) -> Function:
        kernels = _kernels(fn)
        order = post_order(fn, gate=lambda n: id(n) not in kernels)
        hint: dict[int, str] = {}
        self_var: dict[int, Var] = {}
        for node in order:
            if isinstance(node, Let) and isinstance(node.value, Function):
                hint[id(node.value)] = node.var.name_hint
                if node.var in free_vars(node.value):
                    self_var[id(node.value)] = node.var
        done: dict[int, Expr] = {}
        for node in order[:-1]:  # the last is fn itself
            done[id(node)] = self.node(node, done, hint, self_var, kernels)
        params = tuple(self.var(p) for p in fn.params)
        return Function(params, done[id(fn.body)], self.conv(fn.ret_type), fn.type_params,
                        fn.attrs, span=fn.span)

    def node(self, e: Expr, done: dict, hint: dict, self_var: dict, kernels: set[int]) -> Expr:
        match e:
            case Var():
                return self.var(e)
            case Constructor():
                return self.ctors.get(e.name, e)
            case Function() if id(e) in kernels:
                return e
            case Function():
                return self.source(e, done, hint.get(id(e), "lambda"), self_var.get(id(e)))
            case Let():
                return Let(self.var(e.var), done[id(e.value)], done[id(e.body)], span=e.span)
            case Match():
                clauses = tuple(Clause(self.pattern(c.lhs), done[id(c.rhs)], span=c.span)
                                for c in e.clauses)
                return Match(done[id(e.data)], clauses, e.complete, span=e.span)
            case Call(op=Op() | GlobalVar() | Constructor()):
                return with_children(e, [done[id(k)] for k in children(e)])
            case Call(op=Function() as f) if id(f) in kernels:
                return with_children(e, [done[id(k)] for k in children(e)])
            case Call():
                ft = e.op.checked_type
                if not isinstance(ft, FuncType):
                    raise Error(f"defunctionalization: cannot call a value of type {ft}", e.span)
                info = self.fn_type(ft)
                args = tuple(done[id(a)] for a in e.args)
                return Call(info.apply, (done[id(e.op)], *args), span=e.span)
        return with_children(e, [done[id(k)] for k in children(e)])

    def source(self, fn: Function, done: dict, hint: str, self_var: Var | None) -> Expr:
        """A function literal as a constructor call; its body becomes a clause of @apply."""
        ft = fn.checked_type
        assert isinstance(ft, FuncType)
        if fn.type_params or _has_type_var(ft):
            raise Error(f"defunctionalization: the function literal {hint} is polymorphic "
                        f"({ft}); function values must be monomorphic", fn.span)
        info = self.fn_type(ft)
        captured = [v for v in free_vars(fn) if v is not self_var]
        ctor = Constructor(self.name(f"{info.header.func.name}_{hint}"),
                           tuple(self.conv(v.checked_type) for v in captured),  # type: ignore
                           info.header.func, span=fn.span)
        info.ctors.append(ctor)
        fields = tuple(Var(v.name_hint, self.conv(v.checked_type)) for v in captured)
        subst: dict[Var, Expr] = {self.var(v): f for v, f in zip(captured, fields)}
        subst.update({self.var(p): a for p, a in zip(fn.params, info.params)})
        if self_var is not None:
            subst[self.var(self_var)] = Call(ctor, fields)
        body = rewrite(done[id(fn.body)], lambda e: subst.get(e) if isinstance(e, Var) else None)
        pattern = PatternConstructor(ctor, tuple(PatternVar(f) for f in fields))
        info.clauses.append(Clause(pattern, body, span=fn.span))
        return Call(ctor, tuple(self.var(v) for v in captured), span=fn.span)

    def run(self) -> IRModule:
        funcs: dict[GlobalVar, Function] = {}
        for gv, fn in self.mod.functions.items():
            funcs[gv] = fn if is_primitive(fn) else self.function(fn)
        tdefs = list(self.tdefs)
        k = 0
        infos = list(self.fn_types.values())
        while k < len(infos):  # building an @apply may meet new function types
            info = infos[k]
            k += 1
            f = Var("f", info.header)
            if not info.ctors:  # no function of this type exists; @apply is never called
                none = Constructor(self.name(f"{info.header.func.name}_none"), (),
                                   info.header.func)
                info.ctors.append(none)
                info.clauses.append(Clause(PatternConstructor(none, ()),
                                           Call(info.apply, (f, *info.params))))
            body = Match(f, tuple(info.clauses))
            funcs[info.apply] = Function((f, *info.params), body, self.conv(info.ft.ret_type))
            tdefs.append(TypeData(info.header.func, (), tuple(info.ctors)))
            infos = list(self.fn_types.values())
        try:  # typed again: the types left on unchanged nodes still mention functions
            return infer_types(IRModule(funcs, tdefs))
        except TypeCheckError as e:
            raise InternalError(f"defunctionalization produced an ill-typed module: "
                                f"{e.message}") from None


def _kernels(fn: Function) -> set[int]:
    """The fused kernels in ``fn``: left alone, and allowed only as callees."""
    kernels = set()
    for node in post_order(fn):
        for i, k in enumerate(children(node)):
            if isinstance(k, Function) and is_primitive(k):
                if not (isinstance(node, Call) and i == 0):
                    raise Error("defunctionalization: a fused kernel (Primitive=1) is used as a "
                                "value; kernels can only be called", k.span)
                kernels.add(id(k))
    return kernels


def _is_first_order(mod: IRModule) -> bool:
    """No function values anywhere: no function-typed value, parameter or ADT field."""
    for td in mod.type_definitions.values():
        if any(_mentions_function(t) for c in td.constructors for t in c.inputs):
            return False
    for fn in mod.functions.values():
        if any(_mentions_function(p.checked_type) for p in fn.params) or (
                _mentions_function(fn.checked_type.ret_type)):  # type: ignore[attr-defined]
            return False
        order = post_order(fn.body)
        callees = {id(e.op) for e in order if isinstance(e, Call)}
        for e in order:
            if id(e) not in callees and _mentions_function(e.checked_type):
                return False
    return True


def _mentions_function(t: Type) -> bool:
    stack = [t]
    while stack:
        x = stack.pop()
        if isinstance(x, FuncType):
            return True
        stack.extend(type_children(x))
    return False


@module_pass("defunctionalization", opt_level=0)
def Defunctionalization(mod: IRModule, ctx: PassContext) -> IRModule:
    """Replace function values by data (an ADT per function type) and calls by @apply."""
    mod = typed(mod)
    if _is_first_order(mod):
        return mod
    funcs = {gv: fn if is_primitive(fn) else eta_expand_function(fn, (GlobalVar, Constructor),
                                                                 annotate=False)
             for gv, fn in mod.functions.items()}
    if any(funcs[gv] is not fn for gv, fn in mod.functions.items()):
        mod = IRModule(funcs, mod.type_definitions)
    mono = _Specializer(mod).run()
    return _Defunctionalizer(mono if mono.is_typed else _infer(mono, "after specialization")).run()
