"""Hugging Face models through `from_torch`, against the models themselves.

Each model is built from a small configuration with random weights (nothing is downloaded:
``HF_HUB_OFFLINE=1``), run by PyTorch in eval mode (the oracle), imported, and run by the
reference interpreter and compiled (`check` of tests/frontend/test_torch.py, rtol 1e-4).
Text models run with and without an attention mask whose second row is padded: the mask is
where they index with several index tensors (``aten.index.Tensor``); RoBERTa makes its
position ids with an integer ``cumsum``; BART shifts its decoder inputs through slice writes;
EfficientNet pools with a window larger than its last feature map.

The default run uses hidden sizes of 32, 2 layers, 8 tokens or 32×32 images; the larger
forms (64 wide, 16 tokens, batch 2 everywhere) run with ``-m slow``.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
from torch import nn  # noqa: E402

from tests.frontend.test_torch import check  # noqa: E402

T = transformers
VOCAB = 100


class Text(nn.Module):
    """A text model's last hidden state for token ids and an optional attention mask."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        if mask is None:
            return self.model(input_ids=ids).last_hidden_state
        return self.model(input_ids=ids, attention_mask=mask).last_hidden_state


class Seq2Seq(nn.Module):
    """An encoder-decoder's decoder output, its decoder fed the first tokens of the input."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, ids: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, decoder_input_ids=ids[:, :5],
                         use_cache=False)
        return out.last_hidden_state


def _draw_batch_norms(model: nn.Module) -> None:
    """Batch norms with statistics and scales drawn near 1: Hugging Face initializes their
    scales with std 0.02, and through EfficientNet's blocks the output is then exactly 0."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.weight.uniform_(0.5, 1.5)
                m.bias.uniform_(-0.2, 0.2)
                m.running_mean.uniform_(-0.2, 0.2)
                m.running_var.uniform_(0.5, 1.5)


class Pixels(nn.Module):
    """A vision (or audio) model's output ``key`` for one input tensor."""

    def __init__(self, model: nn.Module, key: str = "last_hidden_state") -> None:
        super().__init__()
        self.model = model
        self.key = key
        _draw_batch_norms(model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return getattr(self.model(x), self.key)


def _ids(batch: int, seq: int) -> torch.Tensor:
    return torch.randint(3, VOCAB, (batch, seq))


def _mask(batch: int, seq: int) -> torch.Tensor:
    mask = torch.ones(batch, seq, dtype=torch.long)
    mask[-1, seq // 2 + 1:] = 0  # the last row padded at the end
    return mask


# name -> (model for a width, a depth of 2), with a text model's config sizes as keywords
TEXT: dict[str, Callable[[int], nn.Module]] = {
    "bert": lambda w: Text(T.BertModel(T.BertConfig(
        vocab_size=VOCAB, hidden_size=w, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=2 * w, max_position_embeddings=32))),
    "roberta": lambda w: Text(T.RobertaModel(T.RobertaConfig(
        vocab_size=VOCAB, hidden_size=w, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=2 * w, max_position_embeddings=40, pad_token_id=1))),
    "distilbert": lambda w: Text(T.DistilBertModel(T.DistilBertConfig(
        vocab_size=VOCAB, dim=w, n_layers=2, n_heads=4, hidden_dim=2 * w,
        max_position_embeddings=32))),
    "gpt2": lambda w: Text(T.GPT2Model(T.GPT2Config(
        vocab_size=VOCAB, n_embd=w, n_layer=2, n_head=4, n_positions=32, bos_token_id=1,
        eos_token_id=2))),
    "llama": lambda w: Text(T.LlamaModel(T.LlamaConfig(
        vocab_size=VOCAB, hidden_size=w, intermediate_size=2 * w, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))),
    "mistral": lambda w: Text(T.MistralModel(T.MistralConfig(
        vocab_size=VOCAB, hidden_size=w, intermediate_size=2 * w, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
        sliding_window=4))),
    "qwen2": lambda w: Text(T.Qwen2Model(T.Qwen2Config(
        vocab_size=VOCAB, hidden_size=w, intermediate_size=2 * w, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))),
    "t5_encoder": lambda w: Text(T.T5EncoderModel(T.T5Config(
        vocab_size=VOCAB, d_model=w, d_kv=w // 4, d_ff=2 * w, num_layers=2, num_heads=4))),
    "t5": lambda w: Seq2Seq(T.T5Model(T.T5Config(
        vocab_size=VOCAB, d_model=w, d_kv=w // 4, d_ff=2 * w, num_layers=2, num_heads=4,
        decoder_start_token_id=0))),
    "bart": lambda w: Seq2Seq(T.BartModel(T.BartConfig(
        vocab_size=VOCAB, d_model=w, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * w,
        decoder_ffn_dim=2 * w, max_position_embeddings=32))),
}

# name -> (model for a width, its input for a batch and a size)
VISION: dict[str, tuple[Callable[[int], nn.Module], Callable[[int, int], torch.Tensor]]] = {
    "vit": (lambda w: Pixels(T.ViTModel(T.ViTConfig(
        image_size=16, patch_size=4, hidden_size=w, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=2 * w))),
        lambda b, s: torch.randn(b, 3, 16, 16)),
    "whisper_encoder": (lambda w: Pixels(T.WhisperModel(T.WhisperConfig(
        vocab_size=VOCAB, num_mel_bins=16, d_model=w, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=2 * w,
        decoder_ffn_dim=2 * w, max_source_positions=16, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, decoder_start_token_id=1)).get_encoder()),
        lambda b, s: torch.randn(b, 16, 32)),  # 32 frames: max_source_positions 16 after conv
    "efficientnet": (lambda w: Pixels(T.EfficientNetModel(T.EfficientNetConfig(
        image_size=32, width_coefficient=w / 128, depth_coefficient=0.25,
        hidden_dim=round(1280 * w / 128 / 8) * 8)), "pooler_output"),
        lambda b, s: torch.randn(b, 3, s, s)),
    "convnext": (lambda w: Pixels(T.ConvNextModel(T.ConvNextConfig(
        hidden_sizes=[w // 4, w // 2, 3 * w // 4, w], depths=[1, 1, 1, 1])), "pooler_output"),
        lambda b, s: torch.randn(b, 3, s, s)),
    "swin": (lambda w: Pixels(T.SwinModel(T.SwinConfig(
        image_size=32, patch_size=4, embed_dim=w // 2, depths=[1, 1], num_heads=[2, 2],
        window_size=4))),
        lambda b, s: torch.randn(b, 3, 32, 32)),
    "resnet": (lambda w: Pixels(T.ResNetModel(T.ResNetConfig(
        embedding_size=w // 2, hidden_sizes=[w // 2, w], depths=[1, 1])), "pooler_output"),
        lambda b, s: torch.randn(b, 3, s, s)),
}


@pytest.fixture
def full_size(request: pytest.FixtureRequest) -> None:
    """Skips a larger form unless the run asked for ``-m slow``."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("long form: run with -m slow")


def _check_lively(model: nn.Module, *inputs: torch.Tensor) -> None:
    """`check`, on a model whose output is not all (nearly) zero: a comparison with zeros
    would pass whatever kiln computed."""
    model.eval()
    with torch.no_grad():
        assert float(model(*inputs).abs().max()) > 1e-2
    check(model, *inputs)


def _text(name: str, masked: bool, width: int, batch: int, seq: int) -> None:
    torch.manual_seed(sum(map(ord, name)))
    model = TEXT[name](width)
    inputs: list[Any] = [_ids(batch, seq)]
    if masked:
        inputs.append(_mask(batch, seq))
    _check_lively(model, *inputs)


@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
@pytest.mark.parametrize("name", sorted(TEXT))
def test_text_model(name: str, masked: bool) -> None:
    _text(name, masked, width=32, batch=2, seq=8)


@pytest.mark.parametrize("name", sorted(VISION))
def test_vision_and_audio_model(name: str) -> None:
    torch.manual_seed(sum(map(ord, name)))
    build, make = VISION[name]
    _check_lively(build(32), make(1, 32))


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(TEXT))
def test_text_model_larger(name: str, full_size: None) -> None:
    _text(name, True, width=64, batch=2, seq=16)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(VISION))
def test_vision_and_audio_model_larger(name: str, full_size: None) -> None:
    torch.manual_seed(sum(map(ord, name)))
    build, make = VISION[name]
    _check_lively(build(64), make(2, 64))
