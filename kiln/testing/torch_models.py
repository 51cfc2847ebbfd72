"""PyTorch twins of the builders in kiln/testing/models.py, holding the same weights.

Each ``torch_<model>(params, ...)`` builds the ``torch.nn.Module`` that computes what the
kiln builder of the same name computes, loads the kiln ``params`` (name → array) into it and
returns it in eval mode. They are the independent oracle of tests/models and the PyTorch side
of benchmarks/models.py. There is no torchvision here, so ResNet-18 and MobileNetV2 are written
out. torch is a test-only dependency: it is imported inside the functions, never at import
time of this module.
"""

from __future__ import annotations

import functools
from types import SimpleNamespace
from typing import Any

import numpy as np

from kiln.errors import Error
from kiln.testing.models import _MOBILENET_V2_BLOCKS, _make_divisible


def _copy(param: Any, value: np.ndarray) -> None:
    import torch

    if tuple(param.shape) != value.shape:
        raise Error(f"a weight of shape {value.shape} does not fit the torch parameter of "
                    f"shape {tuple(param.shape)}")
    with torch.no_grad():
        param.copy_(torch.from_numpy(np.ascontiguousarray(value, dtype=np.float32)))


def _encoder_layers(params: dict[str, np.ndarray], heads: int, norm_first: bool,
                    activation: str) -> Any:
    """``layer0_...``, ``layer1_...``, ... of ``params`` as an ``nn.ModuleList`` of
    `_encoder_layer`s, as many as there are."""
    from torch import nn

    layers, i = [], 0
    while f"layer{i}_in_proj_weight" in params:
        layers.append(_encoder_layer(params, f"layer{i}", heads, norm_first, activation))
        i += 1
    return nn.ModuleList(layers)


def _encoder_layer(params: dict[str, np.ndarray], p: str, heads: int, norm_first: bool,
                   activation: str) -> Any:
    """An ``nn.TransformerEncoderLayer`` (batch first, no dropout) holding the weights
    ``{p}_in_proj_weight``, ... that kiln/testing/models.py's encoder layers name."""
    from torch import nn

    ff, d_model = params[f"{p}_linear1_weight"].shape
    layer = nn.TransformerEncoderLayer(d_model, heads, dim_feedforward=ff, dropout=0.0,
                                       activation=activation, batch_first=True,
                                       norm_first=norm_first)
    for kiln_name, param in (
        ("in_proj_weight", layer.self_attn.in_proj_weight),
        ("in_proj_bias", layer.self_attn.in_proj_bias),
        ("out_proj_weight", layer.self_attn.out_proj.weight),
        ("out_proj_bias", layer.self_attn.out_proj.bias),
        ("linear1_weight", layer.linear1.weight),
        ("linear1_bias", layer.linear1.bias),
        ("linear2_weight", layer.linear2.weight),
        ("linear2_bias", layer.linear2.bias),
        ("norm1_weight", layer.norm1.weight),
        ("norm1_bias", layer.norm1.bias),
        ("norm2_weight", layer.norm2.weight),
        ("norm2_bias", layer.norm2.bias),
    ):
        _copy(param, params[f"{p}_{kiln_name}"])
    return layer


def _layer_norm(params: dict[str, np.ndarray], name: str) -> Any:
    """``nn.LayerNorm`` (eps 1e-5) holding ``{name}_weight`` and ``{name}_bias``."""
    from torch import nn

    norm = nn.LayerNorm(params[f"{name}_weight"].shape[0], eps=1e-5)
    _copy(norm.weight, params[f"{name}_weight"])
    _copy(norm.bias, params[f"{name}_bias"])
    return norm


@functools.cache
def _classes() -> SimpleNamespace:
    """The nn.Module classes, defined once torch is imported."""
    import torch
    from torch import nn

    class ConvBN(nn.Module):
        """Convolution without bias, then BatchNorm2d (eps 1e-5), then an optional activation."""

        def __init__(self, params: dict, name: str, c_in: int, c_out: int, k: int,
                     stride: int, groups: int = 1, act: str | None = "relu") -> None:
            super().__init__()
            self.conv = nn.Conv2d(c_in, c_out, k, stride=stride, padding=k // 2, groups=groups,
                                  bias=False)
            self.bn = nn.BatchNorm2d(c_out, eps=1e-5)
            self.act = {"relu": nn.ReLU(), "relu6": nn.ReLU6(), None: nn.Identity()}[act]
            _copy(self.conv.weight, params[f"{name}_weight"])
            _copy(self.bn.weight, params[f"{name}_bn_gamma"])
            _copy(self.bn.bias, params[f"{name}_bn_beta"])
            _copy(self.bn.running_mean, params[f"{name}_bn_mean"])
            _copy(self.bn.running_var, params[f"{name}_bn_var"])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.act(self.bn(self.conv(x)))

    class BasicBlock(nn.Module):
        def __init__(self, params: dict, name: str, c_in: int, c_out: int, stride: int) -> None:
            super().__init__()
            self.conv1 = ConvBN(params, f"{name}_conv1", c_in, c_out, 3, stride)
            self.conv2 = ConvBN(params, f"{name}_conv2", c_out, c_out, 3, 1, act=None)
            self.down = None
            if stride != 1 or c_in != c_out:
                self.down = ConvBN(params, f"{name}_down", c_in, c_out, 1, stride, act=None)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            shortcut = x if self.down is None else self.down(x)
            return torch.relu(self.conv2(self.conv1(x)) + shortcut)

    class ResNet18(nn.Module):
        def __init__(self, params: dict) -> None:
            super().__init__()
            self.conv1 = ConvBN(params, "conv1", 3, 64, 7, 2)
            self.pool = nn.MaxPool2d(3, 2, 1)
            blocks, c_in = [], 64
            for stage, c_out in enumerate((64, 128, 256, 512)):
                for block in range(2):
                    stride = 2 if stage > 0 and block == 0 else 1
                    blocks.append(BasicBlock(params, f"layer{stage + 1}_{block}", c_in, c_out,
                                             stride))
                    c_in = c_out
            self.blocks = nn.Sequential(*blocks)
            classes = params["fc_weight"].shape[0]
            self.fc = nn.Linear(512, classes)
            _copy(self.fc.weight, params["fc_weight"])
            _copy(self.fc.bias, params["fc_bias"])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.blocks(self.pool(self.conv1(x)))
            h = torch.flatten(nn.functional.adaptive_avg_pool2d(h, 1), 1)
            return torch.softmax(self.fc(h), dim=-1)

    class InvertedResidual(nn.Module):
        def __init__(self, params: dict, j: int, c_in: int, c_out: int, t: int,
                     stride: int) -> None:
            super().__init__()
            hidden = c_in * t
            layers = []
            if t != 1:
                layers.append(ConvBN(params, f"block{j}_expand", c_in, hidden, 1, 1, act="relu6"))
            layers.append(ConvBN(params, f"block{j}_dw", hidden, hidden, 3, stride,
                                 groups=hidden, act="relu6"))
            layers.append(ConvBN(params, f"block{j}_project", hidden, c_out, 1, 1, act=None))
            self.body = nn.Sequential(*layers)
            self.residual = stride == 1 and c_in == c_out

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + self.body(x) if self.residual else self.body(x)

    class MobileNetV2(nn.Module):
        def __init__(self, params: dict, width: float) -> None:
            super().__init__()
            c_in = _make_divisible(32 * width)
            layers: list[nn.Module] = [ConvBN(params, "stem", 3, c_in, 3, 2, act="relu6")]
            j = 0
            for t, c, n, s in _MOBILENET_V2_BLOCKS:
                c_out = _make_divisible(c * width)
                for r in range(n):
                    layers.append(InvertedResidual(params, j, c_in, c_out, t, s if r == 0 else 1))
                    c_in = c_out
                    j += 1
            c_last = _make_divisible(1280 * max(1.0, width))
            layers.append(ConvBN(params, "head", c_in, c_last, 1, 1, act="relu6"))
            self.features = nn.Sequential(*layers)
            self.fc = nn.Linear(c_last, params["fc_weight"].shape[0])
            _copy(self.fc.weight, params["fc_weight"])
            _copy(self.fc.bias, params["fc_bias"])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = nn.functional.adaptive_avg_pool2d(self.features(x), 1)
            return self.fc(torch.flatten(h, 1))

    class MLP(nn.Module):
        def __init__(self, params: dict) -> None:
            super().__init__()
            layers = []
            i = 0
            while f"fc{i}_weight" in params:
                n_out, n_in = params[f"fc{i}_weight"].shape
                layer = nn.Linear(n_in, n_out)
                _copy(layer.weight, params[f"fc{i}_weight"])
                _copy(layer.bias, params[f"fc{i}_bias"])
                layers.append(layer)
                i += 1
            self.layers = nn.ModuleList(layers)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for i, layer in enumerate(self.layers):
                x = layer(x)
                if i < len(self.layers) - 1:
                    x = torch.relu(x)
            return torch.softmax(x, dim=-1)

    class LSTM(nn.Module):
        def __init__(self, params: dict) -> None:
            super().__init__()
            four_hidden, n_in = params["w_ih"].shape
            self.lstm = nn.LSTM(n_in, four_hidden // 4)
            _copy(self.lstm.weight_ih_l0, params["w_ih"])
            _copy(self.lstm.weight_hh_l0, params["w_hh"])
            _copy(self.lstm.bias_ih_l0, params["b_ih"])
            _copy(self.lstm.bias_hh_l0, params["b_hh"])

        def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            _, (h, c) = self.lstm(x)
            return h[0], c[0]

    class TransformerEncoder(nn.Module):
        def __init__(self, params: dict, heads: int, activation: str) -> None:
            super().__init__()
            self.layers = _encoder_layers(params, heads, False, activation)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            for layer in self.layers:
                x = layer(x)
            return x

    class ViT(nn.Module):
        def __init__(self, params: dict, heads: int) -> None:
            super().__init__()
            d_model, _, patch, _ = params["patch_embed_weight"].shape
            self.embed = nn.Conv2d(3, d_model, patch, stride=patch)
            _copy(self.embed.weight, params["patch_embed_weight"])
            _copy(self.embed.bias, params["patch_embed_bias"])
            self.class_token = nn.Parameter(torch.from_numpy(params["class_token"].copy()))
            self.pos_embed = nn.Parameter(torch.from_numpy(params["pos_embed"].copy()))
            self.layers = _encoder_layers(params, heads, True, "gelu")
            self.norm = _layer_norm(params, "norm")
            self.head = nn.Linear(d_model, params["head_weight"].shape[0])
            _copy(self.head.weight, params["head_weight"])
            _copy(self.head.bias, params["head_bias"])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            t = self.embed(x).flatten(2).transpose(1, 2)
            cls = self.class_token.expand(t.shape[0], -1, -1)
            h = torch.cat((cls, t), dim=1) + self.pos_embed
            for layer in self.layers:
                h = layer(h)
            return self.head(self.norm(h)[:, 0])

    class GPT(nn.Module):
        def __init__(self, params: dict, heads: int) -> None:
            super().__init__()
            self.layers = _encoder_layers(params, heads, True, "gelu")
            self.norm = _layer_norm(params, "norm")

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            seq = x.shape[1]
            mask = torch.triu(torch.full((seq, seq), float("-inf")), diagonal=1)
            for layer in self.layers:
                x = layer(x, src_mask=mask, is_causal=True)
            return self.norm(x)

    return SimpleNamespace(ResNet18=ResNet18, MobileNetV2=MobileNetV2, MLP=MLP, LSTM=LSTM,
                           TransformerEncoder=TransformerEncoder, ViT=ViT, GPT=GPT)


def torch_mlp(params: dict[str, np.ndarray]) -> Any:
    """The twin of ``models.mlp``: Linear/ReLU layers, softmax; sizes read from the weights."""
    return _classes().MLP(params).eval()


def torch_resnet18(params: dict[str, np.ndarray]) -> Any:
    """The twin of ``models.resnet18`` (softmax at the end); classes read from ``fc_weight``."""
    return _classes().ResNet18(params).eval()


def torch_mobilenet_v2(params: dict[str, np.ndarray], width: float = 1.0) -> Any:
    """The twin of ``models.mobilenet_v2`` built with the same ``width``; returns logits."""
    return _classes().MobileNetV2(params, width).eval()


def torch_lstm(params: dict[str, np.ndarray]) -> Any:
    """The twin of ``models.lstm``: ``nn.LSTM``; ``forward(x)`` returns ``(h, c)`` at the end."""
    return _classes().LSTM(params).eval()


def torch_transformer_encoder(params: dict[str, np.ndarray], heads: int,
                              activation: str = "relu") -> Any:
    """The twin of ``models.transformer_encoder``: ``nn.TransformerEncoderLayer``s, eval mode."""
    if activation not in ("relu", "gelu"):
        raise Error(f"activation must be 'relu' or 'gelu', not {activation!r}")
    return _classes().TransformerEncoder(params, heads, activation).eval()


def torch_vit_block(params: dict[str, np.ndarray], heads: int) -> Any:
    """The twin of ``models.vit_block``: Conv2d patches, class token, pre-norm GELU
    ``nn.TransformerEncoderLayer``s, LayerNorm, a Linear head on the class token."""
    return _classes().ViT(params, heads).eval()


def torch_gpt_block(params: dict[str, np.ndarray], heads: int) -> Any:
    """The twin of ``models.gpt_block``: pre-norm GELU ``nn.TransformerEncoderLayer``s called
    with a causal mask (``is_causal=True``), then LayerNorm."""
    return _classes().GPT(params, heads).eval()


def torch_tree_lstm(params: dict[str, np.ndarray]) -> Any:
    """The twin of ``models.tree_lstm``, in eager PyTorch: ``forward(tree)`` on the same tree
    as nested tuples (``("leaf", x)`` or ``("node", left, right)``, `as_torch_tree`), by
    recursion in Python, as a TreeLSTM is written for PyTorch; returns the root's h."""
    import torch

    weights = {k: torch.from_numpy(v) for k, v in params.items()}
    hidden = params["leaf_bias"].shape[0] // 3

    class TreeLSTM(torch.nn.Module):
        def cell(self, tree: tuple) -> tuple[Any, Any]:
            fn = torch.nn.functional
            if tree[0] == "leaf":
                i, o, u = fn.linear(tree[1], weights["leaf_weight"],
                                    weights["leaf_bias"]).split(hidden, dim=1)
                c = torch.sigmoid(i) * torch.tanh(u)
                return torch.sigmoid(o) * torch.tanh(c), c
            (hl, cl), (hr, cr) = self.cell(tree[1]), self.cell(tree[2])
            i, fl, fr, o, u = fn.linear(torch.cat((hl, hr), dim=1), weights["node_weight"],
                                        weights["node_bias"]).split(hidden, dim=1)
            c = torch.sigmoid(i) * torch.tanh(u) + torch.sigmoid(fl) * cl + torch.sigmoid(fr) * cr
            return torch.sigmoid(o) * torch.tanh(c), c

        def forward(self, tree: tuple) -> Any:
            return self.cell(tree)[0]

    return TreeLSTM().eval()


def as_torch_tree(value: Any) -> tuple:
    """A `kiln.ConstructorValue` tree of ``models.random_tree`` as the twin's nested tuples
    of torch tensors (the same arrays)."""
    import torch

    # post-order with an explicit stack: a tree thousands of levels deep converts too
    out: dict[int, tuple] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    while stack:
        v, ready = stack.pop()
        if v.name == "Leaf":
            out[id(v)] = ("leaf", torch.from_numpy(np.asarray(v.fields[0])))
        elif ready:
            out[id(v)] = ("node", out[id(v.fields[0])], out[id(v.fields[1])])
        else:
            stack += [(v, True), (v.fields[1], False), (v.fields[0], False)]
    return out[id(value)]


def run_torch(module: Any, *inputs: np.ndarray) -> np.ndarray | tuple[np.ndarray, ...]:
    """Run a twin on numpy inputs in inference mode; numpy out (a tuple for tuple results)."""
    import torch

    with torch.inference_mode():
        out = module(*(torch.from_numpy(np.ascontiguousarray(x)) for x in inputs))
    if isinstance(out, tuple):
        return tuple(o.numpy() for o in out)
    return out.numpy()


__all__ = ["as_torch_tree", "run_torch", "torch_gpt_block", "torch_lstm", "torch_mlp",
           "torch_mobilenet_v2", "torch_resnet18", "torch_transformer_encoder", "torch_tree_lstm",
           "torch_vit_block"]


def onnx_model(twin: Any, x: np.ndarray) -> bytes:
    """``twin`` exported to ONNX with the TorchScript exporter (offline, opset 17), its input
    named ``data``: the file the benchmarks give ONNX Runtime (and, asked, kiln's importer)."""
    import tempfile
    import warnings
    from pathlib import Path

    import torch

    with tempfile.TemporaryDirectory(prefix="kiln-twin-") as tmp:
        path = Path(tmp) / "twin.onnx"
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(twin, (torch.from_numpy(x),), str(path), dynamo=False,
                              input_names=["data"], opset_version=17)
        return path.read_bytes()


def onnx_session(twin: Any, x: np.ndarray, threads: int, model: bytes | None = None) -> Any:
    """A call of ONNX Runtime on ``twin`` exported by `onnx_model` (or on ``model``, that
    export made already), ``threads`` intra-op threads, every graph optimization: the
    benchmarks' third runtime."""
    import onnxruntime as ort

    if model is None:
        model = onnx_model(twin, x)
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    session = ort.InferenceSession(model, options,
                                   providers=["CPUExecutionProvider"])
    outputs = [o.name for o in session.get_outputs()]
    return lambda: session.run(outputs, {"data": x})


def max_error(got: Any, want: Any) -> float:
    """The largest difference relative to the largest expected magnitude."""
    got = got if isinstance(got, (tuple, list)) else (got,)
    want = want if isinstance(want, (tuple, list)) else (want,)
    return max(float(np.abs(np.asarray(g) - w).max() / max(1.0, np.abs(w).max()))
               for g, w in zip(got, want))
