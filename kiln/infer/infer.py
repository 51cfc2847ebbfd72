"""Type inference: Relay's unification plus operator type relations solved to a fixpoint.

Every expression gets a type, at first possibly unknown (an `IncompleteType`). Walking the
program in evaluation order equates types as each construct demands (`Unifier`); an operator
call runs its type relation as soon as its argument types are known, and waits in a queue
otherwise. After the walk the queue is run until nothing changes. Finally the program is
rebuilt with every node's resolved type in ``checked_type``.

Polymorphic globals and constructors are instantiated with fresh unknowns at each use. A
module's globals are checked callees first, one group of mutually recursive globals at a time
(`inference_order`): a polymorphic global's type, its result type included, is complete before
any caller outside its group instantiates it. Inside a group, a polymorphic global whose type
is not yet known is used at an unknown type that is checked against an instance of its type
once that is known (`_Instance`), so mutual recursion needs no annotations beyond Relay's.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import Error, InternalError, Span, TypeCheckError
from kiln.infer.exhaustive import unmatched_case
from kiln.infer.order import inference_order
from kiln.infer.unify import Mismatch, Unifier
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
    TypeData,
    pattern_vars,
)
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
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import Visit, children, free_vars, post_order, trampoline
from kiln.ir.ty import (
    FuncType,
    IncompleteType,
    RefType,
    TensorType,
    TupleType,
    Type,
    TypeCall,
    TypeVar,
    scalar_type,
    substitute,
    type_children,
)
from kiln.op import registry
from kiln.op.registry import OpDef

BOOL_SCALAR = scalar_type("bool")
UNIT = TupleType(())


def span_of(e: Expr, outer: Span | None) -> Span | None:
    """Where ``e`` is in the source; a variable's own span is its binding, so use the context."""
    if isinstance(e, Var):
        return outer
    return e.span or outer


def describe(e: Expr) -> str:
    """A short text for an expression, for messages about programs without source text."""
    match e:
        case Var():
            return f"%{e.name_hint}"
        case GlobalVar():
            return f"@{e.name}"
        case Op():
            return e.name
        case Constructor():
            return e.name
        case Constant():
            return "a constant" if e.data.ndim else f"{e.data.item()!r}"
        case Call():
            args = ", ".join(describe(a) if not isinstance(a, Call) else "..." for a in e.args)
            return f"{describe(e.op)}({args})"
        case Function():
            return "fn (" + ", ".join(f"%{p.name_hint}" for p in e.params) + ") {...}"
    return type(e).__name__


class _Relation:
    """An operator call whose argument types were not yet known when it was reached."""

    __slots__ = ("opdef", "call", "arg_types", "attrs", "values", "out", "span")

    def __init__(self, opdef, call, arg_types, attrs, values, out, span):  # noqa: ANN001
        self.opdef, self.call, self.arg_types = opdef, call, arg_types
        self.attrs, self.values, self.out, self.span = attrs, values, out, span

    def try_solve(self, inf: _Inferer) -> bool:
        result = inf.run_relation(self.opdef, self.call, self.arg_types, self.attrs, self.values,
                                  self.span)
        if result is None:
            return False
        inf.unify(self.out, result, f"the result of {self.opdef.name}", self.span)
        return True

    def unsolved_error(self, inf: _Inferer) -> TypeCheckError:
        args = ", ".join(
            f"{name}: {inf.u.resolve(t)}" for name, t in zip(self.opdef.inputs, self.arg_types)
        )
        return TypeCheckError(
            f"cannot infer the type of this call to {self.opdef.name}: its argument types are "
            f"not known ({args}); annotate the parameters it depends on"
            + inf.where(self.call, self.span),
            self.span,
        )


class _Projection:
    """``t.i`` where the type of ``t`` was not yet known when it was reached."""

    __slots__ = ("expr", "tuple_type", "out", "span")

    def __init__(self, expr, tuple_type, out, span):  # noqa: ANN001
        self.expr, self.tuple_type, self.out, self.span = expr, tuple_type, out, span

    def try_solve(self, inf: _Inferer) -> bool:
        t = inf.u.find(self.tuple_type)
        if isinstance(t, IncompleteType):
            return False
        inf.unify(self.out, inf.project(self.expr, t, self.span), "the projection", self.span)
        return True

    def unsolved_error(self, inf: _Inferer) -> TypeCheckError:
        return TypeCheckError(
            f"cannot infer the type of the tuple projected by .{self.expr.index}; annotate it"
            + inf.where(self.expr, self.span),
            self.span,
        )


class _Instance:
    """A use of a polymorphic global of the group being checked, made before the global's
    type was complete: the use's type must be an instance of the global's, once that is known.
    """

    __slots__ = ("gv", "use", "span")

    def __init__(self, gv: GlobalVar, use: Type, span: Span | None) -> None:
        self.gv, self.use, self.span = gv, use, span

    def try_solve(self, inf: _Inferer) -> bool:
        scheme = inf.global_types[self.gv.name]
        if not inf.u.is_ground(scheme):
            return False
        inf.unify(self.use, scheme, f"this use of @{self.gv.name}", self.span, self.gv)
        return True

    def unsolved_error(self, inf: _Inferer) -> TypeCheckError:
        name = self.gv.name
        so_far = inf.u.resolve(inf.global_types[name])
        return TypeCheckError(
            f"cannot infer the type of @{name} (so far {so_far}): it is polymorphic and used "
            f"here, within its own recursion, before its body says what it returns; annotate "
            f"its return type (def @{name}[...](...) -> T)" + inf.where(self.gv, self.span),
            self.span,
        )


def _is_nullary_constructor(e: Expr) -> bool:
    # A value such as `Nil` is polymorphic: when rewriting shares one such node between uses
    # at different types, each use gets its own instance of the constructor's type.
    return isinstance(e, Call) and isinstance(e.op, Constructor) and not e.args


class _Inferer:
    """One run of inference over a module (or a lone expression)."""

    def __init__(self, mod: IRModule | None) -> None:
        self.mod = mod
        self.u = Unifier()
        self.types: dict[int, Type] = {}  # id(node) -> its type, maybe still unknown
        self.var_types: dict[Var, Type] = {}
        self.in_scope: set[Var] = set()
        self.global_types: dict[str, Type] = {}
        self.attrs: dict[int, Any] = {}  # id(op call) -> its normalized attributes
        self.pending: list[_Relation | _Projection | _Instance] = []
        self.constant_types: dict[tuple, TensorType] = {}

    # --- helpers ----------------------------------------------------------------------------

    def where(self, e: Expr, span: Span | None) -> str:
        """For programs built in Python (no source), say which expression is meant."""
        return "" if span is not None and span.source is not None else f" (in {describe(e)})"

    def unify(self, expected: Type, found: Type, what: str, span: Span | None,
              e: Expr | None = None) -> Type:
        try:
            return self.u.unify(expected, found)
        except Mismatch as m:
            exp, got = self.u.resolve(expected), self.u.resolve(found)
            suffix = self.where(e, span) if e is not None else ""
            raise TypeCheckError(
                f"{what}: expected {exp}, but found {got}{m.detail}{suffix}", span
            ) from None

    def fresh_or(self, annotation: Type | None) -> Type:
        return annotation if annotation is not None else IncompleteType()

    def bind_var(self, v: Var, span: Span | None) -> Type:
        self.in_scope.add(v)
        known = self.var_types.get(v)
        if known is not None:  # the same Var bound twice: both bindings must agree
            return known
        t = self.fresh_or(v.type_annotation)
        self.var_types[v] = t
        return t

    def type_data(self, c: Constructor, span: Span | None) -> tuple[TypeData, Constructor]:
        if self.mod is None or c.belong_to not in self.mod.type_definitions:
            raise TypeCheckError(
                f"constructor {c.name} belongs to type {c.belong_to.name}, which is not defined "
                "in the module", span)
        td = self.mod.type_definitions[c.belong_to]
        for own in td.constructors:
            if own.name == c.name:
                return td, own
        raise TypeCheckError(f"type {td.header.name} has no constructor {c.name}", span)

    def constructor_type(self, c: Constructor, span: Span | None) -> FuncType:
        td, own = self.type_data(c, span)
        return td.constructor_type(own)

    def run_relation(self, opdef: OpDef, call: Call, arg_types: list[Type], attrs: Any,
                     values: tuple | None, span: Span | None) -> Type | None:
        resolved = tuple(self.u.resolve(t) for t in arg_types)
        try:
            if opdef.needs_values:
                return opdef.relation(resolved, attrs, values)
            return opdef.relation(resolved, attrs)
        except Error as e:
            raise TypeCheckError(f"{opdef.name}: {e.message}{self.where(call, span)}",
                                 span) from None
        except Exception as e:  # noqa: BLE001 - a relation that crashes is kiln's bug
            raise InternalError(f"the type relation of {opdef.name} failed: {e!r}", span) from e

    def project(self, e: TupleGetItem, t: Type, span: Span | None) -> Type:
        if not isinstance(t, TupleType):
            raise TypeCheckError(
                f"cannot take field {e.index} of a value of type {self.u.resolve(t)}: it is not "
                "a tuple" + self.where(e, span), span)
        if not 0 <= e.index < len(t.fields):
            raise TypeCheckError(
                f"tuple index {e.index} is out of range for a tuple of {len(t.fields)} "
                f"field(s) of type {self.u.resolve(t)}" + self.where(e, span), span)
        return t.fields[e.index]

    # --- the walk -----------------------------------------------------------------------------

    def visit(self, e: Expr, outer: Span | None) -> Visit:
        """The type of ``e`` (a generator, run by `trampoline`)."""
        if isinstance(e, GlobalVar):  # each use of a polymorphic global has its own type
            return self.visit_global(e, span_of(e, outer))
        t = self.types.get(id(e))
        if t is not None and not _is_nullary_constructor(e):
            return t
        span = span_of(e, outer)
        match e:
            case Var():
                t = self.var_types.get(e)
                if t is None or e not in self.in_scope:
                    raise TypeCheckError(
                        f"variable %{e.name_hint} is used outside the scope that binds it", span)
            case Constant():
                key = (e.data.shape, e.data.dtype)
                t = self.constant_types.get(key)
                if t is None:
                    t = self.constant_types[key] = TensorType(e.data.shape, e.data.dtype.name)
            case Constructor():
                t = self.constructor_type(e, span)
            case Op():
                raise TypeCheckError(
                    f"operator {e.name} is used as a value; operators can only be called "
                    f"(wrap it in a function: fn (%a) {{ {e.name}(%a) }})", span)
            case Tuple():
                fields = []
                for f in e.fields:
                    fields.append((yield self.visit(f, span)))
                t = TupleType(tuple(fields))
            case TupleGetItem():
                tt = yield self.visit(e.tuple_value, span)
                found = self.u.find(tt)
                if isinstance(found, IncompleteType):
                    t = IncompleteType()
                    self.pending.append(_Projection(e, tt, t, span))
                else:
                    t = self.project(e, found, span)
            case Let():
                t = yield from self.visit_let(e, span)
            case Function():
                t = yield from self.visit_function(e, span)
            case Call():
                t = yield from self.visit_call(e, span)
            case If():
                t = yield from self.visit_if(e, span)
            case Match():
                t = yield from self.visit_match(e, span)
            case RefCreate():
                t = RefType((yield self.visit(e.value, span)))
            case RefRead():
                rt = yield self.visit(e.ref, span)
                t = IncompleteType()
                self.unify(rt, RefType(t), "ref_read needs a reference", span, e)
            case RefWrite():
                rt = yield self.visit(e.ref, span)
                vt = yield self.visit(e.value, span)
                self.unify(rt, RefType(vt), "ref_write writes a value of the reference's type",
                           span, e)
                t = UNIT
            case _:
                raise InternalError(f"type inference met an unknown node {type(e).__name__}")
        if not isinstance(e, Var):  # a variable's scope is checked at every use
            self.types[id(e)] = t
        return t

    def visit_global(self, e: GlobalVar, span: Span | None) -> Type:
        """The type of one use of a global: its type, or an unknown checked against it later."""
        t = self.global_types.get(e.name)
        if t is None:
            raise TypeCheckError(f"there is no global function @{e.name}", span)
        self.types[id(e)] = t  # the node's own type is the global's (polymorphic) type
        found = self.u.find(t)
        if not isinstance(found, FuncType) or not found.type_params:
            return t  # monomorphic: every use shares the global's one type
        if self.u.is_ground(found):
            return self.u.resolve(found)
        # Used inside its own recursive group before its type is known: sharing the unknowns
        # of its type with this use would let the caller's types leak into the global's.
        use = IncompleteType()
        self.pending.append(_Instance(e, use, span))
        return use

    def visit_let(self, e: Let, span: Span | None) -> Visit:
        # Walk a let chain in a loop: A-normal-form chains are thousands deep.
        chain = []
        body: Expr = e
        while isinstance(body, Let) and id(body) not in self.types:
            sp = body.span or span
            vt = self.bind_var(body.var, sp)  # in scope in its own value: recursive closures
            value_t = yield self.visit(body.value, sp)
            self.unify(vt, value_t, f"the value bound to %{body.var.name_hint}", sp, body.var)
            chain.append(body)
            body = body.body
        t = yield self.visit(body, span)
        for node in chain:
            self.types[id(node)] = t
            self.in_scope.discard(node.var)
        return t

    def visit_function(self, f: Function, span: Span | None) -> Visit:
        params = tuple(self.bind_var(p, span) for p in f.params)
        ret = self.fresh_or(f.ret_type)
        body_t = yield self.visit(f.body, span)
        self.in_scope.difference_update(f.params)
        self.unify(ret, body_t, "the function's body must have its declared result type",
                   span_of(f.body, span), f)
        return FuncType(params, ret, f.type_params)

    def visit_call(self, c: Call, span: Span | None) -> Visit:
        if isinstance(c.op, Op):
            return (yield from self.visit_op_call(c, c.op, span))
        if c.attrs:
            raise TypeCheckError(
                f"only operator calls take attributes; this call of {describe(c.op)} has "
                f"{', '.join(c.attrs)}", span)
        if isinstance(c.op, Constructor):
            callee: Type = self.constructor_type(c.op, span)
            self.types[id(c.op)] = callee
        else:
            callee = yield self.visit(c.op, span)
        args = []
        for a in c.args:
            args.append((yield self.visit(a, span)))
        ft = self.u.find(callee)
        if isinstance(ft, IncompleteType):
            ret = IncompleteType()
            self.unify(ft, FuncType(tuple(args), ret), "the called value", span, c)
            return ret
        if not isinstance(ft, FuncType):
            raise TypeCheckError(
                f"cannot call {describe(c.op)}: it has type {self.u.resolve(ft)}, not a function "
                "type" + self.where(c, span), span)
        ft = self.u.instantiate(ft)
        if len(ft.arg_types) != len(args):
            raise TypeCheckError(
                f"{describe(c.op)} takes {len(ft.arg_types)} argument(s) but is given "
                f"{len(args)}" + self.where(c, span), span)
        for i, (p, a) in enumerate(zip(ft.arg_types, args)):
            self.unify(p, a, f"argument {i + 1} of the call to {describe(c.op)}",
                       span_of(c.args[i], span), c)
        return ft.ret_type

    def visit_op_call(self, c: Call, op: Op, span: Span | None) -> Visit:
        opdef = registry.get(op.name, span)  # an unknown name raises with a suggestion
        if len(c.args) != opdef.num_inputs:
            raise TypeCheckError(
                f"{opdef.name} takes {opdef.num_inputs} argument(s) ({', '.join(opdef.inputs)}) "
                f"but is given {len(c.args)}" + self.where(c, span), span)
        args = []
        for a in c.args:
            args.append((yield self.visit(a, span)))
        try:
            attrs = opdef.normalize_attrs(c.attrs, span)
        except TypeCheckError:
            raise
        except Error as e:
            raise TypeCheckError(e.message + self.where(c, span), span) from None
        self.attrs[id(c)] = attrs
        values = None
        if opdef.needs_values:
            values = tuple(a.data if isinstance(a, Constant) else None for a in c.args)
        out = self.run_relation(opdef, c, args, attrs, values, span)
        if out is None:
            out = IncompleteType()
            self.pending.append(_Relation(opdef, c, args, attrs, values, out, span))
        return out

    def visit_if(self, e: If, span: Span | None) -> Visit:
        ct = yield self.visit(e.cond, span)
        self.unify(BOOL_SCALAR, ct, "the condition of an if must be a scalar bool tensor",
                   span_of(e.cond, span), e.cond)
        tt = yield self.visit(e.true_branch, span)
        ft = yield self.visit(e.false_branch, span)
        try:
            return self.u.unify(tt, ft)
        except Mismatch as m:
            raise TypeCheckError(
                f"the branches of an if have different types: the true branch has type "
                f"{self.u.resolve(tt)} and the false branch {self.u.resolve(ft)}{m.detail}"
                + self.where(e, span), span_of(e.false_branch, span)) from None

    def visit_match(self, e: Match, span: Span | None) -> Visit:
        if not e.clauses:
            raise TypeCheckError("a match needs at least one clause", span)
        dt = yield self.visit(e.data, span)
        result: Type | None = None
        for clause in e.clauses:
            cspan = clause.span or span
            self.bind_pattern(clause.lhs, dt, cspan)
            t = yield self.visit(clause.rhs, cspan)
            self.in_scope.difference_update(pattern_vars(clause.lhs))
            if result is None:
                result = t
                continue
            try:
                result = self.u.unify(result, t)
            except Mismatch as m:
                raise TypeCheckError(
                    f"the clauses of a match have different types: {self.u.resolve(result)} and "
                    f"{self.u.resolve(t)}{m.detail}", span_of(clause.rhs, cspan)) from None
        if e.complete and self.mod is not None:
            missing = unmatched_case([c.lhs for c in e.clauses], self.mod)
            if missing is not None:
                raise TypeCheckError(
                    f"this match does not handle every case: {missing} is not matched; "
                    "add a clause, or write match? for a partial match", span)
        return result

    def bind_pattern(self, p: Pattern, t: Type, span: Span | None) -> None:
        stack: list[tuple[Pattern, Type]] = [(p, t)]
        while stack:
            q, qt = stack.pop()
            sp = getattr(q, "span", None) or span
            match q:
                case PatternWildcard():
                    pass
                case PatternVar(var=v):
                    vt = self.bind_var(v, sp)
                    self.unify(vt, qt, f"the pattern variable %{v.name_hint}", sp)
                case PatternConstructor(constructor=c, patterns=subs):
                    td, own = self.type_data(c, sp)
                    fresh: dict[Type, Type] = {tv: IncompleteType() for tv in td.type_vars}
                    expected = TypeCall(td.header, tuple(fresh[tv] for tv in td.type_vars))
                    self.unify(expected, qt, f"the pattern {c.name}(...) is matched against a "
                               "value of another type", sp)
                    if len(subs) != len(own.inputs):
                        raise TypeCheckError(
                            f"constructor {c.name} has {len(own.inputs)} field(s) but the "
                            f"pattern gives {len(subs)}", sp)
                    for sub, it in zip(subs, own.inputs):
                        stack.append((sub, substitute(it, fresh)))
                case PatternTuple(patterns=subs):
                    found = self.u.find(qt)
                    if isinstance(found, IncompleteType):
                        fields = tuple(IncompleteType() for _ in subs)
                        self.unify(found, TupleType(fields), "the tuple pattern", sp)
                        found = TupleType(fields)
                    if not isinstance(found, TupleType) or len(found.fields) != len(subs):
                        raise TypeCheckError(
                            f"a tuple pattern of {len(subs)} field(s) is matched against a value "
                            f"of type {self.u.resolve(qt)}", sp)
                    stack.extend(zip(subs, found.fields))

    # --- solving and rebuilding ---------------------------------------------------------------

    def solve(self, strict: bool = True) -> None:
        """Run the waiting relations, projections and instances until none makes progress.

        ``strict``: what is still waiting then is an error; otherwise it waits on.
        """
        while self.pending:
            waiting = []
            for c in self.pending:
                if not c.try_solve(self):
                    waiting.append(c)
            if len(waiting) == len(self.pending):
                if strict:
                    raise waiting[0].unsolved_error(self)
                return
            self.pending = waiting

    def check_group(self, mod: IRModule, group: list[str]) -> None:
        """Solve what a group of globals constrains and fix its polymorphic types.

        What a monomorphic global leaves unknown may still be settled by its callers; a
        polymorphic global's type must be complete now, before its callers instantiate it.
        """
        for name in group:
            gv = GlobalVar(name)
            fn = mod.functions[gv]
            ft = trampoline(self.visit(fn, fn.span))
            self.unify(self.global_types[name], ft, f"the type of @{name}", fn.span)
        self.solve(strict=False)
        for name in group:
            fn = mod.functions[GlobalVar(name)]
            if not fn.type_params:
                continue
            if self.u.is_ground(self.global_types[name]):
                continue
            scheme = self.u.resolve(self.global_types[name])
            stuck = [p for p in self.pending if isinstance(p, _Instance)] or self.pending
            if stuck:
                raise stuck[0].unsolved_error(self)
            raise TypeCheckError(
                f"cannot infer the type of @{name}: its body leaves part of it unknown "
                f"({scheme}); annotate its parameters and return type", fn.span)

    def check_type_vars(self, mod: IRModule) -> None:
        """Every global's type mentions only its own type parameters.

        A global whose parameters are left to inference, called from inside a polymorphic
        global, can be given that global's type variables, which mean nothing outside it.
        """
        for gv, fn in mod.functions.items():
            t = self.u.resolve(self.global_types[gv.name])
            foreign = _foreign_type_var(t, set(fn.type_params))
            if foreign is None:
                continue
            raise TypeCheckError(
                f"the type of @{gv.name} would be {t}, which mentions the type variable "
                f"{foreign.name} of another function (it is called with values of that type "
                f"there); make @{gv.name} polymorphic (def @{gv.name}[{foreign.name}](...)) or "
                "annotate its parameters", fn.span)

    def final(self, e: Expr, t: Type) -> Type:
        out = self.u.resolve(t)
        if isinstance(out, IncompleteType):
            what = f"%{e.name_hint}" if isinstance(e, Var) else f"this {type(e).__name__}"
            raise TypeCheckError(
                f"cannot infer the type of {what}; add a type annotation"
                + self.where(e, e.span), e.span)
        return out

    def rebuild(self, root: Expr) -> Expr:
        """``root`` with a resolved ``checked_type`` on every node (Vars replaced consistently)."""
        new: dict[int, Expr] = {}
        new_vars: dict[int, Var] = {}

        def var(v: Var) -> Var:
            nv = new_vars.get(id(v))
            if nv is None:
                t = self.var_types.get(v)
                if t is None:
                    raise TypeCheckError(f"variable %{v.name_hint} is never bound", v.span)
                nv = Var(v.name_hint, v.type_annotation, span=v.span,
                         checked_type_=self.final(v, t))
                new_vars[id(v)] = nv
            return nv

        def pattern(p: Pattern) -> Pattern:
            match p:
                case PatternVar():
                    return PatternVar(var(p.var), span=p.span)
                case PatternConstructor():
                    return PatternConstructor(p.constructor, tuple(pattern(s) for s in p.patterns),
                                              span=p.span)
                case PatternTuple():
                    return PatternTuple(tuple(pattern(s) for s in p.patterns), span=p.span)
            return p

        for node in post_order(root):
            if isinstance(node, Var):
                new[id(node)] = var(node)
                continue
            if isinstance(node, Op):
                continue  # typed per call below
            t = self.types.get(id(node))
            if t is None:
                raise InternalError(f"inference left a {type(node).__name__} untyped", node.span)
            ty = self.final(node, t)
            # Children are rebuilt before their parent; an operator is typed per call below.
            kids = [k if isinstance(k, Op) else new[id(k)] for k in children(node)]
            match node:
                case Constant():
                    out: Expr = Constant(node.data, span=node.span, checked_type_=ty)
                case GlobalVar():
                    out = GlobalVar(node.name, span=node.span, checked_type_=ty)
                case Constructor():
                    out = Constructor(node.name, node.inputs, node.belong_to, span=node.span,
                                      checked_type_=ty)
                case Tuple():
                    out = Tuple(tuple(kids), span=node.span, checked_type_=ty)
                case TupleGetItem():
                    out = TupleGetItem(kids[0], node.index, span=node.span, checked_type_=ty)
                case Let():
                    out = Let(var(node.var), kids[0], kids[1], span=node.span, checked_type_=ty)
                case Function():
                    out = Function(tuple(var(p) for p in node.params), kids[0], node.ret_type,
                                   node.type_params, node.attrs, span=node.span, checked_type_=ty)
                case Call():
                    if isinstance(node.op, Op):
                        arg_types = tuple(k.checked_type for k in kids[1:])
                        op = Op(node.op.name, span=node.op.span,
                                checked_type_=FuncType(arg_types, ty))
                        out = Call(op, tuple(kids[1:]), self.attrs[id(node)], span=node.span,
                                   checked_type_=ty)
                    else:
                        out = Call(kids[0], tuple(kids[1:]), node.attrs, span=node.span,
                                   checked_type_=ty)
                case If():
                    out = If(kids[0], kids[1], kids[2], span=node.span, checked_type_=ty)
                case Match():
                    clauses = tuple(Clause(pattern(c.lhs), rhs, span=c.span)
                                    for c, rhs in zip(node.clauses, kids[1:]))
                    out = Match(kids[0], clauses, node.complete, span=node.span, checked_type_=ty)
                case RefCreate():
                    out = RefCreate(kids[0], span=node.span, checked_type_=ty)
                case RefRead():
                    out = RefRead(kids[0], span=node.span, checked_type_=ty)
                case RefWrite():
                    out = RefWrite(kids[0], kids[1], span=node.span, checked_type_=ty)
                case _:
                    raise InternalError(f"cannot rebuild {type(node).__name__}")
            new[id(node)] = out
        return new[id(root)]


def _foreign_type_var(t: Type, allowed: set[TypeVar]) -> TypeVar | None:
    """A type variable in ``t`` that neither ``allowed`` nor an enclosing type binds."""
    stack: list[tuple[Type, frozenset[TypeVar]]] = [(t, frozenset(allowed))]
    seen: set[tuple[int, frozenset[TypeVar]]] = set()  # types share their parts: a DAG
    while stack:
        x, bound = stack.pop()
        if (id(x), bound) in seen:
            continue
        seen.add((id(x), bound))
        if isinstance(x, TypeVar) and x not in bound:
            return x
        if isinstance(x, FuncType) and x.type_params:
            bound = bound | frozenset(x.type_params)
        stack.extend((k, bound) for k in type_children(x))
    return None


def _global_placeholder(fn: Function) -> FuncType:
    params = tuple(p.type_annotation or IncompleteType() for p in fn.params)
    return FuncType(params, fn.ret_type or IncompleteType(), fn.type_params)


def infer_types(obj: IRModule | Expr, mod: IRModule | None = None) -> Any:
    """Type-check a module (or an expression, with ``mod`` for its globals and ADTs).

    Returns a new module (expression) in which every expression has ``.checked_type``.
    Raises `kiln.TypeCheckError` pointing at the offending construct.
    """
    if isinstance(obj, IRModule):
        inf = _Inferer(obj)
        for gv, fn in obj.functions.items():
            inf.global_types[gv.name] = _global_placeholder(fn)
        for group in inference_order(obj):
            inf.check_group(obj, group)
        inf.solve()
        inf.check_type_vars(obj)
        funcs: dict[GlobalVar, Function] = {}
        for gv, fn in obj.functions.items():
            typed_fn = inf.rebuild(fn)
            assert isinstance(typed_fn, Function)  # rebuild keeps the kind of node
            funcs[gv] = typed_fn
        return IRModule(funcs, obj.type_definitions)._mark_typed()
    if isinstance(obj, Expr):
        inf = _Inferer(mod)
        if mod is not None:
            typed = mod if mod.is_typed else infer_types(mod)
            for gv, fn in typed.functions.items():
                inf.global_types[gv.name] = fn.checked_type
        for v in free_vars(obj):
            inf.bind_var(v, v.span)
        trampoline(inf.visit(obj, obj.span))
        inf.solve()
        return inf.rebuild(obj)
    raise Error(f"infer_types takes an IRModule or an expression, not {type(obj).__name__}")
