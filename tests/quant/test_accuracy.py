"""Accuracy on a trained model (issue 14, item 4): a small CNN trained here with torch on
synthetic images, quantized by kiln.quantize and by ONNX Runtime's quantize_static (QDQ);
both int8 models stay within 1 point of the float model on held-out images, and kiln running
ORT's QDQ file agrees with ORT's own int8 run.

ORT quantizes with ``reduce_range=True`` (7-bit weights): its x86 uint8 x int8 kernels sum
pairs of products in saturating int16 (vpmaddubsw), which full-range weights can overflow;
7-bit weights keep ORT's sums exact, so ORT's results are the ONNX definition that kiln
computes (tests/frontend/test_onnx_quant.py shows the difference on one node).
"""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnx")
from onnxruntime import quantization as q  # noqa: E402

import kiln  # noqa: E402
from kiln.frontend import from_onnx, from_torch  # noqa: E402

BATCH = 100
N_TEST = 1000


def patterns(n: int, rng: np.random.Generator, size: int = 16,
             noise: float = 1.2) -> tuple[np.ndarray, np.ndarray]:
    """Four classes of 1 x size x size images: horizontal stripes, vertical stripes, a
    diagonal band, a bright blob; random phase, period, position, contrast, and noise strong
    enough that the CNN below gets some wrong (about 97-98%), so the accuracies can differ."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    labels = rng.integers(0, 4, n)
    out = np.empty((n, 1, size, size), np.float32)
    for i, c in enumerate(labels):
        period, phase = rng.uniform(3, 6), rng.uniform(0, 2 * np.pi)
        if c == 0:
            img = np.sin(2 * np.pi * yy / period + phase)
        elif c == 1:
            img = np.sin(2 * np.pi * xx / period + phase)
        elif c == 2:
            img = np.sin(2 * np.pi * (xx + yy) / (1.4 * period) + phase)
        else:
            cy, cx, r = rng.uniform(4, 12), rng.uniform(4, 12), rng.uniform(2, 4)
            img = 2 * np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r)) - 1
        out[i, 0] = rng.uniform(0.5, 1.5) * img + rng.normal(0, noise, (size, size))
    return out, labels


def train(seed: int = 0, n: int = 1200, epochs: int = 4):  # noqa: ANN201 - a torch module
    torch.manual_seed(seed)
    x, y = patterns(n, np.random.default_rng(seed))
    net = torch.nn.Sequential(
        torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Flatten(), torch.nn.Linear(16 * 4 * 4, 32), torch.nn.ReLU(),
        torch.nn.Linear(32, 4))
    opt = torch.optim.Adam(net.parameters(), lr=3e-3)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    for _ in range(epochs):
        perm = torch.randperm(n)
        for i in range(0, n, 32):
            idx = perm[i:i + 32]
            opt.zero_grad()
            torch.nn.functional.cross_entropy(net(xt[idx]), yt[idx]).backward()
            opt.step()
    return net.eval()


class Reader(q.CalibrationDataReader):
    def __init__(self, batches: list[np.ndarray]) -> None:
        self.items = iter([{"x": b} for b in batches])

    def get_next(self):  # noqa: ANN201 - ORT's interface
        return next(self.items, None)


def _session(data: bytes):  # noqa: ANN202
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(data, options, providers=["CPUExecutionProvider"])


def _accuracy(run, x: np.ndarray, y: np.ndarray) -> float:  # noqa: ANN001
    preds = np.concatenate([np.asarray(run(x[i:i + BATCH])).argmax(1)
                            for i in range(0, len(x), BATCH)])
    return float((preds == y).mean())


def test_trained_cnn_int8_accuracy(tmp_path) -> None:  # noqa: ANN001
    torch.set_num_threads(1)
    net = train()
    x_test, y_test = patterns(N_TEST, np.random.default_rng(1))
    x_cal, _ = patterns(2 * BATCH, np.random.default_rng(2))
    cal = [x_cal[:BATCH], x_cal[BATCH:]]
    example = torch.from_numpy(x_test[:BATCH])

    with torch.no_grad():
        acc_torch = _accuracy(lambda b: net(torch.from_numpy(b)).numpy(), x_test, y_test)
    assert acc_torch >= 0.95

    mod, params = from_torch(net, (example,))
    acc_float = _accuracy(kiln.build(mod, params=params), x_test, y_test)
    assert abs(acc_float - acc_torch) <= 0.005
    qmod, qparams = kiln.quantize(mod, params, calibration=cal, scheme="minmax")
    assert "qnn.conv2d" in kiln.astext(qmod)
    acc_kiln8 = _accuracy(kiln.build(qmod, params=qparams), x_test, y_test)
    assert acc_kiln8 >= acc_float - 0.01, (acc_kiln8, acc_float)

    buf = io.BytesIO()
    torch.onnx.export(net, (example,), buf, dynamo=False, input_names=["x"],
                      output_names=["y"], opset_version=17)
    fp32, qdq = tmp_path / "cnn.onnx", tmp_path / "cnn.qdq.onnx"
    fp32.write_bytes(buf.getvalue())
    q.quantize_static(str(fp32), str(qdq), Reader(cal), quant_format=q.QuantFormat.QDQ,
                      activation_type=q.QuantType.QUInt8, weight_type=q.QuantType.QInt8,
                      per_channel=True, reduce_range=True)
    sess = _session(qdq.read_bytes())
    acc_ort8 = _accuracy(lambda b: sess.run(None, {"x": b})[0], x_test, y_test)
    assert acc_ort8 >= acc_float - 0.01, (acc_ort8, acc_float)

    # kiln on ORT's QDQ file against ORT: argmax and output steps
    import onnx

    model = onnx.load(str(qdq))
    last = next(n for n in model.graph.node if n.output[0] == "y")
    assert last.op_type == "DequantizeLinear"
    init = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    step = float(init[last.input[1]])
    qm, qp = from_onnx(model)
    exe = kiln.build(qm, params=qp)
    got = np.concatenate([np.asarray(exe(x_test[i:i + BATCH])) for i in range(0, N_TEST, BATCH)])
    want = np.concatenate([sess.run(None, {"x": x_test[i:i + BATCH]})[0]
                           for i in range(0, N_TEST, BATCH)])
    steps = np.rint(np.abs(got - want) / step)
    assert steps.max() <= 1 and (steps > 0).mean() <= 0.02, (steps.max(), (steps > 0).mean())
    assert (got.argmax(1) == want.argmax(1)).mean() >= 0.995
    print(f"\naccuracy: torch {acc_torch:.4f}, kiln float32 {acc_float:.4f}, "
          f"kiln.quantize int8 {acc_kiln8:.4f}, ORT QDQ int8 {acc_ort8:.4f}; kiln on the QDQ "
          f"file vs ORT: {int((steps > 0).sum())} of {steps.size} outputs differ, max "
          f"{int(steps.max())} step")


@pytest.mark.slow
@pytest.mark.parametrize("scheme", ["percentile", "kl"])
def test_trained_cnn_other_schemes(scheme: str) -> None:
    torch.set_num_threads(1)
    net = train(n=3000, epochs=6)
    x_test, y_test = patterns(3000, np.random.default_rng(1))
    x_cal, _ = patterns(4 * BATCH, np.random.default_rng(2))
    mod, params = from_torch(net, (torch.from_numpy(x_test[:BATCH]),))
    acc_float = _accuracy(kiln.build(mod, params=params), x_test, y_test)
    cal = [x_cal[i:i + BATCH] for i in range(0, len(x_cal), BATCH)]
    qmod, qparams = kiln.quantize(mod, params, calibration=cal, scheme=scheme, percentile=99.99)
    acc8 = _accuracy(kiln.build(qmod, params=qparams), x_test, y_test)
    print(f"\n{scheme}: kiln float32 {acc_float:.4f}, kiln.quantize int8 {acc8:.4f}")
    assert acc_float >= 0.95 and acc8 >= acc_float - 0.01
