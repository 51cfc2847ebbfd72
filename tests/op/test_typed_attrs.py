"""Typed operator attributes: each operator's calls carry its Attrs subclass."""

import pytest

import kiln
from kiln.errors import Error
from kiln.ir.attrs import Attrs
from kiln.op import registry
from kiln.op.registry import Attr, OpPattern
from kiln.op.shape import ConcatenateAttrs, TransposeAttrs


def test_builder_calls_carry_the_typed_class():
    x = kiln.var("x", shape=(2, 3))
    c = kiln.op.transpose(x, axes=[1, 0])
    assert isinstance(c.attrs, TransposeAttrs)
    assert c.attrs.axes == (1, 0)
    assert isinstance(kiln.op.transpose(x).attrs, TransposeAttrs)  # the shared defaults too


def test_typed_and_plain_attrs_are_equal_and_hash_alike():
    typed = ConcatenateAttrs(axis=1)
    plain = Attrs(axis=1)
    assert typed == plain and hash(typed) == hash(plain)
    assert repr(typed) == repr(plain)


def test_view_rewraps_a_plain_mapping_and_with_keeps_the_class():
    plain = Attrs(axis=2)
    view = ConcatenateAttrs.view(plain)
    assert isinstance(view, ConcatenateAttrs) and view.axis == 2
    typed = ConcatenateAttrs(axis=0)
    assert ConcatenateAttrs.view(typed) is typed
    assert isinstance(typed.with_(axis=3), ConcatenateAttrs)


def test_register_refuses_a_class_that_disagrees_with_the_schema():
    class WrongAttrs(Attrs):
        __slots__ = ()
        axes: int

    with pytest.raises(Error, match="compiler bug"):
        registry.OpDef(
            name="test.wrong",
            inputs=("x",),
            attrs=(Attr("axis", 0, kind="int"),),
            relation=lambda arg_types, attrs: None,
            compute=lambda arrays, attrs: None,
            pattern=OpPattern.OPAQUE,
            attrs_type=WrongAttrs,
        )


def test_every_operator_with_attributes_has_a_typed_class():
    untyped = [op.name for op in registry.all_ops() if op.attrs and op.attrs_type is Attrs]
    assert untyped == []
