"""`kiln.frontend.from_torch` against PyTorch itself: whole models and single ATen operators.

Each model is exported with ``torch.export``, imported, then run twice — by the reference
interpreter (``kiln.interpret``) and compiled (``kiln.build``) — and both results are compared
with the torch module's own output (the oracle) in eval mode. Tolerance, the issue's bar:
float32 with ``rtol = 1e-4`` and ``atol = 1e-4 · max|expected|`` (kiln and torch sum in
different orders and approximate exp/tanh/erf differently). Integer and bool results must be
equal. The default run uses small sizes (32×32 images, narrow layers); the full-size forms
(224×224 ResNet-18 and MobileNetV2, bigger LSTMs and encoders) run with ``-m slow``.
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
from kiln.runtime.compiler import native_available  # noqa: E402
from tests.frontend import torch_modules as tm  # noqa: E402

RTOL = 1e-4
needs_native = pytest.mark.skipif(not native_available(), reason="needs llvmlite (native code)")


@pytest.fixture
def full_size(request: pytest.FixtureRequest) -> None:
    """Skips a full-size model unless the run asked for ``-m slow``."""
    if "slow" not in (request.config.getoption("markexpr") or ""):
        pytest.skip("long form: run with -m slow")


def to_numpy(value: Any) -> Any:
    """torch's (nested) outputs as kiln returns them: arrays, lists and tuples as tuples."""
    if isinstance(value, torch.Tensor):
        return value.detach().numpy()
    return tuple(to_numpy(v) for v in value)


def assert_close(got: Any, want: Any, where: str = "result") -> None:
    """Arrays (or nested tuples of them) agree in shape, dtype and value within the tolerance."""
    if isinstance(want, tuple):
        assert isinstance(got, tuple) and len(got) == len(want), (where, type(got))
        for i, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, f"{where}[{i}]")
        return
    assert isinstance(got, np.ndarray), (where, type(got))
    assert got.shape == want.shape and got.dtype == want.dtype, \
        (where, got.shape, got.dtype, want.shape, want.dtype)
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=where)
        return
    scale = float(np.abs(want).max()) if want.size else 0.0
    np.testing.assert_allclose(got, want, rtol=RTOL, atol=RTOL * max(1.0, scale), err_msg=where)


def check(model: nn.Module, *inputs: Any, build: bool = True) -> tuple[kiln.IRModule, dict]:
    """Import ``model`` and compare the interpreter's and the compiled program's results with
    torch's. ``None`` inputs are optional arguments left out (they are not kiln inputs)."""
    model.eval()
    with torch.no_grad():
        want = to_numpy(model(*inputs))
    mod, params = from_torch(model, tuple(inputs))
    args = [x.numpy() for x in inputs if x is not None]
    assert_close(kiln.interpret(mod, *args, params=params), want, "interpreter")
    if build and native_available():
        assert_close(kiln.build(mod, params=params)(*args), want, "kiln.build")
    return mod, params


# --- models ---------------------------------------------------------------------------------


def test_mlp():
    torch.manual_seed(0)
    check(tm.MLP(), torch.randn(4, 32))


def test_resnet18_shaped_cnn():
    torch.manual_seed(1)
    mod, params = check(tm.randomize_norms(tm.ResNet(width=8)), torch.randn(2, 3, 32, 32))
    assert "layer2_0_downsample_0_weight" in params  # state-dict names, made identifiers


def test_mobilenet_v2_shaped_cnn():
    torch.manual_seed(2)
    check(tm.randomize_norms(tm.MobileNetV2()), torch.randn(2, 3, 32, 32))


@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("batch_first", [False, True])
def test_nn_lstm(layers, batch_first):
    torch.manual_seed(3)
    x = torch.randn(2, 5, 8) if batch_first else torch.randn(5, 2, 8)
    check(tm.LSTMModel(layers=layers, batch_first=batch_first), x)


class Recurrent(nn.Module):
    """``nn.GRU``/``nn.RNN``/``nn.LSTM``, possibly bidirectional: its output sequence and state."""

    def __init__(self, kind: str, bidirectional: bool) -> None:
        super().__init__()
        layer = {"gru": nn.GRU, "rnn": nn.RNN, "lstm": nn.LSTM}[kind]
        self.rnn = layer(6, 5, 2, bidirectional=bidirectional, batch_first=True)

    def forward(self, x: torch.Tensor) -> Any:
        return self.rnn(x)


class Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attention = nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, q: torch.Tensor, kv: torch.Tensor) -> Any:
        return self.attention(q, kv, kv)  # the output and the heads' mean attention weights


def test_multihead_attention():
    torch.manual_seed(10)
    check(Attention(), torch.randn(2, 5, 8), torch.randn(2, 7, 8))


@pytest.mark.parametrize(("kind", "bidirectional"),
                         [("gru", False), ("rnn", False), ("lstm", True), ("gru", True)])
def test_other_recurrent_layers(kind, bidirectional):
    torch.manual_seed(9)
    check(Recurrent(kind, bidirectional), torch.randn(3, 4, 6))


@pytest.mark.parametrize("cell", [True, False], ids=["lstm_cell", "linear_gates"])
def test_lstm_as_python_loop(cell):
    torch.manual_seed(4)
    check(tm.LoopLSTM(cell=cell), torch.randn(2, 6, 8))


def test_transformer_encoder():
    torch.manual_seed(5)
    check(tm.Encoder(layers=2), torch.randn(2, 6, 16))


def test_transformer_encoder_norm_first_gelu():
    torch.manual_seed(6)
    check(tm.Encoder(layers=3, norm_first=True, activation="gelu"), torch.randn(2, 5, 16))


@pytest.mark.parametrize("kind", ["float_causal", "bool", "padding"])
def test_transformer_encoder_masks(kind):
    torch.manual_seed(7)
    x = torch.randn(2, 6, 16)
    if kind == "float_causal":
        inputs = (x, torch.triu(torch.full((6, 6), float("-inf")), 1))
    elif kind == "bool":
        inputs = (x, torch.rand(6, 6) > 0.7)
    else:
        inputs = (x, None, torch.tensor([[False] * 6, [False] * 4 + [True] * 2]))
    check(tm.Encoder(layers=2), *inputs)


CORE_ATEN_MODELS = {
    "mlp": lambda: (tm.MLP(), (torch.randn(4, 32),)),
    "loop_lstm": lambda: (tm.LoopLSTM(cell=False), (torch.randn(2, 5, 8),)),
    "instance_norm": lambda: (nn.InstanceNorm2d(3, affine=True), (torch.randn(2, 3, 5, 5),)),
    "resnet": lambda: (tm.randomize_norms(tm.ResNet()), (torch.randn(2, 3, 32, 32),)),
    "mobilenet": lambda: (tm.randomize_norms(tm.MobileNetV2()), (torch.randn(2, 3, 32, 32),)),
    "nn_lstm": lambda: (tm.LSTMModel(layers=2), (torch.randn(5, 2, 8),)),
    "encoder_mask": lambda: (tm.Encoder(), (torch.randn(2, 6, 16), torch.rand(6, 6) > 0.5)),
}


@pytest.mark.parametrize("name", [
    "mlp", "loop_lstm", "instance_norm",
    *(pytest.param(k, marks=pytest.mark.slow) for k in
      ("resnet", "mobilenet", "nn_lstm", "encoder_mask")),
])
def test_models_decomposed_to_core_aten(name, request):
    """An ExportedProgram decomposed in full (torch's default table): from_torch converts the
    core ATen operators it gives, the path taken when a model has an operator without a direct
    converter. (Decomposing takes seconds, so most of these run with ``-m slow``.)"""
    if request.node.get_closest_marker("slow"):
        request.getfixturevalue("full_size")
    torch.manual_seed(8)
    model, inputs = CORE_ATEN_MODELS[name]()
    model.eval()
    exported = torch.export.export(model, inputs).run_decompositions()
    with torch.no_grad():
        want = to_numpy(model(*inputs))
    mod, params = from_torch(exported)
    assert_close(kiln.interpret(mod, *(x.numpy() for x in inputs), params=params), want)


@pytest.mark.slow
def test_resnet18_full_size(full_size):
    torch.manual_seed(10)
    check(tm.randomize_norms(tm.ResNet(width=64, classes=1000)), torch.randn(1, 3, 224, 224))


@pytest.mark.slow
def test_mobilenet_v2_full_size(full_size):
    torch.manual_seed(11)
    model = tm.MobileNetV2(tm.MobileNetV2.FULL, stem=32, last=1280, classes=1000)
    check(tm.randomize_norms(model), torch.randn(1, 3, 224, 224))


@pytest.mark.slow
def test_lstm_full_size(full_size):
    torch.manual_seed(12)
    check(tm.LSTMModel(inputs=64, hidden=128, layers=2, batch_first=True),
          torch.randn(4, 32, 64))


@pytest.mark.slow
def test_transformer_encoder_full_size(full_size):
    torch.manual_seed(13)
    check(tm.Encoder(d_model=128, heads=4, ff=512, layers=4), torch.randn(2, 64, 128))


# --- single operators -----------------------------------------------------------------------


class Fn(nn.Module):
    """A module whose forward is ``fn``: one ATen operator (or a few) under test."""

    def __init__(self, fn: Callable[..., Any]) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        return self.fn(*args)


def r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def ints(*shape: int, high: int = 5) -> torch.Tensor:
    return torch.randint(0, high, shape)


def inplace_then_read(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    z = y.relu_()  # y is overwritten and read below: not convertible as a plain relu
    return y + z + 1


def inplace_on_view(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    y[:, 0].mul_(-3.0)  # overwrites a column of y through a view
    return y.sigmoid_()  # overwrites a dead temporary: converted as sigmoid


def inplace_after_view(x: torch.Tensor) -> torch.Tensor:
    y = x * 2
    v = y.view(12)
    y.relu_()  # v sees the new values
    return v + 1


F = nn.functional
OPS: dict[str, tuple[Callable[..., Any], Callable[[], tuple[Any, ...]]]] = {
    # shapes
    "view": (lambda x: x.view(2, -1), lambda: (r(2, 3, 4),)),
    "reshape": (lambda x: x.reshape(4, 6) + 1, lambda: (r(2, 3, 4),)),
    "flatten": (lambda x: torch.flatten(x, 1), lambda: (r(2, 3, 4),)),
    "permute": (lambda x: x.permute(2, 0, 1), lambda: (r(2, 3, 4),)),
    "transpose": (lambda x: x.transpose(1, -1), lambda: (r(2, 3, 4),)),
    "t": (lambda x: x.t() * 2, lambda: (r(3, 4),)),
    "unsqueeze_squeeze": (lambda x: x.unsqueeze(1).squeeze(-1) * 3, lambda: (r(3, 1),)),
    "expand": (lambda x: x.expand(2, 3, 4) + 0, lambda: (r(3, 1),)),
    "repeat": (lambda x: x.repeat(2, 1, 3), lambda: (r(3, 2),)),
    "cat": (lambda x, y: torch.cat([x, y, x], dim=1), lambda: (r(2, 3), r(2, 2))),
    "stack": (lambda x, y: torch.stack([x, y], dim=-1), lambda: (r(2, 3), r(2, 3))),
    "split": (lambda x: x.split([1, 3], dim=1), lambda: (r(2, 4),)),
    "chunk": (lambda x: x.chunk(3, dim=0), lambda: (r(6, 2),)),
    "unbind": (lambda x: x.unbind(1), lambda: (r(2, 3),)),
    "slice": (lambda x: x[:, 1:3, ::2], lambda: (r(2, 4, 5),)),
    "slice_negative": (lambda x: x[..., -3:-1], lambda: (r(2, 4, 5),)),
    "select": (lambda x: x[1, :, -1], lambda: (r(2, 4, 5),)),
    "index_tensor": (lambda x, i: x[i], lambda: (r(5, 3), torch.tensor([4, 0, 2, 2]))),
    "index_select": (lambda x, i: torch.index_select(x, 1, i),
                     lambda: (r(2, 5), torch.tensor([3, 1]))),
    "gather": (lambda x, i: torch.gather(x, 1, i), lambda: (r(3, 5, 2), ints(3, 4, 2))),
    "gather_first_axis": (lambda x, i: torch.gather(x, 0, i),
                          lambda: (r(4, 3), ints(2, 3, high=4))),
    "cumsum": (lambda x: torch.cumsum(x, 1) + torch.cumsum(x, -1), lambda: (r(2, 5, 3),)),
    "embedding": (lambda w, i: F.embedding(i, w), lambda: (r(10, 4), ints(2, 3, high=10))),
    "flip": (lambda x: torch.flip(x, [0, 2]), lambda: (r(2, 3, 4),)),
    "pad": (lambda x: F.pad(x, (1, 2, 0, 1), value=0.5), lambda: (r(1, 2, 3, 3),)),
    # in-place operators
    "inplace_then_read": (inplace_then_read, lambda: (r(3, 4),)),
    "inplace_on_view": (inplace_on_view, lambda: (r(3, 4),)),
    "inplace_after_view": (inplace_after_view, lambda: (r(3, 4),)),
    # activations and normalizations
    "softmax": (lambda x: torch.softmax(x, dim=1), lambda: (r(2, 5, 3),)),
    "log_softmax": (lambda x: F.log_softmax(x, dim=-1), lambda: (r(2, 5),)),
    "layer_norm": (lambda x, w, b: F.layer_norm(x, (4,), w, b, 1e-5),
                   lambda: (r(2, 3, 4), r(4), r(4))),
    "layer_norm_2d": (lambda x: F.layer_norm(x, (3, 4)), lambda: (r(2, 3, 4),)),
    "instance_norm": (lambda x, w, b: F.instance_norm(x, weight=w, bias=b),
                      lambda: (r(2, 3, 4, 4), r(3), r(3))),
    "instance_norm_running_stats": (
        lambda x, m, v: F.instance_norm(x, m, v, use_input_stats=False),
        lambda: (r(2, 3, 4, 4), r(3), torch.rand(3) + 0.5)),
    "group_norm": (lambda x: F.group_norm(x, 2), lambda: (r(2, 4, 3, 3),)),
    "gelu": (lambda x: F.gelu(x), lambda: (r(3, 4),)),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda: (r(3, 4),)),
    "relu6_hardswish": (lambda x: F.relu6(x * 4) + F.hardswish(x), lambda: (r(3, 4),)),
    "silu_leaky_elu": (lambda x: F.silu(x) + F.leaky_relu(x, 0.1) + F.elu(x), lambda: (r(3, 4),)),
    "unary": (lambda x: torch.exp(x) + torch.log(x.abs() + 1) + torch.sqrt(x.abs())
              + torch.rsqrt(x.abs() + 1) + torch.tanh(x) + torch.sigmoid(-x) + torch.erf(x),
              lambda: (r(3, 4),)),
    "clamp_pow": (lambda x: torch.clamp(x, -0.5, 0.7) + x.pow(2) + (x.abs() + 1) ** 0.5,
                  lambda: (r(3, 4),)),
    "arith_scalars": (lambda x: (1 - x) / 3 + 2 * x - x / (x.abs() + 1), lambda: (r(3, 4),)),
    # linear algebra
    "matmul_2d": (lambda a, b: a @ b, lambda: (r(3, 4), r(4, 5))),
    "matmul_3d_2d": (lambda a, b: a @ b, lambda: (r(2, 3, 4), r(4, 5))),
    "matmul_broadcast_4d": (lambda a, b: torch.matmul(a, b), lambda: (r(2, 2, 3, 4), r(2, 4, 5))),
    "matmul_vector": (lambda a, b: a @ b, lambda: (r(3, 4), r(4))),
    "einsum_baddbmm": (lambda c, a, b: torch.einsum("bij,bjk->bik", a, b)
                       + torch.baddbmm(c, a, b, alpha=0.5),
                       lambda: (r(2, 3, 5), r(2, 3, 4), r(2, 4, 5))),
    "bmm": (lambda a, b: torch.bmm(a, b), lambda: (r(2, 3, 4), r(2, 4, 5))),
    "linear_no_bias": (lambda x, w: F.linear(x, w), lambda: (r(2, 3, 4), r(5, 4))),
    "conv2d_same": (lambda x, w: F.conv2d(x, w, padding="same", dilation=2),
                    lambda: (r(1, 2, 7, 7), r(3, 2, 3, 3))),
    "conv2d_same_even_kernel": (lambda x, w: F.conv2d(x, w, padding="same"),
                                lambda: (r(1, 2, 6, 5), r(3, 2, 4, 2))),
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
               lambda: (r(1, 2, 9), r(4, 2, 3), r(4))),
    "conv2d_groups_dilation": (lambda x, w: F.conv2d(x, w, stride=2, dilation=2, groups=2),
                               lambda: (r(1, 4, 9, 9), r(6, 2, 3, 3))),
    "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1),
                         lambda: (r(1, 2, 4, 4), r(2, 3, 3, 3))),
    "sdpa_causal": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                    lambda: (r(2, 2, 5, 4), r(2, 2, 5, 4), r(2, 2, 5, 4))),
    "sdpa_grouped_query": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v,
                                                                        enable_gqa=True),
                           lambda: (r(1, 4, 5, 4), r(1, 2, 6, 4), r(1, 2, 6, 4))),
    "interpolate_nearest_pixel_shuffle": (
        lambda x: F.pixel_shuffle(F.interpolate(x, scale_factor=2), 2),
        lambda: (r(1, 8, 3, 3),)),
    "interpolate_bilinear": (
        lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")
        + F.interpolate(x, size=(6, 6), mode="bilinear", align_corners=True),
        lambda: (r(1, 2, 3, 3),)),
    "interpolate_bilinear_odd": (
        lambda x: F.interpolate(x, size=(7, 4), mode="bilinear"), lambda: (r(2, 1, 5, 3),)),
    "pad_reflect": (lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect"), lambda: (r(1, 2, 4, 4),)),
    # pooling
    "pool1d": (lambda x: F.max_pool1d(x, 2) + F.avg_pool1d(x, 2), lambda: (r(1, 2, 8),)),
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1), lambda: (r(1, 2, 7, 7),)),
    "max_pool2d_ceil": (lambda x: F.max_pool2d(x, 2, 2, ceil_mode=True), lambda: (r(1, 2, 5, 5),)),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1), lambda: (r(1, 2, 7, 7),)),
    "avg_pool2d_no_pad_count": (lambda x: F.avg_pool2d(x, 3, 2, 1, count_include_pad=False),
                                lambda: (r(1, 2, 7, 7),)),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, (2, 2)), lambda: (r(1, 2, 8, 8),)),
    "adaptive_max_pool2d": (lambda x: F.adaptive_max_pool2d(x, 1), lambda: (r(1, 2, 6, 6),)),
    # reductions
    "mean_sum": (lambda x: x.mean(dim=1) + x.sum(dim=(1,), keepdim=False), lambda: (r(2, 3, 4),)),
    "mean_keepdim": (lambda x: x.mean(dim=[0, 2], keepdim=True), lambda: (r(2, 3, 4),)),
    "sum_all": (lambda x: x.sum(), lambda: (r(2, 3, 4),)),
    "amax_amin": (lambda x: torch.amax(x, dim=-1) - torch.amin(x, dim=(0, 2)),
                  lambda: (r(4, 3, 4),)),
    "max_dim": (lambda x: torch.max(x, dim=1), lambda: (r(2, 5),)),
    "argmax": (lambda x: torch.argmax(x, dim=-1), lambda: (r(2, 5),)),
    "var": (lambda x: torch.var(x, dim=1), lambda: (r(3, 6),)),
    "vector_norm": (lambda x: F.normalize(x, dim=-1) + torch.norm(x, dim=0)
                    + torch.linalg.vector_norm(x, ord=1, dim=1, keepdim=True)
                    + torch.linalg.vector_norm(x, ord=float("inf"))
                    + torch.linalg.vector_norm(x, ord=3), lambda: (r(3, 4),)),
    "std_logsumexp": (lambda x: torch.std(x, dim=1) + torch.logsumexp(x, dim=1),
                      lambda: (r(3, 5),)),
    "sum_int": (lambda x: x.sum(dim=0), lambda: (ints(3, 4),)),
    "cross_entropy": (lambda x, t: F.cross_entropy(x, t), lambda: (r(4, 5), ints(4))),
    # comparisons and selection
    "comparisons": (lambda a, b: (a > b, a <= b, a == b, a != 0.5, a < 0),
                    lambda: (r(3, 4), r(3, 4))),
    "where": (lambda a, b: torch.where(a > b, a, b * 2), lambda: (r(3, 4), r(3, 4))),
    "where_scalar": (lambda a: torch.where(a > 0, a, 0.0), lambda: (r(3, 4),)),
    "masked_fill": (lambda a: a.masked_fill(a < 0, -1.0), lambda: (r(3, 4),)),
    "logical": (lambda a, b: (a > 0) & (b > 0) | ~(a > b), lambda: (r(3, 4), r(3, 4))),
    "maximum_minimum": (lambda a, b: torch.maximum(a, b) - torch.minimum(a, b),
                        lambda: (r(3, 4), r(3, 4))),
    # creation
    "arange": (lambda x: x + torch.arange(4), lambda: (r(3, 4),)),
    "arange_step": (lambda x: x * torch.arange(1, 3, 0.5), lambda: (r(2, 4),)),
    "ones_zeros_full": (lambda x: x + torch.ones(3, 4) - torch.zeros(4) * torch.full((3, 1), 2.0),
                        lambda: (r(3, 4),)),
    "like": (lambda x: torch.ones_like(x) + torch.zeros_like(x) + torch.full_like(x, 3.0) + x,
             lambda: (r(3, 4),)),
    "new_ones": (lambda x: x.new_ones(3) + x.new_zeros((2, 3)), lambda: (r(2, 3),)),
    "tril_triu": (lambda x: torch.tril(x) + torch.triu(x, 1) * 2, lambda: (r(4, 4),)),
    # dtypes
    "to_int32": (lambda x: (x * 3).to(torch.int32), lambda: (r(3, 4),)),
    "to_int64_float": (lambda x: (x * 3).long().float() + 0.5, lambda: (r(3, 4),)),
    "to_bool": (lambda x: x.round().bool(), lambda: (r(3, 4),)),
    "round_halves_to_even": (lambda x: torch.round(x * 2.0) + torch.round(x - 0.5),
                             lambda: (torch.arange(-6, 6, dtype=torch.float32).reshape(3, 4)
                                      * 0.75,)),
    "float64": (lambda x: (x.double() * 2).sum(dim=1), lambda: (r(3, 4),)),
    "int_arith": (lambda a, b: a * b + a // 2 - b % 3, lambda: (ints(3, 4) + 1, ints(3, 4) + 1)),
    "int_div_true": (lambda a: a / 2, lambda: (ints(3, 4),)),
    "promote_int_float": (lambda a, x: a + x, lambda: (ints(3, 4), r(3, 4))),
}


@pytest.mark.parametrize("name", sorted(OPS))
def test_operator(name):
    fn, make = OPS[name]
    torch.manual_seed(sum(map(ord, name)))
    check(Fn(fn), *make())
