"""Higher-order reverse mode (Relay's algorithm): differentiate the whole language.

Every floating-point tensor ``v`` of the program becomes a pair ``(v, ref(adjoint))`` whose
reference starts at zero; integer and boolean tensors stay as they are, and tuples, closures,
references and ADT values hold transformed values (``Tensor[float]`` becomes
``(Tensor, ref(Tensor))`` in every type). A reference ``%bp`` holds the backpropagator, a
closure of no arguments. Each differentiable operator call computes its result, pairs it with
a zero adjoint, and replaces ``%bp`` by a closure that reads the result's adjoint, runs the
operator's gradient rule, adds each contribution into its input's adjoint, and then calls the
previous backpropagator (a tail call: the chain runs in constant stack). After the forward
pass the differentiated output's adjoint is seeded, ``ref_read(%bp)()`` runs the chain, and
the parameters' references hold their gradients.

Closures capture ``%bp`` like any other variable. A global function that touches
floating-point values is transformed into a local recursive function taking ``%bp`` as a last
argument (mutual recursion is tied through references), so the gradient function needs from
its module only what the original did. Globals that never touch floating-point values (list
utilities, counters) are called as they are. ADTs must keep their tensors in type parameters
(``List[A]``, not a type with a ``Tensor`` field), so that their definitions serve unchanged.

The paired values are built and taken apart in `kiln.ad.dual`; `kiln.ad.activity` tells which
values may depend on a differentiated parameter (the others need no backward step).
"""

from __future__ import annotations

from kiln.ad.activity import Taint
from kiln.ad.common import (
    UNIT,
    Binder,
    LetList,
    apply_rule,
    has_float,
    is_plain,
    project,
)
from kiln.ad.dual import Types, accumulate, pair, primal, read_adjoint
from kiln.ad.grad import GradSpec
from kiln.errors import Error, InternalError
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
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
from kiln.ir.traverse import Visit, post_order, trampoline
from kiln.ir.ty import (
    FuncType,
    RefType,
)

BP_TYPE = RefType(FuncType((), UNIT))


# --- the transformation of one function body ------------------------------------------------


class _Transform:
    """Transforms the expressions of one function (main or a global) with its ``%bp``."""

    def __init__(self, ad: _HigherOrder, bp: Var, taint: Taint, owner: str | None) -> None:
        self.ad = ad
        self.bp = bp
        self.taint = taint
        self.owner = owner  # the global being transformed, None for the differentiated fn
        self.memo: dict[int, Expr] = {}

    def run(self, e: Expr) -> Expr:
        return trampoline(self.visit(e))

    def bind_var(self, v: Var, annotate: bool) -> Var:
        nv = self.ad.var_map.get(v)
        if nv is None:
            t = self.ad.types.ad(v.checked_type)
            nv = Var(v.name_hint, t if annotate else None, checked_type_=t)
            self.ad.var_map[v] = nv
        return nv

    def pattern(self, p: Pattern) -> Pattern:
        # Patterns are shallow trees written by people (kiln.infer rebuilds them this way too).
        match p:
            case PatternVar():
                return PatternVar(self.bind_var(p.var, False), span=p.span)
            case PatternConstructor():
                self.ad.types.check_adt(p.constructor.belong_to, p.span)
                subs = tuple(self.pattern(s) for s in p.patterns)
                return PatternConstructor(p.constructor, subs, span=p.span)
            case PatternTuple():
                return PatternTuple(tuple(self.pattern(s) for s in p.patterns), span=p.span)
        return p

    def visit(self, e: Expr) -> Visit:
        done = self.memo.get(id(e))
        if done is not None:
            return done
        out: Expr
        match e:
            case Var():
                bound = self.ad.var_map.get(e)
                if bound is None:
                    raise InternalError(f"variable %{e.name_hint} has no transformed binding")
                out = bound
            case Constant():
                out = pair(e, e.checked_type)
            case GlobalVar():
                out = self.ad.global_value(e, self)
            case Constructor():
                self.ad.types.check_adt(e.belong_to, e.span)
                out = e
            case Tuple():
                fields = []
                for f in e.fields:
                    fields.append((yield self.visit(f)))
                out = Tuple(tuple(fields), span=e.span)
            case TupleGetItem():
                out = TupleGetItem((yield self.visit(e.tuple_value)), e.index, span=e.span)
            case Let():
                out = yield from self.visit_let(e)
            case Function():
                params = tuple(self.bind_var(p, True) for p in e.params)
                body = yield self.visit(e.body)
                ret = self.ad.types.ad(e.ret_type) if e.ret_type is not None else None
                out = Function(params, body, ret, e.type_params, e.attrs, span=e.span)
            case Call(op=Op()):
                out = yield from self.visit_op_call(e)
            case Call():
                out = yield from self.visit_call(e)
            case If():
                cond = yield self.visit(e.cond)
                then = yield self.visit(e.true_branch)
                other = yield self.visit(e.false_branch)
                out = If(cond, then, other, span=e.span)
            case Match():
                data = yield self.visit(e.data)
                clauses = []
                for c in e.clauses:
                    lhs = self.pattern(c.lhs)
                    clauses.append(Clause(lhs, (yield self.visit(c.rhs)), span=c.span))
                out = Match(data, tuple(clauses), e.complete, span=e.span)
            case RefCreate():
                out = RefCreate((yield self.visit(e.value)), span=e.span)
            case RefRead():
                out = RefRead((yield self.visit(e.ref)), span=e.span)
            case RefWrite():
                ref = yield self.visit(e.ref)
                out = RefWrite(ref, (yield self.visit(e.value)), span=e.span)
            case _:
                raise InternalError(f"cannot differentiate a {type(e).__name__}")
        self.memo[id(e)] = out
        return out

    def visit_let(self, e: Let) -> Visit:
        # A loop over the chain: A-normal-form programs are let chains thousands deep.
        chain = []
        body: Expr = e
        while isinstance(body, Let) and id(body) not in self.memo:
            # A let-bound function may call itself: annotate it (polymorphic recursion).
            nv = self.bind_var(body.var, isinstance(body.value, Function))
            chain.append((body, nv, (yield self.visit(body.value))))
            body = body.body
        out = yield self.visit(body)
        for node, nv, value in reversed(chain):
            out = Let(nv, value, out, span=node.span)
            self.memo[id(node)] = out
        return out

    def visit_call(self, e: Call) -> Visit:
        args = []
        for a in e.args:
            args.append((yield self.visit(a)))
        if isinstance(e.op, GlobalVar) and self.ad.needs_ad(e.op.name):
            return Call(self.ad.global_ref(e.op.name, self), (*args, self.bp), span=e.span)
        if isinstance(e.op, Constructor):
            self.ad.types.check_adt(e.op.belong_to, e.span)
        callee = yield self.visit(e.op)
        return Call(callee, tuple(args), span=e.span)

    def visit_op_call(self, e: Call) -> Visit:
        lets = LetList()
        values: list[Expr] = []  # transformed arguments (constants as they are)
        primals: list[Expr] = []
        active: list[bool] = []
        for i, a in enumerate(e.args):
            t = a.checked_type
            if isinstance(a, Constant):  # no adjoint to collect
                values.append(a)
                primals.append(a)
                active.append(False)
                continue
            value = lets.bind((yield self.visit(a)), f"a{i}")
            values.append(value)
            forward_arg = primal(value, t)
            if not isinstance(forward_arg, Var):  # typed, for the gradient rule
                forward_arg = lets.push(forward_arg, "p", t)
            primals.append(forward_arg)
            active.append(has_float(t) and self.taint.of(a))
        forward = Call(e.op, tuple(primals), e.attrs, span=e.span)
        out_t = e.checked_type
        if not has_float(out_t):  # comparisons, argmax, casts to integers: no adjoint
            return lets.build(forward)
        result = lets.push(forward, "v", out_t)
        paired = lets.push(pair(result, out_t), "r")
        if not any(active):
            return lets.build(paired)
        previous = lets.push(RefRead(self.bp), "prev")
        back = LetList()
        g = back.push(read_adjoint(paired, out_t), "g", out_t)
        rule_call = Call(e.op, tuple(primals), e.attrs, checked_type_=out_t)
        grads = apply_rule(rule_call, g, e)
        binder = Binder(back, {id(rule_call): result})
        for i, ga in enumerate(grads):
            if ga is not None and active[i]:
                accumulate(back, values[i], e.args[i].checked_type, binder.bind(ga))
        backprop = Function((), back.build(Call(previous, ())), UNIT)
        lets.push(RefWrite(self.bp, backprop), "_")
        return lets.build(paired)


# --- globals and the whole transformation ---------------------------------------------------


class _HigherOrder:
    """One differentiation: the transformed variables and global functions."""

    def __init__(self, mod: IRModule | None) -> None:
        self.mod = mod
        self.types = Types(mod)
        self.var_map: dict[Var, Var] = {}
        self.locals: dict[str, Var] = {}  # transformed global -> the local function holding it
        self.knots: dict[str, Var] = {}  # members of mutually recursive groups -> their ref
        self.scc: dict[str, frozenset[str]] = {}
        self.needed: dict[str, bool] = {}
        self.refs: dict[str, set[str]] = {}

    def analyse(self, root: Expr) -> None:
        """Find the globals ``root`` reaches, which of them need transforming, and their
        groups of mutual recursion."""
        todo = _global_names(root)
        while todo:
            name = todo.pop()
            if name in self.refs:
                continue
            fn = self._global(name)
            self.refs[name] = _global_names(fn.body)
            todo |= self.refs[name]
        touches = {n: _touches_float(self._global(n)) for n in self.refs}
        needed = {n for n, t in touches.items() if t}
        changed = True
        while changed:
            changed = False
            for n, callees in self.refs.items():
                if n not in needed and callees & needed:
                    needed.add(n)
                    changed = True
        self.needed = {n: n in needed for n in self.refs}
        reach = {n: _reachable(n, self.refs, needed) for n in needed}
        for n in needed:
            self.scc[n] = frozenset(m for m in reach[n] if n in reach[m]) | {n}

    def _global(self, name: str) -> Function:
        if self.mod is None:
            raise Error(f"the function calls @{name}: pass the module that defines it (mod=)")
        return self.mod[name]

    def needs_ad(self, name: str) -> bool:
        return self.needed.get(name, False)

    def global_ref(self, name: str, where: _Transform) -> Expr:
        """How the body being transformed refers to the transformed global ``name``."""
        if name not in self.locals:
            fn = self._global(name)
            ft = self.types.ad(fn.checked_type)
            assert isinstance(ft, FuncType)
            full = FuncType((*ft.arg_types, BP_TYPE), ft.ret_type, ft.type_params)
            self.locals[name] = Var(f"{name}_grad", full)
            if len(self.scc[name]) > 1:
                self.knots[name] = Var(f"{name}_knot", RefType(full))
        owner = where.owner
        if owner is not None and owner != name and name in self.scc[owner]:
            return RefRead(self.knots[name])  # a peer in a group of mutual recursion
        return self.locals[name]

    def global_value(self, gv: GlobalVar, where: _Transform) -> Expr:
        """A global used as a value: itself, or its transformed version closed over ``%bp``."""
        if not self.needs_ad(gv.name):
            return gv
        target = self.global_ref(gv.name, where)
        ft = self.types.ad(self._global(gv.name).checked_type)
        assert isinstance(ft, FuncType)
        params = tuple(Var(f"a{i}", t) for i, t in enumerate(ft.arg_types))
        body = Call(target, (*params, where.bp))
        return Function(params, body, ft.ret_type, ft.type_params)

    def transform_global(self, name: str) -> Function:
        fn = self._global(name)
        bp = Var("bp", BP_TYPE)
        taint = Taint(fn.body, set(fn.params))
        t = _Transform(self, bp, taint, name)
        params = tuple(t.bind_var(p, True) for p in fn.params)
        body = t.run(fn.body)
        ret = self.types.ad(fn.ret_type) if fn.ret_type is not None else None
        return Function((*params, bp), body, ret, fn.type_params, fn.attrs)

    def emit_globals(self, lets: LetList) -> None:
        """Bind every transformed global, callees before callers."""
        done: dict[str, Function] = {}
        while len(done) < len(self.locals):
            for name in list(self.locals):
                if name not in done:
                    done[name] = self.transform_global(name)  # may discover more globals
        emitted: set[str] = set()
        groups = []
        for name in self.locals:
            group = self.scc[name] & set(self.locals)
            if group not in groups:
                groups.append(group)
        while groups:
            for group in groups:
                callees = set().union(*(self.refs[n] for n in group)) & set(self.locals)
                if callees - group <= emitted:
                    break
            else:
                raise InternalError("the transformed globals have no order")
            groups.remove(group)
            members = sorted(group, key=list(self.locals).index)
            if len(members) > 1:
                for n in members:  # placeholders, replaced once every member exists
                    lets.bindings.append((self.knots[n], RefCreate(_placeholder(self.locals[n]))))
            for n in members:
                lets.bindings.append((self.locals[n], done[n]))
            if len(members) > 1:
                for n in members:
                    lets.push(RefWrite(self.knots[n], self.locals[n]), "_")
            emitted |= group


def _placeholder(v: Var) -> Expr:
    """A function of ``v``'s type that is never called: it only fills a reference at first."""
    ft = v.type_annotation
    assert isinstance(ft, FuncType)
    self_var = Var(f"{v.name_hint}_unset", ft)
    params = tuple(Var(f"a{i}", t) for i, t in enumerate(ft.arg_types))
    fn = Function(params, Call(self_var, params), ft.ret_type, ft.type_params)
    return Let(self_var, fn, self_var)


def _global_names(e: Expr) -> set[str]:
    return {n.name for n in post_order(e) if isinstance(n, GlobalVar)}


def _touches_float(fn: Function) -> bool:
    if has_float(fn.checked_type):
        return True
    return any(
        n.checked_type_ is not None and has_float(n.checked_type_) for n in post_order(fn.body)
    )


def _reachable(start: str, refs: dict[str, set[str]], within: set[str]) -> set[str]:
    seen: set[str] = set()
    todo = [start]
    while todo:
        n = todo.pop()
        for m in refs.get(n, ()):
            if m in within and m not in seen:
                seen.add(m)
                todo.append(m)
    return seen


def differentiate(spec: GradSpec, mod: IRModule | None) -> Function:
    """The gradient function of ``spec.fn`` by Relay's higher-order algorithm."""
    fn = spec.fn
    ad = _HigherOrder(mod)
    ad.analyse(fn.body)
    for p in fn.params:
        t = p.checked_type
        if has_float(t) and not is_plain(t):
            raise Error(
                f"higher_order differentiation takes parameters that are tensors, tuples of "
                f"tensors, or values holding no floating-point tensor; %{p.name_hint} has type "
                f"{t}. Pass its tensors as parameters and build the value inside the function"
            )
    bp = Var("bp", BP_TYPE)
    lets = LetList()
    lets.bindings.append((bp, RefCreate(Function((), Tuple(()), UNIT))))
    params = LetList()
    for p in fn.params:
        if has_float(p.checked_type):
            ad.var_map[p] = params.push(pair(p, p.checked_type), f"{p.name_hint}_ad")
        else:
            ad.var_map[p] = p
    taint = Taint(fn.body, {fn.params[i] for i in spec.wrt})
    body = _Transform(ad, bp, taint, None).run(fn.body)
    ad.emit_globals(lets)
    lets.bindings.extend(params.bindings)
    result_t = fn.body.checked_type
    result = lets.push(body, "result")
    forward = lets.bind(primal(result, result_t), "value", result_t)
    for path, seed in spec.seed_leaves(lambda path: project(forward, path)):
        adjoint = TupleGetItem(project(result, path), 1)
        lets.push(RefWrite(adjoint, RefRead(adjoint) + seed), "_")
    lets.push(Call(RefRead(bp), ()), "_")
    grads = []
    for i in spec.wrt:
        p = fn.params[i]
        grads.append(lets.push(read_adjoint(ad.var_map[p], p.checked_type), f"d_{p.name_hint}"))
    return Function(spec.params(), lets.build(spec.assemble(forward, grads)))

