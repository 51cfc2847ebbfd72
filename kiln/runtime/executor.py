"""Executors: what runs an SSA program once its kernels are compiled.

An `Executable` delegates each call to an executor object. Executors are tried in order of
priority, and the first that accepts the program runs it: a whole-program native executor
(static programs: tensors, tuples, branches, loops — one native call per inference) can
register itself ahead of the VM, which accepts every program.

    register_executor("native", make_native_executor, priority=10)

A factory takes the program and its compiled kernels (and a `Specializer` for kernels of
symbolic shape) and returns an executor, or None when it cannot run that program.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from kiln.errors import Error, InternalError
from kiln.runtime.compiler import KernelSet
from kiln.runtime.vm import VM, Specializer
from kiln.ssa.ir import Program


class Executor(Protocol):
    """Runs the entry function of a program on checked arguments."""

    name: str

    def run(self, args: list[Any]) -> Any: ...


ExecutorFactory = Callable[[Program, KernelSet, Specializer], "Executor | None"]


@dataclass(frozen=True)
class _Registered:
    name: str
    factory: ExecutorFactory
    priority: int


_REGISTRY: list[_Registered] = []


def register_executor(name: str, factory: ExecutorFactory, priority: int = 0) -> None:
    """Offer ``factory`` to run programs; higher priorities are asked first."""
    kept = [r for r in _REGISTRY if r.name != name]
    _REGISTRY[:] = sorted([*kept, _Registered(name, factory, priority)],
                          key=lambda r: -r.priority)


def unregister_executor(name: str) -> None:
    """Stop offering programs to the executor registered as ``name``."""
    _REGISTRY[:] = [r for r in _REGISTRY if r.name != name]


def executor_names() -> list[str]:
    return [r.name for r in _REGISTRY]


def choose_executor(program: Program, kernels: KernelSet, specialize: Specializer,
                    prefer: str | None = None) -> Executor:
    """The executor for ``program``: ``prefer`` by name, else the first that accepts it."""
    candidates = _REGISTRY
    if prefer is not None:
        candidates = [r for r in _REGISTRY if r.name == prefer]
        if not candidates:
            raise Error(f"unknown executor {prefer!r}; kiln has {', '.join(executor_names())}")
    for r in candidates:
        ex = r.factory(program, kernels, specialize)
        if ex is not None:
            return ex
    if prefer is not None:
        raise Error(f"the {prefer} executor cannot run this program")
    raise InternalError("no executor accepts the program")


class VMExecutor:
    """The VM as an executor: runs every program."""

    name = "vm"

    def __init__(self, program: Program, kernels: KernelSet, specialize: Specializer) -> None:
        self.vm = VM(program, kernels.functions, specialize, checked=kernels.checked_calls)
        self.entry = program.entry

    def run(self, args: list[Any]) -> Any:
        return self.vm.run(self.entry, args)

    @property
    def specializations(self) -> int:
        return self.vm.specializations


register_executor("vm", VMExecutor, priority=0)
