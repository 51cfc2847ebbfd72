"""Whole Relay programs: parse, type-check, round-trip through text, and run.

The programs under tests/programs are written the way TVM's prelude and tutorials write
Relay. Their results are checked against Python computations and, for the CNN, PyTorch.
"""

from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.eval import adt_to_list

PROGRAMS = Path(__file__).parent.parent / "programs"


def load(name: str) -> kiln.IRModule:
    text = (PROGRAMS / name).read_text()
    return kiln.infer_types(kiln.parse(text, source_name=name))


@pytest.mark.parametrize("name", sorted(p.name for p in PROGRAMS.glob("*.rly")))
def test_programs_round_trip_through_text(name):
    mod = load(name)
    text = kiln.astext(mod)
    again = kiln.parse(text)
    assert kiln.structural_equal(again, kiln.parse((PROGRAMS / name).read_text()))
    assert kiln.astext(kiln.infer_types(again)) == text


def test_lists():
    mod = load("lists.rly")
    v = np.array([1.0, -2.0, 0.5], "float32")
    n = 6
    length, total, squares, evens, scaled, pairs, both = kiln.interpret(mod, np.int32(n), v)
    xs = list(range(n, 0, -1))
    assert int(length) == n and length.dtype == np.int32
    assert int(total) == sum(xs)
    assert [int(a) for a in adt_to_list(squares)] == [x * x for x in xs]
    assert [int(a) for a in adt_to_list(evens)] == [x for x in xs if x % 2 == 0]
    np.testing.assert_array_equal(scaled, v * float(list(reversed(xs))[1]))
    assert [(int(a), int(b)) for a, b in adt_to_list(pairs)] == list(zip(xs, reversed(xs)))
    assert int(both) == 2 * len([x for x in xs if x % 2 == 0])


def test_lists_types():
    mod = load("lists.rly")
    ret = mod["main"].checked_type.ret_type
    lst = kiln.GlobalTypeVar("List")
    i32 = kiln.scalar_type("int32")
    assert ret.fields[0] == i32
    assert ret.fields[2] == lst[i32]
    assert ret.fields[4] == kiln.TensorType((3,), "float32")
    assert ret.fields[5] == lst[kiln.TupleType([i32, i32])]


def test_trees_and_options():
    mod = load("trees.rly")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((2, 2)).astype("float32")
    b = rng.standard_normal((2, 2)).astype("float32")
    size, total, doubled, big, huge = kiln.interpret(mod, a, b)
    assert int(size) == 4
    expected = a + b + b + a  # root a, leaf b, node b with leaf a
    np.testing.assert_allclose(total, expected, rtol=1e-6)
    np.testing.assert_allclose(doubled, 2 * expected, rtol=1e-6)
    assert int(big) == 8 and int(huge) == -1


def test_closures_references_and_recursion():
    mod = load("closures.rly")
    x = np.array([1.0, 2.0], "float32")
    steps = 10000
    out = kiln.interpret(mod, x, np.int32(steps))
    both, iterated, first, second, third, diff, fib, loop, even, fact = out
    np.testing.assert_allclose(both, (x + 1) * 3)
    np.testing.assert_allclose(iterated, x * 81)
    assert (int(first), int(second), int(third)) == (10, 11, 12)
    assert int(diff) == 5
    assert int(fib) == 610
    assert int(loop) == steps * (steps - 1) // 2 and loop.dtype == np.int64
    assert bool(even) is False
    assert int(fact) == 3628800


def test_cnn_matches_pytorch():
    torch = pytest.importorskip("torch")
    mod = load("cnn.rly")
    rng = np.random.default_rng(1)

    def rand(*shape, scale=0.3):
        return (rng.standard_normal(shape) * scale).astype("float32")

    args = {
        "data": rand(2, 3, 16, 16, scale=1.0),
        "conv1_weight": rand(8, 3, 3, 3),
        "conv1_bias": rand(8),
        "bn_gamma": rand(8) + 1,
        "bn_beta": rand(8),
        "bn_mean": rand(8),
        "bn_var": np.abs(rand(8)) + 0.5,
        "conv2_weight": rand(16, 8, 3, 3),
        "dw_weight": rand(16, 1, 3, 3),
        "fc_weight": rand(10, 256, scale=0.05),
        "fc_bias": rand(10),
    }
    out = kiln.interpret(mod, args["data"], params={k: v for k, v in args.items() if k != "data"})

    F = torch.nn.functional
    t = {k: torch.from_numpy(v) for k, v in args.items()}
    y = F.conv2d(t["data"], t["conv1_weight"], t["conv1_bias"], padding=1)
    y = F.batch_norm(y, t["bn_mean"], t["bn_var"], t["bn_gamma"], t["bn_beta"], False, 0.0, 1e-5)
    y = F.max_pool2d(F.relu(y), 2, 2)
    y = F.conv2d(y, t["conv2_weight"], padding=1)
    y = F.conv2d(y, t["dw_weight"], padding=1, groups=16)
    y = F.avg_pool2d(F.leaky_relu(y, 0.1), 2, 2)
    y = F.linear(y.flatten(1), t["fc_weight"], t["fc_bias"])
    expected = F.softmax(y, dim=-1).numpy()
    assert out.shape == (2, 10) and out.dtype == np.float32
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-6)
