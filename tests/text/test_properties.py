"""Properties over many programs: printing then parsing is the identity, and no text whatever
makes the parser fail with anything but a kiln.ParseError."""

from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kiln
from kiln.testing.strategies import constants, modules, types
from kiln.text import astext, parse, parse_expr, parse_type
from kiln.text.lexer import tokenize

ROOT = Path(__file__).parent
CORPUS = [p.read_text() for p in sorted((ROOT / "data").glob("*.rly"))]
CORPUS += [p.read_text() for p in sorted((ROOT.parent / "programs").glob("*.rly"))]

FAST = settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=300)


@FAST
@given(modules())
def test_printing_then_parsing_gives_the_same_module(mod):
    text = astext(mod)
    again = parse(text)
    assert kiln.structural_equal(again, mod), text
    assert astext(again) == text  # and printing is a fixed point


@FAST
@given(types(depth=3))
def test_types_round_trip(ty):
    assert kiln.structural_equal(parse_type(astext(ty)), ty)


@FAST
@given(st.lists(constants(), min_size=1, max_size=4))
def test_constants_round_trip_bit_for_bit(consts):
    e = kiln.Tuple(consts)
    back = parse_expr(astext(e))
    for a, b in zip(consts, back.fields):
        assert a.data.dtype == b.data.dtype and a.data.shape == b.data.shape
        assert a.data.tobytes() == b.data.tobytes()


# --- nothing but ParseError -------------------------------------------------------------------

VOCABULARY = [
    "%x", "%y", "%0", "%1", "@main", "@f", "let", "fn", "def", "if", "else", "type", "match",
    "match?", "extern", "free_var", "ref", "ref_read", "ref_write", "True", "_", "(", ")", "[",
    "]", "{", "}", ",", ";", ":", "=", "=>", "->", "==", "!=", "<=", ">=", "<", ">", "+", "-",
    "*", "/", "?", ".", ".0", ".99999999999", "1", "-1", "--1", "1.5f", "1e999f", "3f16",
    "7i8", "99999999999999999999", "inff", "nanf", '"s"', '"', "meta[relay.Constant][0]",
    "meta[x][99]", '#[version = "0.0.5"]', "#[metadata]", '{"relay.Constant": [1]}', "Tensor",
    "float32", "int8x4", "List", "Cons", "Nil", "A", "add", "nn.conv2d", "nn.relu", "cast",
    "strides", "dtype", "None", "/*", "*/", "//", "\n", "%", "@", "#", "x", "é", "\x00",
]


def only_parse_errors(text: str) -> None:
    for fn in (parse, parse_expr, parse_type):
        try:
            fn(text)
        except kiln.ParseError:
            pass


@FAST
@given(st.text(max_size=300))
def test_random_text(text):
    only_parse_errors(text)


@FAST
@given(st.lists(st.sampled_from(VOCABULARY), max_size=60), st.sampled_from([" ", "", "\n"]))
def test_token_soup(words, sep):
    only_parse_errors(sep.join(words))


MUTATION = st.tuples(st.integers(0, 3), st.integers(0, 10**6), st.integers(0, 10**6))


def mutate(parts: list[str], mutations) -> list[str]:
    parts = list(parts)
    for op, a, b in mutations:
        if not parts:
            break
        a %= len(parts)
        b %= len(parts)
        if op == 0:
            del parts[a]
        elif op == 1:
            parts.insert(a, parts[b])
        elif op == 2:
            parts[a], parts[b] = parts[b], parts[a]
        else:
            parts[a] = VOCABULARY[b % len(VOCABULARY)]
    return parts


def tokens_of(text: str) -> list[str]:
    toks = tokenize(kiln.errors.SourceFile("x", text))
    return [text[s:e] for s, e in zip(toks.starts, toks.ends)]


@FAST
@given(st.sampled_from(CORPUS), st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_programs_token_by_token(text, mutations):
    only_parse_errors(" ".join(mutate(tokens_of(text), mutations)))


@FAST
@given(st.sampled_from(CORPUS), st.lists(MUTATION, min_size=1, max_size=4))
def test_mutated_programs_character_by_character(text, mutations):
    only_parse_errors("".join(mutate(list(text), mutations)))


@settings(deadline=None, suppress_health_check=list(HealthCheck), max_examples=150)
@given(modules(max_depth=2), st.lists(MUTATION, min_size=1, max_size=3), st.booleans())
def test_mutated_printed_modules(mod, mutations, by_token):
    text = astext(mod)
    parts = tokens_of(text) if by_token else list(text)
    only_parse_errors((" " if by_token else "").join(mutate(parts, mutations)))
