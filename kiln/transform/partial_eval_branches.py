"""The partial evaluator's rules for control flow: ``if`` and ``match``.

A condition or scrutinee known statically picks its branch, which is evaluated in place. An
unknown one makes a *residual branch* of each arm: its own scope (let-list), with the store
and the memo of shared nodes rolled back after it, since only one arm runs. Afterwards the
store forgets what any arm may have changed (see `PartialEvaluator` in partial_eval.py).
"""

from __future__ import annotations

from kiln.errors import Error
from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternVar,
    PatternWildcard,
)
from kiln.ir.expr import (
    Call,
    Clause,
    Expr,
    Function,
    If,
    Match,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
    TupleGetItem,
    Var,
)
from kiln.ir.traverse import Visit, children
from kiln.transform.partial_eval_values import (
    PV,
    Frame,
    Scope,
    SCtor,
    SRef,
    STensor,
    Store,
    STuple,
    dynamic,
)

_YES, _NO, _UNKNOWN = "yes", "no", "unknown"


class UndefinedSharing(Error):
    """An effectful node shared in graph form between a residual branch and the code after
    it: the partial evaluator cannot say whether its effect happens there."""


class _Effects:
    """What the arms of one residual branch did: references whose knowledge changed, whether
    unknown code ran, and shared nodes (of the frame) first evaluated in an arm."""

    __slots__ = ("changed", "unknown", "evaluated")

    def __init__(self) -> None:
        self.changed: set[SRef] = set()
        self.unknown = False
        self.evaluated: list[int] = []


class BranchRules:
    """``if`` and ``match``, mixed into `PartialEvaluator`, whose state and ``pe``/``reify``
    they use."""

    store: Store
    scopes: list[Scope]
    control_depth: int
    memo_log: list[tuple[Frame, int]]
    forgotten_in: dict[Scope, list[tuple[Frame, int]]]

    @property
    def scope(self) -> Scope:
        """The innermost scope: where residual code is bound now."""
        return self.scopes[-1]

    def pe(self, e: Expr, fr: Frame, hint: str = "") -> Visit:
        """Partially evaluate ``e`` (the evaluator's own)."""
        raise NotImplementedError

    def reify(self, pv: PV) -> Visit:
        """An atom of residual code whose value is ``pv`` (the evaluator's own)."""
        raise NotImplementedError

    def pe_if(self, e: If, fr: Frame, hint: str) -> Visit:
        c = yield self.pe(e.cond, fr)
        if isinstance(c.static, STensor):
            branch = e.true_branch if bool(c.static.data) else e.false_branch
            return (yield self.pe(branch, fr, hint))
        catom = yield self.reify(c)
        effects = _Effects()
        t = yield from self.branch(e.true_branch, fr, [], effects)
        f = yield from self.branch(e.false_branch, fr, [], effects)
        pv = dynamic(self.scope.push(If(catom, t, f, span=e.span), hint))
        self.after_branches(effects, fr)
        return pv

    def pe_match(self, e: Match, fr: Frame, hint: str) -> Visit:
        data = yield self.pe(e.data, fr)
        for clause in e.clauses:
            status, binds = self.match_static(clause.lhs, data)
            if status is _NO:
                continue
            if status is _YES:
                fr.env.update(binds)
                return (yield self.pe(clause.rhs, fr, hint))
            break
        # Unknown (or no clause matches: a match? that fails at run time, if reached).
        datom = yield self.reify(data)
        effects = _Effects()
        clauses = []
        for clause in e.clauses:
            fresh: list[tuple[Var, PV]] = []
            lhs = yield _fresh_pattern(clause.lhs, fresh)
            rhs = yield from self.branch(clause.rhs, fr, fresh, effects)
            clauses.append(Clause(lhs, rhs, span=clause.span))
        pv = dynamic(self.scope.push(Match(datom, tuple(clauses), e.complete, span=e.span), hint))
        self.after_branches(effects, fr)
        return pv

    def match_static(self, p: Pattern, value: PV) -> tuple[str, list[tuple[Var, PV]]]:
        """Whether ``value`` matches ``p`` as far as it is known, and the bindings made."""
        status = _YES
        binds: list[tuple[Var, PV]] = []
        stack = [(p, value)]
        while stack:
            q, v = stack.pop()
            s = v.static
            match q:
                case PatternVar():
                    binds.append((q.var, v))
                case PatternConstructor():
                    if not isinstance(s, SCtor):
                        status = _UNKNOWN
                    elif s.ctor != q.constructor:
                        return _NO, []
                    else:
                        stack.extend(zip(q.patterns, s.fields))
                case PatternTuple():
                    if isinstance(s, STuple):
                        stack.extend(zip(q.patterns, s.fields))
                    else:
                        for i, sub in enumerate(q.patterns):
                            if not isinstance(sub, PatternWildcard):
                                assert v.atom is not None
                                field = self.scope.push(TupleGetItem(v.atom, i))
                                stack.append((sub, dynamic(field)))
        return status, binds

    def branch(self, e: Expr, fr: Frame, binds: list[tuple[Var, PV]],
               effects: _Effects) -> Visit:
        """A residual branch: ``e`` in a scope of its own, its effects on the store undone."""
        outer = self.scope
        scope = Scope(outer.level, outer.tvars)
        self.scopes.append(scope)
        mark = self.store.mark()
        memo_mark = len(self.memo_log)
        self.control_depth += 1
        try:
            fr.env.update(binds)
            result = yield self.pe(e, fr)
            atom = yield self.reify(result)
        finally:
            self.control_depth -= 1
            changed, unknown = self.store.rollback(mark)
            while len(self.memo_log) > memo_mark:
                frame, key = self.memo_log.pop()
                if frame.memo.pop(key, None) is not None and frame is fr:
                    effects.evaluated.append(key)
            for frame, key in self.forgotten_in.pop(scope, ()):  # from branches nested here
                if frame is fr and fr.forgotten.get(key) is scope:
                    effects.evaluated.append(key)
            self.scopes.pop()
        effects.changed |= changed
        effects.unknown = effects.unknown or unknown
        return scope.close(atom)

    def after_branches(self, effects: _Effects, fr: Frame) -> None:
        """After a residual branch, forget what any of its branches may have changed."""
        for ref in effects.changed:
            self.store.forget(ref)
        if effects.unknown:
            self.store.unknown_effect()
        # Graph form: a node first evaluated in a branch is evaluated again if used after it.
        here = self.scope
        for key in effects.evaluated:
            fr.forgotten[key] = here
        self.forgotten_in.setdefault(here, []).extend((fr, key) for key in effects.evaluated)


def check_reevaluation(e: Expr, scope: Scope) -> None:
    """A node shared in graph form, first evaluated inside a residual branch, is used again
    after it. Evaluating it again is right unless it has effects: then whether they happened
    depends on the branch taken, which graph form leaves undefined."""
    if not scope.open:
        return  # the use is in another branch of an enclosing if or match
    stack = [e]
    while stack:
        x = stack.pop()
        if isinstance(x, (RefCreate, RefRead, RefWrite)) or (
            isinstance(x, Call) and not isinstance(x.op, (Op, Constructor))
        ):
            raise UndefinedSharing(
                "partial-evaluate: an expression with effects (on references, or a call that "
                "may have them) is shared in graph form between a branch and the code after "
                "it, so whether its effect happens there is not defined; bind it with a let",
                e.span)
        if not isinstance(x, Function):
            stack.extend(children(x))


def _fresh_pattern(p: Pattern, binds: list[tuple[Var, PV]]) -> Visit:
    """``p`` with fresh variables; ``binds`` gets each old variable's dynamic value."""
    match p:
        case PatternVar():
            v = Var(p.var.name_hint)
            binds.append((p.var, dynamic(v)))
            return PatternVar(v, span=p.span)
        case PatternConstructor():
            subs = []
            for q in p.patterns:
                subs.append((yield _fresh_pattern(q, binds)))
            return PatternConstructor(p.constructor, tuple(subs), span=p.span)
        case PatternTuple():
            subs = []
            for q in p.patterns:
                subs.append((yield _fresh_pattern(q, binds)))
            return PatternTuple(tuple(subs), span=p.span)
    return p
