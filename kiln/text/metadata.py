"""The metadata section: constants too large (or too special) for a literal, stored exactly.

The text after ``#[metadata]`` is JSON in kiln's own encoding::

    {
      "kiln_metadata": 1,
      "relay.Constant": [
        {"dtype": "float32", "shape": [2, 3], "data": "<base64 of the little-endian bytes>"}
      ]
    }

and ``meta[relay.Constant][i]`` in the program is the i-th entry. The bytes are the array's
elements in C order, little-endian, so NaN payloads and negative zeros come back bit for bit.

The relay.Constant entries of a metadata section as TVM printed it (its node format) are read
too.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
import struct
from collections.abc import Collection, Sequence

import numpy as np

from kiln.ir.expr import Constant
from kiln.ir.ty import DTYPES

CONSTANT_KEY = "relay.Constant"


class MetadataError(ValueError):
    """A metadata section that kiln cannot read (the parser adds the location)."""


def encode(constants: Sequence[Constant], elided: Collection[int] = ()) -> str:
    """The JSON text of a metadata section holding ``constants`` in order (those at the
    indices ``elided`` by dtype and shape only, for reading: ``"elided": true``)."""
    entries = []
    for i, c in enumerate(constants):
        data = c.data
        if i in elided:
            entries.append("    " + json.dumps({"dtype": data.dtype.name,
                                                "shape": list(data.shape), "elided": True}))
            continue
        little = data.astype(data.dtype.newbyteorder("<"), copy=False)
        blob = base64.b64encode(np.ascontiguousarray(little).tobytes()).decode("ascii")
        entry = json.dumps({"dtype": data.dtype.name, "shape": list(data.shape), "data": blob})
        entries.append("    " + entry)
    body = ",\n".join(entries)
    return f'{{\n  "kiln_metadata": 1,\n  "{CONSTANT_KEY}": [\n{body}\n  ]\n}}\n'


def decode(text: str) -> dict[str, list[Constant]]:
    """The tables of a metadata section: ``{"relay.Constant": [Constant, ...]}``."""
    try:
        root = json.loads(text)
    except RecursionError:
        raise MetadataError("the metadata section is nested too deeply") from None
    except ValueError as e:
        raise MetadataError(f"the metadata section is not valid JSON: {e}") from None
    if not isinstance(root, dict):
        raise MetadataError("the metadata section must be a JSON object")
    if "root" in root and "nodes" in root:
        return _decode_tvm(root)
    entries = root.get(CONSTANT_KEY, [])
    if not isinstance(entries, list):
        raise MetadataError(f'"{CONSTANT_KEY}" in the metadata section must be a list')
    return {CONSTANT_KEY: [_constant(e, i) for i, e in enumerate(entries)]}


def _constant(entry: object, index: int) -> Constant:
    where = f"metadata entry {CONSTANT_KEY}[{index}]"
    if not isinstance(entry, dict):
        raise MetadataError(f"{where} must be an object with dtype, shape and data")
    dtype, shape, data = entry.get("dtype"), entry.get("shape"), entry.get("data")
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise MetadataError(f"{where} has an unsupported dtype {dtype!r}")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and 0 <= d < 2**62 for d in shape
    ):
        raise MetadataError(f"{where} needs a shape: a list of non-negative integers")
    if len(shape) > 32:
        raise MetadataError(f"{where} has more than 32 dimensions")
    if not isinstance(data, str) and entry.get("elided") is True:
        raise MetadataError(f"{where} was elided when printed (its data left out for reading): "
                            "print the program with its constants to parse it again")
    if not isinstance(data, str):
        raise MetadataError(f"{where} needs its data as a base64 string")
    try:
        raw = base64.b64decode(data.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError):
        raise MetadataError(f"{where} has data that is not valid base64") from None
    np_dtype = np.dtype(dtype).newbyteorder("<")
    count = 1
    for d in shape:
        count *= d
    if count * np_dtype.itemsize != len(raw):
        raise MetadataError(
            f"{where} holds {len(raw)} bytes, but shape {tuple(shape)} of {dtype} needs "
            f"{count * np_dtype.itemsize}"
        )
    array = np.frombuffer(raw, dtype=np_dtype).reshape(shape).astype(np.dtype(dtype))
    return Constant(array)


# --- TVM's node format -----------------------------------------------------------------------
#
# TVM printed its metadata with tvm.ir.save_json: a list of nodes (the root a Map from type key
# to an Array of nodes), and the tensors as base64 of TVM's NDArray serialization. kiln reads
# the relay.Constant entries of such a section so that programs TVM printed load unchanged.

_TVM_NDARRAY_MAGIC = 0xDD5E40F096B4A13F
_INDEX = re.compile(r"[0-9]{1,9}")
_TVM_DTYPES = {
    (0, 8): "int8", (0, 16): "int16", (0, 32): "int32", (0, 64): "int64",
    (1, 1): "bool", (1, 8): "uint8", (1, 16): "uint16", (1, 32): "uint32", (1, 64): "uint64",
    (2, 16): "float16", (2, 32): "float32", (2, 64): "float64",
}


def _decode_tvm(root: dict[str, object]) -> dict[str, list[Constant]]:
    nodes, arrays = root.get("nodes"), root.get("b64ndarrays", [])
    if not isinstance(nodes, list) or not isinstance(arrays, list):
        raise MetadataError("TVM metadata needs a list of nodes and a list of b64ndarrays")

    def node(index: object) -> dict[str, object]:
        if isinstance(index, str) and _INDEX.fullmatch(index):
            index = int(index)
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index < len(nodes):
            raise MetadataError(f"TVM metadata refers to a node {index!r} it does not have")
        n = nodes[index]
        if not isinstance(n, dict):
            raise MetadataError(f"TVM metadata node {index} is not an object")
        return n

    table = node(root.get("root"))
    keys, values = table.get("keys"), table.get("data", [])
    if not isinstance(values, list):
        raise MetadataError("the root of TVM metadata must be a map")
    if keys is None:  # newer TVM writes string keys as nodes, interleaved with the values
        keys = [node(k).get("repr_str") for k in values[0::2]]
        values = values[1::2]
    if not isinstance(keys, list) or len(keys) != len(values):
        raise MetadataError("the root of TVM metadata must be a map from type keys to arrays")
    out: dict[str, list[Constant]] = {CONSTANT_KEY: []}
    for key, value in zip(keys, values):
        if key != CONSTANT_KEY:
            continue
        items = node(value).get("data", [])
        if not isinstance(items, list):
            raise MetadataError(f"TVM metadata for {CONSTANT_KEY} must be an array")
        for item in items:
            attrs = node(item).get("attrs", {})
            index = attrs.get("data") if isinstance(attrs, dict) else None
            if not isinstance(index, str) or not _INDEX.fullmatch(index) or (
                int(index) >= len(arrays)
            ):
                raise MetadataError("a TVM metadata constant refers to a missing tensor")
            out[CONSTANT_KEY].append(Constant(_tvm_ndarray(arrays[int(index)])))
    return out


def _tvm_ndarray(blob: object) -> np.ndarray:
    if not isinstance(blob, str):
        raise MetadataError("a TVM metadata tensor must be a base64 string")
    try:
        raw = base64.b64decode(blob.encode("ascii"), validate=True)
        magic, _ = struct.unpack_from("<QQ", raw, 0)
        _, _, ndim = struct.unpack_from("<iii", raw, 16)
        code, bits, lanes = struct.unpack_from("<BBH", raw, 28)
        if magic != _TVM_NDARRAY_MAGIC or not 0 <= ndim <= 32:
            raise MetadataError("a TVM metadata tensor has a bad header")
        shape = struct.unpack_from(f"<{ndim}q", raw, 32)
        offset = 32 + 8 * ndim
        (size,) = struct.unpack_from("<q", raw, offset)
    except (binascii.Error, UnicodeEncodeError, ValueError, struct.error):
        raise MetadataError("a TVM metadata tensor is not valid base64 of an NDArray") from None
    dtype = _TVM_DTYPES.get((code, bits))
    if dtype is None or lanes != 1:
        raise MetadataError(f"a TVM metadata tensor has a dtype kiln does not support "
                            f"(code {code}, bits {bits}, lanes {lanes})")
    data = raw[offset + 8 : offset + 8 + size]
    count = 1
    for d in shape:
        if d < 0:
            raise MetadataError("a TVM metadata tensor has a negative dimension")
        count *= d
    item = np.dtype(dtype).itemsize
    if size != len(data) or size != count * item:
        raise MetadataError("a TVM metadata tensor's size does not match its shape")
    return np.frombuffer(data, dtype=np.dtype(dtype).newbyteorder("<")).reshape(shape)
