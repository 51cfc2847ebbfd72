"""The lexer: one regular expression, TVM's token rules, positions for every token."""

import pytest

import kiln
from kiln.errors import SourceFile
from kiln.text.lexer import tokenize


def lex(text):
    toks = tokenize(SourceFile("t", text))
    assert toks.kinds[-1] == "eof"
    return list(zip(toks.kinds, toks.values))[:-1]


def test_names_and_punctuation():
    assert lex("%x %0 @main nn.conv2d Cons A float32") == [
        ("local", "x"), ("graph", "0"), ("global", "main"), ("ident", "nn.conv2d"),
        ("ident", "Cons"), ("ident", "A"), ("ident", "float32"),
    ]
    kinds = [k for k, _ in lex("( ) [ ] { } , ; : = => -> == != <= >= < > + - * / ? .")]
    assert kinds == ["(", ")", "[", "]", "{", "}", ",", ";", ":", "=", "=>", "->", "==", "!=",
                     "<=", ">=", "<", ">", "+", "-", "*", "/", "?", "."]


def test_keywords_booleans_and_underscore():
    assert lex("let fn def if else type match match? extern free_var ref ref_read ref_write") == [
        (k, k if k in ("let", "fn", "def", "if", "else", "type", "match", "extern", "free_var",
                       "ref", "ref_read", "ref_write") else "")
        for k in ["let", "fn", "def", "if", "else", "type", "match", "match?", "extern",
                  "free_var", "ref", "ref_read", "ref_write"]
    ]
    assert lex("True False _ %_ %True") == [
        ("bool", "True"), ("bool", "False"), ("_", "_"), ("local", "_"), ("local", "True")
    ]


def test_projections_after_names_are_integers_not_floats():
    assert lex("%x.0.1") == [("local", "x"), ("proj", "0"), ("proj", "1")]
    assert lex("%x.10 1.5f") == [("local", "x"), ("proj", "10"), ("num", "1.5f")]


def test_numbers_keep_their_signs_and_suffixes():
    assert lex("1 -100 --10 1e-05f 3f16 -42i64 -inff nanf 2.5") == [
        ("num", t) for t in ["1", "-100", "--10", "1e-05f", "3f16", "-42i64", "-inff", "nanf",
                             "2.5"]
    ]
    # a minus not followed by a number is the operator; `info` is a name, not inf + "o"
    assert lex("%a - %b -> info") == [
        ("local", "a"), ("-", ""), ("local", "b"), ("->", ""), ("ident", "info")
    ]


def test_strings_and_escapes():
    assert lex(r'"NCHW" "" "a\"b\\c\nd\te"') == [
        ("str", "NCHW"), ("str", ""), ("str", 'a"b\\c\nd\te')
    ]


def test_slashes_inside_names_as_tvm_reads_them():
    assert lex("%conv1/weight @a/b %x/%y") == [
        ("local", "conv1/weight"), ("global", "a/b"), ("local", "x"), ("/", ""), ("local", "y")
    ]


def test_comments_and_whitespace_are_skipped():
    assert lex("/* a /* b */ c */ 1 // two\n 3 /**/") == [("num", "1"), ("num", "3")]


def test_version_header_and_metadata_section():
    toks = tokenize(SourceFile("t", '#[version = "0.0.4"]\n1\n#[metadata]\n{"x": [}'))
    assert list(zip(toks.kinds, toks.values)) == [("version", "0.0.4"), ("num", "1"),
                                                   ("eof", "")]
    assert toks.metadata == '\n{"x": [}'


def test_token_spans_are_one_based_lines_and_columns():
    toks = tokenize(SourceFile("t", "let %x = 1;\n  add(%x,\n\t%x)"))
    add = toks.values.index("add")
    span = toks.span(add)
    assert (span.line, span.column, span.end_line, span.end_column) == (2, 3, 2, 6)
    last_x = len(toks.kinds) - 3
    assert toks.values[last_x] == "x"
    assert (toks.span(last_x).line, toks.span(last_x).column) == (3, 2)
    whole = toks.span(add, len(toks.kinds) - 2)
    assert (whole.line, whole.column, whole.end_line, whole.end_column) == (2, 3, 3, 5)


@pytest.mark.parametrize(
    "text, column, message",
    [
        ("1 $", 3, "unexpected character"),
        ('1 "abc', 3, "never closed"),
        ("1 /* /* */", 3, "never closed"),
        ("# x", 1, "`#` must start"),
        ("% x", 1, "followed by a name"),
        ("@ x", 1, "followed by a name"),
        ("#[versio]", 1, "unknown attribute"),
        ('"\\x"', 1, "unknown escape"),
    ],
)
def test_lexical_errors(text, column, message):
    with pytest.raises(kiln.ParseError) as info:
        tokenize(SourceFile("t", text))
    assert info.value.column == column and message in info.value.message
