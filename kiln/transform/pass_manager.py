"""The pass manager: passes, pipelines, the context they run in, and instruments.

A pass is a named, pure transformation from module to module with an optimization level
(TVM's pass infrastructure, xDSL's `ModulePass` contract):

- `module_pass` / `function_pass` turn a function into a `Pass` (a function pass runs on
  each global function that is not a fused kernel);
- `Sequential` runs passes in order, skipping those above the context's ``opt_level`` or
  disabled by name;
- `PassContext` is the context manager that holds the options (``opt_level``,
  ``required_pass``, ``disabled_pass``, ``config``, ``debug``) and the instruments that
  observe every pass: timing, IR dumps, anything with the `PassInstrument` hooks.

The same manager runs the back end (kiln/runtime/backend.py): its passes take and give a
`LoweredIR` — the SSA program and its kernels on their way to machine code — instead of an
`IRModule`, and each pass's `PassInfo.level` says which IR it works on (1: the functional
IR; 2: the SSA program; 3: the loop IR of kernels). In debug mode the checker of the
result's level runs after every pass — type inference for Level 1, the SSA verifier and the
loop-IR bounds verifier for the back end — and a failure is reported as a compiler bug
naming the pass. Every pass has a kebab-case name (``fold-constant``, ``plan-memory``) by
which the command line and `get_pass` find it.
"""

from __future__ import annotations

import contextvars
import difflib
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TextIO

from kiln.errors import Error, InternalError, TypeCheckError
from kiln.ir.expr import Function
from kiln.ir.module import IRModule


@dataclass(frozen=True)
class PassInfo:
    """What the pass manager knows of a pass: its name, opt level, the passes it needs first,
    and the IR level it works on (1: functional IR, 2: SSA program, 3: loop IR)."""

    name: str
    opt_level: int = 0
    required: tuple[str, ...] = ()
    doc: str = ""
    level: int = 1


class LoweredIR:
    """What a back-end pass takes and gives (kiln/runtime/backend.py's `Lowered`): the pass
    manager asks it only to check itself and to print itself."""

    def verify(self, pass_name: str) -> None:
        """Raise `InternalError` naming ``pass_name`` if the IR is not valid."""
        raise NotImplementedError

    def text(self) -> str:
        """The IR as text, for `DumpIR`."""
        raise NotImplementedError


# What a pass runs on: a module (Level 1) or the back end's lowered program (Levels 2 and 3).
IR = IRModule | LoweredIR


class Pass:
    """A module-to-module transformation. Call it on a module to run it in the current context."""

    info: PassInfo

    def __call__(self, mod: Any) -> Any:
        return PassContext.current().run_pass(self, mod)

    def transform(self, mod: Any, ctx: PassContext) -> Any:
        """The transformation itself; `PassContext.run_pass` wraps it with the instruments."""
        raise NotImplementedError

    @property
    def name(self) -> str:
        return self.info.name

    def __repr__(self) -> str:
        return f"<pass {self.info.name} (opt_level {self.info.opt_level})>"


class ModulePass(Pass):
    """A pass given as ``fn(mod, ctx) -> mod`` (a back-end pass: ``fn(lowered, ctx)``)."""

    def __init__(self, info: PassInfo, fn: Callable[[Any, PassContext], Any]) -> None:
        self.info = info
        self.fn = fn

    def transform(self, mod: Any, ctx: PassContext) -> Any:
        return self.fn(mod, ctx)


def is_primitive(fn: Function) -> bool:
    """True for a fused kernel (``Primitive=1``), which function passes leave alone."""
    return bool(fn.attrs.get("Primitive", 0))


class FunctionPass(Pass):
    """A pass given as ``fn(func, mod, ctx) -> func``, run on each global function in turn."""

    def __init__(
        self, info: PassInfo, fn: Callable[[Function, IRModule, PassContext], Function]
    ) -> None:
        self.info = info
        self.fn = fn

    def transform(self, mod: IRModule, ctx: PassContext) -> IRModule:
        funcs = {}
        changed = False
        for gv, func in mod.functions.items():
            new = func if is_primitive(func) else self.fn(func, mod, ctx)
            if not isinstance(new, Function):
                raise InternalError(
                    f"pass {self.info.name} turned @{gv.name} into a {type(new).__name__}"
                )
            changed |= new is not func
            funcs[gv] = new
        return IRModule(funcs, mod.type_definitions) if changed else mod


class Sequential(Pass):
    """Passes run in order; each runs only if the context enables it."""

    def __init__(self, passes: Sequence[Pass], name: str = "sequential", opt_level: int = 0):
        self.passes = list(passes)
        self.info = PassInfo(name, opt_level, doc="; ".join(p.info.name for p in self.passes),
                             level=max((p.info.level for p in self.passes), default=1))

    def transform(self, mod: Any, ctx: PassContext) -> Any:
        done: set[str] = set()
        for p in self.passes:
            if not ctx.pass_enabled(p.info):
                continue
            for name in p.info.required:
                if name not in done and ctx.pass_enabled(get_pass(name).info):
                    mod = ctx.run_pass(get_pass(name), mod)
                    done.add(name)
            mod = ctx.run_pass(p, mod)
            done.add(p.info.name)
        return mod

    def __repr__(self) -> str:
        return f"<sequential {self.info.name}: {self.info.doc}>"


# --- the context ----------------------------------------------------------------------------


class PassInstrument:
    """Hooks called around passes; subclass and override the ones you need."""

    def enter_pass_ctx(self) -> None:
        pass

    def exit_pass_ctx(self) -> None:
        pass

    def should_run(self, mod: IR, info: PassInfo) -> bool:
        return True

    def run_before_pass(self, mod: IR, info: PassInfo) -> None:
        pass

    def run_after_pass(self, mod: IR, info: PassInfo) -> None:
        pass


_CURRENT: contextvars.ContextVar[PassContext | None] = contextvars.ContextVar(
    "kiln_pass_context", default=None
)


class PassContext:
    """Options and instruments for the passes run inside ``with PassContext(...):``."""

    def __init__(
        self,
        opt_level: int = 2,
        required_pass: Iterable[str] = (),
        disabled_pass: Iterable[str] = (),
        config: Mapping[str, Any] | None = None,
        instruments: Iterable[PassInstrument] = (),
        debug: bool = False,
    ) -> None:
        self.opt_level = opt_level
        self.required_pass = frozenset(required_pass)
        self.disabled_pass = frozenset(disabled_pass)
        for name in self.required_pass | self.disabled_pass:
            get_pass_factory(name)  # an unknown name is an error, not silently ignored
        self.config = dict(config or {})
        self.instruments = list(instruments)
        self.debug = debug
        self._token: contextvars.Token | None = None

    @staticmethod
    def current() -> PassContext:
        """The innermost active context, or a default one (opt_level 2)."""
        ctx = _CURRENT.get()
        return ctx if ctx is not None else PassContext()

    def __enter__(self) -> PassContext:
        self._token = _CURRENT.set(self)
        for inst in self.instruments:
            inst.enter_pass_ctx()
        return self

    def __exit__(self, *exc: object) -> None:
        for inst in self.instruments:
            inst.exit_pass_ctx()
        if self._token is not None:
            _CURRENT.reset(self._token)
            self._token = None

    def pass_enabled(self, info: PassInfo) -> bool:
        """Whether a pass runs here: not disabled, and required or within the opt level."""
        if info.name in self.disabled_pass:
            return False
        return info.name in self.required_pass or info.opt_level <= self.opt_level

    def run_pass(self, p: Pass, mod: Any) -> Any:
        """Run one pass with the instruments around it (and its level's checks in debug mode)."""
        if not isinstance(mod, IRModule | LoweredIR):
            raise Error(f"pass {p.info.name} needs an IRModule, not {type(mod).__name__}")
        if p.info.level == 1 and not isinstance(p, Sequential) and not isinstance(mod, IRModule):
            raise Error(f"pass {p.info.name} works on the functional IR (Level 1); it must run "
                        f"before lower-to-ssa")
        for inst in self.instruments:
            if not inst.should_run(mod, p.info):
                return mod
        for inst in self.instruments:
            inst.run_before_pass(mod, p.info)
        out = p.transform(mod, self)
        if not isinstance(out, IRModule | LoweredIR):
            raise InternalError(f"pass {p.info.name} returned a {type(out).__name__}")
        if self.debug and not isinstance(p, Sequential):
            if isinstance(out, IRModule):
                _check_types(out, p.info.name)
            else:
                out.verify(p.info.name)
        for inst in self.instruments:
            inst.run_after_pass(out, p.info)
        return out


def _check_types(mod: IRModule, name: str) -> None:
    from kiln.infer import infer_types

    try:
        infer_types(mod)
    except TypeCheckError as e:
        raise InternalError(f"pass {name} produced an ill-typed module: {e.message}") from None


# --- instruments ----------------------------------------------------------------------------


@dataclass
class PassTimingInstrument(PassInstrument):
    """Records how long each pass takes; `render` gives a table, slowest first."""

    times: list[tuple[str, float]] = field(default_factory=list)
    _starts: list[float] = field(default_factory=list, repr=False)

    def run_before_pass(self, mod: IR, info: PassInfo) -> None:
        self._starts.append(time.perf_counter())

    def run_after_pass(self, mod: IR, info: PassInfo) -> None:
        self.times.append((info.name, time.perf_counter() - self._starts.pop()))

    def render(self) -> str:
        totals: dict[str, float] = {}
        for name, t in self.times:
            totals[name] = totals.get(name, 0.0) + t
        rows = sorted(totals.items(), key=lambda kv: -kv[1])
        width = max((len(n) for n, _ in rows), default=4)
        return "\n".join(f"{n:<{width}}  {t * 1000:9.2f} ms" for n, t in rows)


class DumpIR(PassInstrument):
    """Prints the IR before and/or after the named passes ("*" for all): a module as Relay
    text, the back end's program as SSA text with its kernels' loop IR."""

    def __init__(
        self, before: Iterable[str] = (), after: Iterable[str] = (), out: TextIO | None = None
    ) -> None:
        self.before = set(before)
        self.after = set(after)
        self.out = out

    def _dump(self, when: str, mod: IR, info: PassInfo) -> None:
        from kiln.text import astext

        stream = self.out if self.out is not None else sys.stdout
        print(f"// ---- IR {when} {info.name} ----", file=stream)
        print(astext(mod) if isinstance(mod, IRModule) else mod.text(), file=stream)

    def run_before_pass(self, mod: IR, info: PassInfo) -> None:
        if info.name in self.before or "*" in self.before:
            self._dump("before", mod, info)

    def run_after_pass(self, mod: IR, info: PassInfo) -> None:
        if info.name in self.after or "*" in self.after:
            self._dump("after", mod, info)


# --- the registry of passes by name ---------------------------------------------------------

_FACTORIES: dict[str, Callable[[], Pass]] = {}


def register_pass(name: str, factory: Callable[[], Pass]) -> None:
    """Make a pass findable by its kebab-case name (for the command line and `required`)."""
    if name in _FACTORIES:
        raise Error(f"a pass named {name!r} is registered already: give yours another name")
    _FACTORIES[name] = factory


def get_pass_factory(name: str) -> Callable[[], Pass]:
    _load_passes()
    factory = _FACTORIES.get(name)
    if factory is None:
        close = difflib.get_close_matches(name, list(_FACTORIES), n=1)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise Error(f"unknown pass {name!r}{hint} (kiln optimize --list shows them all)")
    return factory


def get_pass(name: str) -> Pass:
    """A pass, with its default options, by its kebab-case name."""
    return get_pass_factory(name)()


def list_passes() -> list[PassInfo]:
    """Every registered pass, by name."""
    _load_passes()
    return sorted((f().info for f in _FACTORIES.values()), key=lambda i: i.name)


def _load_passes() -> None:
    # Importing these registers every pass: Level 1's, then the back end's.
    import kiln.runtime.backend  # noqa: F401
    import kiln.transform  # noqa: F401


def module_pass(
    name: str, opt_level: int = 0, required: Sequence[str] = (), level: int = 1
) -> Callable[[Callable[[Any, PassContext], Any]], Callable[[], Pass]]:
    """Decorate ``fn(mod, ctx) -> mod`` into a registered pass factory named ``name``
    (``level`` 2 or 3: a back-end pass over `LoweredIR`)."""

    def wrap(fn: Callable[[Any, PassContext], Any]) -> Callable[[], Pass]:
        info = PassInfo(name, opt_level, tuple(required), (fn.__doc__ or "").strip(), level)

        def factory() -> Pass:
            return ModulePass(info, fn)

        factory.__doc__ = fn.__doc__
        factory.__name__ = fn.__name__
        register_pass(name, factory)
        return factory

    return wrap


def function_pass(
    name: str, opt_level: int = 0, required: Sequence[str] = ()
) -> Callable[[Callable[[Function, IRModule, PassContext], Function]], Callable[[], Pass]]:
    """Decorate ``fn(func, mod, ctx) -> func`` into a registered pass factory named ``name``."""

    def wrap(fn: Callable[[Function, IRModule, PassContext], Function]) -> Callable[[], Pass]:
        info = PassInfo(name, opt_level, tuple(required), (fn.__doc__ or "").strip())

        def factory() -> Pass:
            return FunctionPass(info, fn)

        factory.__doc__ = fn.__doc__
        factory.__name__ = fn.__name__
        register_pass(name, factory)
        return factory

    return wrap


def typed(mod: IRModule) -> IRModule:
    """The module with checked types (inferred again only if it lacks them)."""
    if mod.is_typed:
        return mod
    from kiln.infer import infer_types

    return infer_types(mod)


def map_typed_functions(mod: IRModule, fn: Callable[[Function], Function]) -> IRModule:
    """``fn`` applied to every global function of ``mod`` with its types checked (a module
    pass that rewrites each function on its own); ``mod`` itself when nothing changed."""
    mod = typed(mod)
    funcs = {gv: fn(f) for gv, f in mod.functions.items()}
    if all(funcs[gv] is f for gv, f in mod.functions.items()):
        return mod
    return IRModule(funcs, mod.type_definitions)
