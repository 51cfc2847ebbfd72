"""A model's inputs, for ``kiln run`` and ``kiln bench``: read from an .npz and checked against
@main's parameter types before anything is compiled, or made up at random.

The inputs of a model are what remains of @main's parameters once ``--params`` bound its
weights (for an ONNX model: the graph's inputs), each known by the user's name (an ONNX
graph's input name) and by kiln's (the parameter's). Random inputs follow one rule, the same
on every run for one seed: floats from a standard normal distribution, integers uniform in
[0, 4) — valid as indices into any axis of at least 4 elements, as token ids and as counts —
and booleans uniform. A parameter of symbolic shape has no random input.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from kiln.cli.common import ModelFile, read_npz
from kiln.errors import Error

if TYPE_CHECKING:
    from kiln.ir.ty import Type
    from kiln.runtime.build import Executable

log = logging.getLogger(__name__)

INT_HIGH = 4  # random integer inputs are drawn from [0, INT_HIGH)


@dataclass(frozen=True)
class Input:
    """One input of a model: the name a user gives it by, kiln's name, its type (None: not
    annotated, checked only when the executable runs)."""

    user: str
    kiln: str
    type: Type | None


def model_inputs(model: ModelFile) -> list[Input]:
    """The inputs of a model read from a file, before it is built."""
    from kiln.runtime.named_io import declared_names

    main = model.module["main"] if "main" in model.module else None
    if main is None:
        return []
    params = [p for p in main.params if p.name_hint not in model.params]
    if model.kind == "onnx":
        users = dict(zip(model.kiln_inputs, model.input_names))
    else:
        users, _ = declared_names(main.attrs, [p.name_hint for p in main.params])
    return [Input(users.get(p.name_hint, p.name_hint), p.name_hint, p.type_annotation)
            for p in params]


def executable_inputs(exe: Executable) -> list[Input]:
    """The inputs of a compiled executable."""
    return [Input(i.name, p.hint, p.type) for i, p in zip(exe.inputs, exe.program.main.params)]


def read_inputs(path: str | None, inputs: list[Input]) -> list[np.ndarray]:
    """The arrays of ``path`` as arguments of @main in order (found by name, or as arr_0,
    arr_1, ...), each checked against its parameter's type."""
    user_names = [i.user for i in inputs]
    shown = ", ".join(repr(n) for n in user_names)
    if path is None:
        if inputs:
            raise Error(f"the model takes inputs {shown}: give them with --inputs file.npz "
                        "(or --random)")
        return []
    arrays = read_npz(path, "inputs") or {}
    positional: list[np.ndarray] = []
    while f"arr_{len(positional)}" in arrays:
        positional.append(arrays.pop(f"arr_{len(positional)}"))
    if len(positional) > len(inputs):
        raise Error(f"{path} has {len(positional)} unnamed arrays (arr_0, ...), but the model "
                    f"takes {len(inputs)} inputs: {shown or 'none'}")
    by_name = {i.user: i for i in inputs} | {i.kiln: i for i in inputs}
    named: dict[str, np.ndarray] = {}
    for key, value in arrays.items():
        if key not in by_name:
            import difflib

            close = difflib.get_close_matches(key, user_names, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise Error(f"{path} has an array {key!r}, which is not an input of the model"
                        f"{hint} (its inputs: {shown or 'none'})")
        named[by_name[key].kiln] = value
    given = {i.kiln for i in inputs[:len(positional)]} | set(named)
    missing = [i.user for i in inputs if i.kiln not in given]
    if missing:
        raise Error(f"{path} lacks input{'s' if len(missing) > 1 else ''} "
                    f"{', '.join(repr(m) for m in missing)} (the model takes {shown})")
    twice = [i.user for i in inputs[:len(positional)] if i.kiln in named]
    if twice:
        raise Error(f"{path} gives input {twice[0]!r} twice: by position and by name")
    sizes: dict[str, tuple[int, str]] = {}  # a symbolic dimension's size, and who set it
    values = {i.kiln: a for i, a in zip(inputs, positional)} | named
    for i in inputs:
        _check(path, i, values[i.kiln], sizes)
    log.debug("%d inputs from %s match @main's parameter types", len(inputs), path)
    return [values[i.kiln] for i in inputs]


def _check(path: str, i: Input, array: np.ndarray, sizes: dict[str, tuple[int, str]]) -> None:
    """``array`` fits the tensor type of input ``i`` (dtype, rank, dimensions)."""
    from kiln.ir.ty import SymDim, TensorType
    from kiln.text.printer import type_text

    t = i.type
    if not isinstance(t, TensorType):
        return  # not annotated, or not a tensor: the executable checks it when called
    want = type_text(t)
    if array.dtype != np.dtype(t.dtype):
        raise Error(f"{path}: input {i.user!r} has dtype {array.dtype}, but the model expects "
                    f"{want}")
    if array.ndim != len(t.shape):
        raise Error(f"{path}: input {i.user!r} has shape {list(array.shape)}, but the model "
                    f"expects {want}")
    for axis, (d, n) in enumerate(zip(t.shape, array.shape)):
        if type(d) is int and d != n:
            raise Error(f"{path}: input {i.user!r} has shape {list(array.shape)}, but the "
                        f"model expects {want} (axis {axis} is {n}, not {d})")
        if isinstance(d, SymDim):
            seen = sizes.setdefault(d.name, (n, i.user))
            if seen[0] != n:
                raise Error(f"{path}: input {i.user!r} has {d.name} = {n} (axis {axis}), but "
                            f"input {seen[1]!r} has {d.name} = {seen[0]}")


def random_inputs(inputs: list[Input], seed: int, command: str) -> list[Any]:
    """Random arguments for @main (the rule in this module's docstring)."""
    from kiln.ir.ty import TensorType, TupleType
    from kiln.text.printer import type_text

    rng = np.random.default_rng(seed)
    fix = "give its inputs with --inputs file.npz"

    def tensor(t: TensorType, name: str) -> np.ndarray:
        if not t.is_static:
            raise Error(f"input {name!r} has type {type_text(t)}, of symbolic shape: {fix}")
        shape, dtype = t.static_shape, np.dtype(t.dtype)
        if dtype.kind == "f":
            return rng.standard_normal(shape).astype(dtype)
        if dtype.kind in "iu":
            return rng.integers(0, INT_HIGH, shape).astype(dtype)
        if dtype.kind == "b":
            return rng.integers(0, 2, shape).astype(bool)
        raise Error(f"input {name!r} is a {t.dtype} tensor, which kiln {command} cannot make "
                    f"up: {fix}")

    args: list[Any] = []
    for i in inputs:
        if i.type is None:
            raise Error(f"input {i.user!r} has no type annotation, so kiln {command} cannot "
                        f"make it up: {fix}")
        # A tuple parameter: its fields in order, rebuilt bottom-up (no recursion).
        made: list[Any] = []
        stack: list[tuple[Type, bool]] = [(i.type, False)]
        while stack:
            t, ready = stack.pop()
            if isinstance(t, TupleType):
                if ready:
                    n = len(t.fields)
                    fields = tuple(made[len(made) - n:]) if n else ()
                    del made[len(made) - n:]
                    made.append(fields)
                else:
                    stack.append((t, True))
                    stack.extend((f, False) for f in reversed(t.fields))
            elif isinstance(t, TensorType):
                made.append(tensor(t, i.user))
            else:
                raise Error(f"input {i.user!r} has type {type_text(i.type)}, which kiln "
                            f"{command} cannot make up: {fix}")
        args.append(made[0])
    return args
