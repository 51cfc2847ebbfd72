"""Hugging Face architectures through both frontends: how close kiln comes to PyTorch.

Each architecture of issue 12's list — BERT, GPT-2, Llama, T5 (encoder and encoder-decoder),
ViT, Whisper's encoder, EfficientNet, ConvNeXt — is built from a small configuration with
random weights (transformers' config objects; nothing is downloaded, ``HF_HUB_OFFLINE=1``):
the models and inputs of tests/frontend/test_torch_hf_models.py. Each goes into kiln twice:

- ``from_torch``: ``torch.export`` and kiln's importer;
- ``onnx``: ``torch.onnx.export`` (the TorchScript exporter, opset 17, static shapes) and
  ``from_onnx``;

is built with ``kiln.build`` and run on the inputs PyTorch ran (eval mode, the oracle). Text
models run with and without an attention mask whose last row is padded. The table gives the
error ``max |kiln - torch| / max |torch|`` over the output, and "pass" where
``np.allclose(kiln, torch, rtol=1e-4, atol=1e-4 * max |torch|)``, the tests' criterion, holds;
also the seconds from export to the first result (export, import, build, one call; the
disk cache as ``KILN_CACHE`` says). The script exits with 1 if any case fails.

    .venv/bin/python benchmarks/hf_models.py [--width 32] [--batch 2] [--seq 8] [--only bert,vit]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
os.environ["HF_HUB_OFFLINE"] = "1"

# the text architectures; "t5" is the encoder-decoder, its decoder fed ids[:, :5]
TEXT_NAMES = ("bert", "gpt2", "llama", "t5_encoder", "t5")
VISION_NAMES = ("vit", "whisper_encoder", "efficientnet", "convnext")


def _relative_error(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.abs(got.astype(np.float64) - want).max() / np.abs(want).max())


def _through_torch(model: Any, inputs: list[Any], tmp: Path) -> np.ndarray:
    import kiln
    from kiln.frontend import from_torch

    mod, params = from_torch(model, tuple(inputs))
    return np.asarray(kiln.build(mod, params=params)(*[x.numpy() for x in inputs]))


def _through_onnx(model: Any, inputs: list[Any], tmp: Path) -> np.ndarray:
    import torch

    import kiln
    from kiln.frontend.onnx import from_onnx

    names = ["input_ids", "attention_mask"][:len(inputs)] if inputs[0].dtype == torch.long \
        else ["x"]
    path = tmp / "model.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, tuple(inputs), str(path), dynamo=False, opset_version=17,
                          input_names=names, output_names=["out"])
    mod, params = from_onnx(path)
    return np.asarray(kiln.build(mod, params=params)(*[x.numpy() for x in inputs]))


FRONTENDS: dict[str, Callable[[Any, list[Any], Path], np.ndarray]] = {
    "from_torch": _through_torch,
    "onnx": _through_onnx,
}


def _cases(names: list[str], width: int, batch: int, seq: int):
    """(architecture, mask column, model for a frontend, inputs) for every case asked for."""
    import torch

    from tests.frontend.test_onnx_hf_models import exportable
    from tests.frontend.test_torch_hf_models import TEXT, VISION, _ids, _mask

    for name in names:
        if name in TEXT:
            for masked in (False, True):
                def model(frontend: str, name: str = name, masked: bool = masked) -> Any:
                    torch.manual_seed(sum(map(ord, name)))
                    m = TEXT[name](width)
                    return exportable(m, masked) if frontend == "onnx" else m
                torch.manual_seed(1)
                inputs = [_ids(batch, seq)] + ([_mask(batch, seq)] if masked else [])
                yield name, "mask" if masked else "no mask", model, inputs
        else:
            build, make = VISION[name]

            def vision(frontend: str, name: str = name, build: Any = build) -> Any:
                torch.manual_seed(sum(map(ord, name)))
                return build(width)
            torch.manual_seed(1)
            size = 16 if name == "vit" else 32  # ViT's config is for 16x16 images
            yield name, "-", vision, [make(batch, size)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=32, help="hidden size (a multiple of 8)")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=8, help="tokens per text input (6 or more)")
    parser.add_argument("--only", default="", help="comma-separated architectures")
    args = parser.parse_args()
    names = [n for n in args.only.split(",") if n] or [*TEXT_NAMES, *VISION_NAMES]
    unknown = set(names) - {*TEXT_NAMES, *VISION_NAMES}
    if unknown:
        parser.error(f"unknown architectures {sorted(unknown)}; known: "
                     f"{', '.join([*TEXT_NAMES, *VISION_NAMES])}")

    import torch
    import transformers

    from kiln.target import Target

    print(f"machine: {Target.host().describe()}; torch {torch.__version__}, "
          f"transformers {transformers.__version__}")
    print(f"width {args.width}, 2 layers, batch {args.batch}, {args.seq} tokens; "
          "error = max|kiln - torch| / max|torch|; pass = rtol 1e-4\n")
    print(f"{'architecture':<16} {'frontend':<10} {'mask':<8} {'max rel err':>11} "
          f"{'result':<6} {'to result s':>11}")
    failures = 0
    for name, mask, model_for, inputs in _cases(names, args.width, args.batch, args.seq):
        for frontend, run in FRONTENDS.items():
            model = model_for(frontend).eval()
            with torch.no_grad():
                want = model(*inputs).numpy()
            t = time.perf_counter()
            try:
                with tempfile.TemporaryDirectory() as tmp:
                    got = run(model, inputs, Path(tmp))
            except Exception as e:  # a failure is a row of the table, not the end of it
                failures += 1
                print(f"{name:<16} {frontend:<10} {mask:<8} {'-':>11} {'FAIL':<6} "
                      f"{type(e).__name__}: {str(e).splitlines()[0][:100]}")
                continue
            seconds = time.perf_counter() - t
            ok = got.shape == want.shape and bool(np.allclose(
                got, want, rtol=1e-4, atol=1e-4 * float(np.abs(want).max())))
            failures += not ok
            error = _relative_error(got, want) if got.shape == want.shape else float("nan")
            print(f"{name:<16} {frontend:<10} {mask:<8} {error:>11.2e} "
                  f"{'pass' if ok else 'FAIL':<6} {seconds:>11.1f}", flush=True)
    print(f"\n{failures} failure(s)")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
