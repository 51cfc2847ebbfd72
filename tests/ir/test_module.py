"""IRModule: lookup by name, immutability, functional updates, clear errors."""

import pytest

import kiln


def _identity():
    x = kiln.var("x", shape=(3,))
    return kiln.Function([x], x)


def test_lookup_by_name_and_global_var():
    mod = kiln.IRModule({"main": _identity()})
    assert mod["main"] is mod[kiln.GlobalVar("main")]
    assert "main" in mod and "other" not in mod
    with pytest.raises(kiln.Error, match="did you mean 'main'"):
        mod["mian"]


def test_module_is_immutable_and_updates_return_copies():
    mod = kiln.IRModule({"main": _identity()})
    with pytest.raises(AttributeError):
        mod.functions = {}  # type: ignore[misc]
    mod2 = mod.with_function("f", _identity())
    assert "f" in mod2 and "f" not in mod


def test_from_expr_wraps_free_variables_into_main():
    x, y = kiln.var("x"), kiln.var("y")
    mod = kiln.IRModule.from_expr(kiln.Tuple([x, y]))
    assert list(mod["main"].params) == [x, y]


def test_type_definitions_and_constructors():
    lst = kiln.GlobalTypeVar("List")
    a = kiln.TypeVar("A")
    cons = kiln.Constructor("Cons", [a, lst[a]], lst)
    nil = kiln.Constructor("Nil", [], lst)
    mod = kiln.IRModule({"main": _identity()}, [kiln.TypeData(lst, [a], [cons, nil])])
    assert mod.get_constructor("Cons") is cons
    assert mod.type_data("List").constructors == (cons, nil)
    with pytest.raises(kiln.Error, match="no constructor"):
        mod.get_constructor("Snoc")
    with pytest.raises(kiln.Error, match="defines constructor Nil twice"):
        kiln.TypeData(lst, [a], [nil, nil])


def test_globals_must_be_functions():
    with pytest.raises(kiln.Error, match="must be a kiln.Function"):
        kiln.IRModule({"main": kiln.const(1.0)})  # type: ignore[dict-item]
