"""The contract of `kiln.frontend.from_torch`: where inputs and weights go, what comes back, and
the errors a user sees (unsupported operators listed all at once, torch.export failures,
training-mode modules, bad arguments). Values are checked against torch's own outputs.
"""

from __future__ import annotations

import numpy as np
import pytest

import kiln

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

from kiln.frontend import from_torch  # noqa: E402
from kiln.ir import SymDim, TensorType  # noqa: E402
from tests.frontend import torch_modules as tm  # noqa: E402


class TwoInputs(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 4)
        self.register_buffer("offset", torch.arange(4, dtype=torch.float32))

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.proj(a) * b + self.offset


def test_inputs_lead_weights_follow_in_params():
    torch.manual_seed(0)
    model = TwoInputs().eval()
    a, b = torch.randn(2, 3), torch.randn(2, 4)
    mod, params = from_torch(model, (a, b))
    main = mod["main"]
    assert [p.checked_type for p in main.params[:2]] == \
        [TensorType((2, 3), "float32"), TensorType((2, 4), "float32")]
    assert [p.name_hint for p in main.params[2:]] == list(params)
    assert set(params) == {"proj_weight", "proj_bias", "offset"}
    np.testing.assert_array_equal(params["proj_weight"], model.proj.weight.detach().numpy())
    np.testing.assert_array_equal(params["offset"], np.arange(4, dtype="float32"))
    want = model(a, b).detach().numpy()
    # Bound by name: the dict's order does not matter.
    shuffled = dict(reversed(list(params.items())))
    got = kiln.interpret(mod, a.numpy(), b.numpy(), params=shuffled)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


class Scaled(nn.Module):
    def forward(self, x: torch.Tensor, scale: float, flag: bool) -> torch.Tensor:
        return x * scale if flag else x


def test_non_tensor_inputs_are_fixed_at_their_example_values():
    x = torch.randn(2, 3)
    mod, params = from_torch(Scaled(), (x, 3.0, True))
    assert len(mod["main"].params) == 1
    np.testing.assert_allclose(kiln.interpret(mod, x.numpy(), params=params), (x * 3).numpy())


class WithConstant(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.tensor([1.0, 2.0, 3.0])  # a constant of the program, not a weight


def test_tensors_made_in_forward_are_constants():
    x = torch.randn(2, 3)
    mod, params = from_torch(WithConstant(), (x,))
    assert params == {} and len(mod["main"].params) == 1
    np.testing.assert_allclose(kiln.interpret(mod, x.numpy()), (x * torch.arange(1, 4)).numpy())


def test_params_as_constants():
    torch.manual_seed(1)
    model = TwoInputs().eval()
    a, b = torch.randn(2, 3), torch.randn(2, 4)
    mod, params = from_torch(model, (a, b), params_as="constants")
    assert params == {} and len(mod["main"].params) == 2
    got = kiln.interpret(mod, a.numpy(), b.numpy())
    np.testing.assert_allclose(got, model(a, b).detach().numpy(), rtol=1e-5, atol=1e-6)
    with pytest.raises(kiln.Error, match="params_as"):
        from_torch(model, (a, b), params_as="weights")


class Outputs(nn.Module):
    def __init__(self, kind: str) -> None:
        super().__init__()
        self.kind = kind

    def forward(self, x: torch.Tensor):
        if self.kind == "one":
            return x * 2
        if self.kind == "tuple":
            return x * 2, x + 1
        if self.kind == "nested":
            return x * 2, (x + 1, [x - 1])
        return {"double": x * 2, "square": x * x}


@pytest.mark.parametrize("kind", ["one", "tuple", "nested", "dict"])
def test_outputs_one_array_several_tuple(kind):
    x = torch.randn(2, 3)
    mod, params = from_torch(Outputs(kind), (x,))
    got = kiln.interpret(mod, x.numpy(), params=params)
    if kind == "one":
        assert isinstance(got, np.ndarray)
        np.testing.assert_allclose(got, (x * 2).numpy())
    elif kind == "tuple":
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_allclose(got[1], (x + 1).numpy())
    elif kind == "nested":
        assert isinstance(got[1], tuple) and isinstance(got[1][1], tuple)
        np.testing.assert_allclose(got[1][1][0], (x - 1).numpy())
    else:  # a dict's values, in order
        assert isinstance(got, tuple) and len(got) == 2
        np.testing.assert_allclose(got[1], (x * x).numpy())


def test_symbolic_batch_dimension():
    torch.manual_seed(2)
    model = tm.MLP((5, 8, 3)).eval()
    batch = torch.export.Dim("batch")
    mod, params = from_torch(model, (torch.randn(4, 5),), dynamic_shapes=({0: batch},))
    assert mod["main"].params[0].checked_type == TensorType((SymDim("batch"), 5), "float32")
    exe = kiln.build(mod, params=params)
    for n in (1, 7):
        x = torch.randn(n, 5)
        want = model(x).detach().numpy()
        np.testing.assert_allclose(kiln.interpret(mod, x.numpy(), params=params), want,
                                   rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(exe(x.numpy()), want, rtol=1e-5, atol=1e-6)


def test_symbolic_batch_through_a_transformer_encoder():
    torch.manual_seed(5)
    model = tm.Encoder().eval()
    batch = torch.export.Dim("batch")
    mod, params = from_torch(model, (torch.randn(2, 6, 16),), dynamic_shapes=({0: batch},))
    x = torch.randn(3, 6, 16)
    got = kiln.interpret(mod, x.numpy(), params=params)
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-4, atol=1e-4)


def test_attention_over_a_symbolic_sequence_length_runs_at_every_length():
    seq = torch.export.Dim("seq")
    model = tm.Encoder().eval()
    mod, params = from_torch(model, (torch.randn(2, 6, 16),), dynamic_shapes=({1: seq},))
    exe = kiln.build(mod, params=params)
    for length in (3, 6, 11):
        x = torch.randn(2, length, 16)
        with torch.no_grad():
            want = model(x).numpy()
        np.testing.assert_allclose(exe(x.numpy()), want, rtol=1e-4, atol=1e-5)


class Grouped(nn.Module):
    def forward(self, x):
        return torch.nn.functional.group_norm(x, 2)


def test_a_symbolic_size_kiln_cannot_handle_names_the_node():
    half = torch.export.Dim("half", min=1, max=32)
    with pytest.raises(kiln.Error) as info:
        from_torch(Grouped(), (torch.randn(2, 4, 6),), dynamic_shapes=({2: 2 * half},))
    message = info.value.message
    assert message.startswith("node %group_norm")
    assert "group_norm needs a static shape, but its input has shape (2, 4, ?)" in message


# --- errors ---------------------------------------------------------------------------------


class Unsupported(nn.Module):
    """Two operators kiln cannot import (mode twice, cummax once), inside named
    submodules."""

    def __init__(self) -> None:
        super().__init__()
        self.first = Fn(lambda x: torch.mode(x, dim=1, keepdim=True).values * x)
        self.second = Fn(lambda x: torch.cummax(x, dim=1).values
                         + torch.mode(x, dim=0).values)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x)))


class Fn(nn.Module):
    def __init__(self, fn) -> None:
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def test_unsupported_operators_all_listed_in_one_error():
    with pytest.raises(kiln.Error) as info:
        from_torch(Unsupported(), (torch.randn(4, 4),))
    message = info.value.message
    assert "2 ATen operators" in message
    assert "aten.mode.default" in message and "aten.cummax" in message
    assert "%mode (in first" in message and "%mode_1 (in second" in message  # every node
    assert "first" in message and "second" in message  # the module paths
    assert "relu" not in message.replace("F.relu", "")  # supported ones are not listed


class DataDependent(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.sum() > 0:  # control flow on a value: torch.export cannot trace it
            return x * 2
        return x


def test_export_failure_is_a_kiln_error():
    with pytest.raises(kiln.Error, match=r"torch.export could not export DataDependent") as info:
        from_torch(DataDependent(), (torch.randn(3),))
    message = info.value.message
    assert "\n" not in message  # torch's message summarized to one line
    assert "(at test_torch_contract.py:" in message and "`if x.sum() > 0:`" in message
    assert "data-dependent" in message
    assert not isinstance(info.value, kiln.InternalError)


def test_bad_arguments():
    with pytest.raises(kiln.Error, match="torch.nn.Module"):
        from_torch(lambda x: x, (torch.randn(2),))
    with pytest.raises(kiln.Error, match="example inputs"):
        from_torch(tm.MLP())
    with pytest.raises(kiln.Error, match="tuple of tensors"):
        from_torch(tm.MLP(), {"x": torch.randn(2, 32)})


def test_a_single_tensor_or_list_is_accepted_as_example_inputs():
    torch.manual_seed(3)
    model = tm.MLP((4, 3)).eval()
    x = torch.randn(2, 4)
    for example in (x, [x]):
        mod, params = from_torch(model, example)
        got = kiln.interpret(mod, x.numpy(), params=params)
        np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


def test_unsupported_dtype():
    class Complex(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2

    with pytest.raises(kiln.Error, match="complex64"):
        from_torch(Complex(), (torch.randn(3, dtype=torch.complex64),))


# --- training mode --------------------------------------------------------------------------


def test_training_mode_without_training_behaviour_imports():
    torch.manual_seed(4)
    model = tm.MLP((4, 3))
    assert model.training
    x = torch.randn(2, 4)
    mod, params = from_torch(model, (x,))
    got = kiln.interpret(mod, x.numpy(), params=params)
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-6)


# (batch norm in train mode imports as nn.batch_norm(training=True), elementwise dropout as
# nn.dropout_train: tests/train/test_batch_norm_dropout.py, tests/train/test_imported_dropout.py)
def test_training_mode_channel_dropout_asks_for_eval():
    model = nn.Sequential(nn.Conv2d(2, 4, 1), nn.Dropout2d(0.5))
    x = torch.randn(2, 2, 3, 3)
    with pytest.raises(kiln.Error, match=r"model\.eval\(\)"):
        from_torch(model.train(), (x,))
    assert model.training  # the model is left as it was
    mod, params = from_torch(model.eval(), (x,))
    got = kiln.interpret(mod, x.numpy(), params=params)
    np.testing.assert_allclose(got, model(x).detach().numpy(), rtol=1e-5, atol=1e-5)
