"""Shape operators against PyTorch, numpy slicing and worked examples from Relay's docs."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kiln
from kiln.ir.ty import ANY, IncompleteType, SymDim, TensorType, TupleType

from .helpers import check, covers, infer, rand, run

T = torch.from_numpy


@st.composite
def regroupings(draw):
    """Two shapes with the same number of elements, made by grouping the same factors."""
    factors = draw(st.lists(st.sampled_from([1, 2, 3, 5]), max_size=5))

    def group() -> tuple[int, ...]:
        order = draw(st.permutations(factors))
        cuts = sorted(draw(st.lists(st.integers(0, len(order)), max_size=3)))
        bounds = [0, *cuts, len(order)]
        return tuple(math.prod(order[a:b]) for a, b in itertools.pairwise(bounds))

    return group(), group(), draw(st.integers(0, 2**16))


@covers("reshape")
@settings(max_examples=40, deadline=None)
@given(case=regroupings(), use_infer=st.booleans(), use_copy=st.booleans())
def test_reshape_against_numpy(case, use_infer: bool, use_copy: bool) -> None:
    src, dst, seed = case
    x = rand(np.random.default_rng(seed), src)
    newshape = list(dst)
    if use_copy:  # 0 copies the input dimension at the same position
        newshape = [0 if i < len(src) and d == src[i] else d for i, d in enumerate(newshape)]
    if use_infer and newshape and math.prod(dst) > 0:
        newshape[len(newshape) // 2] = -1
    check("reshape", [x], np.reshape(x, dst), newshape=newshape)


# Worked examples from Relay's reshape documentation: (input shape, newshape, result shape).
RESHAPE_EXAMPLES = [
    ((2, 3, 4), (6, 1, -1), (6, 1, 4)),
    ((2, 3, 4), (3, -1, 8), (3, 1, 8)),
    ((2, 3, 4), (-1,), (24,)),
    ((2, 3, 4), (2, 0, 0), (2, 3, 4)),
    ((2, 3, 4), (4, 0, 2), (4, 3, 2)),
    ((2, 3, 4), (-2,), (2, 3, 4)),
    ((2, 3, 4), (2, -2), (2, 3, 4)),
    ((2, 3, 4), (-2, 1, 1), (2, 3, 4, 1, 1)),
    ((2, 3, 4), (-3, 4), (6, 4)),
    ((2, 3, 4, 5), (-3, -3), (6, 20)),
    ((2, 3, 4), (0, -3), (2, 12)),
    ((2, 3, 4), (-3, -2), (6, 4)),
    ((2, 3, 4), (-4, 1, 2, -2), (1, 2, 3, 4)),
    ((2, 3, 4), (2, -4, -1, 3, -2), (2, 1, 3, 4)),
]


@pytest.mark.parametrize(("src", "newshape", "dst"), RESHAPE_EXAMPLES)
def test_reshape_special_codes(src, newshape, dst) -> None:
    x = np.arange(math.prod(src), dtype="int32").reshape(src)
    check("reshape", [x], x.reshape(dst), newshape=newshape)


def test_reshape_allowzero_keeps_zero_sizes() -> None:
    x = np.zeros((0, 3), "float32")
    check("reshape", [x], np.zeros((3, 0), "float32"), newshape=[3, 0], allowzero=1)


def test_reshape_relation_with_symbols_and_errors() -> None:
    n = SymDim("n")
    assert infer("reshape", [TensorType((n, 3, 4))], newshape=[0, -1]) == TensorType((n, 12))
    assert infer("reshape", [TensorType((n, 12))], newshape=[-1, 3, 4]) == TensorType((n, 3, 4))
    assert infer("reshape", [TensorType((n, 3))], newshape=[-1]) == TensorType((ANY,))
    assert infer("reshape", [TensorType((ANY, 4))], newshape=[2, -1]) == TensorType((2, ANY))
    with pytest.raises(kiln.TypeCheckError, match=r"\(2, 3\) \(6 elements\) to \(4, 2\)"):
        infer("reshape", [TensorType((2, 3))], newshape=[4, 2])
    with pytest.raises(kiln.TypeCheckError, match="more than one -1"):
        infer("reshape", [TensorType((2, 3))], newshape=[-1, -1])
    with pytest.raises(
        kiln.TypeCheckError,
        match=r"shape \(2, 3\) to \[4, -1\]: 6 elements do not divide into parts of 4",
    ):
        infer("reshape", [TensorType((2, 3))], newshape=[4, -1])


@covers("transpose")
@pytest.mark.parametrize("seed", range(6))
def test_transpose_against_torch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    shape = tuple(rng.integers(1, 4, size=rng.integers(0, 5)))
    x = rand(rng, shape)
    perm = [int(p) for p in rng.permutation(len(shape))]
    axes = [p - len(shape) if rng.random() < 0.5 else p for p in perm]
    check("transpose", [x], T(x).permute(*perm).numpy(), axes=axes)
    check("transpose", [x], T(x).permute(*reversed(range(len(shape)))).numpy())
    if len(shape) >= 2:
        with pytest.raises(kiln.TypeCheckError, match="permutation"):
            infer("transpose", [TensorType(shape)], axes=[0] * len(shape))


@covers("expand_dims")
@pytest.mark.parametrize(
    ("shape", "axis", "count"),
    [((2, 3), 0, 1), ((2, 3), 2, 2), ((2, 3), -1, 1), ((2, 3), -3, 2), ((), 0, 3), ((4,), 1, 0)],
)
def test_expand_dims_against_torch(shape, axis: int, count: int) -> None:
    x = rand(np.random.default_rng(0), shape)
    t = T(x)
    at = axis + len(shape) + 1 if axis < 0 else axis
    for _ in range(count):
        t = t.unsqueeze(at)
    check("expand_dims", [x], t.numpy(), axis=axis, num_newaxis=count)
    with pytest.raises(kiln.TypeCheckError, match="out of range"):
        infer("expand_dims", [TensorType(shape)], axis=len(shape) + 1)


@covers("squeeze")
def test_squeeze_against_torch() -> None:
    x = rand(np.random.default_rng(1), (1, 3, 1, 2, 1))
    check("squeeze", [x], T(x).squeeze().numpy())
    check("squeeze", [x], T(x).squeeze(2).squeeze(0).numpy(), axis=[0, -3])
    with pytest.raises(kiln.TypeCheckError, match="dimension 1 .* size is 3, not 1"):
        infer("squeeze", [TensorType((1, 3))], axis=[1])
    n = SymDim("n")
    assert infer("squeeze", [TensorType((1, n, 1))]) == TensorType((n,))


@covers("concatenate")
@pytest.mark.parametrize("seed", range(6))
def test_concatenate_against_torch(seed: int) -> None:
    rng = np.random.default_rng(seed)
    ndim = int(rng.integers(1, 4))
    base = list(rng.integers(1, 4, size=ndim))
    axis = int(rng.integers(-ndim, ndim))
    parts = []
    for _ in range(int(rng.integers(1, 4))):
        shape = list(base)
        shape[axis] = int(rng.integers(0, 4))
        parts.append(rand(rng, shape, "int32"))
    expected = torch.cat([T(p) for p in parts], dim=axis).numpy()
    check("concatenate", [parts], expected, axis=axis)


def test_concatenate_relation_errors_and_symbols() -> None:
    n = SymDim("n")
    both = TupleType((TensorType((n, 2)), TensorType((n, 3))))
    assert infer("concatenate", [both], axis=1) == TensorType((n, 5))
    assert infer("concatenate", [both], axis=-1) == TensorType((n, 5))
    with pytest.raises(kiln.TypeCheckError, match="dimension 0 differs"):
        infer("concatenate", [TupleType((TensorType((2, 2)), TensorType((3, 2))))], axis=1)
    with pytest.raises(kiln.TypeCheckError, match="dtype"):
        infer("concatenate", [TupleType((TensorType((2,)), TensorType((2,), "int32")))])
    with pytest.raises(kiln.TypeCheckError, match="out of range"):
        infer("concatenate", [TupleType((TensorType((2,)), TensorType((2,))))], axis=1)
    assert infer("concatenate", [TupleType((TensorType((2,)), IncompleteType()))]) is None


@covers("stack")
@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_stack_against_torch(axis: int) -> None:
    rng = np.random.default_rng(axis + 5)
    parts = [rand(rng, (2, 3)) for _ in range(3)]
    check("stack", [parts], torch.stack([T(p) for p in parts], dim=axis).numpy(), axis=axis)


def test_stack_needs_equal_shapes() -> None:
    with pytest.raises(kiln.TypeCheckError, match="equal shapes"):
        infer("stack", [TupleType((TensorType((2, 3)), TensorType((2, 4))))])


@covers("split")
def test_split_against_torch() -> None:
    x = rand(np.random.default_rng(3), (4, 6, 5))
    out = run("split", x, indices_or_sections=3, axis=1)
    expected = torch.split(T(x), 2, dim=1)
    assert len(out) == 3
    for o, e in zip(out, expected, strict=True):
        np.testing.assert_array_equal(o, e.numpy())
    out = run("split", x, indices_or_sections=[1, 4], axis=-1)
    expected = torch.tensor_split(T(x), [1, 4], dim=-1)
    for o, e in zip(out, expected, strict=True):
        np.testing.assert_array_equal(o, e.numpy())


def test_split_relation() -> None:
    n = SymDim("n")
    ty = infer("split", [TensorType((n, 6))], indices_or_sections=[2, 5], axis=1)
    assert ty == TupleType((TensorType((n, 2)), TensorType((n, 3)), TensorType((n, 1))))
    assert infer("split", [TensorType((n, 6))], indices_or_sections=2) == TupleType(
        (TensorType((ANY, 6)), TensorType((ANY, 6)))
    )
    with pytest.raises(kiln.TypeCheckError, match="size 6 into 4 equal sections"):
        infer("split", [TensorType((2, 6))], indices_or_sections=4, axis=1)
    with pytest.raises(kiln.TypeCheckError, match="strictly increasing"):
        infer("split", [TensorType((2, 6))], indices_or_sections=[3, 2], axis=1)


def _take_oracle(x: np.ndarray, idx: np.ndarray, axis: int, batch: int) -> np.ndarray:
    """take with batch dimensions, one batch at a time through torch.index_select."""
    if batch == 0:
        flat = torch.index_select(T(x), axis, T(idx.reshape(-1)))
        return flat.numpy().reshape(x.shape[:axis] + idx.shape + x.shape[axis + 1 :])
    out = [_take_oracle(x[b], idx[b], axis - 1, batch - 1) for b in range(x.shape[0])]
    return np.stack(out) if out else np.zeros((0,), x.dtype)


@covers("take")
@pytest.mark.parametrize("mode", ["clip", "wrap", "fast"])
@pytest.mark.parametrize("seed", range(4))
def test_take_against_torch(mode: str, seed: int) -> None:
    rng = np.random.default_rng(seed)
    x = rand(rng, (3, 4, 5))
    axis = int(rng.integers(0, 3))
    batch = int(rng.integers(0, axis + 1))
    idx_shape = (3, 4)[:batch] + tuple(rng.integers(1, 4, size=2))
    n = x.shape[axis]
    low, high = (0, n - 1) if mode == "fast" else (-2 * n, 2 * n)
    idx = rng.integers(low, high + 1, size=idx_shape).astype("int32")
    fixed = {"clip": np.clip(idx, 0, n - 1), "wrap": idx % n, "fast": idx}[mode].astype("int64")
    expected = _take_oracle(x, fixed, axis, batch)
    check(
        "take", [x, idx], expected, axis=axis - 3 if seed % 2 else axis, batch_dims=batch, mode=mode
    )
    flat_idx = np.clip(idx, 0, x.size - 1) if mode == "clip" else idx % x.size
    check(
        "take",
        [x, idx],
        torch.take(T(x), T(flat_idx.astype("int64"))).numpy(),
        mode="clip" if mode == "clip" else "wrap",
    )


def test_take_fast_out_of_range_is_an_eval_error() -> None:
    with pytest.raises(kiln.EvalError, match="outside"):
        run("take", np.zeros(3, "float32"), np.array([3], "int32"), axis=0, mode="fast")


def test_take_relation() -> None:
    ty = infer("take", [TensorType((2, 5, 7)), TensorType((2, 3), "int64")], axis=1, batch_dims=1)
    assert ty == TensorType((2, 3, 7))
    with pytest.raises(kiln.TypeCheckError, match="integer"):
        infer("take", [TensorType((2,)), TensorType((2,))], axis=0)
    with pytest.raises(kiln.TypeCheckError, match="mode"):
        infer("take", [TensorType((2,)), TensorType((2,), "int32")], mode="nan")


@st.composite
def slices(draw):
    shape = tuple(draw(st.lists(st.integers(0, 6), min_size=1, max_size=3)))
    count = draw(st.integers(1, len(shape)))
    bound = st.integers(-8, 8)
    begin = draw(st.lists(bound, min_size=count, max_size=count))
    end = draw(st.lists(st.one_of(bound, st.just(2**31 - 1)), min_size=count, max_size=count))
    strides = draw(st.lists(st.integers(-3, 3).filter(bool), min_size=count, max_size=count))
    return shape, begin, end, strides


@covers("strided_slice")
@settings(max_examples=60, deadline=None)
@given(case=slices())
def test_strided_slice_against_python_slicing(case) -> None:
    shape, begin, end, strides = case
    x = np.arange(math.prod(shape), dtype="int32").reshape(shape)
    index = tuple(slice(b, e, s) for b, e, s in zip(begin, end, strides, strict=True))
    check("strided_slice", [x], x[index], begin=begin, end=end, strides=strides)


def test_strided_slice_axes_and_size_mode() -> None:
    x = np.arange(60, dtype="float32").reshape(3, 4, 5)
    check("strided_slice", [x], x[:, 1:3, :], begin=[1], end=[3], axes=[1])
    check("strided_slice", [x], x[:, :, ::-2], begin=[-1], end=[-(2**31)], strides=[-2], axes=[-1])
    check("strided_slice", [x], x[1:3, 2:], begin=[1, 2], end=[2, -1], slice_mode="size")
    check("strided_slice", [x], x[-2:, :2], begin=[-2, 0], end=[5, 2], slice_mode="size")
    check("strided_slice", [x], x[-2:], begin=[-2], end=[2], slice_mode="size")
    check("strided_slice", [x], x[:, -3:-1], begin=[-3], end=[2], axes=[1], slice_mode="size")
    n = SymDim("n")
    ty = infer("strided_slice", [TensorType((n, 8))], begin=[0, 2], end=[2**31 - 1, 6])
    assert ty == TensorType((n, 4))
    ty = infer("strided_slice", [TensorType((n, 8))], begin=[1], end=[3])
    assert ty == TensorType((ANY, 8))
    with pytest.raises(kiln.TypeCheckError, match="must not be 0"):
        infer("strided_slice", [TensorType((4,))], begin=[0], end=[4], strides=[0])


@covers("broadcast_to")
@pytest.mark.parametrize(
    ("src", "dst"),
    [((3,), (2, 3)), ((1, 3), (4, 3)), ((), (2, 2)), ((2, 1, 1), (2, 3, 4)), ((1,), (0,))],
)
def test_broadcast_to_against_torch(src, dst) -> None:
    x = rand(np.random.default_rng(0), src)
    check("broadcast_to", [x], torch.broadcast_to(T(x), dst).numpy(), shape=dst)


def test_broadcast_to_rejects_mismatch() -> None:
    with pytest.raises(kiln.TypeCheckError, match="dimension 0 is 3, which is neither 1 nor 4"):
        infer("broadcast_to", [TensorType((3,))], shape=[4])


@covers("tile")
@pytest.mark.parametrize(
    ("src", "reps"), [((2, 3), (2, 1)), ((3,), (2, 2)), ((2, 2, 2), (3,)), ((), (2,)), ((2,), (0,))]
)
def test_tile_against_torch(src, reps) -> None:
    x = rand(np.random.default_rng(0), src, "int32")
    check("tile", [x], torch.tile(T(x), reps).numpy(), reps=reps)
    n = SymDim("n")
    assert infer("tile", [TensorType((n, 3))], reps=[1, 2]) == TensorType((n, 6))
