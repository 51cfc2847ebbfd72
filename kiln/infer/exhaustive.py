"""Exhaustiveness of `match`: find a value no clause matches (Maranget's usefulness check).

A complete ``match`` must handle every value of its type; ``match?`` may leave some out.
Patterns are small trees written by people, so the search recurses over pattern columns.
"""

from __future__ import annotations

from kiln.ir.adt import (
    Constructor,
    Pattern,
    PatternConstructor,
    PatternTuple,
    PatternWildcard,
)
from kiln.ir.module import IRModule

_WILD = PatternWildcard()


def _head(p: Pattern) -> Pattern:
    """Variables match like wildcards."""
    return p if isinstance(p, (PatternConstructor, PatternTuple)) else _WILD


def _specialize_ctor(rows: list[list[Pattern]], c: Constructor) -> list[list[Pattern]]:
    out = []
    for row in rows:
        h = _head(row[0])
        if isinstance(h, PatternConstructor):
            if h.constructor == c:
                out.append(list(h.patterns) + row[1:])
        else:
            out.append([_WILD] * len(c.inputs) + row[1:])
    return out


def _specialize_tuple(rows: list[list[Pattern]], arity: int) -> list[list[Pattern]]:
    out = []
    for row in rows:
        h = _head(row[0])
        if isinstance(h, PatternTuple):
            out.append(list(h.patterns) + row[1:])
        else:
            out.append([_WILD] * arity + row[1:])
    return out


def _default(rows: list[list[Pattern]]) -> list[list[Pattern]]:
    return [row[1:] for row in rows if isinstance(_head(row[0]), PatternWildcard)]


def _missing(rows: list[list[Pattern]], n: int, mod: IRModule) -> list[str] | None:
    """A vector of ``n`` values (as text) that no row matches, or None if the rows cover all."""
    if n == 0:
        return None if rows else []
    heads = [_head(r[0]) for r in rows]
    ctors = [h.constructor for h in heads if isinstance(h, PatternConstructor)]
    tuples = [h for h in heads if isinstance(h, PatternTuple)]
    if tuples:
        k = len(tuples[0].patterns)
        w = _missing(_specialize_tuple(rows, k), k + n - 1, mod)
        if w is None:
            return None
        inner = ", ".join(w[:k])
        return [f"({inner},)" if k == 1 else f"({inner})"] + w[k:]
    if ctors:
        all_ctors = mod.type_data(ctors[0].belong_to).constructors
        present = set(ctors)
        if all(c in present for c in all_ctors):
            for c in all_ctors:
                k = len(c.inputs)
                w = _missing(_specialize_ctor(rows, c), k + n - 1, mod)
                if w is not None:
                    return [_ctor_text(c, w[:k])] + w[k:]
            return None
        w = _missing(_default(rows), n - 1, mod)
        if w is None:
            return None
        absent = next(c for c in all_ctors if c not in present)
        return [_ctor_text(absent, ["_"] * len(absent.inputs))] + w
    w = _missing(_default(rows), n - 1, mod)
    return None if w is None else ["_"] + w


def _ctor_text(c: Constructor, args: list[str]) -> str:
    return f"{c.name}({', '.join(args)})" if args else c.name


def unmatched_case(patterns: list[Pattern], mod: IRModule) -> str | None:
    """A value (as text, ``_`` for anything) that none of the patterns match, or None."""
    w = _missing([[p] for p in patterns], 1, mod)
    return None if w is None else w[0]
