"""The memory planner: tensors whose lifetimes do not overlap share memory.

Each function gets one arena, allocated once per call (per frame), and every `alloc` whose
tensor stays inside the frame gets an offset in it. A tensor stays inside when every use of
it — directly, or through a tuple holding it and a `get_field` taking it out — is a kernel
reading or writing it, a `cond_br` testing it, or a `kernel_dyn` reading it. Anything else
(returning it, passing it to a call or a block argument, storing it in an ADT, a closure
or a reference) lets it outlive its place in the frame or be overwritten by the next loop
iteration, so it keeps its own memory (``offset=None``: the executor allocates it).

Two planned tensors interfere when both are live at one point of the function (liveness
from `kiln.ssa.analysis`); a kernel's outputs interfere with its inputs, since both are
live at the kernel instruction. Each tensor's live points are widened to an interval of the
function's blocks in reverse post-order — never less safe, and for straight-line code
exact. Offsets are then chosen greedily, largest tensor first, each at the lowest
64-byte-aligned offset clear of every interfering tensor already placed (TensorFlow Lite's
"greedy by size" arena planner).

No tensor or arena may be larger than `alloc_limit` bytes (``KILN_MAX_ALLOC_BYTES``; by default
the machine's physical memory): the planner refuses a program whose static shapes are beyond
it, and the executors check what they allocate (the VM its arenas and allocs when it loads a
program, the results of kernels of symbolic shape at run time; the native executor its
scratch stack and results) with `check_alloc`, so an absurd shape is a `kiln.Error` naming the
tensor, not numpy's MemoryError.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field

from kiln.errors import Error, InternalError
from kiln.ir.dtype import dtype_of
from kiln.ir.ty import TensorType, Type
from kiln.ssa.analysis import Liveness, reverse_post_order
from kiln.ssa.ir import UNIT, Function, Instr, Program, Value

ALIGN = 64

# Uses that read a tensor and keep nothing of it (a tuple's, a field's and a view's own
# uses are followed instead).
_TRANSIENT_USES = frozenset(["kernel", "kernel_dyn", "tuple", "get_field", "view"])


def tensor_bytes(t: Type) -> int:
    """The bytes of a tensor of static shape (the type of what an ``alloc`` makes)."""
    if not isinstance(t, TensorType):
        raise InternalError(f"{t} is not a tensor type")
    n = dtype_of(t.dtype).itemsize
    for d in t.static_shape:
        n *= d
    return n


LIMIT_VARIABLE = "KILN_MAX_ALLOC_BYTES"
_FALLBACK_LIMIT = 2**40  # where the machine's memory cannot be read
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40, "P": 2**50}


def alloc_limit() -> int:
    """The most bytes one tensor or arena may take: ``KILN_MAX_ALLOC_BYTES`` (a number of bytes,
    or with a K, M, G, T or P suffix in powers of 1024), by default the machine's memory."""
    text = os.environ.get(LIMIT_VARIABLE, "").strip()
    if not text:
        return _physical_memory()
    number, unit = text.rstrip("KMGTPkmgtpiBb"), text[len(text.rstrip("KMGTPkmgtpiBb")):]
    unit = unit.upper().removesuffix("B").removesuffix("I")
    try:
        value = int(number.strip())
    except ValueError:
        value = -1
    if unit not in _UNITS or value <= 0:
        raise Error(f"{LIMIT_VARIABLE}={text!r} is not a size: give a positive number of "
                    "bytes, such as 17179869184 or 16G")
    return value * _UNITS[unit]


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return _FALLBACK_LIMIT


def size_text(n: int) -> str:
    """``n`` bytes for people: ``4.0 TiB``."""
    if n < 1024:
        return f"{n} B"
    size = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        size /= 1024
        if size < 1024:
            return f"{size:.1f} {unit}"
    return f"{size / 1024:.1f} PiB"


def check_alloc(where: str, what: str, shape: Sequence[int] | None, dtype: str | None,
                nbytes: int | None = None) -> int:
    """The bytes of ``what`` (a tensor of ``shape`` and ``dtype``, or ``nbytes`` of memory);
    a `kiln.Error` when a dimension is negative or it is more than `alloc_limit` allows.

    ``where`` names the function or program, ``what`` the tensor (``%3, the output of kernel
    @main_zeros``). Sizes are Python integers, so no product overflows.
    """
    if shape is not None:
        assert dtype is not None
        dims = [int(d) for d in shape]
        shown = f"{what} would be {dtype}[{', '.join(map(str, dims))}]"
        if any(d < 0 for d in dims):
            raise Error(f"{where}: {shown}, with a negative dimension")
        nbytes = dtype_of(dtype).itemsize
        for d in dims:
            nbytes *= d
        shown += f" ({size_text(nbytes)})"
    else:
        assert nbytes is not None
        shown = f"{what} would take {size_text(nbytes)}"
    limit = alloc_limit()
    if nbytes > limit:
        raise Error(f"{where}: {shown}, more than the limit of {size_text(limit)} for one "
                    f"allocation ({LIMIT_VARIABLE}; by default the machine's memory)")
    return nbytes


def _aligned(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass
class FunctionPlan:
    """The arena of one function."""

    name: str
    arena_bytes: int = 0
    intermediate_bytes: int = 0  # the planned tensors' sizes added up: memory without reuse
    planned: int = 0
    heap: int = 0  # allocs that escape the frame and get their own memory
    heap_bytes: int = 0


@dataclass
class MemoryPlan:
    """What the planner did to each function of a program."""

    functions: dict[str, FunctionPlan] = field(default_factory=dict)

    @property
    def arena_bytes(self) -> int:
        return sum(f.arena_bytes for f in self.functions.values())

    @property
    def intermediate_bytes(self) -> int:
        return sum(f.intermediate_bytes for f in self.functions.values())

    @property
    def heap_bytes(self) -> int:
        return sum(f.heap_bytes for f in self.functions.values())

    def __str__(self) -> str:
        ratio = self.arena_bytes / self.intermediate_bytes if self.intermediate_bytes else 1.0
        return (f"arena {self.arena_bytes} bytes for {self.intermediate_bytes} bytes of "
                f"intermediates ({ratio:.1%}); {self.heap_bytes} bytes allocated separately")


def _aliases(fn: Function, allocs: list[Instr]) -> dict[Value, set[Instr]]:
    """For each value that may hold an alloc'd tensor, the allocs it may hold."""
    roots: dict[Value, set[Instr]] = {a: {a} for a in allocs}
    changed = True
    order = reverse_post_order(fn)
    while changed:  # tuples defined before their uses in RPO: one pass, a second to confirm
        changed = False
        for b in order:
            for ins in b.instrs:
                if ins.op == "tuple":
                    got = set().union(*(roots.get(v, set()) for v in ins.operands))
                elif ins.op == "view":  # its operand's memory (and itself, if a root)
                    got = set(roots.get(ins.operands[0], set())) | roots.get(ins, set())
                elif ins.op == "get_field":
                    src = ins.operands[0]
                    if isinstance(src, Instr) and src.op == "tuple":
                        got = set(roots.get(src.operands[ins.attrs["index"]], set()))
                    else:
                        got = set(roots.get(src, set()))
                else:
                    continue
                if got and got != roots.get(ins):
                    roots[ins] = got
                    changed = True
    return roots


def _escaping(fn: Function, roots: dict[Value, set[Instr]]) -> set[Instr]:
    out: set[Instr] = set()
    for b in fn.blocks:
        for ins in b.instrs:
            if ins.op in _TRANSIENT_USES:
                continue
            for v in ins.operands:
                out |= roots.get(v, set())
        t = b.terminator
        if t is None:
            continue
        if t.op == "cond_br":
            uses = [a for tgt in t.targets for a in tgt.args]
        else:
            uses = list(t.uses())
        for v in uses:
            out |= roots.get(v, set())
    return out


def materialize_views(fn: Function) -> int:
    """Make each `view` of ``fn`` whose tensor leaves the frame (returned, passed to a call
    or a block, stored: through tuples and fields too) the copy it stands for, an alloc
    filled by its kernel; a view whose every use is a kernel's read stays a view. Returns
    how many were made copies."""
    views = [ins for ins in fn.instructions() if ins.op == "view"]
    if not views:
        return 0
    leaving = _escaping(fn, _aliases(fn, views))
    for v in views:
        if v not in leaving:
            continue
        kernel = v.attrs.get("kernel")
        if not isinstance(kernel, str):
            raise InternalError(f"a view in @{fn.name} leaves its frame and names no kernel")
        block = v.block
        assert block is not None
        src = v.operands[0]
        v.op, v.operands, v.attrs = "alloc", [], {"offset": None}
        copy = Instr("kernel", [src, v], UNIT, {"kernel": kernel, "num_inputs": 1})
        copy.block = block
        block.instrs.insert(block.instrs.index(v) + 1, copy)
    return len(leaving & set(views))


def plan_function(fn: Function) -> FunctionPlan:
    """Set the offset of every alloc of ``fn`` and its arena size (after making the views
    that leave the frame copies, `materialize_views`)."""
    plan = FunctionPlan(fn.name)
    materialize_views(fn)
    allocs = [ins for ins in fn.instructions() if ins.op == "alloc"]
    _check_allocs(fn)
    roots = _aliases(fn, allocs)
    escaping = _escaping(fn, roots)
    planned = [a for a in allocs if a not in escaping]
    for a in allocs:
        a.attrs["offset"] = None
        if a in escaping:
            plan.heap += 1
            plan.heap_bytes += tensor_bytes(a.type)
    if not planned:
        fn.arena_bytes = 0
        return plan
    # Live intervals over the blocks in reverse post-order.
    wanted = set(planned)
    live = Liveness(fn)
    first: dict[Instr, int] = {}
    last: dict[Instr, int] = {}
    base = 0
    for b in reverse_post_order(fn):
        top = {r for v in live.live_in[b] | set(b.params) for r in roots.get(v, ()) if r in wanted}
        for r in top:
            first[r] = min(first.get(r, base), base)
            last[r] = max(last.get(r, base), base)
        for i, values in live.points(b):
            point = base + 1 + i
            for v in values:
                for r in roots.get(v, ()):
                    if r in wanted:
                        if r not in first or point < first[r]:
                            first[r] = point
                        if r not in last or point > last[r]:
                            last[r] = point
        base += len(b.instrs) + 2
    sizes = {a: _aligned(max(tensor_bytes(a.type), 1)) for a in planned}
    order = sorted(planned, key=lambda a: (-sizes[a], first.get(a, 0)))
    placed: list[tuple[int, int, int, int]] = []  # (first, last, offset, end)
    arena = 0
    for a in order:
        lo, hi = first.get(a, 0), last.get(a, 0)
        busy = sorted((off, end) for f, l_, off, end in placed if f <= hi and lo <= l_)
        offset = 0
        for off, end in busy:
            if offset + sizes[a] <= off:
                break
            offset = max(offset, end)
        a.attrs["offset"] = offset
        placed.append((lo, hi, offset, offset + sizes[a]))
        arena = max(arena, offset + sizes[a])
        plan.planned += 1
        plan.intermediate_bytes += tensor_bytes(a.type)
    check_alloc(f"@{fn.name}", "its arena (the tensors that stay in its frame)", None, None,
                arena)
    fn.arena_bytes = arena
    plan.arena_bytes = arena
    return plan


def check_frame(fn: Function) -> None:
    """Refuse a planned function whose arena or one of whose allocs is beyond the limit
    (the VM, when it loads a program: a saved file is not planned again)."""
    _check_allocs(fn)
    check_alloc(f"@{fn.name}", "its arena (the tensors that stay in its frame)", None, None,
                fn.arena_bytes)


def check_entry(stack_bytes: int, outputs: Sequence[TensorType]) -> None:
    """Refuse a native entry point whose scratch stack (every frame's arena, nested) or one of
    whose results is beyond the limit."""
    check_alloc("the program", "its scratch stack (the arenas of its frames)", None, None,
                stack_bytes)
    for i, t in enumerate(outputs):
        check_alloc("the program", f"its result {i}", t.static_shape, t.dtype)


def _check_allocs(fn: Function) -> None:
    """Refuse an ``alloc`` beyond the limit, named as the SSA printer names it (``%3``)."""
    limit = alloc_limit()
    for number, ins in enumerate(fn.instructions()):
        if ins.op == "alloc" and tensor_bytes(ins.type) > limit:
            t = ins.type
            assert isinstance(t, TensorType)  # tensor_bytes says so
            check_alloc(f"@{fn.name}", f"%{number}{_role(fn, ins)}", t.static_shape, t.dtype)


def _role(fn: Function, alloc: Instr) -> str:
    """``, the output of kernel @k``: what an alloc is for, where a kernel fills it."""
    for ins in fn.instructions():
        if ins.op == "kernel" and alloc in ins.operands[ins.attrs["num_inputs"]:]:
            return f", the output of kernel @{ins.attrs['kernel']},"
    return ""


def plan_memory(program: Program) -> MemoryPlan:
    """Plan the memory of every function of ``program`` (offsets are set in place). The
    kernels only the views stood for (none of them left its frame) are dropped: nothing
    runs them."""
    plan = MemoryPlan({name: plan_function(fn) for name, fn in program.functions.items()})
    run = {ins.attrs["kernel"] for fn in program.functions.values()
           for ins in fn.instructions() if ins.op in ("kernel", "kernel_dyn")}
    unused: set[str] = set()
    for fn in program.functions.values():
        for ins in fn.instructions():
            if ins.op == "view" and ins.attrs.get("kernel") not in run:
                unused.add(ins.attrs.pop("kernel", None))
    for name in unused & set(program.kernels):
        del program.kernels[name]
    return plan


def result_sources(program: Program) -> list[frozenset[int]] | None:
    """For each tensor of the entry function's result (tuples flattened), the tensors of its
    parameters (flattened, by index) that it may be a copy of: empty when every ``ret``
    returns a tensor computed in the frame or a constant there. None when that cannot be
    told (a result passed through a block parameter)."""
    fn = program.main
    index: dict[Value, list[frozenset[int]]] = {}
    n = 0
    for p in fn.params:
        count = len(_tensor_leaves(p.type))
        index[p] = [frozenset([n + i]) for i in range(count)]
        n += count
    out: list[frozenset[int]] | None = None
    for b in fn.blocks:
        t = b.terminator
        if t is None or t.op != "ret":
            continue
        got = _sources_of(t.operands[0], index)
        if got is None:
            return None
        out = got if out is None else [a | c for a, c in zip(out, got)]
    return out or []


def _tensor_leaves(t: Type) -> list[Type]:
    from kiln.ir.ty import TupleType

    stack, out = [t], []
    while stack:
        x = stack.pop()
        if isinstance(x, TupleType):
            stack.extend(reversed(x.fields))
        else:
            out.append(x)
    return out


def _sources_of(v: Value, index: dict[Value, list[frozenset[int]]]
                ) -> list[frozenset[int]] | None:
    """The parameter tensors each leaf of ``v`` may be (through tuples and their fields; a
    field of a field recurses once per level of tuple nesting, never along a chain)."""
    out: list[frozenset[int]] = []
    stack: list[Value] = [v]
    while stack:
        value = stack.pop()
        if value in index:
            out.extend(index[value])
        elif isinstance(value, Instr) and value.op == "tuple":
            stack.extend(reversed(value.operands))
        elif isinstance(value, Instr) and value.op == "view":  # its operand's memory
            stack.append(value.operands[0])
        elif isinstance(value, Instr) and value.op == "get_field":
            src = _sources_of(value.operands[0], index)
            if src is None:
                return None
            fields = value.operands[0].type.fields  # type: ignore[attr-defined]
            i = value.attrs["index"]
            start = sum(len(_tensor_leaves(f)) for f in fields[:i])
            out.extend(src[start: start + len(_tensor_leaves(fields[i]))])
        elif isinstance(value, Instr):  # alloc, const, call: memory of the frame or constants
            out.extend(frozenset() for _ in _tensor_leaves(value.type))
        else:  # a block parameter: could hold anything passed to it
            return None
    return out


def donation_hazards(program: Program, donate: dict[int, int]) -> set[int]:
    """Of the results donated to inputs (``donate``: result tensor -> input tensor, both
    flattened), those that must not be written straight into their input's memory.

    The native entry point writes its results into the caller's arrays only at its ``ret``,
    after every kernel has read its inputs, so a result computed from the input whose memory
    it takes is safe. What is not: a result that is a copy of an input (its ``ret`` copies
    the input's memory, which an earlier result may have overwritten), and a result donated
    to an input that such a copy reads. Those take scratch memory, copied over afterwards.
    """
    sources = result_sources(program)
    if sources is None:
        return set(donate)
    read = set().union(*sources) if sources else set()
    return {out for out, inp in donate.items()
            if out >= len(sources) or sources[out] or inp in read}
