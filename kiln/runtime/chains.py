"""Kernel chains: the kernels of a straight stretch of a VM block, run by one native call.

A VM block of a dynamic program (a TreeLSTM cell: a match arm of a dozen instructions)
calls several kernels with only reference moves between them (``alloc``, ``const``,
``tuple``, ``get_field``, ``adt_field``, ``view``). Each kernel called from Python costs a few
microseconds; a chain calls them all from machine code (``kiln_run_chain``,
kiln/codegen/chain.py) with one ctypes call.

A chain is a maximal run of such instructions holding at least two kernels, each compiled
to machine code for fixed shapes. Its step first runs the run's other instructions in their
order — none reads a tensor's contents, so they can go before the kernels — then the
kernels, in their order. A buffer the memory planner put in the frame's arena (``alloc``
with an ``offset``) that only the chain's kernels use is never made into an array: the
kernels get the arena's address plus its offset. Other arguments are registers (their data
pointers are read at each call) or constants (their addresses are fixed in the plan).

Only the VM's trusted path builds chains (its registers are right by construction; see
`kiln.runtime.vm.VM`); a kernel's failure raises the error that kernel would have raised.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from kiln.runtime.pointers import DATA_OFFSET, data_pointer
from kiln.ssa.ir import Function, Instr, Value

MOVES = frozenset(["alloc", "const", "tuple", "get_field", "adt_field", "view"])
OUTSIDE = None  # a use by a terminator

Step = Callable[[list[Any], Any], None]


def users(fn: Function) -> dict[Value, list[Instr | None]]:
    """Every use of each value of ``fn``: the instruction, or None for a terminator's."""
    found: dict[Value, list[Instr | None]] = {}
    for b in fn.blocks:
        for ins in b.instrs:
            for v in ins.operands:
                found.setdefault(v, []).append(ins)
        t = b.terminator
        if t is not None:
            for v in t.operands:
                found.setdefault(v, []).append(OUTSIDE)
            for target in t.targets:
                for v in target.args:
                    found.setdefault(v, []).append(OUTSIDE)
    return found


def chain_end(instrs: Sequence[Instr], start: int, chainable: Callable[[Instr], bool]) -> int:
    """The end of the chain starting at ``instrs[start]``, or ``start`` when there is none
    there (fewer than two kernels before the first instruction a chain cannot hold)."""
    end, kernels = start, 0
    while end < len(instrs):
        ins = instrs[end]
        if ins.op == "kernel" and chainable(ins):
            kernels += 1
        elif ins.op not in MOVES:
            break
        end += 1
    return end if kernels >= 2 else start


def chain_step(run: Sequence[Instr], kernels: dict[str, Any], constants: Sequence[np.ndarray],
               register: Callable[[Value], int], uses: dict[Value, list[Instr | None]],
               move_step: Callable[[Instr], Step]) -> Step:
    """The VM step of one chain (``run``: instructions `chain_end` accepted).

    ``kernels`` maps kernel names to `CompiledKernel`s, ``register`` gives a value's
    register, and ``move_step`` the VM's own step for a moving instruction."""
    from kiln.codegen.chain import run_chain, split_status

    calls = [ins for ins in run if ins.op == "kernel"]
    in_chain = {id(ins) for ins in calls}
    pre: list[Step] = []
    in_arena: dict[Value, int] = {}
    for ins in run:
        if ins.op == "kernel":
            continue
        offset = ins.attrs.get("offset") if ins.op == "alloc" else None
        if offset is not None and all(u is not OUTSIDE and id(u) in in_chain
                                      for u in uses.get(ins, ())):
            in_arena[ins] = int(offset)  # no array: only the chain's kernels see it
            continue
        pre.append(move_step(ins))

    live: list[int] = []  # registers whose data pointers each call passes, after the arena's
    functions = []
    plan = [len(calls), max(len(ins.operands) for ins in calls)]
    for ins in calls:
        f = kernels[ins.attrs["kernel"]]
        functions.append(f)
        plan += [f.address, len(ins.operands)]
        for v in ins.operands:
            if v in in_arena:
                plan += [0, in_arena[v]]
            elif isinstance(v, Instr) and v.op == "const":
                plan += [-1, data_pointer(constants[v.attrs["index"]])]
            else:
                reg = register(v)
                if reg not in live:
                    live.append(reg)
                plan += [1 + live.index(reg), 0]
    words = np.array(plan, np.int64)
    address = data_pointer(words)
    bases_type = ctypes.c_void_p * (1 + len(live))
    chain = run_chain()
    steps = tuple(pre)

    def fail(status: int) -> None:
        k, own = split_status(status)
        functions[k].fail(own)

    if DATA_OFFSET is None:
        def step(regs: list[Any], fr: Any, _plan: np.ndarray = words) -> None:
            for s in steps:
                s(regs, fr)
            status = chain(address, bases_type(fr.base, *[data_pointer(regs[i]) for i in live]))
            if status:
                fail(status)
    else:
        at, off = ctypes.c_void_p.from_address, DATA_OFFSET

        def step(regs: list[Any], fr: Any, _plan: np.ndarray = words) -> None:
            for s in steps:
                s(regs, fr)
            status = chain(address, bases_type(fr.base, *[at(id(regs[i]) + off).value
                                                          for i in live]))
            if status:
                fail(status)
    return step  # (its default argument keeps the plan's words alive)
