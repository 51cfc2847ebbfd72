"""Errors kiln reports to people, and the source spans they point at."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True, eq=False)
class SourceFile:
    """A named piece of source text; spans point into it."""

    name: str
    text: str
    _lines: list[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_lines", self.text.split("\n"))

    def line(self, number: int) -> str:
        """The text of a 1-based line, without its newline ('' past the end)."""
        if 1 <= number <= len(self._lines):
            return self._lines[number - 1].rstrip("\r")
        return ""


@dataclass(frozen=True, slots=True)
class Span:
    """A region of source: 1-based line and column of its start and (exclusive) end."""

    source: SourceFile | None
    line: int
    column: int
    end_line: int
    end_column: int

    def merge(self, other: Span | None) -> Span:
        """The smallest span covering both."""
        if other is None:
            return self
        start = min((self.line, self.column), (other.line, other.column))
        end = max((self.end_line, self.end_column), (other.end_line, other.end_column))
        return Span(self.source, start[0], start[1], end[0], end[1])

    def __str__(self) -> str:
        name = self.source.name if self.source is not None else "<input>"
        return f"{name}:{self.line}:{self.column}"


def render_span(span: Span) -> str:
    """The source line of a span with a caret line under the construct."""
    if span.source is None:
        return ""
    text = span.source.line(span.line).expandtabs(1)
    gutter = str(span.line)
    if span.end_line == span.line:
        width = max(1, span.end_column - span.column)
    else:
        width = max(1, len(text) - span.column + 1)
    width = min(width, max(1, len(text) - span.column + 1), _WINDOW // 2)
    # Quote a window of a long line (one-line programs) around the construct.
    start = max(0, span.column - 1 - _WINDOW // 4)
    if len(text) <= _WINDOW:
        start = 0
    shown = text[start : start + _WINDOW]
    prefix = "..." if start > 0 else ""
    suffix = "..." if start + _WINDOW < len(text) else ""
    pad = " " * len(gutter)
    caret = " " * (len(prefix) + span.column - 1 - start) + "^" * width
    return f" {gutter} | {prefix}{shown}{suffix}\n {pad} | {caret}"


_WINDOW = 120


class Error(Exception):
    """Base of every error kiln reports to its users.

    ``message`` says what was wrong; ``span`` (when known) where. ``line`` and ``column``
    are 1-based, or None for programs built from Python without source text.
    """

    kind = "error"

    def __init__(self, message: str, span: Span | None = None) -> None:
        self.message = message
        self.span = span
        super().__init__(self.render())

    @property
    def line(self) -> int | None:
        return self.span.line if self.span is not None else None

    @property
    def column(self) -> int | None:
        return self.span.column if self.span is not None else None

    def render(self) -> str:
        """The full text of the error: location, message and the quoted source line."""
        if self.span is None:
            return self.message
        quoted = render_span(self.span)
        head = f"{self.span}: {self.kind}: {self.message}"
        return f"{head}\n{quoted}" if quoted else head


class ParseError(Error):
    """Malformed program text: a syntax error, an unbound name, a bad literal."""

    kind = "syntax error"


class TypeCheckError(Error):
    """A program that is well formed but ill typed."""

    kind = "type error"


class EvalError(Error):
    """A failure while running a program (a `match?` with no matching clause, ...)."""

    kind = "runtime error"


class InternalError(Error):
    """A bug in kiln itself, not in the user's program."""

    kind = "internal compiler error"

    def __init__(self, message: str, span: Span | None = None) -> None:
        super().__init__(f"{message} (this is a bug in kiln; please report it)", span)
