"""Relay's standard prelude for kiln programs: List, Option, Tree, nat and their functions.

    kiln.std.prelude()            # the prelude (kiln/std/prelude.rly) as a type-checked module
    kiln.std.with_prelude(text)   # a module parsed from text that uses the prelude's names

The prelude is TVM's ``prelude.rly`` and ``nat.rly``: the same names and types (``@map``,
``@foldl``, ``List[A]`` with ``Cons``/``Nil``, ``Option``, ``Tree``, ``nat``, ...), so a program
written against TVM's prelude parses and runs unchanged through `with_prelude`.
"""

from __future__ import annotations

import functools
from importlib import resources

from kiln.errors import Error, ParseError, SourceFile, Span
from kiln.infer import infer_types
from kiln.ir.module import IRModule
from kiln.text import parse
from kiln.text.lexer import Tokens, tokenize

PRELUDE_NAME = "kiln/std/prelude.rly"


@functools.cache
def prelude_text() -> str:
    """The prelude's Relay text, as shipped with kiln."""
    return resources.files(__package__).joinpath("prelude.rly").read_text(encoding="utf-8")


@functools.cache
def prelude() -> IRModule:
    """The prelude as a type-checked module (parsed once; modules are immutable, so shared)."""
    return infer_types(parse(prelude_text(), source_name=PRELUDE_NAME))


def _prelude_body() -> str:
    """The prelude's definitions without its version header, which only a module's first
    line may carry."""
    text = prelude_text()
    header, _, body = text.partition("\n")
    assert header.startswith("#[version"), "prelude.rly starts with its version header"
    return body


def with_prelude(text: str, source_name: str = "<string>") -> IRModule:
    """The module of ``text`` (``def`` and ``type`` definitions, as TVM prints a module) with
    the prelude's types and global functions defined beside its own.

    The prelude's definitions are read after the program's (a module's definitions may refer
    to each other in any order), so every position in an error about the program is the
    program's own. A program that defines a name the prelude defines is an error, and so is a
    bare expression: write it as ``def @main(...) { ... }``. The result is untyped, as
    `kiln.parse`'s is: `kiln.infer_types`, `kiln.interpret` and `kiln.build` check it.
    """
    if not isinstance(text, str):
        raise Error(f"the text to parse must be a str, not {type(text).__name__}")
    tokens = tokenize(SourceFile(str(source_name), text))  # a ParseError here is the program's
    first = 1 if tokens.kinds[0] == "version" else 0
    if tokens.kinds[first] not in ("def", "type", "extern", "eof"):
        raise ParseError(
            "kiln.std.with_prelude reads a module of `def` and `type` definitions, but this "
            "text is a bare expression: write it as `def @main(...) { ... }`",
            tokens.span(first),
        )
    _check_names(tokens)
    # Before a metadata section, which runs to the end of the text.
    cut = tokens.starts[-1] if tokens.metadata is not None else len(text)
    head, tail = text[:cut], text[cut:]
    first_prelude_line = head.count("\n") + 2
    body = _prelude_body()
    combined = f"{head}\n{body}\n{tail}"
    try:
        return parse(combined, source_name=source_name)
    except ParseError as e:
        last_prelude_line = first_prelude_line + body.count("\n")
        if e.span is None or not first_prelude_line <= e.span.line <= last_prelude_line:
            raise
        # Found in the prelude's part: the program left something open or went on past its
        # definitions. Point at the program's end, not at prelude text the user never wrote.
        end = head.rstrip()
        line = end.count("\n") + 1
        column = len(end) - (end.rfind("\n") + 1) + 1
        raise ParseError(
            f"the program does not end after its definitions (a bracket or block left open, or "
            f"an expression after them?); reading on into the prelude: {e.message}",
            Span(SourceFile(str(source_name), text), line, column, line, column),
        ) from None


def _check_names(tokens: Tokens) -> None:
    """A ParseError at the program's own ``def @f``, ``type T`` or constructor when the
    prelude defines that name too."""
    mod = prelude()
    taken = {("global", gv.name) for gv in mod.global_vars}
    taken |= {("type", td.name) for td in mod.type_definitions}
    taken |= {("constructor", name) for name in mod.constructors}
    for i, (kind, name) in _defined_names(tokens):
        if (kind, name) in taken:
            what = {"global": f"@{name}", "type": f"type {name}",
                    "constructor": f"constructor {name}"}[kind]
            raise ParseError(
                f"{what} is defined by the prelude (kiln/std/prelude.rly); a program read with "
                "kiln.std.with_prelude uses the prelude's and cannot define its own",
                tokens.span(i),
            )


def _defined_names(tokens: Tokens) -> list[tuple[int, tuple[str, str]]]:
    """(token index, (kind, name)) of every global, type and constructor the text defines."""
    kinds, values = tokens.kinds, tokens.values
    out: list[tuple[int, tuple[str, str]]] = []
    i = 0
    while i < len(kinds) - 1:
        if kinds[i] == "def" and kinds[i + 1] == "global":
            out.append((i + 1, ("global", values[i + 1])))
        elif kinds[i] == "type" and kinds[i + 1] == "ident":
            out.append((i + 1, ("type", values[i + 1])))
            # constructors: the names at the top of the body, after `{` or `,`
            j = i + 2
            while j < len(kinds) and kinds[j] not in ("{", ";", "eof"):
                j += 1
            depth = 0
            while j < len(kinds) - 1 and kinds[j] != "eof":
                k = kinds[j]
                if k in ("{", "(", "["):
                    depth += 1
                elif k in ("}", ")", "]"):
                    depth -= 1
                    if depth == 0:
                        break
                elif depth == 1 and k == "ident" and kinds[j - 1] in ("{", ","):
                    out.append((j, ("constructor", values[j])))
                j += 1
            i = j
        i += 1
    return out


__all__ = ["prelude", "prelude_text", "with_prelude"]
