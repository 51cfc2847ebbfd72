"""Fuzzing the .kiln loader with files an attacker could make (run as a script by
test_artifact_fuzz.py, so a crash is seen as the process dying, not the test run).

    python artifact_fuzz.py SEED_FILE INPUTS_NPZ COUNT RNG_SEED

Each case edits a saved file — a JSON field of the header, the program or the kernels set
to a hostile value, swapped with another field's value or deleted; bytes of the machine
code or the constants changed — and writes it with a correct checksum and the original
seal or a forged one. Loading it (default trust) and running it on the inputs must give
results or a `kiln.Error`; anything else is an escape. Prints one JSON line of counts.
"""

from __future__ import annotations

import hashlib
import json
import struct
import sys
import tempfile
import traceback
from pathlib import Path

import numpy as np

import kiln
from kiln import trust

# --- the file's parts, for edits that keep its checksum right -------------------------------

_PREFIX = struct.Struct("<8sIIQ")
_SEAL, _DIGEST = trust.ID_BYTES + trust.MAC_BYTES, 32


def split(data: bytes) -> tuple[dict, dict[str, bytes], bytes]:
    """The header, the sections by name, and the seal of a .kiln file's bytes."""
    hlen = _PREFIX.unpack_from(data)[3]
    header = json.loads(data[_PREFIX.size:_PREFIX.size + hlen])
    sections = {s["name"]: data[s["offset"]:s["offset"] + s["length"]]
                for s in header["sections"]}
    return header, sections, data[-_SEAL - _DIGEST:-_DIGEST]


def join(header: dict, sections: dict[str, bytes], seal: bytes) -> bytes:
    """A file of these parts with a correct checksum: what anyone can make."""
    table = [{"name": n, "offset": 0, "length": len(d)} for n, d in sections.items()]
    meta = {k: v for k, v in header.items() if k != "sections"}
    room = len(json.dumps({**meta, "sections": table})) + 64 + 24 * len(table)
    start = (_PREFIX.size + room + 63) // 64 * 64
    offset = start
    for entry, data in zip(table, sections.values()):
        entry["offset"] = offset
        offset += (len(data) + 63) // 64 * 64
    text = json.dumps({**meta, "sections": table}).encode()
    text += b" " * (start - _PREFIX.size - len(text))
    body = bytearray(_PREFIX.pack(b"KILNEXE\0", header["kiln_format"], 0, len(text)) + text)
    for data in sections.values():
        body += data + b"\0" * ((-len(data)) % 64)
    body += seal
    return bytes(body + hashlib.sha256(body).digest())


def reseal(data: bytes, key: bytes) -> bytes:
    """``data`` sealed again with ``key`` (what only a holder of the key can do)."""
    body = data[:-_SEAL - _DIGEST] + trust.key_id(key)
    body += trust.mac(key, body)
    return body + hashlib.sha256(body).digest()


HOSTILE = [0, -1, 1, 2, 63, 64, 2**31, 2**32 + 7, 2**62, 2**63, -2**63, 10**30, 1.5, -0.0,
           1e308, float("inf"), None, True, "", "x", "float32", "int64", "native", "vm", [],
           [0], [[0]], {}, {"a": 1}, [2**40, 2**40], "Load", "For", "Seq"]


def leaves(doc):
    """Every (container, key) of a JSON document, without recursion."""
    out, stack = [], [doc]
    while stack:
        node = stack.pop()
        items = node.items() if isinstance(node, dict) else enumerate(node)
        for k, v in items:
            out.append((node, k))
            if isinstance(v, (dict, list)) and v:
                stack.append(v)
    return out


def edit_json(doc, rng):
    spots = leaves(doc)
    if not spots:
        return doc
    node, k = spots[rng.integers(len(spots))]
    choice = rng.integers(10)
    if choice < 6:
        node[k] = HOSTILE[rng.integers(len(HOSTILE))]
    elif choice < 8:  # a plausible value: another field's
        other, j = spots[rng.integers(len(spots))]
        node[k] = json.loads(json.dumps(other[j]))  # a copy: no cycles
    elif choice < 9 and isinstance(node[k], int) and not isinstance(node[k], bool):
        node[k] += int(rng.choice([-1, 1, 64, -64]))
    elif isinstance(node, dict):
        del node[k]
    else:
        node.pop(k)
    return doc


def mutate(data: bytes, rng) -> bytes:
    header, sections, seal = split(data)
    what = rng.integers(8)
    if what < 2:
        meta = {k: v for k, v in header.items() if k != "sections"}
        meta = edit_json(meta, rng)
        header = {**meta, "sections": header["sections"], "kiln_format": 4}
    elif what < 6:
        name = "program" if what < 4 else "kernels"
        doc = json.loads(sections[name])
        for _ in range(int(rng.integers(1, 3))):
            doc = edit_json(doc, rng)
        sections[name] = json.dumps(doc).encode()
    else:
        names = [n for n in ("machine_code", "program_code", "constants") if n in sections]
        name = names[rng.integers(len(names))]
        raw = bytearray(sections[name])
        for _ in range(int(rng.integers(1, 16))):
            if raw:
                raw[rng.integers(len(raw))] = int(rng.integers(256))
        sections[name] = bytes(raw)
    if rng.integers(3) == 0:  # a forged seal: the local key's id with a made-up MAC
        local = trust.local_key()
        assert local is not None
        seal = trust.key_id(local) + bytes(rng.integers(0, 256, trust.MAC_BYTES, np.uint8))
    return join(header, sections, seal)


def main() -> None:
    seed_file, inputs, count, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    data = Path(seed_file).read_bytes()
    with np.load(inputs) as f:
        args = [f[k] for k in sorted(f.files)]
    rng = np.random.default_rng(seed)
    counts = {"cases": 0, "load_errors": 0, "run_errors": 0, "ran": 0, "escapes": 0}
    escapes = []
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "case.kiln"
        for case in range(count):
            try:
                path.write_bytes(mutate(data, rng))
            except (KeyError, ValueError, TypeError):
                continue  # the edit broke what join() needs: not a file of this format
            counts["cases"] += 1
            print(f"case {case}", file=sys.stderr, flush=True)  # the last one, if it crashes
            stage = "load"
            try:
                exe = kiln.load(path)
                stage = "run"
                exe(*args)
                counts["ran"] += 1
            except kiln.Error as e:
                if isinstance(e, kiln.InternalError):
                    counts["escapes"] += 1
                    escapes.append(f"case {case} {stage}: InternalError: {e}"[:300])
                else:
                    counts["load_errors" if stage == "load" else "run_errors"] += 1
            except Exception as e:  # noqa: BLE001 -- what this counts
                counts["escapes"] += 1
                tb = traceback.extract_tb(e.__traceback__)[-1]
                escapes.append(f"case {case} {stage}: {type(e).__name__}: {e} "
                               f"({Path(tb.filename).name}:{tb.lineno})"[:300])
    print(json.dumps({**counts, "examples": escapes[:10]}))


if __name__ == "__main__":
    main()
