"""Level 3: the loop IR — buffers, loops, loads and stores, scalar and vector arithmetic.

A fused primitive function lowers to one `Kernel`: a loop nest over buffers. The IR is
deliberately small and explicit, so that the verifier can prove every access in bounds and
code generation is a direct translation to LLVM:

- expressions are scalars or short vectors (``lanes > 1``, e.g. 8 × float32 for AVX2):
  `Const`, `Var`, `Load`, `Binary`, `Unary`, `Cast`, `Bitcast`, `Select`, `Broadcast`, `FMA`,
  `DotProduct` (the int8 dot product of 4-byte groups: VNNI's ``vpdpbusd``);
- statements: `For` (serial, parallel, vectorized or unrolled), `Store`, `LetStmt`,
  `Allocate` (a local buffer: a register tile or scratch space), `Seq`, `IfThenElse`,
  `Check`, `TileProduct` (an 8-bit product on AMX matrix tiles);
- `Buffer`s are row-major and contiguous, of static shapes — except in a *symbolic* kernel
  (compiled once for every size), whose arguments' shapes may name its `Kernel.dims`,
  INDEX variables passed at run time; a `Load`/`Store` with
  ``lanes > 1`` touches ``lanes`` consecutive elements along the last axis from its index.

Nodes are frozen dataclasses; `Var` and `Buffer` compare by identity. Dtypes are kiln's
dtype names (``float32``, ``int64``, ``bool``, ...); index arithmetic is ``int64``.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kiln.errors import InternalError
from kiln.ir.dtype import dtype_of
from kiln.ir.ty import DTYPES

INDEX = "int64"

_ids = itertools.count()


def _check_dtype(dtype: str) -> None:
    if dtype not in DTYPES:
        raise InternalError(f"loop IR: unknown dtype {dtype!r}")


# --- buffers and variables ---------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class Buffer:
    """A row-major contiguous array: a kernel argument (``scope="global"``) or local scratch.

    A dimension is an int, or — in a kernel compiled once for every size (a *symbolic*
    kernel, `Kernel.dims`) — one of the kernel's dimension variables (an INDEX `Var` whose
    value the caller passes at run time). Only kernel arguments may have symbolic dimensions.
    """

    name: str
    # ints; a symbolic kernel's arguments may hold its dim `Var`s too. Typed as ints for the
    # code that only meets static buffers (all but the verifier, the code generator and
    # the run-time check, which test `is_symbolic`).
    shape: tuple[int, ...]
    dtype: str
    scope: str = "global"  # "global" (a kernel argument) or "local" (allocated in the kernel)

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(d if isinstance(d, Var) else int(d)
                                                for d in self.shape))  # (Var: see above)
        _check_dtype(self.dtype)
        if any(isinstance(d, Var) and (d.dtype != INDEX or d.lanes != 1) for d in self.shape):
            raise InternalError(f"loop IR: buffer {self.name} has a dimension that is not an "
                                "index variable")
        if any(isinstance(d, int) and d < 0 for d in self.shape):
            raise InternalError(f"loop IR: buffer {self.name} has a negative dimension")

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_symbolic(self) -> bool:
        """Whether a dimension is a variable (known only when the kernel is called)."""
        return any(isinstance(d, Var) for d in self.shape)

    def _static(self, what: str) -> tuple[int, ...]:
        if self.is_symbolic:
            raise InternalError(f"loop IR: the {what} of {self.name}, of symbolic shape, is "
                                "known only at run time")
        return self.shape

    @property
    def size(self) -> int:
        n = 1
        for d in self._static("size"):
            n *= d
        return n

    @property
    def strides(self) -> tuple[int, ...]:
        """Element strides of the row-major layout."""
        out = []
        step = 1
        for d in reversed(self._static("strides")):
            out.append(step)
            step *= d
        return tuple(reversed(out))

    def stride_exprs(self) -> tuple[Expr, ...]:
        """Element strides as index expressions (products of the trailing dimensions): what
        addresses a buffer of symbolic shape."""
        out: list[Expr] = []
        step: Expr = Const(1)
        for d in reversed(self.shape):
            out.append(step)
            step = binary("mul", step, d)
        return tuple(reversed(out))

    def __repr__(self) -> str:
        return f"Buffer({self.name}: {self.dtype}{list(self.shape)})"

    def __getitem__(self, indices: object) -> Load:
        if not isinstance(indices, tuple):
            indices = (indices,)
        return Load(self, tuple(as_expr(i) for i in indices))


# --- expressions -------------------------------------------------------------------------------


class Expr:
    """Base of loop-IR expressions; every expression has a ``dtype`` and ``lanes``."""

    __slots__ = ()

    if TYPE_CHECKING:
        # Read-only to the type checker: some nodes hold them as fields (Const, Cast), others
        # derive them (Binary). Declared only for it, since a class attribute here would
        # become the default of a subclass's dataclass field.
        @property
        def dtype(self) -> str: ...

        @property
        def lanes(self) -> int: ...

    # Sugar for writing lowerings: index arithmetic reads like Python.
    def __add__(self, o: object) -> Expr:
        return binary("add", self, o)

    def __radd__(self, o: object) -> Expr:
        return binary("add", o, self)

    def __sub__(self, o: object) -> Expr:
        return binary("sub", self, o)

    def __rsub__(self, o: object) -> Expr:
        return binary("sub", o, self)

    def __mul__(self, o: object) -> Expr:
        return binary("mul", self, o)

    def __rmul__(self, o: object) -> Expr:
        return binary("mul", o, self)

    def __floordiv__(self, o: object) -> Expr:
        return binary("floordiv", self, o)

    def __mod__(self, o: object) -> Expr:
        return binary("floormod", self, o)

    def __neg__(self) -> Expr:
        return Unary("neg", self)

    def __str__(self) -> str:
        from kiln.loops.printer import expr_text

        return expr_text(self)

    __hash__ = object.__hash__


@dataclass(frozen=True, eq=False)
class Const(Expr):
    """A constant (broadcast to every lane when ``lanes > 1``)."""

    value: int | float | bool
    dtype: str = INDEX
    lanes: int = 1

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)


@dataclass(frozen=True, eq=False)
class Var(Expr):
    """A scalar variable: a loop index or a let-bound value. Compares by identity."""

    name: str
    dtype: str = INDEX
    lanes: int = 1
    uid: int = field(default_factory=lambda: next(_ids), repr=False)

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)


@dataclass(frozen=True, eq=False)
class Load(Expr):
    """``buffer[indices]``; with ``lanes > 1``, that many elements along the last axis."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    lanes: int = 1

    @property
    def dtype(self) -> str:
        return self.buffer.dtype


BINARY_OPS = frozenset(
    ["add", "sub", "mul", "div", "floordiv", "floormod", "truncdiv", "truncmod", "min", "max",
     "pow", "and", "or", "xor", "shl", "shr", "lt", "le", "gt", "ge", "eq", "ne"]
)
COMPARISONS = frozenset(["lt", "le", "gt", "ge", "eq", "ne"])


@dataclass(frozen=True, eq=False)
class Binary(Expr):
    """``a op b`` on equal dtypes and lanes; comparisons give bool.

    ``div`` is float division; integers use ``floordiv``/``floormod`` (index arithmetic) or
    ``truncdiv``/``truncmod`` (C semantics, as kiln's integer divide and mod).
    """

    op: str
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return "bool" if self.op in COMPARISONS else self.a.dtype

    @property
    def lanes(self) -> int:
        return self.a.lanes


UNARY_OPS = frozenset(
    ["neg", "not", "abs", "sqrt", "rsqrt", "exp", "log", "tanh", "sigmoid", "erf", "sin", "cos",
     "floor", "ceil", "round", "nearbyint", "sign"]
)
# Unary operations that are not core arithmetic: lowerings write them, and the
# decompose-math pass (decompose_math.py) rewrites them into core operations before a
# kernel is evaluated or compiled.
TRANSCENDENTAL_OPS = frozenset(["exp", "log", "tanh", "sigmoid", "erf", "sin", "cos"])


@dataclass(frozen=True, eq=False)
class Unary(Expr):
    """A unary operation; the transcendental ones (`TRANSCENDENTAL_OPS`) are decomposed into
    core arithmetic (range reduction and polynomials) before evaluation and code generation."""

    op: str
    a: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype

    @property
    def lanes(self) -> int:
        return self.a.lanes


@dataclass(frozen=True, eq=False)
class Cast(Expr):
    """Conversion to another dtype (same lanes)."""

    dtype: str
    a: Expr

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)

    @property
    def lanes(self) -> int:
        return self.a.lanes


_BITS = {"bool": 1, "int8": 8, "int16": 16, "int32": 32, "int64": 64, "uint8": 8, "uint16": 16,
         "uint32": 32, "uint64": 64, "float16": 16, "float32": 32, "float64": 64}


@dataclass(frozen=True, eq=False)
class Bitcast(Expr):
    """The bits of ``a`` read as another dtype of the same width (same lanes): how the math
    decomposition reaches a float's exponent and sign."""

    dtype: str
    a: Expr

    def __post_init__(self) -> None:
        _check_dtype(self.dtype)
        if _BITS.get(self.dtype) != _BITS.get(self.a.dtype) or self.dtype == "bool":
            raise InternalError(f"loop IR: bitcast from {self.a.dtype} to {self.dtype} "
                                "changes the width")

    @property
    def lanes(self) -> int:
        return self.a.lanes


@dataclass(frozen=True, eq=False)
class Select(Expr):
    """``cond ? a : b``. Both arms are evaluated: an arm must never be an unsafe access."""

    cond: Expr
    a: Expr
    b: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype

    @property
    def lanes(self) -> int:
        return self.a.lanes


@dataclass(frozen=True, eq=False)
class Broadcast(Expr):
    """A scalar repeated in every lane of a vector."""

    value: Expr
    lanes: int

    @property
    def dtype(self) -> str:
        return self.value.dtype


@dataclass(frozen=True, eq=False)
class FMA(Expr):
    """``a * b + c``, fused (one rounding) where the target has FMA."""

    a: Expr
    b: Expr
    c: Expr

    @property
    def dtype(self) -> str:
        return self.a.dtype

    @property
    def lanes(self) -> int:
        return self.a.lanes


# What the packed values of a DotProduct operand can be: 4 bytes or 2 int16 per int32 lane.
DOT_DTYPES = ("uint8", "int8", "int16")


def dot_group(dtype: str) -> int:
    """How many values of ``dtype`` a 32-bit lane of a `DotProduct` operand packs."""
    return 2 if dtype == "int16" else 4


@dataclass(frozen=True, eq=False)
class DotProduct(Expr):
    """``c + Σ_q a[g·l+q]·b[g·l+q]`` per lane ``l``: integer dot products in groups of g.

    ``a``, ``b`` and ``c`` are int32 vectors of equal lanes; each 32-bit lane of ``a`` and
    ``b`` packs g values (lowest first) of ``a_dtype``/``b_dtype``: 4 bytes (``uint8`` or
    ``int8``, g = 4) or 2 ``int16`` (g = 2). Products are exact and the sum wraps modulo 2³²
    like int32 addition. The code generator picks the instructions from the Target's
    features: uint8 × int8 is one ``vpdpbusd`` on AVX-512-VNNI / AVX-VNNI, int16 pairs one
    ``vpmaddwd`` and an add on AVX2; elsewhere an exact widening sequence.
    """

    a: Expr
    b: Expr
    c: Expr
    a_dtype: str = "uint8"
    b_dtype: str = "int8"

    def __post_init__(self) -> None:
        if self.a_dtype not in DOT_DTYPES or self.b_dtype not in DOT_DTYPES:
            raise InternalError(f"loop IR: a dot product of {self.a_dtype} x {self.b_dtype}; "
                                f"its operands hold {' or '.join(DOT_DTYPES)}")
        if dot_group(self.a_dtype) != dot_group(self.b_dtype):
            raise InternalError(f"loop IR: a dot product of {self.a_dtype} x {self.b_dtype} "
                                "packs different numbers of values per lane")

    @property
    def dtype(self) -> str:
        return "int32"

    @property
    def lanes(self) -> int:
        return self.c.lanes


def as_expr(value: object, dtype: str = INDEX) -> Expr:
    """An expression from an expression or a Python number (an index by default)."""
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool):
        return Const(value, "bool")
    if isinstance(value, int):
        return Const(value, dtype if dtype != "bool" else INDEX)
    if isinstance(value, float):
        return Const(value, dtype if dtype_of(dtype).is_float else "float32")
    raise InternalError(f"loop IR: cannot use {value!r} as an expression")


def binary(op: str, a: object, b: object) -> Expr:
    """``a op b``, turning Python numbers into constants of the other operand's dtype.

    Integer index arithmetic is simplified as it is built (``x + 0``, ``x * 1``, ``x // 1``,
    constants folded), so lowerings can write plain formulas.
    """
    if not isinstance(a, Expr):
        a = as_expr(a, b.dtype if isinstance(b, Expr) else INDEX)
        if isinstance(b, Expr) and b.lanes > 1:
            a = Broadcast(a, b.lanes)
    if not isinstance(b, Expr):
        b = as_expr(b, a.dtype)
        if a.lanes > 1:
            b = Broadcast(b, a.lanes)
    if a.dtype == INDEX and b.dtype == INDEX and a.lanes == b.lanes == 1:
        simpler = _simplify_index(op, a, b)
        if simpler is not None:
            return simpler
    return Binary(op, a, b)


def _simplify_index(op: str, a: Expr, b: Expr) -> Expr | None:
    ca = a.value if isinstance(a, Const) else None
    cb = b.value if isinstance(b, Const) else None
    if ca is not None and cb is not None:
        fold = {"add": ca + cb, "sub": ca - cb, "mul": ca * cb}
        if op in fold:
            return Const(fold[op], INDEX)
        if op == "floordiv" and cb != 0:
            return Const(ca // cb, INDEX)
        if op == "floormod" and cb != 0:
            return Const(ca % cb, INDEX)
    if op == "add" and ca == 0:
        return b
    if op in ("add", "sub") and cb == 0:
        return a
    if op == "mul" and (ca == 1 or cb == 1):
        return b if ca == 1 else a
    if op == "mul" and (ca == 0 or cb == 0):
        return Const(0, INDEX)
    if op == "floordiv" and cb == 1:
        return a
    if op == "floormod" and cb == 1:
        return Const(0, INDEX)
    return None


def const(value: int | float | bool, dtype: str) -> Const:
    return Const(value, dtype)


def operands(e: Expr) -> tuple[Expr, ...]:
    """The expressions ``e`` is computed from, in field order (none for constants and
    variables): the one place that knows each expression's fields, for every walk."""
    match e:
        case Load(indices=idx):
            return idx
        case Binary(a=a, b=b):
            return (a, b)
        case Unary(a=a) | Cast(a=a) | Bitcast(a=a):
            return (a,)
        case Select(cond=c, a=a, b=b):
            return (c, a, b)
        case Broadcast(value=v):
            return (v,)
        case FMA(a=a, b=b, c=c) | DotProduct(a=a, b=b, c=c):
            return (a, b, c)
    return ()


def with_operands(e: Expr, ops: tuple[Expr, ...]) -> Expr:
    """``e`` with its operands (in `operands`' order) replaced by ``ops``."""
    match e:
        case Load():
            return replace(e, indices=ops)
        case Binary():
            return replace(e, a=ops[0], b=ops[1])
        case Unary() | Cast() | Bitcast():
            return replace(e, a=ops[0])
        case Select():
            return replace(e, cond=ops[0], a=ops[1], b=ops[2])
        case Broadcast():
            return replace(e, value=ops[0])
        case FMA() | DotProduct():
            return replace(e, a=ops[0], b=ops[1], c=ops[2])
    return e


def subexpressions(root: Expr) -> Iterator[Expr]:
    """Every node of ``root``'s tree once (a shared node once), parents before children."""
    stack, seen = [root], set()
    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        stack.extend(operands(e))


# --- statements --------------------------------------------------------------------------------


class Stmt:
    """Base of loop-IR statements."""

    __slots__ = ()

    def __str__(self) -> str:
        from kiln.loops.printer import stmt_text

        return stmt_text(self)


LOOP_KINDS = ("serial", "parallel", "vectorized", "unrolled", "scalar", "rolled")
# A parallel loop's iterations are cut into this many chunks per thread by default: a few,
# so that the threads that are running take over the share of one that is not (a busy
# core), and few enough that claiming one (an atomic add) costs nothing beside its work
CHUNKS_PER_THREAD = 4
MAX_CHUNKS_PER_THREAD = 64


@dataclass(frozen=True, eq=False)
class For(Stmt):
    """``for var in [start, start + extent)``.

    ``kind``: serial; parallel (iterations run on the thread pool; they must not depend on
    each other); vectorized (a hint: the code generator asks LLVM to vectorize this innermost
    loop); unrolled (fully unrolled; the extent must be a small constant); scalar (serial,
    and LLVM must not vectorize it: a copy that transposes, which it would vectorize with
    scatters, each slower than the scalar stores it replaces); rolled (serial, and LLVM
    must neither vectorize nor unroll it: a reduction over kernel taps around a body that
    is large already, which full unrolling multiplied into minutes of compiling).
    ``chunks``: for a parallel loop, how many pieces per thread the pool hands out (a
    schedule knob, kiln/codegen/outline.py; results never depend on it).
    """

    var: Var
    start: Expr
    extent: Expr
    body: Stmt
    kind: str = "serial"
    chunks: int = CHUNKS_PER_THREAD

    def __post_init__(self) -> None:
        if self.kind not in LOOP_KINDS:
            raise InternalError(f"loop IR: unknown loop kind {self.kind!r}")
        if not 1 <= self.chunks <= MAX_CHUNKS_PER_THREAD:
            raise InternalError(f"loop IR: {self.chunks} chunks per thread")


@dataclass(frozen=True, eq=False)
class Store(Stmt):
    """``buffer[indices] = value`` (``value.lanes`` consecutive elements when a vector)."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr


@dataclass(frozen=True, eq=False)
class LetStmt(Stmt):
    """Bind a scalar (or vector) value to ``var`` in ``body``."""

    var: Var
    value: Expr
    body: Stmt


@dataclass(frozen=True, eq=False)
class Allocate(Stmt):
    """A local buffer live in ``body`` (stack for small ones, heap otherwise)."""

    buffer: Buffer
    body: Stmt


@dataclass(frozen=True, eq=False)
class Seq(Stmt):
    """Statements in order."""

    stmts: tuple[Stmt, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "stmts", tuple(self.stmts))


@dataclass(frozen=True, eq=False)
class IfThenElse(Stmt):
    """A branch; unlike `Select`, only the taken side runs (so it may guard an access)."""

    cond: Expr
    then_case: Stmt
    else_case: Stmt | None = None


@dataclass(frozen=True, eq=False)
class Check(Stmt):
    """Stop the kernel with an error unless ``cond`` holds (integer division by zero, an
    index out of range in ``take`` with mode="fast"). The kernel returns a nonzero status and
    the runtime raises `kiln.EvalError` with ``message``."""

    cond: Expr
    message: str


@dataclass(frozen=True, eq=False)
class Prefetch(Stmt):
    """A hint: bring the cache line of ``ref``'s first element closer (LLVM's
    ``llvm.prefetch``, for reading, into all cache levels). Reads nothing and changes
    nothing; ``ref`` must still lie inside its buffer (the verifier checks it as a load).
    The GEMM prefetches a streamed weight's panel ahead of its use (kiln/loops/gemm.py)."""

    ref: Load


# A matrix tile of `TileProduct`: 16 rows of 64 bytes (16 int32), the shape of an AMX tile.
TILE_ROWS = 16
TILE_WORDS = 16
TILE_DTYPES = ("uint8", "int8")
TILE_FEATURES = ("amx-tile", "amx-int8")  # what a Target needs for a TileProduct (LLVM's names)


@dataclass(frozen=True, eq=False)
class TileProduct(Stmt):
    """An 8-bit matrix product on matrix tiles (Intel AMX's ``tdpb[su][su]d``), exact in int32.

    Each tile is `TILE_ROWS` rows of `TILE_WORDS` int32 (64 bytes) in an int32 buffer,
    its rows ``*_stride`` elements apart, named by a `Load` of its first element (row 0,
    word 0): the address; nothing is read as a scalar. For ``var`` over [0, ``steps``),
    A tile ``a[i]`` (16 rows × 64 values of ``a_dtype``: M × K) times B tile ``b[j]``
    (16 rows × 16 int32, each the 4 consecutive K values of one column, of ``b_dtype``:
    K/4 × N, VNNI's layout) is summed into the 16×16 int32 accumulator (i, j), which
    starts at zero; products are exact and sums wrap modulo 2³² as int32 sums do. After
    the last step accumulator (i, j) is stored to tile ``c[i·len(b) + j]``. The operands'
    indices may use ``var`` (and only they). At most 8 tiles are live at once (AMX has 8
    tile registers): len(a)·len(b) + len(a) + len(b) ≤ 8.
    """

    var: Var
    steps: Expr
    a: tuple[Load, ...]
    b: tuple[Load, ...]
    c: tuple[Load, ...]
    a_stride: int
    b_stride: int
    c_stride: int
    a_dtype: str = "int8"
    b_dtype: str = "uint8"

    def __post_init__(self) -> None:
        object.__setattr__(self, "a", tuple(self.a))
        object.__setattr__(self, "b", tuple(self.b))
        object.__setattr__(self, "c", tuple(self.c))
        if self.a_dtype not in TILE_DTYPES or self.b_dtype not in TILE_DTYPES:
            raise InternalError(f"loop IR: a tile product of {self.a_dtype} x {self.b_dtype}; "
                                f"its operands hold {' or '.join(TILE_DTYPES)}")
        na, nb = len(self.a), len(self.b)
        if not na or not nb or len(self.c) != na * nb or na * nb + na + nb > 8:
            raise InternalError(f"loop IR: a tile product of {na} A, {nb} B and "
                                f"{len(self.c)} C tiles (C must be A x B, and 8 tiles at most)")
        for ref in (*self.a, *self.b, *self.c):
            if ref.lanes != 1 or ref.buffer.dtype != "int32":
                raise InternalError(f"loop IR: tile {ref.buffer.name} must be named by a "
                                    "scalar element of an int32 buffer")


@dataclass(frozen=True, eq=False)
class Kernel:
    """A compiled unit: buffers in (inputs then outputs) and a body.

    ``inputs`` are read, ``outputs`` are written; the code generator may assume they do not
    overlap (noalias). ``attrs`` carries notes for the code generator and the runtime (e.g. the
    fused operators, for messages and statistics).
    """

    name: str
    inputs: tuple[Buffer, ...]
    outputs: tuple[Buffer, ...]
    body: Stmt
    attrs: dict = field(default_factory=dict)
    # The dimension variables of a symbolic kernel (compiled once for every size): INDEX
    # variables that buffer shapes mention, passed by the caller after the buffers and
    # checked against the arrays' shapes before the call (kiln/runtime/symbolic.py).
    dims: tuple[Var, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "dims", tuple(self.dims))
        known = {id(d) for d in self.dims}
        for b in self.inputs + self.outputs:
            for d in b.shape:
                if isinstance(d, Var) and id(d) not in known:
                    raise InternalError(f"loop IR: buffer {b.name} of kernel {self.name} has "
                                        f"the dimension {d.name}, not one of the kernel's dims")

    @property
    def is_symbolic(self) -> bool:
        """Whether the kernel takes its sizes at run time (`dims`)."""
        return bool(self.dims)

    @property
    def params(self) -> tuple[Buffer, ...]:
        return self.inputs + self.outputs

    def __str__(self) -> str:
        from kiln.loops.printer import kernel_text

        return kernel_text(self)


def seq(*stmts: Stmt | None) -> Stmt:
    """A `Seq` of the non-None statements (the statement itself when there is one)."""
    kept = [s for s in stmts if s is not None]
    return kept[0] if len(kept) == 1 else Seq(tuple(kept))


def loop_nest(
    extents: Sequence[int], body_fn, names: Sequence[str] | None = None, kind: str = "serial"
) -> Stmt:  # noqa: ANN001
    """``for i0 in extents[0]: for i1 in ...: body_fn(i0, i1, ...)`` (serial loops)."""
    names = names or [f"i{k}" for k in range(len(extents))]
    vs = [Var(n) for n in names]
    stmt = body_fn(*vs)
    for v, n in reversed(list(zip(vs, extents))):
        stmt = For(v, Const(0), Const(n), stmt, kind)
    return stmt
