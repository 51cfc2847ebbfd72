"""lambda-lift: move every local function to a global function of its own.

A local function (a closure) becomes a global whose parameters are the variables it captures
followed by its own parameters (Relay's LambdaLift, which prepared programs for the VM):

    def @main(%x) { let %f = fn (%y) { %x + %y }; %f(1f) }
becomes
    def @main_f(%x, %y) { %x + %y }
    def @main(%x) { @main_f(%x, 1f) }

Where the local function is called directly (a let-bound function called by name, or a
function literal applied on the spot), the call passes the captured values itself. Where it
is used as a value (passed to ``@map``, returned, stored in a tuple or an ADT) it becomes a
*partial application*: a closure with no captured variables of its own would simply be the
global ``@main_f``; one that captures becomes a stub ``fn (%y, Closure=1) { @main_f(%x, %y) }``,
the make-closure of a VM (TVM marked the closures it produced ``Closure=1`` too).

A recursive let-bound function calls its lifted self with its captured variables passed
along. A function that captures another local function captures what that one captures
instead (a direct call needs no closure). The lifted global is annotated with the types
inference found, and takes as type parameters the type variables its signature mentions (a
closure inside a polymorphic function is polymorphic too).

After the pass, the only nested functions are fused kernels (``Primitive=1``, left as they
are) and the ``Closure=1`` stubs, whose body is a single call of a lifted global.
"""

from __future__ import annotations

from dataclasses import dataclass

from kiln.ir.adt import pattern_vars
from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr, Function, GlobalVar, Let, Match, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import (
    Visit,
    bound_vars,
    children,
    post_order,
    rewrite,
    trampoline,
    with_children,
)
from kiln.ir.ty import FuncType, Type, TypeVar, type_children
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass, typed

CLOSURE_ATTRS = Attrs(Closure=1)


@dataclass(frozen=True)
class Lifted:
    """A local function made global: call it with the captured variables first."""

    gv: GlobalVar
    captured: tuple[Var, ...]
    func: Function  # the original local function (for its parameter types)


def is_closure_stub(fn: Function) -> bool:
    """True for the partial applications lambda-lift leaves: ``fn (..., Closure=1)``."""
    return bool(fn.attrs.get("Closure", 0))


def _type_vars(types: list[Type | None]) -> list[TypeVar]:
    out: list[TypeVar] = []
    stack = [t for t in reversed(types) if t is not None]
    while stack:
        t = stack.pop()
        if isinstance(t, TypeVar) and t not in out:
            out.append(t)
        stack.extend(reversed(type_children(t)))
    return out


def _not_function(e: Expr) -> bool:
    return not isinstance(e, Function)


def function_free_vars(root: Expr) -> dict[int, list[Var]]:
    """The free variables of every function inside ``root`` (by id), each in order of use.

    One walk: each function's own part (its body up to the functions nested in it) is walked
    once, innermost functions first, and a function's free variables are those of its own part
    and of the functions directly inside it, less what it binds. Calling `free_vars` on every
    function instead walks a function nested n deep n times.
    """
    out: dict[int, list[Var]] = {}
    for fn in post_order(root):
        if not isinstance(fn, Function) or id(fn) in out:
            continue
        bound: set[Var] = set(fn.params)
        used: dict[Var, None] = {}  # ordered
        for node in post_order(fn.body, gate=_not_function):
            match node:
                case Var():
                    used.setdefault(node, None)
                case Function():
                    for v in out[id(node)]:
                        used.setdefault(v, None)
                case Let():
                    bound.add(node.var)
                case Match():
                    for clause in node.clauses:
                        bound.update(pattern_vars(clause.lhs))
        out[id(fn)] = [v for v in used if v not in bound]
    return out


class _Lifter:
    """Lifts the local functions of one module's globals."""

    def __init__(self, mod: IRModule) -> None:
        self.mod = mod
        self.names = {gv.name for gv in mod.functions}
        self.last_number: dict[str, int] = {}
        self.new_globals: dict[GlobalVar, Function] = {}
        self.known: dict[Var, Lifted] = {}  # let-bound local functions, by variable
        self.lifted: dict[int, Lifted] = {}  # by id of the Function
        self.memo: dict[int, Expr] = {}
        self.owner = ""
        self.free: dict[int, list[Var]] = {}  # by id of the Function, for the current global

    def fresh_name(self, hint: str) -> str:
        base = f"{self.owner}_{hint}"
        # Count on from the last number given to this base: a thousand closures named
        # "lambda" would otherwise try every taken name before each new one.
        name, n = base, self.last_number.get(base, 0)
        if n:
            name = f"{base}{n}"
        while name in self.names:
            n += 1
            name = f"{base}{n}"
        self.names.add(name)
        self.last_number[base] = n
        return name

    def captured_by(self, fn: Function, self_var: Var | None) -> tuple[Var, ...]:
        """What a lifted ``fn`` must be given: its free variables, through lifted ones."""
        out: dict[Var, None] = {}  # ordered
        for v in self.free[id(fn)]:
            if v is self_var:
                continue
            for w in self.known[v].captured if v in self.known else (v,):
                out.setdefault(w, None)
        return tuple(out)

    def lift(self, fn: Function, hint: str, self_var: Var | None = None) -> Visit:
        """Make ``fn`` a global (once) and say how to call it."""
        done = self.lifted.get(id(fn))
        if done is not None:
            return done
        info = Lifted(GlobalVar(self.fresh_name(hint)), self.captured_by(fn, self_var), fn)
        self.lifted[id(fn)] = info
        if self_var is not None:
            self.known[self_var] = info  # recursive calls inside go straight to the global
        body = yield self.visit(fn.body)
        fresh: dict[Var, Expr] = {}
        params = []
        for v in (*info.captured, *fn.params):
            nv = Var(v.name_hint, v.checked_type, span=v.span)
            fresh[v] = nv
            params.append(nv)
        body = rewrite(body, lambda e: fresh.get(e) if isinstance(e, Var) else None)
        ft = fn.checked_type
        assert isinstance(ft, FuncType)
        annotations = [p.type_annotation for p in params] + [ft.ret_type]
        annotations += [v.type_annotation for v in bound_vars(body)]
        tps = list(fn.type_params)
        tps += [tv for tv in _type_vars(annotations) if tv not in tps]
        self.new_globals[info.gv] = Function(tuple(params), body, ft.ret_type, tuple(tps),
                                             span=fn.span)
        return info

    def as_value(self, info: Lifted) -> Expr:
        """The lifted function as a value: the global, or a stub applying it partially."""
        if not info.captured:
            return info.gv
        fn = info.func
        params = tuple(Var(p.name_hint, p.checked_type) for p in fn.params)
        call = Call(info.gv, (*info.captured, *params))
        ft = fn.checked_type
        assert isinstance(ft, FuncType)
        return Function(params, call, ft.ret_type, fn.type_params, CLOSURE_ATTRS, span=fn.span)

    def visit(self, e: Expr) -> Visit:
        done = self.memo.get(id(e))
        if done is not None:
            return done
        match e:
            case Var():
                out = self.as_value(self.known[e]) if e in self.known else e
            case Function() if not is_primitive(e):
                out = self.as_value((yield self.lift(e, "lambda")))
            case Function():
                out = e  # a fused kernel stays as it is
            case Call(op=Var() as f) if f in self.known:
                out = yield from self.direct_call(self.known[f], e)
            case Call(op=Function() as f) if not is_primitive(f):
                out = yield from self.direct_call((yield self.lift(f, "lambda")), e)
            case Let():
                out = yield from self.visit_let(e)
            case _:
                kids = []
                for k in children(e):
                    kids.append((yield self.visit(k)))
                out = with_children(e, kids)
        self.memo[id(e)] = out
        return out

    def direct_call(self, info: Lifted, e: Call) -> Visit:
        args = []
        for a in e.args:
            args.append((yield self.visit(a)))
        return Call(info.gv, (*info.captured, *args), span=e.span)

    def visit_let(self, e: Let) -> Visit:
        # A let chain is walked in a loop: A-normal-form chains are thousands deep.
        kept: list[tuple[Let, Expr]] = []
        body: Expr = e
        while isinstance(body, Let) and id(body) not in self.memo:
            value = body.value
            if isinstance(value, Function) and not is_primitive(value):
                yield self.lift(value, body.var.name_hint, body.var)  # the let disappears
            else:
                kept.append((body, (yield self.visit(value))))
            body = body.body
        out = yield self.visit(body)
        for let, value in reversed(kept):
            out = Let(let.var, value, out, span=let.span)
        return out

    def run(self) -> IRModule:
        funcs: dict[GlobalVar, Function] = {}
        for gv, fn in self.mod.functions.items():
            if is_primitive(fn):
                funcs[gv] = fn
                continue
            self.owner = gv.name
            self.free = function_free_vars(fn.body)
            body = trampoline(self.visit(fn.body))
            funcs[gv] = Function(fn.params, body, fn.ret_type, fn.type_params, fn.attrs,
                                 span=fn.span)
        funcs.update(self.new_globals)
        return IRModule(funcs, self.mod.type_definitions)


@module_pass("lambda-lift", opt_level=0)
def LambdaLift(mod: IRModule, ctx: PassContext) -> IRModule:
    """Lift local functions to globals taking their captured variables first."""
    return _Lifter(typed(mod)).run()
