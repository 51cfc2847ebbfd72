"""Hugging Face models exported to ONNX and brought in by `from_onnx`, against PyTorch.

The models and their inputs are those of tests/frontend/test_torch_hf_models.py: small
configurations, random weights, nothing downloaded (``HF_HUB_OFFLINE=1``). Each is run by
PyTorch in eval mode (the oracle), exported by the TorchScript exporter (``dynamo=False``,
opset 17, static shapes), imported with `kiln.frontend.onnx.from_onnx` and compiled with
`kiln.build`. A text model given an attention mask must keep it as a graph input: the
exporter drops inputs the output does not depend on. Llama without a mask is exported with
its eager attention (see `exportable`).

The default run uses hidden sizes of 32, 2 layers, 8 tokens or 32×32 images (ViT 16×16);
the larger forms (64 wide, 16 tokens, batch 2) run with ``-m slow``.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

os.environ["HF_HUB_OFFLINE"] = "1"
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")
from torch import nn  # noqa: E402

import kiln  # noqa: E402
from kiln.frontend.onnx import from_onnx  # noqa: E402
from tests.frontend.test_torch_hf_models import (  # noqa: E402
    TEXT,
    VISION,
    _ids,
    _mask,
    full_size,  # noqa: F401 (the fixture that skips the larger forms)
)

# (text model, with an attention mask) pairs: each text architecture with and without a mask
TEXT_CASES = [(name, masked) for name in ("bert", "gpt2", "llama", "t5_encoder", "t5")
              for masked in (False, True)]
VISION_CASES = ["convnext", "efficientnet", "vit", "whisper_encoder"]


def _check_onnx(model: nn.Module, inputs: list[torch.Tensor], names: list[str],
                path: Path) -> None:
    """kiln's compiled code for ``model`` exported to ONNX agrees with PyTorch at rtol 1e-4,
    on an output that is not all (nearly) zero."""
    model.eval()
    with torch.no_grad():
        want = model(*inputs).numpy()
    assert float(np.abs(want).max()) > 1e-2
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, opset_version=17,
                          input_names=names, output_names=["out"])
    assert [i.name for i in onnx.load(str(path)).graph.input] == names

    mod, params = from_onnx(path)
    got = np.asarray(kiln.build(mod, params=params)(*[x.numpy() for x in inputs]))
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))


def exportable(model: nn.Module, masked: bool) -> nn.Module:
    """``model``, its attention made exportable by the TorchScript exporter.

    Without a mask, transformers' SDPA attention has a grouped-query model (Llama's 2 key and
    value heads for 4 query heads) call ``scaled_dot_product_attention(enable_gqa=True)``,
    which that exporter refuses ("not implemented if enable_gqa is True"); its eager attention
    computes the same with the key and value heads repeated. PyTorch, the oracle, runs the
    model as exported."""
    inner = getattr(model, "model", None)
    if not masked and isinstance(inner, transformers.LlamaModel):
        inner.set_attn_implementation("eager")
    return model


def _text(name: str, masked: bool, width: int, batch: int, seq: int, path: Path) -> None:
    torch.manual_seed(sum(map(ord, name)))
    model = exportable(TEXT[name](width), masked)
    inputs, names = [_ids(batch, seq)], ["input_ids"]
    if masked:
        inputs.append(_mask(batch, seq))
        names.append("attention_mask")
    _check_onnx(model, inputs, names, path)


def _vision(name: str, width: int, batch: int, size: int, path: Path) -> None:
    torch.manual_seed(sum(map(ord, name)))
    build, make = VISION[name]
    _check_onnx(build(width), [make(batch, size)], ["x"], path)


@pytest.mark.parametrize(("name", "masked"), TEXT_CASES,
                         ids=[f"{n}-{'mask' if m else 'no_mask'}" for n, m in TEXT_CASES])
def test_text_model(name: str, masked: bool, tmp_path: Path) -> None:
    _text(name, masked, width=32, batch=2, seq=8, path=tmp_path / f"{name}.onnx")


@pytest.mark.parametrize("name", VISION_CASES)
def test_vision_and_audio_model(name: str, tmp_path: Path) -> None:
    _vision(name, width=32, batch=1, size=32, path=tmp_path / f"{name}.onnx")


@pytest.mark.slow
@pytest.mark.usefixtures("full_size")
@pytest.mark.parametrize(("name", "masked"), TEXT_CASES,
                         ids=[f"{n}-{'mask' if m else 'no_mask'}" for n, m in TEXT_CASES])
def test_text_model_larger(name: str, masked: bool, tmp_path: Path) -> None:
    _text(name, masked, width=64, batch=2, seq=16, path=tmp_path / f"{name}.onnx")


@pytest.mark.slow
@pytest.mark.usefixtures("full_size")
@pytest.mark.parametrize("name", VISION_CASES)
def test_vision_and_audio_model_larger(name: str, tmp_path: Path) -> None:
    _vision(name, width=64, batch=2, size=64, path=tmp_path / f"{name}.onnx")


# --- dynamic axes: one executable for several shapes ------------------------------------------

# name -> (inputs for (batch, seq) or (batch,), input names, the dynamic axes of each input,
# the shapes run); vision and audio models take a dynamic batch
DYNAMIC = {
    "t5_encoder": (lambda b, s: [_ids(b, s), _mask(b, s)], ["input_ids", "attention_mask"],
                   {0: "batch", 1: "seq"}, [(2, 8), (1, 5), (3, 13)]),
    "roberta": (lambda b, s: [_ids(b, s), _mask(b, s)], ["input_ids", "attention_mask"],
                {0: "batch", 1: "seq"}, [(2, 8), (1, 5), (3, 13)]),  # CumSum of the mask
    "distilbert": (lambda b, s: [_ids(b, s), _mask(b, s)], ["input_ids", "attention_mask"],
                   {0: "batch", 1: "seq"}, [(2, 8), (1, 5), (3, 13)]),
    "bart": (lambda b, s: [_ids(b, s), _mask(b, s)], ["input_ids", "attention_mask"],
             {0: "batch", 1: "seq"}, [(2, 8), (1, 6), (3, 13)]),  # decoder fed ids[:, :5]
    **{name: (lambda b, s: [_ids(b, s), _mask(b, s)], ["input_ids", "attention_mask"],
              {0: "batch", 1: "seq"}, [(2, 8), (1, 6), (3, 13)])
       for name in ("mistral", "qwen2", "t5")},
    "vit": (lambda b: [VISION["vit"][1](b, 16)], ["x"], {0: "batch"}, [(2,), (1,), (3,)]),
    **{name: (lambda b, name=name: [VISION[name][1](b, 32)], ["x"], {0: "batch"},
              [(2,), (1,), (3,)]) for name in ("swin", "convnext", "efficientnet", "resnet")},
    "whisper_encoder": (lambda b: [VISION["whisper_encoder"][1](b, 16)], ["x"], {0: "batch"},
                        [(2,), (1,), (3,)]),
}


def _model(name: str) -> nn.Module:
    torch.manual_seed(sum(map(ord, name)))
    return (TEXT[name](32) if name in TEXT else VISION[name][0](32)).eval()


@pytest.mark.parametrize("name", ["vit", *(pytest.param(n, marks=pytest.mark.slow) for n in
                                           [n for n in DYNAMIC if n != "vit"])])
def test_dynamic_axes(name: str, tmp_path: Path) -> None:
    """Exported with dynamic axes, built once, run at several shapes against PyTorch."""
    model = _model(name)
    make, names, axes, shapes = DYNAMIC[name]
    path = str(tmp_path / f"{name}.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(make(*shapes[0])), path, dynamo=False,
                          opset_version=17, input_names=names, output_names=["out"],
                          dynamic_axes={n: axes for n in [*names, "out"]})
    mod, params = from_onnx(path)
    exe = kiln.build(mod, params=params)
    assert exe.executor.name == "vm"  # shapes known when it runs: one executable
    for shape in shapes:
        inputs = make(*shape)
        with torch.no_grad():
            want = model(*inputs).numpy()
        got = np.asarray(exe(*[x.numpy() for x in inputs]))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max()))
