"""torch.export with dynamic_shapes: symbolic sizes become expressions computed when the
program runs (kiln/frontend/torch/sizes.py), so one executable runs every batch size and
sequence length; checked against PyTorch at several shapes."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.export import Dim

import kiln
from kiln.frontend import from_torch

from .test_onnx_dynamic import Encoder, ids_and_mask


def run_at_shapes(module, mod, params, make_inputs, shapes=((1, 5), (2, 8), (3, 13))):
    exe = kiln.build(mod, params=params)
    for b, s in shapes:
        args = make_inputs(b, s)
        with torch.no_grad():
            want = module(*args).numpy()
        got = exe(*(a.numpy() for a in args))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bert-like", "gpt-like"])
def test_a_transformer_exported_with_dynamic_batch_and_sequence(causal):
    torch.manual_seed(0)
    module = Encoder(causal).eval()
    batch, seq = Dim("batch", min=1, max=32), Dim("seq", min=2, max=60)
    ids, mask = ids_and_mask(2, 8)
    if causal:
        mod, params = from_torch(module, (ids,), dynamic_shapes=({0: batch, 1: seq},))
        run_at_shapes(module, mod, params, lambda b, s: ids_and_mask(b, s)[:1])
    else:
        mod, params = from_torch(module, (ids, mask),
                                 dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
        run_at_shapes(module, mod, params, ids_and_mask)
    text = kiln.astext(mod)
    assert "Tensor[(batch, seq), int64]" in text  # the inputs keep their Dims' names


class SizesAsValues(torch.nn.Module):
    """Sizes used as numbers: a new tensor of the input's shape, an arange of its length, a
    view no copy code can express, a slice at a computed position."""

    def forward(self, x):
        n, t = x.shape
        ramp = torch.arange(t, dtype=torch.float32)
        filled = torch.full((n, t), 0.5) + ramp
        halves = (x * filled).view(n * 2, t // 2)
        return halves[:, t // 4:] + 1.0


def test_sizes_used_as_values():
    module = SizesAsValues()
    n, t = Dim("n", min=1, max=16), Dim("t2", min=1, max=16)
    x = torch.randn(3, 8)
    mod, params = from_torch(module, (x,), dynamic_shapes=({0: n, 1: 2 * t},))
    exe = kiln.build(mod, params=params)
    for shape in ((1, 4), (3, 8), (5, 12)):
        x = torch.randn(*shape)
        with torch.no_grad():
            want = module(x).numpy()
        got = exe(x.numpy())
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-6)


@pytest.mark.parametrize("name", ["bert", pytest.param("gpt2", marks=pytest.mark.slow),
                                  pytest.param("llama", marks=pytest.mark.slow)])
def test_hugging_face_models_exported_with_dynamic_shapes(name):
    from .test_onnx_dynamic import LastHidden, _hf

    module = LastHidden(_hf(name)).eval()
    batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=2, max=32)
    mod, params = from_torch(module, ids_and_mask(2, 8),
                             dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    run_at_shapes(module, mod, params, ids_and_mask)


class DataDependent(torch.nn.Module):
    """Results whose size is a count of the data: nonzero, masked_select, a boolean mask."""

    def forward(self, x, m):
        return torch.nonzero(x > 0.5), torch.masked_select(x, m), (x[m] * 2).sum()


def test_shapes_counted_from_the_data():
    x = torch.rand(3, 4)
    mod, params = from_torch(DataDependent(), (x, x < 0.3))
    exe = kiln.build(mod, params=params)
    counts = set()
    for seed in range(4):
        x = torch.rand(3, 4, generator=torch.Generator().manual_seed(seed))
        got = exe(x.numpy(), (x < 0.3).numpy())
        want = DataDependent()(x, x < 0.3)
        for g, w in zip(got, want, strict=True):
            assert g.shape == tuple(w.shape)
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-6)
        counts.add(got[0].shape[0])
    assert len(counts) > 1  # the sizes really came from the data


class Positions(torch.nn.Module):
    """RoBERTa's position ids: the padding mask counted along the sequence (an int cumsum),
    and a float cumprod along the batch."""

    def forward(self, ids, x):
        mask = ids.ne(1).int()
        return (torch.cumsum(mask, dim=1) * mask).long() + 1, torch.cumprod(x, dim=0)


def test_cumsum_and_cumprod_along_symbolic_axes():
    batch, seq = Dim("batch", min=1, max=16), Dim("seq", min=2, max=32)

    def inputs(b, s):
        g = torch.Generator().manual_seed(b * 100 + s)
        return torch.randint(0, 3, (b, s), generator=g), torch.rand(b, s, generator=g) + 0.5

    module = Positions()
    mod, params = from_torch(module, inputs(2, 8),
                             dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}))
    exe = kiln.build(mod, params=params)
    for b, s in ((1, 5), (2, 8), (3, 13)):
        args = inputs(b, s)
        for got, want in zip(exe(*(a.numpy() for a in args)), module(*args), strict=True):
            assert got.dtype == want.numpy().dtype
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


class Pools(torch.nn.Module):
    def forward(self, x):
        return (torch.nn.functional.max_pool2d(x, 3, 2, 1),
                torch.nn.functional.avg_pool2d(x, 3, ceil_mode=True))


def test_pooling_over_a_symbolic_batch():
    mod, params = from_torch(Pools(), (torch.randn(2, 2, 7, 7),),
                             dynamic_shapes=({0: Dim("batch")},))
    exe = kiln.build(mod, params=params)
    for b in (1, 3):
        x = torch.randn(b, 2, 7, 7)
        for got, want in zip(exe(x.numpy()), Pools()(x), strict=True):
            np.testing.assert_allclose(got, want.numpy(), rtol=1e-6)


# Hugging Face models of tests/frontend/test_torch_hf_models.py with a dynamic batch (and for
# text, sequence): name -> (inputs for a shape, dynamic axes of each input, shapes run)
_SEQ = ({0: Dim("batch", min=1, max=16), 1: Dim("seq", min=2, max=32)},)
HF_DYNAMIC = {
    "t5_encoder": ("text", _SEQ * 2, [(2, 8), (1, 5), (3, 13)]),
    "roberta": ("text", _SEQ * 2, [(2, 8), (1, 5), (3, 13)]),
    "distilbert": ("text", _SEQ * 2, [(2, 8), (1, 5), (3, 13)]),
    "vit": ("vision", ({0: Dim("batch", min=1, max=16)},), [(2,), (1,), (3,)]),
    "whisper_encoder": ("vision", ({0: Dim("batch", min=1, max=16)},), [(2,), (1,), (3,)]),
    "qwen2": ("text", _SEQ * 2, [(2, 8), (1, 5), (3, 13)]),
    # torch.export needs these sequences longer than Mistral's window and the decoder's
    # ids[:, :5] of tests/frontend/test_torch_hf_models.py
    **{name: ("text", ({0: Dim("batch", min=1, max=16), 1: Dim("seq", min=6, max=32)},) * 2,
              [(2, 8), (1, 6), (3, 13)]) for name in ("mistral", "bart", "t5")},
    **{name: ("vision", ({0: Dim("batch", min=1, max=16)},), [(2,), (1,), (3,)])
       for name in ("swin", "convnext", "efficientnet", "resnet")},
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(HF_DYNAMIC))
def test_more_hugging_face_models_with_dynamic_shapes(name):
    pytest.importorskip("transformers")
    from .test_torch_hf_models import TEXT, VISION, _ids, _mask

    kind, axes, shapes = HF_DYNAMIC[name]
    torch.manual_seed(sum(map(ord, name)))
    if kind == "text":
        module = TEXT[name](32).eval()

        def make(*shape):
            return [_ids(*shape), _mask(*shape)]
    else:
        module = VISION[name][0](32).eval()

        def make(*shape):
            return [VISION[name][1](shape[0], 32)]

    mod, params = from_torch(module, tuple(make(*shapes[0])), dynamic_shapes=axes)
    exe = kiln.build(mod, params=params)
    for shape in shapes:
        args = make(*shape)
        with torch.no_grad():
            want = module(*args).numpy()
        got = exe(*(a.numpy() for a in args))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
