"""Staged Python (DLVM's NNKit idea): ``@kiln.script`` turns a Python function into kiln IR.

    @kiln.script
    def cell(x: kiln.Tensor[(1, 4), "float32"], h: kiln.Tensor[(1, 6), "float32"]):
        return kiln.op.tanh(x @ wx.T + h @ wh.T)

    cell.function       # the typed kiln.Function
    cell.module         # an IRModule whose @main is that function
    cell(x, h)          # runs it (numpy in, numpy out)
    kiln.grad(cell.function)

The function is never run as Python: its source is parsed and each construct is staged into
kiln IR (`kiln/frontend/script_stage.py`). Staging happens once, on first use of ``function``,
``module`` or a call, so globals may be defined after the decorated function.
"""

from __future__ import annotations

import ast
import functools
import inspect
import linecache
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kiln.errors import Error, InternalError, SourceFile, Span
from kiln.ir import Function, IRModule, TensorType, tensor_type


class Tensor:
    """The annotation of a tensor parameter: ``kiln.Tensor[(1, 4), "float32"]``.

    The shape is a tuple of ints, names (symbolic dimensions such as ``"batch"``) and None
    (unknown until run time); ``()`` is a scalar. The dtype defaults to float32.
    Subscripting gives a `kiln.TensorType`.
    """

    def __init__(self) -> None:
        raise Error("kiln.Tensor is an annotation: write kiln.Tensor[(1, 4), \"float32\"]")

    def __class_getitem__(cls, key: object) -> TensorType:
        if (isinstance(key, tuple) and len(key) == 2 and isinstance(key[0], (tuple, list))
                and not isinstance(key[1], (int, tuple, list))):
            shape, dtype = key
        elif isinstance(key, (tuple, list)):
            shape, dtype = key, "float32"
        else:
            shape, dtype = (key,), "float32"
        return tensor_type(tuple(shape), dtype)


# The syntax nodes that carry a source position (lineno, col_offset and their ends).
_POSITIONED = (ast.expr, ast.stmt, ast.arg, ast.keyword, ast.excepthandler, ast.alias,
               ast.pattern)


@dataclass(frozen=True)
class ParsedSource:
    """The AST of a function and what is needed to turn AST positions into file spans."""

    node: ast.FunctionDef
    source: SourceFile
    lines: list[str]  # the parsed (dedented) lines, to turn byte offsets into columns
    line_offset: int  # file line = AST line + line_offset
    indent: int  # file column = AST column + indent

    def span(self, node: ast.AST) -> Span:
        """The file span of an AST node (1-based columns, counted in characters)."""
        if not isinstance(node, _POSITIONED):
            raise InternalError(f"a {type(node).__name__} node has no source position")
        line = node.lineno
        end_line = node.end_lineno or line
        col = self._column(line, node.col_offset)
        end_col = self._column(end_line, node.end_col_offset or 0)
        off = self.line_offset
        return Span(self.source, line + off, col + 1, end_line + off, end_col + 1)

    def _column(self, line: int, byte_offset: int) -> int:
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        return self.indent + len(text.encode("utf-8")[:byte_offset].decode("utf-8", "replace"))


def parse_source(fn: Callable[..., Any]) -> ParsedSource:
    """Parse the source of a Python function; a kiln.Error when it cannot be read."""
    name = getattr(fn, "__name__", repr(fn))
    if not inspect.isfunction(fn):
        raise Error(f"@kiln.script decorates a Python function (def), not {type(fn).__name__}")
    if fn.__name__ == "<lambda>":
        raise Error("@kiln.script needs a function written with def, not a lambda")
    try:
        lines, first = inspect.getsourcelines(fn)
    except (OSError, TypeError) as e:
        raise Error(f"cannot read the source of {name} to stage it: {e}") from None
    filename = inspect.getsourcefile(fn) or fn.__code__.co_filename
    file_lines = linecache.getlines(filename, fn.__globals__)
    if file_lines:
        source = SourceFile(filename, "".join(file_lines))
        offset = first - 1
    else:  # source known to inspect but not to linecache: quote the snippet itself
        source = SourceFile(filename, "".join(lines))
        offset = 0
    prefix = lines[0][: len(lines[0]) - len(lines[0].lstrip())]
    indent = len(prefix)
    dedented = [ln[indent:] if ln.startswith(prefix) else ln.lstrip() for ln in lines]
    try:
        tree = ast.parse("".join(dedented))
    except SyntaxError as e:
        raise Error(f"cannot parse the source of {name}: {e.msg}") from None
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == fn.__name__:
            return ParsedSource(node, source, [ln.rstrip("\n") for ln in dedented], offset,
                                indent)
    raise Error(f"cannot find the definition of {name} in its source")


class ScriptFunction:
    """A Python function staged into kiln IR: ``function``, ``module``, and callable on numpy.

    Made by ``@kiln.script``. Staging reads the source once, on first use.
    """

    __name__: str  # with __qualname__, __doc__ and the rest: copied from fn by update_wrapper

    def __init__(self, fn: Callable[..., Any]) -> None:
        self.python = fn
        self._parsed: ParsedSource | None = None
        self._module: IRModule | None = None
        functools.update_wrapper(self, fn)

    def parsed(self) -> ParsedSource:
        """The parsed source of the Python function (read once)."""
        if self._parsed is None:
            self._parsed = parse_source(self.python)
        return self._parsed

    @property
    def module(self) -> IRModule:
        """A type-checked IRModule whose ``@main`` is the staged function."""
        if self._module is None:
            from kiln.frontend.script_stage import stage_module

            self._module = stage_module(self)
        return self._module

    @property
    def function(self) -> Function:
        """The staged, type-checked kiln Function (self-contained: ``kiln.grad`` takes it)."""
        return self.module["main"]

    def __call__(self, *args: Any) -> Any:
        """Run the staged function with the reference interpreter on numpy arguments."""
        from kiln.eval import interpret

        return interpret(self.module, *args)

    def __repr__(self) -> str:
        return f"<kiln.script {self.python.__qualname__}>"


def script(fn: Callable[..., Any]) -> ScriptFunction:
    """Decorator: stage a Python function with annotated tensor parameters into kiln IR."""
    if isinstance(fn, ScriptFunction):
        return fn
    return ScriptFunction(fn)
