"""kiln graph's pictures checked as geometry: boxes apart and inside the canvas, every edge's
route starting on its producer and ending on its consumer; weights inside their operators with
their logical shapes; collapsed blocks; the layout's linear growth; PNG and PDF output."""

import struct
import sys
import time
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import kiln
from kiln.cli import main
from kiln.testing import models
from kiln.transform import PassContext
from kiln.viz import DrawOptions, picture
from kiln.viz.scene import Box, Scene

EPS = 1e-6


def _apart(a: Box, b: Box) -> bool:
    return (a.x + a.w <= b.x + EPS or b.x + b.w <= a.x + EPS or a.y + a.h <= b.y + EPS
            or b.y + b.h <= a.y + EPS)


def _inside(a: Box, outer: Box) -> bool:
    return (outer.x - EPS <= a.x and a.x + a.w <= outer.x + outer.w + EPS
            and outer.y - EPS <= a.y and a.y + a.h <= outer.y + outer.h + EPS)


def _all_apart(boxes: list[Box]) -> bool:
    """No two boxes overlap (pairs compared within 200-pixel bands of rows only)."""
    bands: dict[int, list[int]] = {}
    for i, b in enumerate(boxes):
        for k in range(int(b.y // 200), int((b.y + b.h) // 200) + 1):
            bands.setdefault(k, []).append(i)
    return all(_apart(boxes[i], boxes[j]) for band in bands.values()
               for a, i in enumerate(band) for j in band[a + 1:])


def _on_polyline(p, points) -> bool:
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        cross = (x1 - x0) * (p[1] - y0) - (y1 - y0) * (p[0] - x0)
        inside = (min(x0, x1) - EPS <= p[0] <= max(x0, x1) + EPS
                  and min(y0, y1) - EPS <= p[1] <= max(y0, y1) + EPS)
        if abs(cross) <= 1e-3 and inside:
            return True
    return False


def check_geometry(scene: Scene) -> None:
    """The picture's invariants (see the module docstring)."""
    graph = scene.graph
    canvas = Box(0, 0, scene.width, scene.height)
    outer = [scene.boxes[i] for i, n in enumerate(graph.nodes) if n.group is None]
    outer += list(scene.groups.values())
    assert all(_inside(b, canvas) for b in outer)
    assert _all_apart(outer)
    for g, box in scene.groups.items():
        mine = [scene.boxes[i] for i, n in enumerate(graph.nodes) if n.group == g]
        assert mine and all(_inside(b, box) for b in mine)
        assert _all_apart(mine)
    assert set(scene.routes) == set(graph.edges)
    corners: dict[int, set[tuple[float, float]]] = {}
    for (u, v), route in scene.routes.items():
        wires = [scene.wires[w] for w in route]
        start, end = wires[0][0], wires[-1][-1]
        bu, bv = scene.boxes[u], scene.boxes[v]
        assert start[1] == pytest.approx(bu.y + bu.h)
        assert bu.x - EPS <= start[0] <= bu.x + bu.w + EPS
        assert end[1] == pytest.approx(bv.y)
        assert bv.x - EPS <= end[0] <= bv.x + bv.w + EPS
        for a, b in zip(route, route[1:]):  # a branch leaves its trunk at one of its corners
            if a not in corners:
                corners[a] = {(round(x, 3), round(y, 3)) for x, y in scene.wires[a]}
            p = scene.wires[b][0]
            assert ((round(p[0], 3), round(p[1], 3)) in corners[a]
                    or _on_polyline(p, scene.wires[a])), (u, v)


def shared_input(n: int) -> kiln.IRModule:
    """A chain of n operators, each also reading the input x."""
    x = kiln.var("x", shape=(1, 4), dtype="float32")
    e = x
    for i in range(n):
        e = kiln.op.add(e, x) if i % 2 else kiln.op.multiply(x, e)
    return kiln.IRModule.from_expr(kiln.Function([x], e))


def conv_model() -> kiln.IRModule:
    """Two conv2d + relu layers and a residual add, weights as constants."""
    r = np.random.default_rng(0)
    x = kiln.var("x", shape=(1, 3, 16, 16), dtype="float32")
    w1 = kiln.const(r.standard_normal((16, 3, 3, 3)).astype("float32"))
    w2 = kiln.const(r.standard_normal((16, 16, 3, 3)).astype("float32"))
    h = kiln.op.nn.relu(kiln.op.nn.conv2d(x, w1, strides=(2, 2), padding=(1, 1)))
    y = kiln.op.nn.relu(kiln.op.add(kiln.op.nn.conv2d(h, w2, padding=(1, 1)), h))
    return kiln.IRModule.from_expr(kiln.Function([x], y))


@pytest.mark.parametrize("blocked", [False, True])
def test_a_fused_cnn_draws_weights_inside_with_their_logical_shapes(blocked: bool):
    # packed for the NCHW GEMM, or in channel blocks by convert-layout: drawn as OIHW
    label = "nn.contrib_conv2d_NCHWc" if blocked else "nn.conv2d_packed"
    with PassContext(config={"convert-layout": blocked}):
        fused = kiln.optimize(conv_model())
    assert label in kiln.astext(fused)  # the weights are packed
    scene = picture(fused, options=DrawOptions(attrs=True))
    check_geometry(scene)
    graph = scene.graph
    assert not [n for n in graph.nodes if n.kind == "constant"]
    convs = [scene.text[i] for i, n in enumerate(graph.nodes)
             if n.label in (label, "nn.conv2d_winograd")]
    assert [t[2] for t in convs] == ["weight float32[16, 3, 3, 3]",
                                     "weight float32[16, 16, 3, 3]"]
    assert "strides=[2, 2]" in convs[0] and "padding=[1, 1, 1, 1]" in convs[0]
    # Edges inside a group are drawn: conv2d -> relu in the first group.
    inner = [(u, v) for u, v in graph.edges if graph.nodes[u].group is not None
             and graph.nodes[u].group == graph.nodes[v].group]
    assert inner


def test_the_pictures_of_models_keep_their_geometry():
    mod, params = models.mlp()
    for m in (kiln.optimize(mod, params=params), mod):
        check_geometry(picture(m, weights=set(params)))
    check_geometry(picture(shared_input(300)))


def _lstm_model(path: Path) -> onnx.ModelProto:
    r = np.random.default_rng(0)
    steps, hidden = 3, 5
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["Y", "Yh"], name="lstm1",
                              hidden_size=hidden),
             helper.make_node("Squeeze", ["Y", "axis"], ["ys"], name="squeeze"),
             helper.make_node("Relu", ["ys"], ["out"], name="relu")]
    graph = helper.make_graph(
        nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [steps, 1, 4])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, [steps, 1, hidden])],
        [numpy_helper.from_array(r.standard_normal((1, 4 * hidden, 4)).astype("float32"), "W"),
         numpy_helper.from_array(r.standard_normal((1, 4 * hidden, hidden)).astype("float32"),
                                 "R"),
         numpy_helper.from_array(r.standard_normal((1, 8 * hidden)).astype("float32"), "B"),
         numpy_helper.from_array(np.array([1], dtype=np.int64), "axis")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, path)
    return model


@pytest.mark.parametrize("unfused", [False, True])
def test_an_onnx_lstm_collapses_into_one_named_box(tmp_path, unfused):
    path = tmp_path / "lstm.onnx"
    _lstm_model(path)
    out = tmp_path / "lstm.svg"
    flags = ["--unfused"] if unfused else []
    assert main(["graph", str(path), *flags, "-o", str(out)]) == 0
    boxes = out.read_text().count('class="node"') + out.read_text().count('class="member"')
    assert boxes > 40  # the LSTM's operators, one box each
    assert main(["graph", str(path), *flags, "--collapse", "--names", "--attrs",
                 "-o", str(out)]) == 0
    text = out.read_text()
    assert text.count('data-kind="block"') == 1
    for line in ("LSTM", "W float32[1, 20, 4]", "hidden_size=5", "lstm1 (LSTM)",
                 "relu (Relu)"):
        assert f">{line}</text>" in text
    assert main(["graph", str(path), *flags, "--collapse", "Relu", "-o", str(out)]) == 0
    assert 'data-kind="block"' not in out.read_text()  # Relu is one operator: nothing merged


def test_collapsing_fused_groups_of_relay_text(tmp_path):
    source = tmp_path / "cnn.rly"
    source.write_text(kiln.astext(conv_model()))
    out = tmp_path / "cnn.svg"
    assert main(["graph", str(source), "--collapse", "--names", "-o", str(out)]) == 0
    text = out.read_text()
    assert 'class="group"' not in text and text.count('data-kind="block"') >= 2
    assert main(["graph", str(source), "--names", "--unfused", "-o", str(out)]) == 0
    assert ">cnn.rly:" in out.read_text()  # named by file and line


def _cost(n: int) -> tuple[float, int, Scene]:
    mod = shared_input(n)
    start = time.perf_counter()
    scene = picture(mod)
    return time.perf_counter() - start, sum(len(w) for w in scene.wires), scene


def test_layout_grows_linearly_when_one_input_feeds_every_operator():
    # One chain of dummy nodes per producer, not per edge: twice the operators, twice the
    # wire points (one chain per edge made it n^2 / 2) and about twice the time.
    t1, points1, _ = _cost(1000)
    t2, points2, scene = _cost(2000)
    assert points2 <= 2.1 * points1
    assert t2 <= 4 * t1 + 0.5
    check_geometry(scene)


@pytest.mark.slow
def test_ten_thousand_operators_reading_one_input_in_seconds():
    seconds, points, _ = _cost(10000)
    assert seconds < 10 and points < 100_000


def _png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">II", data[16:24])


def test_png_and_pdf_through_cairosvg(tmp_path):
    pytest.importorskip("cairosvg", reason="cairosvg (pip install 'kiln[graph]') is not "
                        "installed")
    source = tmp_path / "cnn.rly"
    source.write_text(kiln.astext(conv_model()))
    assert main(["graph", str(source), "-o", str(tmp_path / "cnn.png")]) == 0
    assert main(["graph", str(source), "-o", str(tmp_path / "cnn.pdf")]) == 0
    assert (tmp_path / "cnn.pdf").read_bytes()[:5] == b"%PDF-"
    scene = picture(kiln.optimize(conv_model()))
    width, height = _png_size((tmp_path / "cnn.png").read_bytes())
    assert abs(width - scene.width) <= 1 and abs(height - scene.height) <= 1


def test_unknown_formats_and_a_missing_converter_are_refused(tmp_path, monkeypatch, capsys):
    source = tmp_path / "cnn.rly"
    source.write_text(kiln.astext(conv_model()))
    assert main(["graph", str(source), "-o", str(tmp_path / "cnn.jpg")]) == 1
    assert "writes .svg, .png, .pdf files, not '.jpg'" in capsys.readouterr().err
    assert not (tmp_path / "cnn.jpg").exists()
    monkeypatch.setitem(sys.modules, "cairosvg", None)  # as if it were not installed
    assert main(["graph", str(source), "-o", str(tmp_path / "cnn.png")]) == 1
    err = capsys.readouterr().err
    assert "needs cairosvg" in err and "pip install 'kiln[graph]'" in err
    assert not (tmp_path / "cnn.png").exists()


def test_a_winograd_convolution_draws_its_weight_as_oihw():
    r = np.random.default_rng(1)
    x = kiln.var("x", shape=(1, 16, 32, 32), dtype="float32")
    w = kiln.const(r.standard_normal((16, 16, 3, 3)).astype("float32"))
    fused = kiln.optimize(kiln.IRModule.from_expr(kiln.Function(
        [x], kiln.op.nn.relu(kiln.op.nn.conv2d(x, w, padding=(1, 1))))))
    assert "nn.conv2d_winograd" in kiln.astext(fused)  # 64 tiles of 4×4: Winograd
    scene = picture(fused, options=DrawOptions(attrs=True))
    convs = [scene.text[i] for i, n in enumerate(scene.graph.nodes)
             if n.label == "nn.conv2d_winograd"]
    assert [t[2] for t in convs] == ["weight float32[16, 16, 3, 3]"]
