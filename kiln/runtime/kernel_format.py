"""Loop-IR kernels as plain data and back, for saved executables.

A saved executable keeps each kernel's loop IR beside its machine code: the runtime needs
the kernel's signature (buffer shapes and dtypes) to check arrays before native code sees
them, and an executable built without the code generator runs the loop IR itself.

A kernel is written as a node table in post-order — every node after the nodes it uses —
so shared subexpressions stay shared and reading is one forward pass with no recursion:

    {"name": ..., "buffers": [[name, shape, dtype, scope], ...], "inputs": [...],
     "outputs": [...], "nodes": [["Binary", "add", 3, 4], ...], "body": 17, "attrs": {...}}

Reading checks every field and reference; the kernel read back is run through the loop
verifier, so a damaged one cannot index outside its buffers.
"""

from __future__ import annotations

import base64
from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.ir.ty import DTYPES
from kiln.loops.ir import (
    BINARY_OPS,
    CHUNKS_PER_THREAD,
    DOT_DTYPES,
    FMA,
    LOOP_KINDS,
    MAX_CHUNKS_PER_THREAD,
    TILE_DTYPES,
    UNARY_OPS,
    Allocate,
    Binary,
    Bitcast,
    Broadcast,
    Buffer,
    Cast,
    Check,
    Const,
    DotProduct,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Load,
    Prefetch,
    Select,
    Seq,
    Store,
    TileProduct,
    Unary,
    Var,
    dot_group,
)
from kiln.loops.verify import verify

# No kernel kiln makes has wider vectors (64 int8 lanes fill a 512-bit register); a file
# asking for more would only make LLVM build absurd types.
MAX_LANES = 256


class MalformedKernel(Error):
    """A saved kernel that does not read back."""


def _need(ok: bool, what: str) -> None:
    if not ok:
        raise MalformedKernel(f"malformed kernel: {what}")


def _kids(n: Any) -> list[Any]:
    """The nodes ``n`` refers to (expressions and statements), in field order."""
    match n:
        case Const() | Var():
            return []
        case Load():
            return list(n.indices)
        case Binary():
            return [n.a, n.b]
        case Unary() | Cast() | Bitcast():
            return [n.a]
        case Select():
            return [n.cond, n.a, n.b]
        case Broadcast():
            return [n.value]
        case FMA() | DotProduct():
            return [n.a, n.b, n.c]
        case For():
            return [n.var, n.start, n.extent, n.body]
        case Store():
            return [*n.indices, n.value]
        case LetStmt():
            return [n.var, n.value, n.body]
        case Allocate():
            return [n.body]
        case Seq():
            return list(n.stmts)
        case IfThenElse():
            return [n.cond, n.then_case] + ([n.else_case] if n.else_case is not None else [])
        case Check():
            return [n.cond]
        case TileProduct():
            return [n.var, n.steps, *n.a, *n.b, *n.c]
        case Prefetch():
            return [n.ref]
    raise InternalError(f"cannot save a loop-IR node {type(n).__name__}")


# --- attributes: JSON values, tuples and arrays tagged ---------------------------------------


def _attr_out(v: Any) -> Any:
    if isinstance(v, (str, bool, int, float)) or v is None:
        return v
    if isinstance(v, np.generic):
        return {"scalar": [v.dtype.name, v.item()]}
    if isinstance(v, tuple):
        return {"tuple": [_attr_out(x) for x in v]}
    if isinstance(v, list):
        return [_attr_out(x) for x in v]
    if isinstance(v, dict):
        return {"dict": [[str(k), _attr_out(x)] for k, x in v.items()]}
    if isinstance(v, np.ndarray):
        return {"array": [v.dtype.name, list(v.shape),
                          base64.b64encode(np.ascontiguousarray(v).tobytes()).decode()]}
    return {"repr": repr(v)}  # informative only (knobs an executor never reads)


def _attr_in(v: Any, depth: int = 0) -> Any:
    _need(depth < 64, "attributes nested too deeply")
    if isinstance(v, (str, bool, int, float)) or v is None:
        return v
    if isinstance(v, list):
        return [_attr_in(x, depth + 1) for x in v]
    _need(isinstance(v, dict) and len(v) == 1, "an attribute value")
    (tag, body), = v.items()
    if tag == "tuple":
        return tuple(_attr_in(x, depth + 1) for x in _list(body))
    if tag == "dict":
        return {str(k): _attr_in(x, depth + 1) for k, x in _list(body)}
    if tag == "array":
        dtype, shape, data = _list(body)
        _need(dtype in DTYPES and isinstance(data, str), "an array attribute")
        try:
            raw = base64.b64decode(data, validate=True)
            return np.frombuffer(raw, dtype=dtype).reshape(shape).copy()
        except (ValueError, TypeError) as e:
            raise MalformedKernel(f"malformed kernel: an array attribute ({e})") from None
    if tag == "repr":
        return str(body)
    if tag == "scalar":
        dtype, value = _list(body)
        _need(dtype in DTYPES and isinstance(value, (bool, int, float)), "a scalar attribute")
        return np.dtype(dtype).type(value)
    raise MalformedKernel(f"malformed kernel: attribute tag {tag!r}")


def _list(x: Any) -> list[Any]:
    _need(isinstance(x, list), "a list")
    return x


# --- writing -------------------------------------------------------------------------------


def write_kernel(k: Kernel) -> dict[str, Any]:
    """``k`` as JSON-able data."""
    buffers: dict[Buffer, int] = {}
    for b in k.params:
        buffers.setdefault(b, len(buffers))
    index: dict[int, int] = {}
    nodes: list[Any] = []
    stack: list[tuple[Any, bool]] = [(k.body, False)]
    while stack:
        n, ready = stack.pop()
        if id(n) in index:
            continue
        kids = _kids(n)
        if not ready:
            stack.append((n, True))
            stack.extend((c, False) for c in reversed(kids) if id(c) not in index)
            continue
        ref = [index[id(c)] for c in kids]
        buf = getattr(n, "buffer", None)
        if buf is not None:
            buffers.setdefault(buf, len(buffers))
        match n:
            case Const():
                entry = ["Const", _attr_out(n.value), n.dtype, n.lanes]
            case Var():
                entry = ["Var", n.name, n.dtype, n.lanes]
            case Load():
                entry = ["Load", buffers[n.buffer], ref, n.lanes]
            case Binary():
                entry = ["Binary", n.op, *ref]
            case Unary():
                entry = ["Unary", n.op, *ref]
            case Cast():
                entry = ["Cast", n.dtype, *ref]
            case Bitcast():
                entry = ["Bitcast", n.dtype, *ref]
            case Select() | FMA():
                entry = [type(n).__name__, *ref]
            case DotProduct():
                entry = ["DotProduct", *ref, n.a_dtype, n.b_dtype]
            case Broadcast():
                entry = ["Broadcast", ref[0], n.lanes]
            case For():
                # the chunks only where a schedule set them: files from before they existed
                # and loops at the default read alike
                entry = ["For", *ref, n.kind] + ([n.chunks] if n.chunks != CHUNKS_PER_THREAD
                                                 else [])
            case Store():
                entry = ["Store", buffers[n.buffer], ref[:-1], ref[-1]]
            case LetStmt():
                entry = ["LetStmt", *ref]
            case Allocate():
                entry = ["Allocate", buffers[n.buffer], ref[0]]
            case Seq():
                entry = ["Seq", ref]
            case IfThenElse():
                entry = ["IfThenElse", *ref] + ([] if n.else_case is not None else [None])
            case Check():
                entry = ["Check", ref[0], n.message]
            case TileProduct():
                na, nb = len(n.a), len(n.b)
                entry = ["TileProduct", ref[0], ref[1], ref[2:2 + na], ref[2 + na:2 + na + nb],
                         ref[2 + na + nb:], n.a_stride, n.b_stride, n.c_stride, n.a_dtype,
                         n.b_dtype]
            case Prefetch():
                entry = ["Prefetch", ref[0]]
        index[id(n)] = len(nodes)
        nodes.append(entry)
    return {
        "name": k.name,
        "buffers": [[b.name, list(b.shape), b.dtype, b.scope] for b in buffers],
        "inputs": [buffers[b] for b in k.inputs],
        "outputs": [buffers[b] for b in k.outputs],
        "nodes": nodes,
        "body": index[id(k.body)],
        "attrs": _attr_out(dict(k.attrs)),
    }


# --- reading -------------------------------------------------------------------------------


_EXPR = (Const, Var, Load, Binary, Unary, Cast, Bitcast, Select, Broadcast, FMA, DotProduct)
_STMT = (For, Store, LetStmt, Allocate, Seq, IfThenElse, Check, TileProduct, Prefetch)


def read_kernel(doc: Any) -> Kernel:
    """The kernel of a document written by `write_kernel`, verified."""
    try:
        return _read_kernel(doc)
    except MalformedKernel:
        raise
    except (TypeError, ValueError, KeyError, IndexError, AttributeError, RecursionError) as e:
        raise MalformedKernel(f"malformed kernel ({type(e).__name__}: {e})") from None


def _read_kernel(doc: Any) -> Kernel:
    _need(isinstance(doc, dict), "not an object")
    buffers = []
    for b in _list(doc.get("buffers")):
        _need(isinstance(b, list) and len(b) == 4, "a buffer")
        name, shape, dtype, scope = b
        _need(isinstance(name, str) and dtype in DTYPES and scope in ("global", "local")
              and isinstance(shape, list)
              and all(type(d) is int and 0 <= d < 1 << 40 for d in shape), "a buffer")
        buffers.append(Buffer(name, tuple(shape), dtype, scope))
    nodes: list[Any] = []

    def node(i: Any, kinds: tuple[type, ...] = _EXPR) -> Any:
        _need(type(i) is int and 0 <= i < len(nodes), f"node reference {i!r}")
        _need(isinstance(nodes[i], kinds), f"node {i} is a {type(nodes[i]).__name__}")
        return nodes[i]

    def buf(i: Any) -> Buffer:
        _need(type(i) is int and 0 <= i < len(buffers), f"buffer reference {i!r}")
        return buffers[i]

    def var(i: Any) -> Var:
        return node(i, (Var,))

    for entry in _list(doc.get("nodes")):
        _need(isinstance(entry, list) and len(entry) > 0 and isinstance(entry[0], str), "a node")
        kind, *f = entry
        try:
            n = _read_node(kind, f, node, buf, var)
        except (ValueError, TypeError, IndexError, InternalError) as e:
            raise MalformedKernel(f"malformed kernel: a {kind} node ({e})") from None
        nodes.append(n)
    body = node(doc.get("body"), _STMT)
    name = doc.get("name")
    _need(isinstance(name, str), "the kernel name")
    attrs = _attr_in(doc.get("attrs", {"dict": []}))
    _need(isinstance(attrs, dict), "kernel attributes")
    k = Kernel(name, tuple(buf(i) for i in _list(doc.get("inputs"))),
               tuple(buf(i) for i in _list(doc.get("outputs"))), body, attrs)
    try:
        return verify(k)
    except Error as e:
        raise MalformedKernel(f"malformed kernel {name}: {e.message}") from None


def _read_node(kind: str, f: list[Any], node: Any, buf: Any, var: Any) -> Any:
    match kind:
        case "Const":
            value, dtype, lanes = f
            value = _attr_in(value)
            _need(isinstance(value, (int, float, bool, np.generic)) and dtype in DTYPES
                  and type(lanes) is int and 1 <= lanes <= MAX_LANES, "a constant")
            return Const(value, dtype, lanes)
        case "Var":
            name, dtype, lanes = f
            _need(isinstance(name, str) and dtype in DTYPES and type(lanes) is int
                  and 1 <= lanes <= MAX_LANES, "a variable")
            return Var(name, dtype, lanes)
        case "Load":
            b, idx, lanes = f
            _need(type(lanes) is int and 1 <= lanes <= MAX_LANES, "lanes")
            return Load(buf(b), tuple(node(i) for i in _list(idx)), lanes)
        case "Binary":
            op, a, b = f
            _need(op in BINARY_OPS, f"binary operation {op!r}")
            return Binary(op, node(a), node(b))
        case "Unary":
            op, a = f
            _need(op in UNARY_OPS, f"unary operation {op!r}")
            return Unary(op, node(a))
        case "Cast":
            dtype, a = f
            _need(dtype in DTYPES, f"dtype {dtype!r}")
            return Cast(dtype, node(a))
        case "Bitcast":
            dtype, a = f
            _need(dtype in DTYPES, f"dtype {dtype!r}")
            return Bitcast(dtype, node(a))
        case "Select":
            return Select(*(node(i) for i in f))
        case "FMA":
            return FMA(*(node(i) for i in f))
        case "DotProduct":
            a, b, c, ta, tb = f
            _need(ta in DOT_DTYPES and tb in DOT_DTYPES and dot_group(ta) == dot_group(tb),
                  f"dot product of {ta!r} x {tb!r}")
            return DotProduct(node(a), node(b), node(c), ta, tb)
        case "Broadcast":
            v, lanes = f
            _need(type(lanes) is int and 1 <= lanes <= MAX_LANES, "lanes")
            return Broadcast(node(v), lanes)
        case "For":
            _need(len(f) in (5, 6), "a loop")
            v, start, extent, body, loop_kind = f[:5]
            _need(loop_kind in LOOP_KINDS, "a loop kind")
            chunks = f[5] if len(f) == 6 else CHUNKS_PER_THREAD
            _need(type(chunks) is int and 1 <= chunks <= MAX_CHUNKS_PER_THREAD,
                  "a loop's chunks per thread")
            return For(var(v), node(start), node(extent), node(body, _STMT), loop_kind, chunks)
        case "Store":
            b, idx, value = f
            return Store(buf(b), tuple(node(i) for i in _list(idx)), node(value))
        case "LetStmt":
            v, value, body = f
            return LetStmt(var(v), node(value), node(body, _STMT))
        case "Allocate":
            b, body = f
            return Allocate(buf(b), node(body, _STMT))
        case "Seq":
            return Seq(tuple(node(i, _STMT) for i in _list(f[0])))
        case "IfThenElse":
            c, then, other = f
            return IfThenElse(node(c), node(then, _STMT),
                              None if other is None else node(other, _STMT))
        case "Check":
            c, message = f
            _need(isinstance(message, str), "a check message")
            return Check(node(c), message)
        case "TileProduct":
            v, steps, a, b, c, sa, sb, sc, ta, tb = f
            _need(all(type(x) is int and 0 <= x < 1 << 40 for x in (sa, sb, sc))
                  and ta in TILE_DTYPES and tb in TILE_DTYPES, "a tile product")

            def tiles(refs: Any) -> tuple[Load, ...]:
                return tuple(node(i, (Load,)) for i in _list(refs))

            return TileProduct(var(v), node(steps), tiles(a), tiles(b), tiles(c), sa, sb, sc,
                               ta, tb)
        case "Prefetch":
            (ref,) = f
            return Prefetch(node(ref, (Load,)))
    raise MalformedKernel(f"malformed kernel: unknown node kind {kind!r}")
