"""from_torch: kthvalue/median/nanmedian, masked_scatter, boolean masks over any axes,
index_put into and chunk/split along symbolic axes — each against PyTorch, where shapes are
symbolic or counted from the data at several inputs with one executable."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

import kiln
from kiln.frontend import from_torch


def run(module, example, feeds, dynamic_shapes=None):
    """Build once from ``example``; every feed against the module, result by result."""
    mod, params = from_torch(module, example, dynamic_shapes=dynamic_shapes)
    exe = kiln.build(mod, params=params)
    outs = []
    for feed in feeds:
        got = exe(*(a.numpy() for a in feed))
        with torch.no_grad():
            want = module(*feed)
        got = list(got) if isinstance(want, tuple) else [got]
        want = list(want) if isinstance(want, tuple) else [want]
        outs.append((got, [w.numpy() for w in want]))
    return outs


# --- kthvalue, median, nanmedian -------------------------------------------------------------


class Ranks(torch.nn.Module):
    def forward(self, x):
        k = torch.kthvalue(x, 3, dim=1)
        kk = torch.kthvalue(x, 1, dim=0, keepdim=True)
        m = torch.median(x, dim=1, keepdim=True)
        nm = torch.nanmedian(x, dim=-1)
        return (k.values, k.indices, kk.values, kk.indices, m.values, m.indices,
                nm.values, nm.indices, torch.median(x), torch.nanmedian(x))


def ties_and_nans(seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 4, (5, 7), generator=g).to(dtype)  # many ties
    if dtype.is_floating_point:
        x[torch.rand(5, 7, generator=g) < 0.2] = float("nan")
        x[2] = float("nan")  # a row of NaN only
        x[3] = torch.randn(7, generator=g)  # a row without ties
    return x


def _check_ranks(x: torch.Tensor, got: list, want: list) -> None:
    # values exactly; an index must point at an element equal to the value (torch documents
    # which one of equal elements as unspecified), and be torch's where the value is unique
    dims = [(1, False), (0, True), (1, True), (1, False)]
    for j, (dim, keep) in enumerate(dims):
        gv, gi, wv, wi = got[2 * j], got[2 * j + 1], want[2 * j], want[2 * j + 1]
        np.testing.assert_array_equal(gv, wv)
        assert gi.dtype == np.int64 and gi.shape == wi.shape
        idx = torch.from_numpy(gi if keep else np.expand_dims(gi, dim))
        at = torch.gather(x, dim, idx).numpy()
        np.testing.assert_array_equal(at, gv if keep else np.expand_dims(gv, dim))
        if x.dtype.is_floating_point:
            value = torch.from_numpy(gv if keep else np.expand_dims(gv, dim))
            unique = ((x == value) | (x.isnan() & value.isnan())).sum(dim, keepdim=keep) == 1
            np.testing.assert_array_equal(gi[unique.numpy()], wi[unique.numpy()])
    np.testing.assert_array_equal(got[8], want[8])
    np.testing.assert_array_equal(got[9], want[9])


def test_kthvalue_median_and_nanmedian_with_ties_and_nan():
    x = ties_and_nans(0)
    feeds = [(ties_and_nans(s),) for s in range(3)]
    for (got, want), (f,) in zip(run(Ranks(), (x,), feeds), feeds, strict=True):
        _check_ranks(f, got, want)


def test_ranks_of_integers():
    class IntRanks(torch.nn.Module):
        def forward(self, x):
            k = torch.kthvalue(x, 5, dim=1)
            m = torch.median(x, dim=0)
            return k.values, k.indices, m.values, m.indices

    x = ties_and_nans(1, torch.int32)
    for got, want in run(IntRanks(), (x,), [(x,)]):
        for g, w in zip(got[0::2], want[0::2]):
            np.testing.assert_array_equal(g, w)
        np.testing.assert_array_equal(np.take_along_axis(x.numpy(), got[1][:, None], 1)[:, 0],
                                      want[0])


def test_kthvalue_out_of_range_is_an_error():
    class Bad(torch.nn.Module):
        def forward(self, x):
            return torch.kthvalue(x, 4, dim=0).values

    with pytest.raises(kiln.Error, match=r"k=4 is outside \[1, 3\]|out of range"):
        from_torch(Bad(), (torch.randn(3, 2),))


# --- masked_scatter and boolean masks ----------------------------------------------------------


class MaskedScatter(torch.nn.Module):
    def forward(self, x, m, s):
        return x.masked_scatter(m, s)


@pytest.mark.parametrize("mask_shape", [(3, 4, 5), (4, 5), (4, 1)], ids=["same", "rows", "bcast"])
def test_masked_scatter_at_different_counts(mask_shape):
    def feed(seed):
        g = torch.Generator().manual_seed(seed)
        m = torch.rand(mask_shape, generator=g) < 0.4 * seed
        return torch.randn(3, 4, 5, generator=g), m, torch.randn(70, generator=g)

    counts = set()
    feeds = [feed(s) for s in range(4)]
    for (got, want), f in zip(run(MaskedScatter(), feed(1), feeds), feeds, strict=True):
        np.testing.assert_array_equal(got[0], want[0])
        counts.add(int(f[1].sum()))
    assert len(counts) > 2  # no true element, some, and (for seed 3) most


def test_masked_scatter_of_a_long_vector_uses_both_levels_of_the_count():
    def feed(seed):
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(3001, generator=g)
        return x, x > 0.3 * seed, torch.randn(3001, generator=g)

    for got, want in run(MaskedScatter(), feed(0), [feed(0), feed(2)]):
        np.testing.assert_array_equal(got[0], want[0])


def test_masked_scatter_with_too_short_a_source_fails_when_it_runs():
    x = torch.randn(4, 5)
    mod, params = from_torch(MaskedScatter(), (x, x > 0, torch.randn(6)))
    exe = kiln.build(mod, params=params)
    exe(x.numpy(), (x > 5).numpy(), np.zeros(6, "float32"))  # no true element: fine
    with pytest.raises(kiln.Error, match="outside"):
        exe(x.numpy(), np.ones((4, 5), bool), np.zeros(6, "float32"))


class MiddleMasks(torch.nn.Module):
    def forward(self, x, m, mm):
        return x[:, m] * 2, x[..., m], x[:, mm]


def masks(seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(4, generator=g) < 0.5, torch.rand(4, 4, generator=g) < 0.5


def test_a_boolean_mask_over_middle_and_last_axes():
    feeds = [(torch.randn(3, 4, 4), *masks(s)) for s in range(4)]
    for got, want in run(MiddleMasks(), feeds[0], feeds):
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)


def test_a_boolean_mask_over_a_middle_axis_with_a_symbolic_batch():
    feeds = [(torch.randn(b, 4, 4), *masks(s)) for s, b in enumerate((1, 2, 5))]
    for got, want in run(MiddleMasks(), feeds[1], feeds,
                         dynamic_shapes=({0: Dim("batch")}, None, None)):
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)


def test_assigning_a_value_through_a_mask():
    class Clear(torch.nn.Module):
        def forward(self, x, y):
            x = x.clone()
            x[x > 0.5] = 0.0
            y = y.clone()
            y[:, y[0] > 0] += 2.0
            return x, y

    feeds = [(torch.randn(3, 4), torch.randn(3, 5)) for _ in range(3)]
    for got, want in run(Clear(), feeds[0], feeds):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


def test_assigning_one_slice_per_true_element():
    class Scaled(torch.nn.Module):
        def forward(self, x, m, y, r):
            x = x.clone()
            x[m] = x[m] * 3 + 1
            y = y.clone()
            y[:, r] = torch.flip(y[:, r], [0])
            return x, y

    def feed(seed):
        g = torch.Generator().manual_seed(seed)
        x, y = torch.randn(3, 4, generator=g), torch.randn(2, 6, 3, generator=g)
        return x, x > 0.3 * seed - 0.5, y, torch.rand(6, generator=g) < 0.5

    feeds = [feed(s) for s in range(4)]
    for got, want in run(Scaled(), feeds[0], feeds):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_allclose(g, w, rtol=1e-6)


# --- symbolic axes: index_put into one, chunk and split along one ----------------------------


def test_index_put_into_a_symbolic_axis():
    class Put(torch.nn.Module):
        def forward(self, x, i, v, z, j, w):
            x = x.clone()
            x[:, i] = v  # distinct indices: torch leaves the winner of repeats open
            return x, z.index_put((j,), w, accumulate=True)  # repeats add up

    b, t = Dim("b"), Dim("t", min=4, max=64)

    def feed(bs, ts):
        g = torch.Generator().manual_seed(bs * 10 + ts)
        return (torch.randn(bs, ts, generator=g), torch.tensor([1, -1, 2]),
                torch.randn(bs, 3, generator=g), torch.randn(ts, 3, generator=g),
                torch.tensor([0, 2, 0, -1]), torch.randn(4, 3, generator=g))

    feeds = [feed(1, 4), feed(3, 9), feed(2, 17)]
    outs = run(Put(), feed(2, 8), feeds,
               dynamic_shapes=({0: b, 1: t}, None, {0: b}, {0: t}, None, None))
    for got, want in outs:
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


class Chunks(torch.nn.Module):
    def forward(self, x):
        a, b = x.chunk(2, dim=1)
        first, *_, last = x.split(3, dim=0)
        c, d = torch.split(x, [2, x.shape[1] - 2], dim=1)
        return a * 2 + b, first, last, c.sum(1), d


def test_chunk_and_split_along_a_symbolic_axis():
    half = Dim("half", min=2, max=32)
    feeds = [(torch.randn(7, 2 * h),) for h in (2, 5, 9)]
    for got, want in run(Chunks(), feeds[1], feeds, dynamic_shapes=({1: 2 * half},)):
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)


def test_ranks_along_a_static_axis_of_a_tensor_with_a_symbolic_batch():
    class Rows(torch.nn.Module):
        def forward(self, x):
            k = torch.kthvalue(x, 2, dim=1)
            return k.values, torch.median(x, dim=1).values, torch.nanmedian(x, dim=-1).values

    feeds = [(ties_and_nans(s)[: 5 - s],) for s in range(3)]  # batch 5, 4, 3
    for got, want in run(Rows(), feeds[0], feeds, dynamic_shapes=({0: Dim("batch")},)):
        for g, w in zip(got, want, strict=True):
            np.testing.assert_array_equal(g, w)


# --- sorting along a symbolic axis -------------------------------------------------------------


class SortsAlongLength(torch.nn.Module):
    def forward(self, x):
        s = torch.sort(x, dim=1, descending=True, stable=True)
        top = torch.topk(x, 2, dim=1)
        k = torch.kthvalue(x, 2, dim=1)
        m = torch.median(x, dim=1)
        nm = torch.nanmedian(x, dim=1)
        return (s.values, s.indices, torch.argsort(x, dim=1, stable=True), top.values,
                k.values, m.values, nm.values, torch.median(x), torch.nanmedian(x))


def _rows(seed: int, length: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 3, (4, length), generator=g).to(torch.float32)  # ties
    x[0] = torch.randn(length, generator=g)  # a row without ties
    x[1, torch.rand(length, generator=g) < 0.3] = float("nan")
    return x


def test_sort_topk_and_ranks_along_a_symbolic_axis():
    feeds = [(_rows(s, n),) for s, n in enumerate((5, 9, 2, 13))]
    length = Dim("length", min=2, max=64)
    outs = run(SortsAlongLength(), feeds[0], feeds, dynamic_shapes=({1: length},))
    for got, want in outs:  # the stable sort and the values: exactly torch's, NaN included
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape
            np.testing.assert_array_equal(g, w)


def test_topk_and_kthvalue_past_a_symbolic_axis_fail_when_they_run():
    class Top(torch.nn.Module):
        def forward(self, x):
            return torch.topk(x, 3, dim=1).values, torch.kthvalue(x, 3, dim=1).values

    mod, params = from_torch(Top(), (torch.randn(2, 6),),
                             dynamic_shapes=({1: Dim("n", min=3, max=32)},))
    exe = kiln.build(mod, params=params)
    x = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    want = Top()(torch.from_numpy(x))
    for g, w in zip(exe(x), want, strict=True):
        np.testing.assert_array_equal(g, w.numpy())
    with pytest.raises(kiln.Error, match="outside"):
        exe(np.zeros((2, 2), np.float32))


# --- a boolean mask beside other index tensors -------------------------------------------------


class MaskAndIndex(torch.nn.Module):
    def forward(self, x, m, mm, m2, i):
        const_mask = torch.tensor([True, False, True])
        return x[m, i], x[:, i, const_mask], x[i, mm], x[m2, i]


def test_a_boolean_mask_beside_index_tensors_at_several_counts():
    g = torch.Generator().manual_seed(0)
    feeds = [(torch.randn(4, 5, 3, generator=g), torch.rand(4, generator=g) > t,
              torch.rand(5, generator=g) > t, torch.rand(4, 5, generator=g) > t,
              torch.tensor([k]))
             for t, k in ((0.5, 1), (0.2, -1), (0.8, 2))]
    feeds[0][1][0] = True  # at least one true element everywhere (torch.export needs a count)
    for got, want in run(MaskAndIndex(), feeds[0], feeds):
        for g_, w in zip(got, want, strict=True):
            assert g_.shape == w.shape
            np.testing.assert_array_equal(g_, w)


def test_assigning_through_a_mask_beside_index_tensors_is_a_clear_error():
    class Put(torch.nn.Module):
        def forward(self, x, m, i):
            x = x.clone()
            x[m, i] = 0.0
            return x

    with pytest.raises(kiln.Error, match="boolean mask beside other index tensors"):
        from_torch(Put(), (torch.randn(4, 5), torch.rand(4) > 0.5, torch.tensor([1])))
