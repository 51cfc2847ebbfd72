"""`from_torch`'s converters for indexing, scatter, scans, sorting and pooling edges, each
against PyTorch itself (interpreter and compiled program, as tests/frontend/test_torch.py).

Index tensors are drawn in range, negative ones included; scatter indices repeat only where
the reduction makes the order irrelevant (torch leaves the winner of a repeated plain scatter
open). Sorted inputs are random floats, so no two values tie.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from kiln.frontend import from_torch  # noqa: E402
from tests.frontend.test_torch import Fn, check  # noqa: E402

F = nn.functional


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def ints(*shape: int, low: int = 0, high: int = 5) -> torch.Tensor:
    return torch.randint(low, high, shape)


def perm(n: int, *lead: int) -> torch.Tensor:
    """Indices without repeats along the last axis: a permutation's first entries per row."""
    rows = [torch.randperm(n) for _ in range(max(1, int(torch.tensor(lead).prod())))]
    return torch.stack(rows).reshape(*lead, n) if lead else rows[0]


def set_items(x: torch.Tensor, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    y = x * 1
    y[i, :, j] = -1.0
    return y


def put_rows(x: torch.Tensor, i: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    y = x + 0
    y[:, i] = v
    return y


def shift_right(ids: torch.Tensor) -> torch.Tensor:
    """BART's shift_tokens_right: writes through slices of a fresh tensor."""
    shifted = ids.new_zeros(ids.shape)
    shifted[:, 1:] = ids[:, :-1].clone()
    shifted[:, 0] = 2
    return shifted.masked_fill(shifted == -100, 1)


def write_through_views(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    z = x * 1
    z[1, ::2] = y[0, :2]
    z[:, -1] = 0.5
    return z


OPS: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
    # advanced indexing (aten.index.Tensor with several index tensors)
    "index_two_adjacent": (lambda x, i, j: x[:, i, j],
                           lambda: (r(2, 4, 5, 3), ints(3, low=-4, high=4), ints(3, high=5))),
    "index_broadcasting": (lambda x, i, j: x[i[:, None], j[None, :]],
                           lambda: (r(4, 5, 2), ints(3, high=4), ints(2, low=-5, high=5))),
    "index_separated": (lambda x, i, j: x[i, :, j],
                        lambda: (r(4, 3, 5), ints(2, 2, high=4), ints(2, 2, high=5))),
    "index_three": (lambda x, a, b, c: x[a, b, c],
                    lambda: (r(2, 3, 4), ints(5, high=2), ints(5, high=3), ints(5, high=4))),
    "index_mask_pattern": (  # the shape of Hugging Face's padding masks
        lambda m: m[torch.arange(2)[:, None, None, None], torch.arange(6)[None, None, None, :]]
        .expand(2, 1, 6, 6) * 1.0,
        lambda: (torch.tensor([[1, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], dtype=torch.bool),)),
    "index_int32_indices": (lambda x, i, j: x[i, j],
                            lambda: (r(3, 4), ints(5, high=3).int(), ints(5, high=4).int())),
    # assignment through indices (aten.index_put)
    "index_put_two": (set_items, lambda: (r(4, 2, 5), ints(3, high=4), perm(5)[:3])),
    "index_put_one": (put_rows, lambda: (r(3, 6), perm(6)[:2], r(3, 2))),
    "index_put_accumulate": (lambda x, i, v: x.index_put((i,), v, accumulate=True),
                             lambda: (r(5, 3), ints(7, high=5), r(7, 3))),
    "index_put_int": (lambda x, i, j: x.index_put((i, j), torch.tensor(7)),
                      lambda: (ints(3, 4, high=9), perm(3)[:2], perm(4)[:2])),
    # writes through views (slice_scatter, select_scatter, copy)
    "shift_tokens_right": (shift_right, lambda: (ints(2, 6, high=50),)),
    "write_through_views": (write_through_views, lambda: (r(3, 4), r(2, 3))),
    "slice_scatter_step": (lambda x, y: torch.slice_scatter(x, y, dim=1, start=1, step=2),
                           lambda: (r(2, 6), r(2, 3))),
    "select_scatter": (lambda x, y: torch.select_scatter(x, y, 0, -1),
                       lambda: (r(3, 4), r(4))),
    # scatter and gather
    "scatter": (lambda x, i, s: x.scatter(1, i, s),
                lambda: (r(3, 6), perm(6, 3)[:, :4], r(3, 5))),
    "scatter_value": (lambda x, i: x.scatter(0, i, 2.5), lambda: (r(5, 2), perm(5, 2).T[:3])),
    "scatter_add": (lambda x, i, s: x.scatter_add(1, i, s),
                    lambda: (r(2, 4, 3), ints(2, 6, 3, high=4), r(2, 6, 3))),
    "scatter_add_int": (lambda x, i, s: torch.scatter_add(x, 0, i, s),
                        lambda: (ints(4, 3), ints(6, 2, high=4), ints(6, 3))),
    "scatter_reduce_sum_prod": (lambda x, i, s: (x.scatter_reduce(1, i, s, "sum"),
                                                 x.scatter_reduce(1, i, s, "prod",
                                                                  include_self=False)),
                                lambda: (r(2, 5), ints(2, 7, high=5), r(2, 7))),
    "scatter_reduce_mean": (lambda x, i, s: (x.scatter_reduce(1, i, s, "mean"),
                                             x.scatter_reduce(1, i, s, "mean",
                                                              include_self=False)),
                            lambda: (r(2, 5), ints(2, 7, high=5), r(2, 7))),
    "scatter_reduce_amax_amin": (lambda x, i, s: (x.scatter_reduce(0, i, s, "amax"),
                                                  x.scatter_reduce(0, i, s, "amin",
                                                                   include_self=False)),
                                 lambda: (r(4, 3), ints(6, 3, high=4), r(6, 3))),
    "index_add": (lambda x, i, s: x.index_add(1, i, s, alpha=0.5),
                  lambda: (r(2, 5, 3), ints(4, high=5), r(2, 4, 3))),
    "index_copy": (lambda x, i, s: x.index_copy(0, i, s),
                   lambda: (r(5, 3), perm(5)[:3], r(3, 3))),
    "index_fill": (lambda x, i: x.index_fill(1, i, -2.0), lambda: (r(3, 5), ints(2, high=5))),
    "gather_negative_dim": (lambda x, i: torch.gather(x, -1, i),
                            lambda: (r(3, 4), ints(3, 6, high=4))),
    "index_select_repeated": (lambda x, i: torch.index_select(x, 0, i),
                              lambda: (r(4, 3), torch.tensor([3, 0, 3]))),
    # integer scans
    "cumsum_int64": (lambda x: torch.cumsum(x, 1), lambda: (ints(2, 7, 3, high=9),)),
    "cumsum_bool_to_int64": (lambda m: m.cumsum(-1) - 1, lambda: (ints(2, 6, high=2).bool(),)),
    "cumsum_int32_dtype": (lambda x: torch.cumsum(x, 0, dtype=torch.int32),
                           lambda: (ints(5, 2, high=9),)),
    "cumprod": (lambda x: torch.cumprod(x, 1), lambda: (torch.rand(2, 6) + 0.5,)),
    "cumprod_int": (lambda x: torch.cumprod(x, 0), lambda: (ints(5, 3, low=-2, high=3),)),
    "position_ids_from_mask": (  # RoBERTa's create_position_ids_from_input_ids
        lambda ids: (torch.cumsum(ids.ne(1).int(), dim=1).type_as(ids) * ids.ne(1).int())
        .long() + 1,
        lambda: (torch.tensor([[5, 6, 7, 1, 1], [8, 9, 3, 4, 2]]),)),
    # sorting
    "sort": (lambda x: torch.sort(x, dim=1), lambda: (r(3, 6, 2),)),
    "sort_descending": (lambda x: torch.sort(x, descending=True), lambda: (r(2, 7),)),
    "sort_stable_int": (lambda x: torch.sort(x, stable=True, dim=0),
                        lambda: (ints(8, 3, high=4),)),
    "argsort": (lambda x: torch.argsort(x, dim=-1, descending=True), lambda: (r(4, 5),)),
    "topk": (lambda x: torch.topk(x, 3), lambda: (r(2, 8),)),
    "topk_smallest_dim0": (lambda x: torch.topk(x, 2, dim=0, largest=False),
                           lambda: (r(5, 3),)),
    "sort_nan": (lambda x: torch.sort(torch.where(x > 1.0, torch.nan, x), dim=-1),
                 lambda: (r(3, 6),)),
    "msort_kthvalue_free": (lambda x: torch.sort(x, 0)[0][1] + 1, lambda: (r(4, 3),)),
    # pooling windows torch sizes differently from kiln
    "avg_pool_window_larger_than_input": (lambda x: F.avg_pool2d(x, 1280, ceil_mode=True),
                                          lambda: (r(1, 3, 7, 7),)),
    "max_pool_window_larger_than_input": (lambda x: F.max_pool2d(x, 9, ceil_mode=True),
                                          lambda: (r(1, 3, 7, 5),)),
    "avg_pool_ceil_last_window_dropped": (lambda x: F.avg_pool2d(x, 2, 2, 1, ceil_mode=True),
                                          lambda: (r(1, 2, 5, 5),)),
    "avg_pool_ceil_no_pad_count": (
        lambda x: F.avg_pool2d(x, 3, 2, 1, ceil_mode=True, count_include_pad=False),
        lambda: (r(1, 2, 6, 6),)),
    "avg_pool_ceil_rectangular": (lambda x: F.avg_pool2d(x, (2, 3), 2, 1, ceil_mode=True),
                                  lambda: (r(1, 2, 5, 6),)),
    "max_pool_ceil_padding_unbatched": (lambda x: F.max_pool2d(x, 2, 2, 1, ceil_mode=True),
                                        lambda: (r(2, 5, 4),)),
    "max_pool_ceil_dilation": (lambda x: F.max_pool2d(x, 3, 2, 1, dilation=2, ceil_mode=True),
                               lambda: (r(1, 2, 9, 8),)),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_operator(name: str) -> None:
    fn, make = OPS[name]
    torch.manual_seed(sum(map(ord, name)))
    check(Fn(fn), *make())


def test_a_boolean_mask_index_counts_its_result_when_it_runs() -> None:
    mod, params = from_torch(Fn(lambda x: x[x > 0] * 2), (r(3, 4),))
    exe = kiln.build(mod, params=params)
    for seed in (1, 2):
        x = torch.randn(3, 4, generator=torch.Generator().manual_seed(seed))
        np.testing.assert_allclose(exe(x.numpy()), (x[x > 0] * 2).numpy(), rtol=1e-6)


def test_a_boolean_mask_of_a_middle_axis() -> None:
    # more in tests/frontend/test_torch_ranks_and_masks.py
    mod, params = from_torch(Fn(lambda x: x[:, x[0] > 0]), (r(3, 4),))
    exe = kiln.build(mod, params=params)
    for _ in range(3):
        x = r(3, 4)
        np.testing.assert_array_equal(exe(x.numpy()), x[:, x[0] > 0].numpy())


class Branches(nn.Module):
    """torch.cond with a weight in one branch and two results."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        a, b = torch.cond(x.sum() > 0, lambda x, y: (self.linear(x) * 2 + y, x - 1),
                          lambda x, y: (x.cos() - y, torch.cumsum(x, 1)), (x, y))
        return a + b


@pytest.mark.parametrize("sign", [1, -1], ids=["true_branch", "false_branch"])
def test_torch_cond(sign: int) -> None:
    torch.manual_seed(7)
    mod, _ = check(Branches(), r(2, 3).abs() * sign, r(2, 3))
    assert "if (" in str(mod)
