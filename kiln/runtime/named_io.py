"""An executable's inputs and outputs by name, as ONNX Runtime's sessions show them.

    exe.inputs       # [ValueInfo(name='input.1', shape=('batch', 3), dtype='float32')]
    exe.outputs      # [ValueInfo(name='logits', shape=('batch', 4), dtype='float32')]
    exe.run(None, {"input.1": x})          # a list, one array per output
    exe.run_named({"input.1": x})          # {"logits": array}

The names come from the program: ``@main``'s attributes ``input_names`` (the user's names of
its leading parameters, in order) and ``output_names`` (one name for the whole result, or one
per field of the tuple it returns), which the ONNX importer sets and which Relay text keeps
(``def @main(%input_1: ..., input_names=["input.1"], output_names=["logits"])``). Without
them an input is called after its parameter and the result ``output``, or ``output_0``,
``output_1``, ... per field of a tuple (as ``kiln run`` writes them).
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.errors import Error
from kiln.ir.attrs import Attrs
from kiln.ir.ty import DTYPES, SymDim, TensorType, TupleType, Type

INPUT_NAMES = "input_names"
OUTPUT_NAMES = "output_names"

Shape = tuple[int | str | None, ...]

# ONNX Runtime's names of the element types (``tensor(float)``).
_ORT_TYPES = {"float32": "float", "float64": "double"}


@dataclass(frozen=True, slots=True)
class ValueInfo:
    """One input or output: its name, shape (ints; a symbolic dimension by its name, an
    unknown one as None; None for a value that is not a tensor) and dtype (None likewise)."""

    name: str
    shape: Shape | None
    dtype: str | None
    ty: Type | None = field(default=None, compare=False, repr=False)

    @property
    def type(self) -> str:
        """ONNX Runtime's spelling of the type, ``tensor(float)``; kiln's type text for a value
        that is not a tensor."""
        if self.dtype is not None:
            return f"tensor({_ORT_TYPES.get(self.dtype, self.dtype)})"
        if self.ty is None:
            return "?"
        from kiln.text.printer import type_text

        return type_text(self.ty)


def value_info(name: str, ty: Type) -> ValueInfo:
    """The record of a value of type ``ty``."""
    if not isinstance(ty, TensorType):
        return ValueInfo(name, None, None, ty)
    shape = tuple(d if type(d) is int else d.name if isinstance(d, SymDim) else None
                  for d in ty.shape)
    return ValueInfo(name, shape, ty.dtype, ty)


def declared_names(attrs: Attrs, params: Sequence[str]) -> tuple[dict[str, str], list[str] | None]:
    """The names a function's attributes give: its parameters' (parameter name → name) and its
    outputs' (None when it names none). Malformed attributes are a kiln.Error."""
    given = attrs.get(INPUT_NAMES)
    inputs: dict[str, str] = {}
    if given is not None:
        names = _names(given, INPUT_NAMES)
        if len(names) > len(params):
            raise Error(f"@main's attribute {INPUT_NAMES} gives {len(names)} names, but @main "
                        f"has {len(params)} parameter(s)")
        inputs = dict(zip(params, names))
    outputs = attrs.get(OUTPUT_NAMES)
    return inputs, None if outputs is None else _names(outputs, OUTPUT_NAMES)


def _names(value: object, what: str) -> list[str]:
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, tuple) or not all(isinstance(n, str) and n for n in value):
        raise Error(f"@main's attribute {what} must be a list of non-empty strings, not "
                    f"{value!r}")
    twice = sorted({n for n in value if value.count(n) > 1})
    if twice:
        raise Error(f"@main's attribute {what} names {twice[0]!r} twice")
    return list(value)


def input_infos(params: Sequence[tuple[str, Type]], names: Mapping[str, str]) -> list[ValueInfo]:
    """The inputs of a function of ``params`` (parameter name, type): named by ``names`` where
    it names them, else after the parameter."""
    out = [value_info(names.get(p, p), t) for p, t in params]
    seen: dict[str, str] = {}
    for info, (p, _) in zip(out, params):
        if info.name in seen:
            raise Error(f"two inputs are named {info.name!r} (parameters %{seen[info.name]} "
                        f"and %{p})")
        seen[info.name] = p
    return out


def output_infos(ret: Type, names: Sequence[str] | None) -> tuple[list[ValueInfo], bool]:
    """The outputs of a function returning ``ret``, and whether the one output is the whole
    result (else each is a field of the tuple): one name names the whole result, several the
    fields; without names, the fields of a tuple are ``output_i``, anything else ``output``."""
    if names is None:
        if isinstance(ret, TupleType):
            return [value_info(f"output_{i}", t) for i, t in enumerate(ret.fields)], False
        return [value_info("output", ret)], True
    if len(names) == 1:
        return [value_info(names[0], ret)], True
    if not isinstance(ret, TupleType) or len(ret.fields) != len(names):
        got = (f"a tuple of {len(ret.fields)}" if isinstance(ret, TupleType)
               else "one value, not a tuple")
        raise Error(f"@main names {len(names)} outputs ({', '.join(names)}), but it returns "
                    f"{got}")
    return [value_info(n, t) for n, t in zip(names, ret.fields)], False


def unknown_name(name: str, names: Sequence[str], what: str) -> Error:
    """An error for a name that is not one of ``names``, with the closest as a hint."""
    close = difflib.get_close_matches(name, list(names), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    shown = ", ".join(repr(n) for n in names) or "none"
    return Error(f"the model has no {what} named {name!r}{hint} (its {what}s: {shown})")


def order_feed(feed: Mapping[str, Any], inputs: Sequence[ValueInfo]) -> list[Any]:
    """The values of a feed (input name → value) in the inputs' order."""
    if not isinstance(feed, Mapping):
        raise Error(f"the inputs must be a mapping from input names to values, not a "
                    f"{type(feed).__name__}")
    names = [i.name for i in inputs]
    for key in feed:
        if not isinstance(key, str) or key not in names:
            raise unknown_name(str(key), names, "input")
    missing = [n for n in names if n not in feed]
    if missing:
        shown = ", ".join(repr(n) for n in missing)
        raise Error(f"input{'s' if len(missing) > 1 else ''} {shown} "
                    f"{'are' if len(missing) > 1 else 'is'} not given (the model takes "
                    f"{', '.join(repr(n) for n in names)})")
    return [feed[n] for n in names]


def select_outputs(wanted: Sequence[str] | str | None, outputs: Sequence[ValueInfo]) -> list[int]:
    """The indices of the outputs named in ``wanted`` (None: all), in its order."""
    names = [o.name for o in outputs]
    if wanted is None:
        return list(range(len(names)))
    if isinstance(wanted, str):
        wanted = [wanted]
    picked: list[int] = []
    for name in wanted:
        if not isinstance(name, str) or name not in names:
            raise unknown_name(str(name), names, "output")
        if names.index(name) in picked:
            raise Error(f"output {name!r} is asked for twice")
        picked.append(names.index(name))
    return picked


# --- in a saved executable (kiln/runtime/artifact.py) ----------------------------------------


def write_io(inputs: Sequence[ValueInfo], outputs: Sequence[ValueInfo]) -> dict[str, Any]:
    """The header's record of the inputs and outputs: ``{"inputs": [{"name", "shape",
    "dtype"}, ...], "outputs": [...]}``."""
    def rows(infos: Sequence[ValueInfo]) -> list[dict[str, Any]]:
        return [{"name": i.name, "shape": None if i.shape is None else list(i.shape),
                 "dtype": i.dtype} for i in infos]

    return {"inputs": rows(inputs), "outputs": rows(outputs)}


def read_io(doc: object, params: Sequence[tuple[str, Type]], ret: Type, bad: Callable[[str], Error]
            ) -> tuple[dict[str, str] | None, list[str] | None]:
    """The names a header's record gives (parameter name → input name, output names), checked
    strictly against the program's own parameters and result; None for a header without one
    (the default names). Anything malformed is ``bad(why)``."""
    if doc is None:
        return None, None
    if not isinstance(doc, dict) or set(doc) != {"inputs", "outputs"}:
        raise bad("the record of inputs and outputs is malformed")
    inputs, outputs = _rows(doc["inputs"], "input", bad), _rows(doc["outputs"], "output", bad)
    if len(inputs) != len(params):
        raise bad(f"it records {len(inputs)} inputs, but its program takes {len(params)}")
    input_names = {p: i.name for i, (p, _) in zip(inputs, params)}
    try:
        if input_infos(params, input_names) != inputs:
            raise bad("its recorded inputs do not match its program's parameters")
    except Error as e:
        raise bad(e.message) from None
    names = [o.name for o in outputs]
    tries: list[list[str] | None] = [names]
    if names == [o.name for o in output_infos(ret, None)[0]]:
        tries.append(None)
    for attempt in tries:
        try:
            if output_infos(ret, attempt)[0] == outputs:
                return input_names, attempt
        except Error:
            pass
    raise bad("its recorded outputs do not match its program's result")


def _rows(rows: object, what: str, bad: Callable[[str], Error]) -> list[ValueInfo]:
    if not isinstance(rows, list):
        raise bad(f"the record of its {what}s is not a list")
    out: list[ValueInfo] = []
    for row in rows:
        if not isinstance(row, dict) or set(row) != {"name", "shape", "dtype"}:
            raise bad(f"an {what}'s record is malformed")
        name, shape, dtype = row["name"], row["shape"], row["dtype"]
        if not isinstance(name, str) or not name:
            raise bad(f"an {what}'s name is not a non-empty string")
        if (shape is None) != (dtype is None):
            raise bad(f"{what} {name!r} has a shape or a dtype, but not both")
        if dtype is not None and (not isinstance(dtype, str) or dtype not in DTYPES):
            raise bad(f"{what} {name!r} has an unknown dtype {dtype!r}")
        if shape is not None and (not isinstance(shape, list) or not all(
                d is None or isinstance(d, str) or (type(d) is int and d >= 0) for d in shape)):
            raise bad(f"{what} {name!r} has a malformed shape")
        if any(o.name == name for o in out):
            raise bad(f"two {what}s are named {name!r}")
        out.append(ValueInfo(name, None if shape is None else tuple(shape), dtype))
    return out
