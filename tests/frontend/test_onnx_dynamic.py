"""ONNX models with dynamic axes: the shape arithmetic stays IR (shape_of, dyn.*), so one
executable runs every batch size and sequence length. Each graph is checked against ONNX
Runtime, and the exported transformers against PyTorch, at several shapes."""

from __future__ import annotations

import math
import os
import warnings

import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
from onnx import TensorProto, helper

import kiln
from kiln.frontend.onnx import from_onnx

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def model(nodes, inputs, outputs, inits=()) -> onnx.ModelProto:
    g = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def vi(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def against_ort(m: onnx.ModelProto, feeds: list[dict[str, np.ndarray]]) -> None:
    mod, params = from_onnx(m)
    exe = kiln.build(mod, params=params)
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for feed in feeds:
        want = session.run(None, feed)
        got = exe.run(None, feed)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape and g.dtype == w.dtype
            np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype("float32")


def test_a_reshape_to_a_shape_computed_from_another_input():
    # y = reshape(x, [Shape(x)[0] * 2, -1]) on x of shape (n, 6)
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Mul", ["n", "two"], ["n2"]),
             helper.make_node("Unsqueeze", ["n2", "axes"], ["n2v"]),
             helper.make_node("Concat", ["n2v", "minus1"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["y"])]
    inits = [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("two", I64, [], [2]),
             helper.make_tensor("axes", I64, [1], [0]),
             helper.make_tensor("minus1", I64, [1], [-1])]
    m = model(nodes, [vi("x", ["n", 6])], [vi("y", ["m", "k"])], inits)
    against_ort(m, [{"x": rand(n, 6)} for n in (1, 2, 5)])


def test_expand_constant_of_shape_and_shape_slices():
    nodes = [helper.make_node("Shape", ["x"], ["s"], start=-2),
             helper.make_node("ConstantOfShape", ["s"], ["ones"],
                              value=helper.make_tensor("v", F, [1], [0.5])),
             helper.make_node("Shape", ["x"], ["full"]),
             helper.make_node("Expand", ["b", "full"], ["bx"]),
             helper.make_node("Add", ["bx", "ones"], ["y"])]
    m = model(nodes, [vi("x", ["a", "r", "c"]), vi("b", [1, "c"])], [vi("y", ["a", "r", "c"])])
    against_ort(m, [{"x": rand(2, 3, 4), "b": rand(1, 4, seed=1)},
                    {"x": rand(1, 5, 2), "b": rand(1, 2, seed=2)}])


def test_slice_with_bounds_from_the_shape():
    # the last half of every row: x[:, Shape(x)[1] // 2 :]
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "one"], ["c"], axis=0),
             helper.make_node("Div", ["c", "two"], ["half"]),
             helper.make_node("Unsqueeze", ["half", "axes"], ["starts"]),
             helper.make_node("Slice", ["x", "starts", "big", "axes1"], ["y"])]
    inits = [helper.make_tensor("one", I64, [], [1]), helper.make_tensor("two", I64, [], [2]),
             helper.make_tensor("axes", I64, [1], [0]), helper.make_tensor("big", I64, [1],
                                                                             [2**62]),
             helper.make_tensor("axes1", I64, [1], [1])]
    m = model(nodes, [vi("x", ["r", "c"])], [vi("y", ["r", "h"])], inits)
    against_ort(m, [{"x": rand(2, 6)}, {"x": rand(3, 5)}, {"x": rand(1, 1)}])


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [-1, 0, 2])
def test_trilu_of_a_dynamic_square(upper, k):
    m = model([helper.make_node("Trilu", ["x", "k"], ["y"], upper=upper)],
              [vi("x", ["a", "r", "c"])], [vi("y", ["a", "r", "c"])],
              [helper.make_tensor("k", I64, [], [k])])
    against_ort(m, [{"x": rand(2, 3, 5)}, {"x": rand(1, 4, 2)}])


def test_batched_matmul_gather_elements_and_flatten():
    nodes = [helper.make_node("MatMul", ["a", "b"], ["ab"]),
             helper.make_node("GatherElements", ["ab", "idx"], ["g"], axis=2),
             helper.make_node("Flatten", ["g"], ["y"], axis=2)]
    m = model(nodes, [vi("a", ["n", 2, "k", 3]), vi("b", [1, 2, 3, 4]),
                      vi("idx", ["n", 2, "k", 2], I64)], [vi("y", ["p", "q"])])
    feeds = []
    for n, k in ((1, 2), (3, 5)):
        idx = np.random.default_rng(n).integers(-k, k, (n, 2, k, 2))  # along axis 2 (k)
        feeds.append({"a": rand(n, 2, k, 3), "b": rand(1, 2, 3, 4, seed=3), "idx": idx})
    against_ort(m, feeds)


def test_cumsum_along_a_dynamic_axis():
    # RoBERTa's position ids: the mask counted along the sequence; and the other modes
    nodes = [helper.make_node("CumSum", ["m", "one"], ["c"]),
             helper.make_node("CumSum", ["x", "one"], ["y1"], exclusive=1),
             helper.make_node("CumSum", ["x", "zero"], ["y2"], reverse=1),
             helper.make_node("CumSum", ["x", "one"], ["y3"], exclusive=1, reverse=1)]
    m = model(nodes, [vi("x", ["a", "t", 3]), vi("m", ["b", "s"], I64)],
              [vi("c", ["b", "s"], I64), *(vi(f"y{k}", ["a", "t", 3]) for k in (1, 2, 3))],
              [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("one", I64, [], [1])])
    feeds = [{"x": rand(a, t, 3, seed=t), "m": np.random.default_rng(t).integers(0, 2, (a, t))}
             for a, t in ((1, 1), (2, 5), (3, 9))]
    against_ort(m, feeds)


def test_topk_along_a_dynamic_axis():
    nodes = [helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=1),
             helper.make_node("TopK", ["x", "k"], ["v0", "i0"], axis=0, largest=0)]
    m = model(nodes, [vi("x", ["a", "t"])],
              [vi("v", ["a", 2]), vi("i", ["a", 2], I64), vi("v0", [2, "t"]),
               vi("i0", [2, "t"], I64)],
              [helper.make_tensor("k", I64, [1], [2])])
    ties = np.round(rand(4, 9, seed=3))  # ties: both runtimes give the lower index first
    feeds = [{"x": rand(2, 5)}, {"x": ties}, {"x": rand(3, 2, seed=1)}]
    against_ort(m, feeds)
    mod, params = from_onnx(m)
    with pytest.raises(kiln.Error, match="outside"):  # K past the axis
        kiln.build(mod, params=params).run(None, {"x": rand(1, 1)})


def test_static_dimensions_stay_known_under_a_dynamic_axis():
    # Swin's window padding: r = reshape(x, [Shape(x)[0], 2, 6]); a Pad whose pads come
    # from Shape(r)[2] must be known at import. BART's ids[:, :5]: constant bounds on a
    # dynamic axis, clamped at run time.
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("Gather", ["s", "zero"], ["n"], axis=0),
             helper.make_node("Unsqueeze", ["n", "axes"], ["nv"]),
             helper.make_node("Concat", ["nv", "two_six"], ["target"], axis=0),
             helper.make_node("Reshape", ["x", "target"], ["r"]),
             helper.make_node("Shape", ["r"], ["rs"]),
             helper.make_node("Gather", ["rs", "two"], ["w"], axis=0),
             helper.make_node("Sub", ["eight", "w"], ["extra"]),
             helper.make_node("Unsqueeze", ["extra", "axes"], ["ev"]),
             helper.make_node("Concat", ["zeros5", "ev"], ["pads"], axis=0),
             helper.make_node("Pad", ["r", "pads"], ["y"]),
             helper.make_node("Slice", ["t", "zero1", "five", "one1"], ["head"])]
    inits = [helper.make_tensor("zero", I64, [], [0]), helper.make_tensor("two", I64, [], [2]),
             helper.make_tensor("axes", I64, [1], [0]),
             helper.make_tensor("two_six", I64, [2], [2, 6]),
             helper.make_tensor("eight", I64, [], [8]),
             helper.make_tensor("zeros5", I64, [5], [0] * 5),
             helper.make_tensor("zero1", I64, [1], [0]), helper.make_tensor("five", I64, [1], [5]),
             helper.make_tensor("one1", I64, [1], [1])]
    m = model(nodes, [vi("x", ["b", 3, 4]), vi("t", [2, "s"])],
              [vi("y", ["b", 2, 8]), vi("head", [2, "h"])], inits)
    against_ort(m, [{"x": rand(b, 3, 4, seed=b), "t": rand(2, s, seed=s)}
                    for b, s in ((1, 3), (2, 5), (4, 9))])


def test_nonzero_of_data_known_only_when_it_runs():
    nodes = [helper.make_node("Greater", ["x", "half"], ["big"]),
             helper.make_node("NonZero", ["big"], ["y"])]
    m = model(nodes, [vi("x", [3, 4])], [vi("y", [2, "n"], I64)],
              [helper.make_tensor("half", F, [], [0.0])])
    against_ort(m, [{"x": rand(3, 4, seed=k)} for k in range(3)])


# --- transformers exported with dynamic batch and sequence axes -------------------------------


class Attention(torch.nn.Module):
    def __init__(self, d, heads, causal):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv, self.out = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)

    def forward(self, x, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        a = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
        if mask is not None:
            a = a + (1.0 - mask[:, None, None, :].to(a.dtype)) * -1e4
        if self.causal:
            a = a.masked_fill(~torch.ones(t, t, dtype=torch.bool).tril(), float("-inf"))
        return self.out((a.softmax(-1) @ v).transpose(1, 2).reshape(b, t, d))


class Encoder(torch.nn.Module):
    """BERT-like (a padding mask, positions from the sequence length) or GPT-like (causal)."""

    def __init__(self, causal, vocab=40, d=32, heads=4, layers=2):
        super().__init__()
        self.emb, self.pos = torch.nn.Embedding(vocab, d), torch.nn.Embedding(64, d)
        self.attn = torch.nn.ModuleList(Attention(d, heads, causal) for _ in range(layers))
        self.norm = torch.nn.ModuleList(torch.nn.LayerNorm(d) for _ in range(layers))
        self.ffn = torch.nn.ModuleList(
            torch.nn.Sequential(torch.nn.Linear(d, 2 * d), torch.nn.GELU(),
                                torch.nn.Linear(2 * d, d)) for _ in range(layers))

    def forward(self, ids, mask=None):
        pos = torch.arange(ids.shape[1]).unsqueeze(0).expand(ids.shape[0], ids.shape[1])
        x = self.emb(ids) + self.pos(pos)
        for attn, norm, ffn in zip(self.attn, self.norm, self.ffn):
            x = norm(x + attn(x, mask))
            x = x + ffn(x)
        return x


def export(module, args, names, tmp_path) -> str:
    path = str(tmp_path / "model.onnx")
    axes = {n: {0: "batch", 1: "seq"} for n in [*names, "out"]}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, path, dynamo=False, input_names=names,
                          output_names=["out"], dynamic_axes=axes, opset_version=17)
    return path


def against_torch(module, path, make_inputs, shapes=((1, 5), (2, 8), (3, 13))):
    mod, params = from_onnx(path)
    exe = kiln.build(mod, params=params)
    assert exe.executor.name == "vm"  # one executable for every shape
    for b, s in shapes:
        args = make_inputs(b, s)
        with torch.no_grad():
            want = module(*args).numpy()
        got = exe(*(a.numpy() for a in args))
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def ids_and_mask(b, s, vocab=40):
    g = torch.Generator().manual_seed(b * 100 + s)
    ids = torch.randint(0, vocab, (b, s), generator=g)
    mask = torch.ones(b, s, dtype=torch.long)
    mask[-1, s // 2:] = 0  # the last sequence is padded
    return ids, mask


@pytest.mark.parametrize("causal", [False, True], ids=["bert-like", "gpt-like"])
def test_a_small_transformer_runs_at_every_batch_and_sequence_length(tmp_path, causal):
    torch.manual_seed(0)
    module = Encoder(causal).eval()
    ids, mask = ids_and_mask(2, 8)
    if causal:
        path = export(module, (ids,), ["ids"], tmp_path)
        against_torch(module, path, lambda b, s: ids_and_mask(b, s)[:1])
    else:
        path = export(module, (ids, mask), ["ids", "mask"], tmp_path)
        against_torch(module, path, ids_and_mask)


def _hf(name):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    if name == "bert":
        cfg = transformers.BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2,
                                      num_attention_heads=4, intermediate_size=64,
                                      max_position_embeddings=64)
        return transformers.BertModel(cfg)
    if name == "gpt2":
        cfg = transformers.GPT2Config(vocab_size=40, n_embd=32, n_layer=2, n_head=4,
                                      n_positions=64, bos_token_id=0, eos_token_id=0)
        return transformers.GPT2Model(cfg)
    cfg = transformers.LlamaConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2,
                                   intermediate_size=64, max_position_embeddings=64)
    return transformers.LlamaModel(cfg)


class LastHidden(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, ids, mask):
        return self.inner(input_ids=ids, attention_mask=mask).last_hidden_state


@pytest.mark.parametrize("name", ["bert", pytest.param("gpt2", marks=pytest.mark.slow),
                                  pytest.param("llama", marks=pytest.mark.slow)])
def test_hugging_face_models_with_dynamic_axes(tmp_path, name):
    module = LastHidden(_hf(name)).eval()
    path = export(module, ids_and_mask(2, 8), ["input_ids", "attention_mask"], tmp_path)
    against_torch(module, path, ids_and_mask)
