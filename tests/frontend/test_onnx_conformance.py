"""The ONNX backend tests that ship in the onnx package, run through kiln.

Node tests: every case of ``onnx.backend.test.case.node`` is imported with `from_onnx`, run by
the reference interpreter and compared with the case's expected outputs (`conformance.py`).
The per-operator report goes to a file in the test's tmp dir (its path and the summary are
printed); the test holds kiln to ≥ 60% of all cases and ≥ 80% of the float32 cases of every
operator kiln's converter table implements.

Model tests: the ``light`` models (``onnx/backend/test/data/light``: the zoo's architectures
with constant weights) on the input ONNX's runner feeds them, against the stored expected
output and ONNX Runtime. The ``real`` models' data is downloaded on demand by ONNX's runner;
where it is not present, those tests are skipped and say so.
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper

import kiln
from kiln.frontend import from_onnx
from kiln.frontend.onnx.conformance import Report, collect_cases, run_cases

DATA = pathlib.Path(onnx.__file__).parent / "backend" / "test" / "data"


def test_node_cases_pass_rates(tmp_path):
    report = Report(run_cases(collect_cases()))
    table = tmp_path / "onnx_node_tests.txt"
    table.write_text(report.table())
    print(f"\n{report.summary()}\nper-operator report: {table}")
    n = len(report.results)
    assert n > 1500, f"only {n} node cases were collected"
    assert report.passed >= 0.6 * n, report.summary()
    below = report.below(0.8)
    assert not below, "implemented operators under 80% of their float32 cases: " + ", ".join(
        f"{s.operator} {s.float32_passed}/{s.float32}" for s in below)
    # An operator is never named "" (a case of Constant alone is Constant's).
    assert "" not in report.by_operator()


# --- light models ------------------------------------------------------------------------


def _light_input(model: onnx.ModelProto) -> tuple[str, np.ndarray]:
    """The input ONNX's runner gives a light model: arange(n) / n in the input's shape."""
    inits = {t.name for t in model.graph.initializer}
    (info,) = [i for i in model.graph.input if i.name not in inits]
    shape = tuple(d.dim_value if d.HasField("dim_value") else 1
                  for d in info.type.tensor_type.shape.dim)
    n = int(np.prod(shape))
    return info.name, (np.arange(n).reshape(shape) / n).astype("float32")


def _with_logits(model: onnx.ModelProto, shape: tuple[int, ...]) -> onnx.ModelProto:
    """The model with the input of its final Softmax as a second output.

    The light models' constant weights make every class score equal up to rounding, at
    magnitudes near 1e10: the softmax of those is uniform only when the rounding is
    identical, so the scores themselves (compared at a relative tolerance) are the real check.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    last = out.graph.node[-1]
    if last.op_type == "Softmax":
        # Softmax keeps the shape of its input.
        out.graph.output.append(helper.make_tensor_value_info(last.input[0],
                                                              onnx.TensorProto.FLOAT, shape))
    return out


def _ort(model: onnx.ModelProto, name: str, x: np.ndarray) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, {name: x})


LIGHT = ["squeezenet", "zfnet512", "bvlc_alexnet", "inception_v1", "inception_v2",
         "resnet50", "shufflenet", "vgg19", "densenet121"]


def light_params(compiled: bool) -> list:
    fast = {"squeezenet"} if not compiled else set()
    return [pytest.param(m, marks=() if m in fast else pytest.mark.slow) for m in LIGHT]


@pytest.mark.parametrize("name", light_params(compiled=False))
def test_light_model_interpreted(name):
    check_light(name, compiled=False)


@pytest.mark.parametrize("name", light_params(compiled=True))
def test_light_model_compiled(name):
    check_light(name, compiled=True)


def check_light(name: str, compiled: bool) -> None:
    path = DATA / "light" / f"light_{name}.onnx"
    if not path.exists():
        pytest.skip(f"{path} is not in this onnx package")
    expected = onnx.numpy_helper.to_array(
        onnx.load_tensor(str(DATA / "light" / f"light_{name}_output_0.pb")))
    model = _with_logits(onnx.load(str(path)), expected.shape)
    input_name, x = _light_input(model)
    reference = _ort(model, input_name, x)
    mod, params = from_onnx(model)
    got = (kiln.build(mod, params=params)(x) if compiled
           else kiln.interpret(mod, x, params=params))
    outs = [np.asarray(g) for g in (got if isinstance(got, tuple) else (got,))]
    assert outs[0].shape == expected.shape
    np.testing.assert_allclose(reference[0], expected, rtol=1e-5, atol=1e-6)
    if len(outs) == 2:  # the class scores, then their softmax (see _with_logits)
        scale = float(np.abs(reference[1]).max()) or 1.0
        np.testing.assert_allclose(outs[1] / scale, reference[1] / scale, rtol=0, atol=1e-5)
        np.testing.assert_allclose(outs[0], expected, rtol=0, atol=5e-3)
    else:
        np.testing.assert_allclose(outs[0], expected, rtol=1e-4, atol=1e-5)


def test_real_models():
    present = [d for d in sorted((DATA / "real").glob("test_*"))
               if (d / "model.onnx").exists() and any(d.glob("test_data_set_*"))]
    if not present:
        pytest.skip("the `real` models' files are not in this onnx package (ONNX's runner "
                    "downloads them; this machine has no network)")
    for directory in present:
        model = onnx.load(str(directory / "model.onnx"))
        mod, params = from_onnx(model)
        for data in sorted(directory.glob("test_data_set_*")):
            inputs = [onnx.numpy_helper.to_array(onnx.load_tensor(str(p)))
                      for p in sorted(data.glob("input_*.pb"))]
            outputs = [onnx.numpy_helper.to_array(onnx.load_tensor(str(p)))
                       for p in sorted(data.glob("output_*.pb"))]
            got = kiln.interpret(mod, *inputs, params=params)
            got = list(got) if isinstance(got, tuple) else [got]
            for g, e in zip(got, outputs):
                np.testing.assert_allclose(np.asarray(g), e, rtol=1e-3, atol=1e-5,
                                           err_msg=f"{directory.name}, {data.name}")
