"""Saving an executable to one file, and loading it back with no compiler work.

The file (``.kiln``), all integers little-endian:

    offset 0   magic  b"KILNEXE\\0"
           8   u32    format version (FORMAT_VERSION)
          12   u32    reserved, 0
          16   u64    length H of the header
          24   H      header: UTF-8 JSON {"sections": [{"name", "offset", "length"}], ...}
           …          sections, each starting at a multiple of 64
    end - 80   16     seal: the id of the key that sealed the file (zeros: not sealed)
    end - 64   32     seal: HMAC-SHA256 under that key of every byte before the seal's MAC
    end - 32   32     SHA-256 of every byte before it

Sections: ``program`` (the SSA program as JSON, kiln/ssa/serialize.py), ``kernels`` (each
kernel's loop IR as JSON, kiln/runtime/kernel_format.py: signatures for the runtime's
checks, and what the evaluator runs when there is no machine code), ``constants`` (the
weights' raw bytes, each at a 64-byte boundary; dtype and shape are in the program),
``machine_code`` (kiln.codegen's object-code blob, itself checksummed and stamped with the
`kiln.Target` it was compiled for) when the kernels were compiled natively, and
``program_code`` (the whole-program native executor's entry point, the same kind of blob)
when that executor runs the program. The header's ``executor`` names the executor; loading
picks the same one. The header's ``target`` is the target's canonical string and
``target_info`` its fields and fingerprint: a file built for a target this host cannot run
(another architecture, or features this CPU lacks) is refused with a `kiln.Error` saying so.

Loading reads the file into one aligned buffer, checks the magic, version and checksum
before looking at anything else, and then reads each section field by field: a truncated
or corrupted file is a `kiln.Error` naming the file, never a crash. Nothing is unpickled.

**Trust.** The SHA-256 only catches damage: anyone can recompute it. Machine code in the
file runs with the user's rights, so it is used only when the file's *seal* (kiln/trust.py)
checks out: an HMAC made by `save` with this user's local key (the default) or a key the
caller names. ``load(trust=...)`` says which seals count:

- ``"local"`` (the default): sealed here, by this user's local key;
- ``"key"``: by the local key, a key under the config directory's ``trusted-keys/``, or
  the ``key=`` given;
- ``"any"``: every file's machine code is used as it is — loading it is running it.

A file whose seal does not count is not refused: its machine code and its program's entry
point are ignored and made again from the loop IR in the file, after the loop verifier has
proved every access in bounds (`read_kernel`), the SSA verifier has checked the program
(arena offsets inside their arenas included), and with every kernel call from the VM
checked against the kernel's signature. Such a file can at worst compute wrong numbers; it
cannot read or write outside its buffers or run code of its own. Rebuilding costs what a
build's code generation costs (the disk cache makes it quick the second time).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
import os
import struct
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.codegen.target import check_runnable
from kiln.errors import Error, InternalError
from kiln.ir.ty import DTYPES, TensorType
from kiln.runtime.compiler import EVALUATOR, NATIVE, KernelSet, compile_kernels, load_kernels
from kiln.runtime.kernel_format import read_kernel, write_kernel
from kiln.runtime.named_io import read_io, write_io
from kiln.runtime.native import NativeExecutor
from kiln.ssa.memory import FunctionPlan, MemoryPlan, tensor_bytes
from kiln.ssa.serialize import (
    parse_relay_function,
    read_program,
    relay_function_text,
    write_program,
)
from kiln.ssa.verify import problems
from kiln.target import Target
from kiln.trust import (
    ID_BYTES,
    MAC_BYTES,
    NO_KEY,
    check_trust,
    key_id,
    local_key,
    mac,
    trusted_keys,
)

if TYPE_CHECKING:
    from kiln.runtime.build import Executable

log = logging.getLogger(__name__)

MAGIC = b"KILNEXE\x00"
FORMAT_VERSION = 4  # 3: the header records the kiln.Target; 4: the seal
_ALIGN = 64
_PREFIX = struct.Struct("<8sIIQ")  # magic, version, reserved, header length
_DIGEST = 32
_SEAL = ID_BYTES + MAC_BYTES


class _Bad(Error):
    """A file that is not a valid executable (the message names the file)."""


def _pad(n: int) -> int:
    return (-n) % _ALIGN


def save(exe: Executable, path: str | Path, *, key: bytes | None = None) -> None:
    """Write ``exe`` to ``path`` (atomically: a temporary file renamed into place), sealed
    with ``key`` (32 bytes, e.g. `kiln.trust.read_key` of a shared key file) or, by default,
    this user's local key (unsealed when there is none: such a file's machine code is
    rebuilt whenever it is loaded, unless with ``trust="any"``)."""
    program = exe.program
    doc = write_program(program, relay_function_text)
    doc["plan"] = {name: [p.arena_bytes, p.intermediate_bytes, p.planned, p.heap, p.heap_bytes]
                   for name, p in exe.plan.functions.items()}
    kernels = [decl.kernel for decl in program.kernels.values() if decl.kernel is not None]
    kernel_docs = [write_kernel(k) for k in kernels]
    backend = exe.kernels.backend
    machine_code = exe.kernels.object_code() if backend == NATIVE else None
    if backend == NATIVE and kernels and machine_code is None:
        backend = EVALUATOR  # nothing native to save: the loop IR will be run
    constants = bytearray()
    offsets = []
    for c in program.constants:
        constants += b"\0" * _pad(len(constants))
        offsets.append(len(constants))
        constants += np.ascontiguousarray(c).astype(c.dtype.newbyteorder("<"), copy=False).tobytes()
    doc["constant_offsets"] = offsets
    sections = [
        ("program", json.dumps(doc, separators=(",", ":")).encode()),
        ("kernels", json.dumps(kernel_docs, separators=(",", ":")).encode()),
        ("constants", bytes(constants)),
    ]
    if machine_code is not None:
        sections.append(("machine_code", machine_code))
    executor: str | None = exe.executor.name
    if isinstance(exe.executor, NativeExecutor):
        sections.append(("program_code", exe.executor.object_code))
    elif executor != "vm":
        executor = None  # nothing saved for it: the first executor that accepts runs it
    target = exe.kernels.target if backend == NATIVE else None
    meta = {"backend": backend, "target": str(target) if target is not None else EVALUATOR,
            "target_info": target.to_json() if target is not None else None,
            "opt_level": exe.opt_level, "kiln_format": FORMAT_VERSION, "executor": executor,
            "io": write_io(exe.inputs, exe.outputs)}
    # The header holds the section offsets, which depend on the header's length: place the
    # sections after a header sized generously, then pad the header to that size.
    table = [{"name": n, "offset": 0, "length": len(d)} for n, d in sections]
    header = json.dumps({**meta, "sections": table}).encode()
    room = len(header) + 64 + 16 * len(sections)
    start = _PREFIX.size + room
    start += _pad(start)
    offset = start
    for entry, (_, data) in zip(table, sections):
        entry["offset"] = offset
        offset += len(data) + _pad(len(data))
    header = json.dumps({**meta, "sections": table}).encode()
    if len(header) > start - _PREFIX.size:
        raise InternalError("the executable's header outgrew the room made for it")
    header += b" " * (start - _PREFIX.size - len(header))
    body = bytearray(_PREFIX.pack(MAGIC, FORMAT_VERSION, 0, len(header)))
    body += header
    for _, data in sections:
        body += data
        body += b"\0" * _pad(len(data))
    seal_key = local_key() if key is None else _key_bytes(key)
    if seal_key is None:
        body += NO_KEY + b"\0" * MAC_BYTES
    else:
        body += key_id(seal_key)
        body += mac(seal_key, body)
    body += hashlib.sha256(body).digest()
    path = Path(path)
    try:
        fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp",
                                   dir=str(path.parent) if str(path.parent) else ".")
        with os.fdopen(fd, "wb") as f:
            f.write(body)
        os.replace(tmp, path)
    except OSError as e:
        raise Error(f"{path}: cannot write the executable ({e.strerror or e})") from None


def _read(path: Path) -> np.ndarray:
    """The file's bytes in a 64-byte-aligned buffer (constants are views into it)."""
    try:
        size = path.stat().st_size
        raw = np.empty(size + _ALIGN, np.uint8)
        skip = (-raw.ctypes.data) % _ALIGN
        buf = raw[skip: skip + size]
        with open(path, "rb") as f:
            got = f.readinto(buf.data)  # the array's own memoryview
    except OSError as e:
        raise Error(f"{path}: cannot read it ({e.strerror or e})") from None
    if got != size:
        raise Error(f"{path}: the file changed while it was read")
    return buf


def _key_bytes(key: bytes) -> bytes:
    if not isinstance(key, bytes) or len(key) != 32:
        raise Error("a kiln key is 32 bytes (kiln.trust.read_key reads one from its file)")
    return key


def sealed_by(data: memoryview, trust: str, key: bytes | None = None) -> bytes | None:
    """The id of the key whose seal on the file's bytes ``data`` counts under ``trust``, or
    None when none does (``trust="any"``: the file's key id, or the zero id)."""
    body_end = len(data) - _DIGEST
    seal_at = body_end - _SEAL
    kid = bytes(data[seal_at: seal_at + ID_BYTES])
    if trust == "any":
        return kid
    if kid == NO_KEY:
        return None
    keys: dict[bytes, bytes] = {}
    if trust == "local":
        local = local_key()
        if local is not None:
            keys[key_id(local)] = local
    else:
        keys = trusted_keys()
        if key is not None:
            keys[key_id(key)] = key
    k = keys.get(kid)
    if k is None:
        return None
    want = mac(k, data[:seal_at + ID_BYTES])
    return kid if hmac.compare_digest(want, bytes(data[seal_at + ID_BYTES: body_end])) else None


def load(path: str | Path, *, threads: int | None = None, trust: str = "local",
         key: bytes | None = None) -> Executable:
    """The executable saved in ``path``, ready to run; ``threads`` as for `kiln.build`
    (`Executable.set_threads`).

    Loading a ``.kiln`` file can mean running its machine code, so ``trust`` says whose
    files may do that: ``"local"`` (default) files sealed by this user's local key, i.e.
    saved by kiln here; ``"key"`` also those sealed by a key under the config directory's
    ``trusted-keys/`` or by ``key`` (32 bytes); ``"any"`` every file (only for files you
    would run as programs). Any other file still loads, but its machine code is made again
    from its verified loop IR (nothing in it runs, and it cannot access memory outside its
    buffers); ``exe.code_source`` says which happened: ``"file"``, ``"rebuilt"`` or
    ``"evaluator"``. See docs/runtime.md, "What a .kiln file is trusted with".
    """
    from kiln.runtime.build import Executable

    check_trust(trust)
    if key is not None:
        key = _key_bytes(key)
    start_time = time.perf_counter()
    path = Path(path)
    buf = _read(path)
    data = buf.data.cast("B")

    def bad(why: str) -> _Bad:
        return _Bad(f"{path}: not a valid kiln executable: {why}")

    if len(buf) < _PREFIX.size + _SEAL + _DIGEST:
        raise bad("it is too short (truncated?)")
    magic, version, _, hlen = _PREFIX.unpack_from(data, 0)
    if magic != MAGIC:
        raise bad("wrong magic number (not a .kiln file)")
    if version != FORMAT_VERSION:
        raise bad(f"it is format version {version}; this kiln reads version {FORMAT_VERSION}")
    body_end = len(buf) - _DIGEST
    if hashlib.sha256(data[:body_end]).digest() != bytes(data[body_end:]):
        raise bad("checksum mismatch (the file is truncated or corrupted)")
    trusted = sealed_by(data, trust, key) is not None
    body_end -= _SEAL
    if _PREFIX.size + hlen > body_end:
        raise bad("the header runs past the end")
    try:
        header = json.loads(bytes(data[_PREFIX.size: _PREFIX.size + hlen]).decode())
        sections: dict[str, memoryview] = {}
        for entry in header["sections"]:
            name, off, length = str(entry["name"]), int(entry["offset"]), int(entry["length"])
            if off < _PREFIX.size + hlen or length < 0 or off + length > body_end:
                raise bad(f"section {name} lies outside the file")
            sections[name] = data[off: off + length]
        backend = header["backend"]
        if backend not in (NATIVE, EVALUATOR):
            raise bad(f"unknown backend {backend!r}")
        target: Target | str = EVALUATOR
        if backend == NATIVE:
            target = Target.from_json(header["target_info"])
        opt_level = int(header.get("opt_level", 3))
        doc = json.loads(bytes(sections["program"]).decode())
        kernel_docs = json.loads(bytes(sections["kernels"]).decode())
        constants = _constants(doc, sections["constants"], buf, bad)
        program = read_program(doc, constants, parse_relay_function)
        kernels = [read_kernel(k) for k in kernel_docs] if isinstance(kernel_docs, list) else None
        if kernels is None:
            raise bad("the kernel section is not a list")
        plan = _plan(doc.get("plan"), bad)
    except _Bad:
        raise
    except Error as e:
        raise bad(e.message) from None
    except (KeyError, TypeError, ValueError, UnicodeDecodeError, RecursionError,
            OverflowError, AttributeError, IndexError) as e:
        raise bad(f"a malformed section ({type(e).__name__}: {e})") from None
    found = problems(program)
    if found:
        raise bad(f"the program is malformed ({found[0]})")
    by_name = {k.name: k for k in kernels}
    for decl in program.kernels.values():
        if decl.is_static:
            k = by_name.get(decl.name)
            if k is None:
                raise bad(f"kernel {decl.name} is missing")
            sig = [(b.shape, b.dtype) for b in k.params]
            want = [(tuple(t.shape), t.dtype) for t in (*decl.inputs, *decl.outputs)]
            if sig != want:
                raise bad(f"kernel {decl.name} does not match its declaration")
            program.kernels[decl.name] = replace(decl, func=None, kernel=k)
    if isinstance(target, Target):
        try:
            check_runnable(target, "it")
        except Error as e:
            raise Error(f"{path}: {e.message}") from None
    machine = sections.get("machine_code")
    executor = header.get("executor")
    if executor is not None and not isinstance(executor, str):
        raise bad("the executor is malformed")
    program_code = sections.get("program_code")
    if executor not in (None, "vm") and program_code is None:
        raise bad(f"it names the {executor} executor but holds no code for it")
    main = program.main
    input_names, output_names = read_io(header.get("io"), [(p.hint, p.type) for p in main.params],
                                        main.ret_type, bad)
    try:
        if trusted or backend != NATIVE:
            kernel_set: KernelSet = load_kernels(
                kernels, backend, bytes(machine) if machine is not None else None)
            kernel_set.program_code = bytes(program_code) if program_code is not None else None
            source = "file" if backend == NATIVE else "evaluator"
        else:  # not sealed by a key that counts: nothing of its machine code is used, and
            # its code is made for this machine (which can run the file's target: checked
            # above), so no string from the file reaches LLVM
            target = Target.host()
            log.info("%s is not sealed by a key trusted under trust=%r: its machine code is "
                     "compiled again from its verified loop IR", path, trust)
            kernel_set = compile_kernels(kernels, target, opt_level)
            source = "rebuilt"
        kernel_set.checked_calls = not trusted
        exe = Executable(program, kernel_set, plan, target=target, opt_level=opt_level,
                         timings={"load": time.perf_counter() - start_time}, executor=executor,
                         threads=threads, input_names=input_names, output_names=output_names)
    except Error as e:
        raise Error(f"{path}: {e.message}") from None
    except Exception as e:
        if trusted:
            raise
        # Verified loop IR and SSA that the code generator still cannot take: the file is
        # malformed in a way the verifiers do not describe (this is not kiln's own file).
        raise bad(f"its kernels or program do not compile ({type(e).__name__}: {e})") from None
    exe.code_source = source
    exe._timings["load"] = time.perf_counter() - start_time
    return exe


def _constants(doc: Any, section: memoryview, buf: np.ndarray, bad: Any) -> list[np.ndarray]:
    descs = doc["constants"]
    offsets = doc["constant_offsets"]
    if not isinstance(descs, list) or not isinstance(offsets, list) or len(descs) != len(offsets):
        raise bad("the constant table is malformed")
    out = []
    for d, off in zip(descs, offsets):
        dtype, shape = d["dtype"], d["shape"]
        if dtype not in DTYPES or not isinstance(shape, list) or not all(
                type(n) is int and n >= 0 for n in shape):
            raise bad("a constant's dtype or shape is malformed")
        nbytes = tensor_bytes(TensorType(tuple(shape), dtype))
        if type(off) is not int or off < 0 or off + nbytes > len(section):
            raise bad("a constant lies outside its section")
        arr = np.frombuffer(section, dtype=np.dtype(dtype).newbyteorder("<"), count=int(np.prod(
            shape, dtype=np.int64)), offset=off).reshape(shape)
        if not arr.dtype.isnative:
            arr = arr.astype(arr.dtype.newbyteorder("="))
        arr.setflags(write=False)
        out.append(arr)
    return out


def _plan(doc: Any, bad: Any) -> MemoryPlan:
    if not isinstance(doc, dict):
        raise bad("the memory plan is missing")
    plan = MemoryPlan()
    for name, entry in doc.items():
        if not (isinstance(entry, list) and len(entry) == 5
                and all(type(x) is int and x >= 0 for x in entry)):
            raise bad("the memory plan is malformed")
        plan.functions[str(name)] = FunctionPlan(str(name), *entry)
    return plan
