"""The machine-code cache: kernel fingerprints, and object files on disk.

A kernel's *fingerprint* hashes its content — a canonical text of its loop IR, in which
variables and buffers are numbered by first appearance (names are only hints, and may
repeat) and shared expression nodes are written once — plus its attributes. The kernel's
name is left out, so identical kernels share machine code. The cache key adds the target
machine's key (`Machine.key`: the `kiln.Target`'s fingerprint — triple, CPU, features —, the
LLVM version, the opt level and kiln's codegen version).

Entries live under ``$KILN_CACHE``, else ``$XDG_CACHE_HOME/kiln``, else ``~/.cache/kiln``
(``KILN_CACHE`` empty, ``0``, ``off``, ``false``, ``no`` or ``none`` turns the cache off,
rather than naming a directory ``0`` in the working directory), as ``objects/<key>.o``::

    magic "KILNOBJ2" | key id (16 bytes) | HMAC-SHA256 (32) | payload length (8) | object file

The HMAC is made with this user's local key (`kiln.trust.local_key`) over the magic, the
cache key and the payload, so an entry is *sealed*: someone who can write into the cache
directory but cannot read the user's key cannot make kiln link machine code of theirs, nor
pass one kernel's entry off as another's. An entry that fails its checks (truncated,
corrupted, another format, another key, a wrong seal) is a miss: it is deleted and rebuilt.
Without a local key (a config directory kiln can neither read nor write) there is no disk
cache at all. Writes go to a temporary file renamed into place, so readers never see half an
entry; a cache that cannot be written is skipped silently.

The cache holds at most ``$KILN_CACHE_MAX_BYTES`` (default 1 GiB; ``512M``, ``2G`` work too).
A hit touches its entry's modification time; when the entries written push the total over
the cap, the least recently used are unlinked until it is 90 % of the cap. The scan that
totals the directory runs once every cap/16 bytes written (the first one after a random
share of that, so that many short processes scan in proportion to what they write, not each
one); processes sharing a cache only ever unlink whole entries, and readers take a missing
entry as a miss.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import random
import re
import struct
import tempfile
import time
import weakref
from dataclasses import dataclass, fields, is_dataclass
from pathlib import Path

import numpy as np

from kiln import trust
from kiln.codegen.target import CODEGEN_VERSION
from kiln.errors import Error
from kiln.loops.ir import Buffer, Const, Expr, Kernel, Stmt, Var

log = logging.getLogger(__name__)

_MAGIC = b"KILNOBJ2"
_HEADER = struct.Struct(f"<8s{trust.ID_BYTES}s{trust.MAC_BYTES}sQ")
DEFAULT_MAX_BYTES = 1 << 30
_STALE_TEMPORARY_SECONDS = 3600.0  # a temporary file this old was left by a killed writer


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
            else:  # a symbolic dim by its name here (the dims are named first)
                shape = [name_of(d) if isinstance(d, Var) else d for d in x.shape]
                n = f"b{len(names)}:{x.dtype}{shape}:{x.scope}"
            names[id(x)] = n
        return n

    for d in kernel.dims:
        name_of(d)
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
    if kernel.dims:
        lines.append("dims " + " ".join(name_of(d) for d in kernel.dims))
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


# values of KILN_CACHE that turn the cache off
CACHE_OFF = frozenset(["", "0", "off", "false", "no", "none"])


def default_root() -> Path | None:
    """Where the cache lives (see the module docstring); None when ``KILN_CACHE`` turns it
    off (`CACHE_OFF`)."""
    root = os.environ.get("KILN_CACHE")
    if root is not None:
        return None if root.strip().lower() in CACHE_OFF else Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg else Path(os.path.expanduser("~")) / ".cache"
    return base / "kiln"


_SIZE = re.compile(r"\s*([0-9]+)\s*([kmgt]?)(i?b)?\s*", re.IGNORECASE)


def parse_size(text: str, what: str = "KILN_CACHE_MAX_BYTES") -> int:
    """A byte count: an integer, optionally with K, M, G or T (powers of 1024)."""
    m = _SIZE.fullmatch(text)
    if m is None or int(m.group(1)) <= 0:
        raise Error(f"{what}={text!r}: want a positive number of bytes, such as 1000000, "
                    "512M or 2G")
    unit = m.group(2).lower()
    return int(m.group(1)) << (10 * (1 + "kmgt".index(unit)) if unit else 0)


def default_max_bytes() -> int:
    """The cap of the cache: ``$KILN_CACHE_MAX_BYTES``, else 1 GiB."""
    text = os.environ.get("KILN_CACHE_MAX_BYTES")
    return DEFAULT_MAX_BYTES if text is None or not text.strip() else parse_size(text)


@dataclass(frozen=True)
class CacheInfo:
    """What is in a cache directory (`DiskCache.info`)."""

    root: Path
    entries: int
    total_bytes: int
    max_bytes: int


# Bytes written into each cache directory by this process since its last scan (see the
# module docstring), shared by every DiskCache of one root.
_WRITTEN: dict[Path, int] = {}


class DiskCache:
    """Sealed object files by key in a directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike, secret: bytes,
                 max_bytes: int | None = None) -> None:
        if len(secret) != trust.KEY_BYTES:
            raise Error(f"a cache key is {trust.KEY_BYTES} bytes, not {len(secret)}")
        self.root = Path(root)
        self.secret = secret
        self.key_id = trust.key_id(secret)
        self.max_bytes = default_max_bytes() if max_bytes is None else max_bytes
        self.hits = 0
        self.misses = 0

    @staticmethod
    def default() -> DiskCache | None:
        """The cache at `default_root`, sealed with this user's local key; None when the cache
        is turned off or there is no local key."""
        root = default_root()
        if root is None:
            return None
        secret = trust.local_key()
        if secret is None:
            log.debug("no local key (kiln.trust): the disk cache is off")
            return None
        return DiskCache(root, secret)

    @property
    def objects(self) -> Path:
        return self.root / "objects"

    def path(self, key: str) -> Path:
        return self.objects / f"{key}.o"

    def get(self, key: str) -> bytes | None:
        """The object file stored under ``key``, or None: missing, or failing its checks (then
        it is deleted)."""
        path = self.path(key)
        try:
            data = path.read_bytes()
        except OSError:
            self.misses += 1
            log.debug("cache miss %s", key[:16])
            return None
        payload, why = open_entry(data, self.secret, key)
        if payload is None:
            self.misses += 1
            # A wrong seal under our own key id is damage or tampering: worth saying.
            level = logging.WARNING if why == "its seal is wrong" else logging.DEBUG
            log.log(level, "cache entry %s: %s; deleted, to be rebuilt", path, why)
            self.delete(key)
            return None
        self.hits += 1
        log.debug("cache hit %s", key[:16])
        try:
            os.utime(path)  # least recently used is evicted first
        except OSError:
            pass
        return payload

    def put(self, key: str, payload: bytes) -> None:
        """Store ``payload`` sealed, atomically (temporary file, then rename); errors are
        ignored. May evict the least recently used entries (see the module docstring)."""
        target = self.path(key)
        entry = seal_entry(payload, self.secret, key)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", dir=target.parent)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(entry)
                os.replace(tmp, target)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as e:
            log.debug("cannot write the cache entry %s (%s)", target, e)
            return
        log.debug("cache store %s (%d bytes)", key[:16], len(entry))
        self._written(len(entry))

    def delete(self, key: str) -> None:
        """Remove the entry under ``key``, if there is one (errors are ignored)."""
        try:
            self.path(key).unlink()
        except OSError:
            pass

    def _written(self, size: int) -> None:
        every = max(1, self.max_bytes // 16)
        # A process's first count starts at a random share of `every` (the module docstring).
        written = _WRITTEN.get(self.root, random.randrange(every)) + size
        if written < every:
            _WRITTEN[self.root] = written
            return
        _WRITTEN[self.root] = 0
        self.evict()

    def _scan(self) -> list[tuple[float, int, Path]]:
        """(last use, size, path) of every entry; stale temporary files are removed."""
        out = []
        now = time.time()
        try:
            items = list(os.scandir(self.objects))
        except OSError:
            return []
        for item in items:
            try:
                st = item.stat(follow_symlinks=False)
            except OSError:
                continue  # unlinked by another process meanwhile
            if item.name.startswith("."):
                if now - st.st_mtime > _STALE_TEMPORARY_SECONDS:
                    _unlink(Path(item.path))
                continue
            if item.name.endswith(".o") and item.is_file(follow_symlinks=False):
                out.append((st.st_mtime, st.st_size, Path(item.path)))
        return out

    def evict(self) -> int:
        """Unlink the least recently used entries while the total is over the cap (down to
        90 % of it); how many were removed."""
        entries = self._scan()
        total = sum(size for _, size, _ in entries)
        if total <= self.max_bytes:
            return 0
        goal = self.max_bytes * 9 // 10
        removed = 0
        for _, size, path in sorted(entries):
            if total <= goal:
                break
            if _unlink(path):
                removed += 1
            total -= size
        log.debug("cache evicted %d entries from %s", removed, self.objects)
        return removed

    def info(self) -> CacheInfo:
        """Where the cache is, its entries and their total size, and its cap."""
        entries = self._scan()
        return CacheInfo(self.root, len(entries), sum(size for _, size, _ in entries),
                         self.max_bytes)

    def clear(self) -> int:
        """Remove every entry (and temporary file); how many entries were removed."""
        removed = 0
        try:
            items = list(os.scandir(self.objects))
        except OSError:
            return 0
        for item in items:
            if (item.name.endswith(".o") or item.name.startswith(".")) and _unlink(
                    Path(item.path)) and not item.name.startswith("."):
                removed += 1
        _WRITTEN.pop(self.root, None)
        return removed


def _unlink(path: Path) -> bool:
    try:
        path.unlink()
    except OSError:
        return False
    return True


def _seal(secret: bytes, key: str, size: int, payload: bytes) -> bytes:
    return trust.mac(secret, _MAGIC + key.encode() + b"\0" + struct.pack("<Q", size) + payload)


def seal_entry(payload: bytes, secret: bytes, key: str) -> bytes:
    """A cache entry for ``payload`` stored under ``key``, sealed with ``secret``."""
    return _HEADER.pack(_MAGIC, trust.key_id(secret), _seal(secret, key, len(payload), payload),
                        len(payload)) + payload


def open_entry(data: bytes, secret: bytes, key: str) -> tuple[bytes | None, str]:
    """The payload of a cache entry stored under ``key`` and sealed with ``secret``, or None and
    why not."""
    if len(data) < _HEADER.size:
        return None, "it is truncated"
    magic, kid, seal, size = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        return None, "it has another format"
    if kid != trust.key_id(secret):
        return None, "it is sealed with another key"
    payload = data[_HEADER.size:]
    if size != len(payload) or not hmac.compare_digest(seal, _seal(secret, key, size, payload)):
        return None, "its seal is wrong"
    return payload, ""
