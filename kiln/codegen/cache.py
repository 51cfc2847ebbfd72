"""The machine-code cache: kernel fingerprints, and object files on disk.

A kernel's *fingerprint* hashes its content — a canonical text of its loop IR, in which
variables and buffers are numbered by first appearance (names are only hints, and may
repeat) and shared expression nodes are written once — plus its attributes. The kernel's
name is left out, so identical kernels share machine code. The cache key adds the target
machine's key (`Machine.key`: the `kiln.Target`'s fingerprint — triple, CPU, features —, the
LLVM version, the opt level and kiln's codegen version).

Entries live under ``$KILN_CACHE`` (default ``~/.cache/kiln``; an empty value turns the
cache off) as ``objects/<key>.o``: a magic number, the SHA-256 of the payload, its length,
then the object file. Writes go to a temporary file renamed into place, so readers never
see half an entry; an entry that fails its checks (truncated, corrupted, another format)
is ignored and rebuilt. A cache that cannot be written is skipped silently.
"""

from __future__ import annotations

import hashlib
import os
import struct
import tempfile
import weakref
from dataclasses import fields, is_dataclass
from pathlib import Path

import numpy as np

from kiln.codegen.target import CODEGEN_VERSION
from kiln.loops.ir import Buffer, Const, Expr, Kernel, Stmt, Var

_MAGIC = b"KILNOBJ1"
_HEADER = struct.Struct("<8s32sQ")


# --- fingerprints ------------------------------------------------------------------------------


def canonical_text(kernel: Kernel) -> str:
    """The kernel's loop IR as canonical text (iterative; shared nodes written once)."""
    names: dict[int, str] = {}
    lines: list[str] = []

    def name_of(x: Var | Buffer) -> str:
        n = names.get(id(x))
        if n is None:
            if isinstance(x, Var):
                n = f"v{len(names)}:{x.dtype}x{x.lanes}"
            else:
                n = f"b{len(names)}:{x.dtype}{list(x.shape)}:{x.scope}"
            names[id(x)] = n
        return n

    for b in kernel.params:
        name_of(b)
    refs: dict[int, str] = {}
    # Post-order over the whole kernel: children (operands, bodies) before their parent.
    stack: list[tuple[object, bool]] = [(kernel.body, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in refs:
            continue
        parts = _parts(node)
        if not ready:
            stack.append((node, True))
            stack.extend((p, False) for p in reversed(parts) if isinstance(p, (Stmt, Expr))
                         and not isinstance(p, Var) and id(p) not in refs)
            continue
        words = [type(node).__name__]
        for p in parts:
            if isinstance(p, (Var, Buffer)):
                words.append(name_of(p))
            elif isinstance(p, (Stmt, Expr)):
                words.append(refs[id(p)])
            else:
                words.append(_atom(p))
        if isinstance(node, Const):
            words.append(node.dtype)
        ref = f"%{len(refs)}"
        refs[id(node)] = ref
        lines.append(f"{ref} = {' '.join(words)}")
    lines.append("params " + " ".join(name_of(b) for b in kernel.params))
    lines.append(f"inputs {len(kernel.inputs)}")
    lines.append("attrs " + _atom(kernel.attrs))
    return "\n".join(lines)


def _parts(node: object) -> list[object]:
    """The fields of a node, tuples flattened, Check messages left out (code ignores them)."""
    out: list[object] = []
    if not is_dataclass(node):
        return out
    for f in fields(node):
        if f.name in ("message", "uid"):
            continue
        value = getattr(node, f.name)
        if isinstance(value, tuple):
            out.append(f"({len(value)})")
            out.extend(value)
        else:
            out.append(value)
    return out


def _atom(value: object) -> str:
    """Deterministic text for an attribute value (arrays by shape and dtype, not content)."""
    if isinstance(value, float):
        return value.hex()
    if isinstance(value, (bool, int, str)) or value is None:
        return repr(value)
    if isinstance(value, np.generic):
        return f"{type(value).__name__}:{_atom(value.item())}"
    if isinstance(value, np.ndarray):
        return f"array({value.dtype}{list(value.shape)})"
    if isinstance(value, (tuple, list)):
        return "[" + ",".join(_atom(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{_atom(k)}:{_atom(v)}" for k, v in sorted(
            value.items(), key=lambda kv: repr(kv[0]))) + "}"
    return f"{type(value).__name__}:{value!r}"


# A kernel is immutable: its fingerprint is computed once (the canonical text of a large
# kernel — decomposed transcendentals, a GEMM — takes milliseconds, and a build asks for it
# for the cache key, the symbol and the library).
_FINGERPRINTS: weakref.WeakKeyDictionary[Kernel, str] = weakref.WeakKeyDictionary()


def fingerprint(kernel: Kernel) -> str:
    """SHA-256 (hex) of the kernel's content and kiln's codegen version."""
    done = _FINGERPRINTS.get(kernel)
    if done is None:
        h = hashlib.sha256(CODEGEN_VERSION.encode())
        h.update(canonical_text(kernel).encode())
        done = _FINGERPRINTS[kernel] = h.hexdigest()
    return done


def kernel_symbol(kernel: Kernel, fp: str | None = None) -> str:
    """The native symbol of a kernel's entry point, derived from its content (``fp``: its
    fingerprint, when already computed)."""
    return "kiln_" + (fp or fingerprint(kernel))[:32]


def cache_key(content: str, target_key: str) -> str:
    """The cache key of some content (a fingerprint, or LLVM IR) compiled for a target."""
    return hashlib.sha256(f"{content}\n{target_key}".encode()).hexdigest()


# --- the disk cache ----------------------------------------------------------------------------


class DiskCache:
    """Object files by key in a directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike) -> None:
        self.root = Path(root)
        self.hits = 0
        self.misses = 0

    @staticmethod
    def default() -> DiskCache | None:
        """The cache at ``$KILN_CACHE`` (default ``~/.cache/kiln``), or None when disabled."""
        root = os.environ.get("KILN_CACHE")
        if root is None:
            root = os.path.join(os.path.expanduser("~"), ".cache", "kiln")
        return DiskCache(root) if root.strip() else None

    def path(self, key: str) -> Path:
        return self.root / "objects" / f"{key}.o"

    def get(self, key: str) -> bytes | None:
        """The object file stored under ``key``, or None (missing or failing its checks)."""
        try:
            data = self.path(key).read_bytes()
        except OSError:
            self.misses += 1
            return None
        payload = unpack_entry(data)
        if payload is None:
            self.misses += 1
        else:
            self.hits += 1
        return payload

    def put(self, key: str, payload: bytes) -> None:
        """Store ``payload`` atomically (temporary file, then rename); errors are ignored."""
        target = self.path(key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", dir=target.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(pack_entry(payload))
                os.replace(tmp, target)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError:
            pass


def pack_entry(payload: bytes) -> bytes:
    return _HEADER.pack(_MAGIC, hashlib.sha256(payload).digest(), len(payload)) + payload


def unpack_entry(data: bytes) -> bytes | None:
    """The payload of a cache entry, or None if it is not an intact entry."""
    if len(data) < _HEADER.size:
        return None
    magic, digest, size = _HEADER.unpack_from(data)
    payload = data[_HEADER.size:]
    if magic != _MAGIC or size != len(payload) or hashlib.sha256(payload).digest() != digest:
        return None
    return payload
