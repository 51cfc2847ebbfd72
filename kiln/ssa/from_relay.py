"""Lowering a fused Level-1 module to the SSA program.

The input is what `kiln.optimize` returns: typed, with operator groups fused into
``Primitive=1`` functions. When it is higher order, Level-1 passes make it first order
first: `eta-expand` (constructors used as values become function literals), `lambda-lift`
(every local function becomes a global taking its captured variables first, and a closure
value becomes a ``Closure=1`` stub), and type inference. Then each global function becomes
an SSA function:

- a call of a primitive function becomes an `alloc` of each (static) output and a `kernel`
  instruction (or `kernel_dyn` when shapes are symbolic) — or, where the function only
  reshapes its one argument (`VIEW_OPS`), a `view` of it: the same memory, no copy (the
  memory planner makes it the copy after all where it would leave its frame, which the
  kernel named in its attributes is for); constants used as values become
  `const`s (those inside kernels are taken out by the next pass, `lift-constants`);
- tuples, projections, constructors, references and calls map to their instructions; a
  ``Closure=1`` stub becomes `make_closure` of the lifted global over the captured values,
  and a global or constructor used as a value a closure with nothing captured;
- `if` becomes `cond_br` to two blocks that meet in a join block whose argument is the
  result; `match` becomes `switch`es on constructor tags (kiln/ssa/match.py), and a
  ``match?`` that no clause matches ends in `fail`;
- in tail position a branch returns directly instead of joining, and a call of the function
  itself becomes a branch back to its loop header: tail recursion runs as a loop.

Expressions are lowered by generators run on `trampoline` (programs are thousands of nodes
deep). Graph-form sharing is kept: a node is lowered once per scope, where a scope is the
code that every later use in it is dominated by (a node first met inside a branch is lowered
again if met after the branch).
"""

from __future__ import annotations

from typing import Any

from kiln.errors import Error, InternalError
from kiln.infer import infer_types
from kiln.ir.adt import (
    Constructor,
)
from kiln.ir.attrs import Attrs
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
from kiln.ir.traverse import Visit, children, free_vars, post_order, trampoline
from kiln.ir.ty import FuncType, RefType, TensorType, TupleType, Type, TypeCall
from kiln.op.dyn import runs_on_host
from kiln.ssa.builder import Builder
from kiln.ssa.cleanup import simplify_cfg
from kiln.ssa.ir import UNIT, Block, BlockArg, Program, Value
from kiln.ssa.ir import Function as SSAFunction
from kiln.ssa.kernels import KernelTable, lift_constants
from kiln.ssa.match import MatchLowering
from kiln.ssa.verify import verify
from kiln.transform.lambda_lift import is_closure_stub
from kiln.transform.pass_manager import PassContext, get_pass, is_primitive


class _Primitive:
    """A let-bound primitive function: not a value, but callable as a kernel."""

    __slots__ = ("fn",)

    def __init__(self, fn: Function) -> None:
        self.fn = fn


def _type(e: Expr) -> Type:
    if e.checked_type_ is None:
        raise InternalError(f"lowering to SSA met a {type(e).__name__} without a checked type",
                            e.span)
    return e.checked_type_


def is_first_order(mod: IRModule) -> bool:
    """Whether no function holds a local function or uses a constructor as a value (most
    models): such a module needs no eta-expansion or lambda lifting before lowering."""
    for fn in mod.functions.values():
        if is_primitive(fn):
            continue
        for n in post_order(fn.body):
            if isinstance(n, Function) and not is_primitive(n):
                return False
            kids = n.args if isinstance(n, Call) else children(n)
            if any(isinstance(k, Constructor) for k in kids):
                return False
    return True


class _ModuleLowering:
    """What the functions of one module share: the program, kernels and constants."""

    def __init__(self, mod: IRModule, entry: str) -> None:
        self.mod = mod
        self.program = Program(entry=entry)
        for td in mod.type_definitions.values():
            self.program.adt_params[td.header.name] = td.type_vars
            for c in td.constructors:
                self.program.constructors[c.name] = c
        self.kernels = KernelTable(self.program)
        self.constant_index: dict[int, int] = {}
        self.pending: list[tuple[str, tuple[Var, ...], Expr, Type, tuple[str, ...]]] = []
        self.wrappers: dict[str, str] = {}
        self.names = {gv.name for gv in mod.functions}

    def fresh_name(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            name = f"{base}{n}"
            n += 1
        self.names.add(name)
        return name

    def constant(self, c: Constant) -> int:
        i = self.constant_index.get(id(c))
        if i is None:
            i = self.program.add_constant(c.data)
            self.constant_index[id(c)] = i
        return i

    def constructor_wrapper(self, ctor: Constructor) -> str:
        """A global ``fn (fields...) { ctor(fields...) }`` for a constructor used as a value."""
        name = self.wrappers.get(ctor.name)
        if name is None:
            name = self.fresh_name(f"ctor_{ctor.name}")
            self.wrappers[ctor.name] = name
            td = self.mod.type_data(ctor.belong_to)
            params = [BlockArg(t, f"f{i}") for i, t in enumerate(ctor.inputs)]
            ret = TypeCall(ctor.belong_to, td.type_vars)
            fn = SSAFunction(name, params, ret, tuple(t.name for t in td.type_vars))
            b = Builder(fn)
            b.ret(b.emit("construct", params, ret, ctor=ctor.name))
            self.program.add_function(fn)
        return name

    def run(self) -> Program:
        for gv, fn in self.mod.functions.items():
            if is_primitive(fn):
                continue  # only ever called: each call becomes a kernel instruction
            ret = _type(fn).ret_type  # type: ignore[attr-defined]
            self.pending.append((gv.name, fn.params, fn.body, ret,
                                 tuple(t.name for t in fn.type_params)))
        while self.pending:
            name, params, body, ret, tps = self.pending.pop(0)
            ssa = _FunctionLowering(self, name, params, ret, tps).run(body)
            self.program.add_function(ssa)
        if self.program.entry not in self.program.functions:
            raise Error(f"the module has no function @{self.program.entry} to run")
        return self.program


class _FunctionLowering(MatchLowering):
    """Lowers one function body into an SSA function."""

    def __init__(self, ctx: _ModuleLowering, name: str, params: tuple[Var, ...], ret: Type,
                 type_params: tuple[str, ...]) -> None:
        self.ctx = ctx
        self.name = name
        args = [BlockArg(_type(p), p.name_hint) for p in params]
        self.fn = SSAFunction(name, args, ret, type_params)
        self.b = Builder(self.fn)
        # Tail calls of the function itself branch here; simplify_cfg folds it away if unused.
        self.header = self.fn.add_block("loop", [BlockArg(a.type, a.hint) for a in args])
        self.b.br(self.header, args)
        self.b.position(self.header)
        self.env: dict[Var, Any] = dict(zip(params, self.header.params))
        # What each node lowered to, where that is visible; the nodes each open branch lowered
        # (forgotten when it ends). One dict, not one per scope: a lookup inside n nested
        # branches would otherwise try n scopes.
        self.lowered: dict[int, Any] = {}
        self.scopes: list[list[int]] = [[]]

    def run(self, body: Expr) -> SSAFunction:
        trampoline(self.tail(body))
        simplify_cfg(self.fn)
        return self.fn

    # --- scopes -------------------------------------------------------------------------------

    def lookup(self, e: Expr) -> Any:
        return self.lowered.get(id(e))

    def branch(self, block: Block) -> None:
        """Start lowering a branch: values made in it are not visible after it."""
        self.b.position(block)
        self.scopes.append([])

    def end_branch(self) -> None:
        for key in self.scopes.pop():
            self.lowered.pop(key, None)

    # --- values -------------------------------------------------------------------------------

    def value(self, e: Expr) -> Visit:
        """Lower ``e`` where control is; its value (a generator for `trampoline`)."""
        done = self.lookup(e)
        if done is not None:
            return done
        b = self.b
        match e:
            case Var():
                v = self.env.get(e)
                if v is None:
                    raise InternalError(f"variable %{e.name_hint} has no value in @{self.name}",
                                        e.span)
            case Constant():
                v = b.emit("const", [], _type(e), index=self.ctx.constant(e))
            case GlobalVar():
                v = self.global_value(e)
            case Constructor():
                v = yield from self.constructor_value(e)
            case Function() if is_primitive(e):
                v = _Primitive(e)
            case Function():
                v = yield from self.closure(e)
            case Tuple():
                fields = []
                for f in e.fields:
                    fields.append((yield self.value(f)))
                v = b.tuple(fields)
            case TupleGetItem():
                v = b.get_field((yield self.value(e.tuple_value)), e.index)
            case Let():
                v = yield from self.let(e, False)
            case Call():
                v = yield from self.call(e, False)
            case If():
                v = yield from self.if_(e, False)
            case Match():
                v = yield from self.match(e, False)
            case RefCreate():
                v = b.emit("ref_new", [(yield self.value(e.value))], _type(e))
            case RefRead():
                v = b.emit("ref_read", [(yield self.value(e.ref))], _type(e))
            case RefWrite():
                ref = yield self.value(e.ref)
                val = yield self.value(e.value)
                v = b.emit("ref_write", [ref, val], UNIT)
            case Op():
                raise Error(f"operator {e.name} cannot be used as a value", e.span)
            case _:
                raise InternalError(f"lowering to SSA met an unknown node {type(e).__name__}")
        self.lowered[id(e)] = v
        self.scopes[-1].append(id(e))
        return v

    def tail(self, e: Expr) -> Visit:
        """Lower ``e`` in tail position: control leaves the function (or loops) after it."""
        match e:
            case Let():
                yield from self.let(e, True)
            case Call():
                yield from self.call(e, True)
            case If():
                yield from self.if_(e, True)
            case Match():
                yield from self.match(e, True)
            case _:
                v = yield self.value(e)
                self.b.ret(self.plain(v, e))
        return None

    def plain(self, v: Any, e: Expr) -> Value:
        if isinstance(v, _Primitive):
            raise Error("a fused kernel cannot be used as a value", e.span)
        return v  # type: ignore[no-any-return]

    def let(self, e: Let, tail: bool) -> Visit:
        body: Expr = e
        while isinstance(body, Let) and self.lookup(body) is None:
            self.env[body.var] = yield self.value(body.value)
            body = body.body
        if tail:
            yield self.tail(body)
            return None
        return (yield self.value(body))

    def global_value(self, gv: GlobalVar) -> Value:
        fn = self.ctx.mod.functions.get(gv)
        if fn is not None and is_primitive(fn):
            raise Error(f"the fused kernel @{gv.name} cannot be used as a value", gv.span)
        return self.b.emit("make_closure", [], _type(gv), func=gv.name)

    def constructor_value(self, c: Constructor) -> Visit:
        t = _type(c)
        if not isinstance(t, FuncType):
            return self.b.emit("construct", [], t, ctor=c.name)
        wrapper = self.ctx.constructor_wrapper(c)
        return self.b.emit("make_closure", [], t, func=wrapper)
        yield  # a generator like the others

    def closure(self, fn: Function) -> Visit:
        """A function value: lambda-lift's stub, or (should one remain) any function literal."""
        body = fn.body
        n = len(fn.params)
        if (is_closure_stub(fn) and isinstance(body, Call) and isinstance(body.op, GlobalVar)
                and len(body.args) >= n
                and all(a is p for a, p in zip(body.args[len(body.args) - n:], fn.params))):
            captured = []
            for a in body.args[: len(body.args) - n]:
                captured.append(self.plain((yield self.value(a)), a))
            return self.b.emit("make_closure", captured, _type(fn), func=body.op.name)
        # A local function lambda-lift left behind: lift it here, capturing its free variables.
        free = [v for v in free_vars(fn)]
        name = self.ctx.fresh_name(f"{self.name}_closure")
        ret = _type(fn).ret_type  # type: ignore[attr-defined]
        self.ctx.pending.append((name, (*free, *fn.params), fn.body, ret,
                                 tuple(t.name for t in fn.type_params)))
        captured = []
        for v in free:
            captured.append(self.plain((yield self.value(v)), v))
        return self.b.emit("make_closure", captured, _type(fn), func=name)

    # --- calls --------------------------------------------------------------------------------

    def args(self, exprs: tuple[Expr, ...]) -> Visit:
        out = []
        for a in exprs:
            out.append(self.plain((yield self.value(a)), a))
        return out

    def call(self, e: Call, tail: bool) -> Visit:
        op = e.op
        b = self.b
        if isinstance(op, Op) and runs_on_host(e):
            pairs = [[k, v] for k, v in e.attrs.items()]
            v = b.emit("host", (yield from self.args(e.args)), _type(e), operator=op.name,
                       op_attrs=pairs)
        elif isinstance(op, Op):
            v = yield from self.kernel(_single_op_function(e), e)
        elif isinstance(op, Constructor):
            v = b.emit("construct", (yield from self.args(e.args)), _type(e), ctor=op.name)
        elif isinstance(op, Function) and is_primitive(op):
            v = yield from self.kernel(op, e)
        elif isinstance(op, GlobalVar):
            target = self.ctx.mod.functions.get(op)
            args = yield from self.args(e.args)
            if target is not None and is_primitive(target):
                v = yield from self.kernel(target, e, args)
            elif tail and op.name == self.name:
                b.br(self.header, args)  # tail recursion: loop
                return None
            else:
                v = b.emit("call", args, _type(e), func=op.name)
        else:
            f = yield self.value(op)
            if isinstance(f, _Primitive):
                v = yield from self.kernel(f.fn, e)
            else:
                args = yield from self.args(e.args)
                v = b.emit("invoke_closure", [f, *args], _type(e))
        if tail:
            b.ret(v)
            return None
        return v

    def kernel(self, fn: Function, e: Call, args: list[Value] | None = None) -> Visit:
        """Run the kernel of primitive function ``fn`` on the arguments of call ``e``."""
        if args is None:
            args = yield from self.args(e.args)
        decl = self.ctx.kernels.get(fn)
        b = self.b
        flat: list[Value] = []
        for a in args:
            if isinstance(a.type, TupleType):
                flat += [b.get_field(a, i) for i in range(len(a.type.fields))]
            else:
                flat.append(a)
        if not decl.is_static:
            return b.emit("kernel_dyn", flat, _type(e), kernel=decl.name)
        if _reshapes_only(fn):
            return b.emit("view", flat, _type(e), kernel=decl.name)
        outs = [b.emit("alloc", [], t, offset=None) for t in decl.outputs]
        b.emit("kernel", [*flat, *outs], UNIT, kernel=decl.name, num_inputs=len(flat))
        return _rebuild(b, _type(e), outs)

    # --- control flow -------------------------------------------------------------------------

    def arm(self, block: Block, e: Expr, tail: bool, join: Block | None) -> Visit:
        """Lower one arm of a branch starting at ``block``: returning, or joining."""
        self.branch(block)
        if tail:
            yield self.tail(e)
        else:
            v = self.plain((yield self.value(e)), e)
            self.b.br(join, [v])  # type: ignore[arg-type]
        self.end_branch()

    def join(self, e: Expr, tail: bool, hint: str) -> Block | None:
        if tail:
            return None
        return self.fn.add_block(hint, [BlockArg(_type(e), hint)])

    def if_(self, e: If, tail: bool) -> Visit:
        c = self.plain((yield self.value(e.cond)), e.cond)
        then, other = self.fn.add_block("then"), self.fn.add_block("else")
        join = self.join(e, tail, "endif")
        self.b.cond_br(c, then, [], other, [])
        yield from self.arm(then, e.true_branch, tail, join)
        yield from self.arm(other, e.false_branch, tail, join)
        if join is None:
            return None
        self.b.position(join)
        return join.params[0]


# Operators that only give their argument another shape of as many elements, kept in the
# same row-major order: a call of a primitive function of one of them is a `view`.
VIEW_OPS = frozenset(["reshape", "squeeze", "expand_dims", "batch_flatten"])


def _reshapes_only(fn: Function) -> bool:
    """Whether primitive function ``fn`` is one `VIEW_OPS` operator on its one parameter,
    from a tensor of static shape to one of the same dtype."""
    body = fn.body
    if not (len(fn.params) == 1 and isinstance(body, Call) and isinstance(body.op, Op)
            and body.op.name in VIEW_OPS and len(body.args) == 1
            and body.args[0] is fn.params[0]):
        return False
    src, out = _type(fn.params[0]), _type(body)
    return (isinstance(src, TensorType) and isinstance(out, TensorType) and src.is_static
            and out.is_static and src.dtype == out.dtype)


def _single_op_function(e: Call) -> Function:
    """An operator call outside any fused function, as a one-operator primitive function."""
    params = []
    for i, a in enumerate(e.args):
        params.append(Var(f"p{i}", _type(a)))
    body = Call(e.op, tuple(params), e.attrs, span=e.span)
    return infer_types(IRModule.from_expr(Function(tuple(params), body, None, (),
                                                   Attrs(Primitive=1))))["main"]


def _rebuild(b: Builder, t: Type, outs: list[Value]) -> Value:
    """The value of type ``t`` (a tensor or nested tuple) made of the flat outputs."""
    if isinstance(t, TensorType):
        return outs[0]
    it = iter(outs)
    # Post-order over the tuple type: fields first, then the tuple of them.
    stack: list[tuple[Type, bool]] = [(t, False)]
    made: list[Value] = []
    while stack:
        ty, ready = stack.pop()
        if isinstance(ty, TupleType):
            if ready:
                n = len(ty.fields)
                fields = made[len(made) - n:] if n else []
                del made[len(made) - n:]
                made.append(b.tuple(fields))
            else:
                stack.append((ty, True))
                stack.extend((f, False) for f in reversed(ty.fields))
        else:
            made.append(next(it))
    return made[0]


def lower_first_order(mod: IRModule, entry: str = "main") -> Program:
    """The SSA program of a typed, fused, first-order module (the `lower-to-ssa` pass)."""
    if not isinstance(mod, IRModule):
        raise Error(f"lower_module takes an IRModule, not {type(mod).__name__}")
    if not mod.is_typed:
        mod = infer_types(mod)
    return verify(_ModuleLowering(mod, entry).run())


def lower_module(mod: IRModule, entry: str = "main") -> Program:
    """The SSA program of a typed, fused module (what `kiln.optimize` returns), its kernels'
    constants lifted into the constant table; verified.

    A higher-order module is made first order first by the back end's `to-first-order`
    passes, run in the current `PassContext`.
    """
    if not isinstance(mod, IRModule):
        raise Error(f"lower_module takes an IRModule, not {type(mod).__name__}")
    ctx = PassContext.current()
    mod = ctx.run_pass(get_pass("to-first-order"), mod)
    return verify(lift_constants(lower_first_order(mod, entry)))


_ = RefType  # imported for readers: ref values are plain instructions
