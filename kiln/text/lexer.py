"""The lexer of Relay's text format: one compiled regular expression, one match per token.

Tokens are kept in parallel lists (kinds, values, start and end offsets) so the parser can
index them without building an object per token. A token's kind is a short string: the
punctuation itself (``"("``, ``"=>"``, ``"->"``, ...), a keyword (``"let"``, ``"fn"``, ...) or
one of ``local`` (``%x``), ``graph`` (``%0``), ``global`` (``@f``), ``ident`` (``nn.conv2d``,
``Cons``, ``float32``), ``num`` (a numeric literal, with its leading minus signs), ``bool``,
``str``, ``proj`` (``.0``), ``meta`` (``meta[relay.Constant][0]``), ``version``, ``eof``.
A token's value is always a str: a word or name without its sigil (``x`` for ``%x``, ``True``),
the number of ``%0`` or ``.0`` in decimal, a literal as written, a string's unescaped body, the
version of a version header, or ``""`` for punctuation, ``match?`` and ``eof``.
Comments and whitespace are skipped; block comments nest. The metadata section
(``#[metadata]`` to the end of the text) is cut off and handed over as text.

Identifiers follow TVM's lexer, which also admits ``/`` inside a ``%local`` or ``@global``
name (``%conv1/weight``, as some frontends name parameters) when a letter follows it.
"""

from __future__ import annotations

import bisect
import re
from dataclasses import dataclass

from kiln.errors import ParseError, SourceFile, Span

KEYWORDS = {
    "let": "let",
    "fn": "fn",
    "def": "def",
    "if": "if",
    "else": "else",
    "type": "type",
    "match": "match",
    "extern": "extern",
    "free_var": "free_var",
    "ref": "ref",
    "ref_read": "ref_read",
    "ref_write": "ref_write",
    "True": "bool",
    "False": "bool",
    "_": "_",
}

_NAME = r"[A-Za-z_](?:[A-Za-z0-9_]|/(?=[A-Za-z_]))*"

# Each alternative is one named group; the whitespace and line comments before a token are
# consumed by the same match. Order matters where one alternative is a prefix of another.
_TOKEN = re.compile(
    r"(?:\s+|//[^\n]*)*"
    r"(?:"
    r"(?P<p>=>|->|==|!=|<=|>=|[()\[\]{},;:=<>+*?]|-(?!-*(?:[0-9]|(?:inf|nan)f))|/(?!\*)|\.(?![0-9]))"
    rf"|(?P<local>%{_NAME})"
    r"|(?P<graph>%[0-9]+)"
    r"|(?P<meta>meta\[[^\]\n]*\]\[[^\]\n]*\])"
    r"|(?P<pmatch>match\?)"
    r"|(?P<special>-*(?:inf|nan)f[0-9]*(?![A-Za-z0-9_]))"
    r"|(?P<ident>[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*)"
    r"|(?P<num>-*[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?[A-Za-z0-9_]*)"
    r"|(?P<proj>\.[0-9]+)"
    rf"|(?P<global>@{_NAME})"
    r'|(?P<str>"(?:[^"\\\n]|\\.)*")'
    r"|(?P<comment>/\*)"
    r"|(?P<attr>#\[[^\]\n]*\])"
    r"|(?P<eof>\Z)"
    r"|(?P<bad>.)"
    r")",
    re.DOTALL,
)
_COMMENT_DELIM = re.compile(r"/\*|\*/")
_VERSION = re.compile(r'#\[\s*version\s*=\s*"([^"]*)"\s*\]')
_METADATA = re.compile(r"#\[\s*metadata\s*\]")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)


@dataclass(slots=True)
class Tokens:
    """The tokens of a source text (always ending with an ``eof`` token)."""

    source: SourceFile
    kinds: list[str]
    values: list[str]
    starts: list[int]
    ends: list[int]
    line_starts: list[int]
    metadata: str | None = None
    metadata_start: int = 0

    def span(self, first: int, last: int | None = None) -> Span:
        """The span from the start of token ``first`` to the end of token ``last``."""
        return self.offset_span(self.starts[first], self.ends[first if last is None else last])

    def offset_span(self, start: int, end: int) -> Span:
        """The span of the characters ``[start, end)``."""
        ls = self.line_starts
        line = bisect.bisect_right(ls, start)
        base = ls[line - 1]
        if line == len(ls) or end <= ls[line]:
            return Span(self.source, line, start - base + 1, line, end - base + 1)
        end_line = bisect.bisect_right(ls, end - 1)
        return Span(self.source, line, start - base + 1, end_line, end - ls[end_line - 1] + 1)


def _error(tokens_source: SourceFile, line_starts: list[int], start: int, end: int, msg: str):
    partial = Tokens(tokens_source, [], [], [], [], line_starts)
    return ParseError(msg, partial.offset_span(start, max(end, start + 1)))


def _unescape(body: str) -> str | None:
    """The value of a string literal's body, or None when it holds an unknown escape."""
    if "\\" not in body:
        return body
    bad = False

    def replace(m: re.Match[str]) -> str:
        nonlocal bad
        c = m.group(1)
        if c not in _ESCAPES:
            bad = True
            return c
        return _ESCAPES[c]

    value = _ESCAPE.sub(replace, body)
    return None if bad else value


def _skip_block_comment(source: SourceFile, line_starts: list[int], start: int) -> int:
    """The offset just past the (nested) block comment that starts at ``start``."""
    depth = 1
    scan = start + 2
    while depth:
        d = _COMMENT_DELIM.search(source.text, scan)
        if d is None:
            message = "this block comment is never closed"
            raise _error(source, line_starts, start, start + 2, message)
        depth += 1 if d.group() == "/*" else -1
        scan = d.end()
    return scan


def _bad_char(c: str) -> str:
    if c == '"':
        return "this string literal is never closed (strings end on the same line)"
    if c == "#":
        return '`#` must start #[version = "0.0.5"] or #[metadata]'
    if c in "%@":
        return f"`{c}` must be followed by a name"
    if c == "-":
        return "`-` here must be followed by a number"
    return f"unexpected character {c!r}"


def tokenize(source: SourceFile) -> Tokens:
    """Split ``source`` into tokens; a ParseError at the first character that starts none."""
    text = source.text
    line_starts = [0]
    line_starts.extend(m.end() for m in re.finditer("\n", text))
    kinds: list[str] = []
    values: list[str] = []
    starts: list[int] = []
    ends: list[int] = []
    metadata: str | None = None
    metadata_start = 0
    keywords = KEYWORDS
    pos = 0
    done = False
    while not done:
        for m in _TOKEN.finditer(text, pos):
            group = m.lastgroup
            assert group is not None  # every alternative of _TOKEN is a named group
            start, end = m.span(group)
            if group == "p":
                kinds.append(text[start:end])
                values.append("")
            elif group == "local":
                kinds.append("local")
                values.append(text[start + 1 : end])
            elif group == "graph":
                if end - start > 19:
                    raise _error(source, line_starts, start, end, "graph name is too large")
                kinds.append("graph")
                values.append(str(int(text[start + 1 : end])))
            elif group == "ident":
                word = text[start:end]
                kind = keywords.get(word, "ident")
                kinds.append(kind)
                values.append(word)
            elif group == "num" or group == "special":
                kinds.append("num")
                values.append(text[start:end])
            elif group == "proj":
                digits = text[start + 1 : end]
                if len(digits) > 9:
                    raise _error(source, line_starts, start, end, "tuple index is too large")
                kinds.append("proj")
                values.append(str(int(digits)))
            elif group == "global":
                kinds.append("global")
                values.append(text[start + 1 : end])
            elif group == "comment":
                pos = _skip_block_comment(source, line_starts, start)
                break
            elif group == "str":
                value = _unescape(text[start + 1 : end - 1])
                if value is None:
                    raise _error(
                        source,
                        line_starts,
                        start,
                        end,
                        'unknown escape in string literal (known: \\" \\\\ \\n \\t \\r)',
                    )
                kinds.append("str")
                values.append(value)
            elif group == "meta":
                kinds.append("meta")
                values.append(text[start:end])
            elif group == "pmatch":
                kinds.append("match?")
                values.append("")
            elif group == "attr":
                raw = text[start:end]
                v = _VERSION.fullmatch(raw)
                if v is not None:
                    kinds.append("version")
                    values.append(v.group(1))
                elif _METADATA.fullmatch(raw):
                    metadata = text[end:]
                    metadata_start = end
                    kinds.append("eof")
                    values.append("")
                    starts.append(start)
                    ends.append(start)
                    done = True
                    break
                else:
                    raise _error(
                        source,
                        line_starts,
                        start,
                        end,
                        f'unknown attribute {raw}: expected #[version = "0.0.5"] or #[metadata]',
                    )
            elif group == "eof":
                kinds.append("eof")
                values.append("")
                starts.append(start)
                ends.append(start)
                done = True
                break
            else:
                raise _error(source, line_starts, start, start + 1, _bad_char(text[start]))
            starts.append(start)
            ends.append(end)
    return Tokens(source, kinds, values, starts, ends, line_starts, metadata, metadata_start)
