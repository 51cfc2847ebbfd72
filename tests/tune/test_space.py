"""The search spaces are legal: candidates of awkward shapes verify and compute what the
default schedule and the reference interpreter compute (kiln/loops/tunable.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest

import kiln
from kiln.codegen.cache import fingerprint
from kiln.ir.traverse import post_order
from kiln.loops import (
    conv_grad_kernels,
    gemm,
    int8_amx,
    int8_conv,
    int8_gemm,
    linear_kernels,
    nchwc_kernels,
    winograd,
    winograd_nchwc,
)
from kiln.loops.conv_kernels import conv_space
from kiln.loops.lower import lower_primitive
from kiln.loops.tunable import ScheduleOverrides, Space, overrides_scope
from kiln.target import Target
from kiln.tune.measure import build_candidate
from kiln.tune.sites import Site, site_of


def _oracle(site: Site) -> np.ndarray:
    """The reference interpreter on the site's program (weights bound by name)."""
    mod, params, inputs = site.program()
    names = [p.name_hint for p in mod["main"].params]
    args = [params[n] if n in params else inputs.pop(0) for n in names]
    return np.asarray(kiln.interpret(mod, *args))


def _points(space: Space, extra: int, seed: int = 0) -> list[dict]:
    """The default, every one-knob move from it (what the greedy search tries first), and
    ``extra`` random points of the whole space."""
    points = [space.default, *space.neighbours(space.default)]
    rest = [p for p in space.points() if p not in points]
    random.Random(seed).shuffle(rest)
    return points + rest[:extra]


def _covering(space: Space) -> list[dict]:
    """A few legal points in which every value of every knob appears (point i takes each
    knob's i-th value where that stays legal; one-knob moves cover what is left)."""
    points = [space.default]
    longest = max(len(v) for _, v in space.knobs)
    for i in range(1, longest):
        point = dict(space.default)
        for name, values in space.knobs:
            moved = {**point, name: values[i % len(values)]}
            if space.legal(moved):
                point = moved
        points.append(point)
    seen = {(n, str(p[n])) for p in points for n in p}
    for point in space.points():  # values legal only with others changed too
        if any((n, str(v)) not in seen for n, v in point.items()):
            points.append(point)
            seen |= {(n, str(v)) for n, v in point.items()}
    return points


def _check_all(space: Space, extra: int, points: list[dict] | None = None,
               target: Target | None = None) -> None:
    target = target or Target.host()
    site = site_of(space.key, target)
    assert site is not None, space.key
    expected = _oracle(site)
    k = max(1, site.flops // (2 * expected.size))
    scale = np.abs(expected).max()
    tuned = 0
    for knobs in points if points is not None else _points(space, extra):
        cand = build_candidate(site, knobs, target)
        assert cand.output.shape == expected.shape
        err = np.abs(cand.output.astype(np.float64) - expected).max()
        assert err <= 1e-5 * scale * np.sqrt(k), (knobs, err)
        tuned += cand.tuned
    assert tuned >= 1  # the moves did reach the kernel


HOST = Target.host()
LANES = HOST.lanes("float32")

SPACES = {
    # dense on a constant weight (its panels prepacked): 7 rows, 21 units, K 19
    "dense prepacked": lambda: gemm.space_of(1, 7, 21, 19, b_prepacked=True),
    # dense of one row (dot products): 37 units (blocks and the rows left), K with a tail;
    # and a narrow dense of 9 rows and 10 units (the rows split)
    "dot": lambda: linear_kernels.dot_space(1, 37, 300),
    "dot narrow": lambda: linear_kernels.dot_space(9, 10, 64),
    # batch_matmul with a batch, odd sizes, K in two blocks or more
    "batch_matmul": lambda: gemm.space_of(3, 5, 21, 37),
    # conv2d 3x3 stride 2, odd channels and image (the weight prepacked)
    "conv2d stride 2": lambda: conv_space((1, 5, 11, 9), (7, 5, 3, 3), (2, 2), (1, 1), (1, 1),
                                          1, (1, 7, 6, 5)),
    # conv2d 3x3, K = 144: the prepacked weight's K blocks may split it evenly (72 × 2)
    "conv2d K blocks": lambda: conv_space((1, 16, 6, 6), (8, 16, 3, 3), (1, 1), (1, 1), (1, 1),
                                          1, (1, 8, 6, 6)),
    # 1x1 conv on a variable weight (nothing prepacked: every knob free)
    "conv2d 1x1": lambda: conv_space((1, 6, 5, 7), (9, 6, 1, 1), (1, 1), (0, 0), (1, 1), 1,
                                     (1, 9, 5, 7), prepacked=False),
    # a Winograd convolution's products (49 tiles, odd channels; U packed for each point)
    "winograd": lambda: winograd.space((1, 9, 28, 28), (1, 10, 28, 28), (1, 1), 4),
    # a blocked direct convolution's register tile: 3 blocks of 16 outputs, 11-pixel rows,
    # border rows and columns; and a plain-NCHW stem of stride 2
    "conv2d_nchwc": lambda: nchwc_kernels.space((1, 2, 9, 11, 16), (3, 2, 3, 3, 16, 16),
                                                (1, 1), (1, 1), (1, 1), (1, 3, 9, 11, 16)),
    "conv2d_nchwc stem": lambda: nchwc_kernels.space((1, 3, 13, 13), (2, 3, 3, 3, 1, 16),
                                                     (2, 2), (1, 1), (1, 1),
                                                     (1, 2, 7, 7, 16)),
    # a blocked depthwise convolution: 2 blocks, stride 2, 13-pixel rows at the borders
    "depthwise_nchwc": lambda: nchwc_kernels.depthwise_space(
        (1, 2, 25, 26, LANES), (2, 1, 3, 3, 1, LANES), (2, 2), (1, 1), (1, 1),
        (1, 2, 13, 13, LANES)),
    # a Winograd convolution's products on blocks: 2 blocks in, 3 out, a 26×27 image whose
    # last tiles stick out (U packed for each point's nr; A read in place for any mr)
    "winograd_nchwc": lambda: winograd_nchwc.space(
        (1, 2, 26, 27, LANES), (1, 3, 26, 27, LANES), (1, 1), 4),
    # ... in blocks of two vectors (a model whose tuning log says so): its program is built
    # in those blocks too
    "winograd_nchwc two vectors": lambda: winograd_nchwc.space(
        (1, 1, 26, 27, 2 * LANES), (1, 2, 26, 27, 2 * LANES), (1, 1), 4),
    # int8 products into int32 (exact): an int8 × int8 dense of 5 rows on a constant weight
    # (its panels packed for each point's nr; A shifted by 128 on VNNI), K with a tail of the
    # 4 bytes a lane packs, 70 units; uint8 × uint8 on a variable weight (the widening form:
    # only its blocks and parallel loop move); an int8 batch_matmul of 3
    # conv2d's weight gradient (a training step's): the adjoint in A's panels, B from the
    # phase planes (6 channels, stride 2) or read in place from a channels-last copy (32
    # channels), its images split between the threads (24² pixels a chunk) or not
    "weight grad planes": lambda: conv_grad_kernels.weight_space(
        (2, 8, 5, 5), (2, 6, 10, 10), (3, 3), (2, 2), (1, 1), (1, 1)),
    "weight grad planes split": lambda: conv_grad_kernels.weight_space(
        (4, 8, 20, 20), (4, 6, 20, 20), (3, 3), (1, 1), (1, 1), (1, 1)),
    "weight grad channels last split": lambda: conv_grad_kernels.weight_space(
        (2, 12, 24, 24), (2, 32, 24, 24), (3, 3), (1, 1), (1, 1), (1, 1)),
    "int8 dense prepacked": lambda: int8_gemm.space("dense_prepacked", 1, 5, 70, 301, "int8",
                                                    "int8"),
    "int8 dense": lambda: int8_gemm.space("dense", 1, 13, 37, 66, "uint8", "uint8"),
    "int8 batch_matmul": lambda: int8_gemm.space("batch_matmul", 3, 9, 21, 35, "int8", "int8"),
}


@pytest.mark.parametrize("name", list(SPACES))
def test_candidates_match_the_oracle(name: str) -> None:
    # every value of every knob, in a few candidates (the slow form: each one-knob move
    # and random points of the whole space)
    space = SPACES[name]()
    points = _covering(space)
    legal = {(n, str(p[n])) for p in space.points() for n in p}
    assert {(n, str(v)) for n, vs in space.knobs for v in vs} == legal  # no dead values
    assert {(n, str(p[n])) for p in points for n in p} == legal
    _check_all(space, 0, points)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(SPACES))
def test_more_candidates_match_the_oracle(name: str) -> None:
    _check_all(SPACES[name](), extra=40)


# The host without AMX, whose 8-bit convolutions run on tiles instead (no site)
NO_AMX = Target.parse("llvm -mattr=-amx-tile")

INT8_CONVS = {
    # int8 × int8 (the data shifted by 128 on VNNI), 3×3 stride 2, odd channels and image:
    # the weight's panels packed for each point's mr
    "int8 conv stride 2": lambda: int8_conv.space((1, 13, 11, 9), (24, 13, 3, 3), (2, 2),
                                                  (1, 1), (1, 1), (1, 24, 6, 5), "int8",
                                                  "int8", NO_AMX),
    # uint8 × uint8 (int16 pairs: only the blocks and the parallel loop move), 3×3
    "int8 conv uint8": lambda: int8_conv.space((1, 6, 10, 12), (20, 6, 3, 3), (1, 1), (1, 1),
                                               (1, 1), (1, 20, 10, 12), "uint8", "uint8",
                                               NO_AMX),
    # uint8 data × int8 weight (what kiln.quantize and ONNX's QDQ convolutions run: VNNI's
    # own operand types), 3×3 with a ragged last column tile
    "int8 conv uint8 x int8": lambda: int8_conv.space((1, 10, 9, 13), (36, 10, 3, 3), (1, 1),
                                                      (1, 1), (1, 1), (1, 36, 9, 13), "uint8",
                                                      "int8", NO_AMX),
}


@pytest.mark.parametrize("name", list(INT8_CONVS))
def test_int8_convolution_candidates_match_the_oracle(name: str) -> None:
    space = INT8_CONVS[name]()
    assert space is not None
    assert site_of(space.key, HOST) is None or not int8_amx.usable(HOST)  # AMX's, here
    _check_all(space, 0, _covering(space), NO_AMX)


@pytest.mark.skipif(not int8_amx.usable(HOST), reason="the host has no AMX tiles to run")
def test_amx_dense_candidates_match_the_oracle() -> None:
    # an int8 dense on AMX tiles: 40 rows (a pair of row tiles and a lone one), 150 units
    # (pairs of column tiles and a lone one), K 200 with a tail in the last tile step
    space = int8_amx.dense_space(40, 150, 200, "int8", "int8")
    points = _covering(space)
    assert {(n, str(p[n])) for p in points for n in p} == \
        {(n, str(p[n])) for p in space.points() for n in p}
    _check_all(space, 0, points)


@pytest.mark.slow
def test_grouped_and_large_k_conv_candidates() -> None:
    # groups of 2; K = 64·9 = 576 in several blocks; pixels as rows (K ≥ 1024) on 4×4
    _check_all(conv_space((1, 8, 7, 7), (6, 4, 3, 3), (1, 1), (1, 1), (1, 1), 2,
                          (1, 6, 7, 7)), extra=10)
    _check_all(conv_space((1, 128, 4, 4), (24, 128, 3, 3), (1, 1), (1, 1), (1, 1), 1,
                          (1, 24, 4, 4)), extra=10)


def test_space_declares_the_default_first() -> None:
    base = gemm.GemmSchedule.heuristic(1, 64, 96, 300)
    space = gemm.space_of(1, 64, 96, 300)
    assert space.default == gemm.tile_knobs(base)
    assert space.legal(space.default)
    for _, values in space.knobs:
        assert len(set(map(str, values))) == len(values)  # no value twice
    # a tile that would not fit the registers is not a point of the space
    lanes, regs = HOST.lanes("float32"), HOST.registers
    too_tall = {**space.default, "nr": 2 * lanes, "mr": (regs - 3) // 2 + 2}
    assert not space.legal(too_tall)
    # a prepacked weight keeps its K blocking (its panels' width follows the schedule:
    # alter-layout packs it for the tuned nr, which "dense prepacked" above checks)
    packed = gemm.space_of(1, 64, 96, 300, b_prepacked=True)
    assert len(packed.values("nr")) > 1 and len(packed.values("kc")) == 1
    # a prepacked conv weight's K blocks, only those covering its padded K exactly (the
    # panels' layout): K = 576 in 3 blocks of 192, or 2, 4 or 6 even ones
    conv = conv_space((1, 64, 56, 56), (64, 64, 3, 3), (1, 1), (1, 1), (1, 1), 1,
                      (1, 64, 56, 56))
    kcs = conv.values("kc")
    assert len(kcs) > 1 and all(kc * -(-576 // kc) == kcs[0] * -(-576 // kcs[0])
                                for kc in kcs)
    # points that build one kernel are measured once: blocks beyond M's tiles are all of M
    mt = -(-64 // space.default["mr"])
    assert space.same_kernel_as({**space.default, "mb": mt}) == space.same_kernel_as(
        {**space.default, "mb": 2 * mt})


def _dense_primitive() -> kiln.Function:
    x = kiln.var("x", shape=(40, 50), dtype="float32")
    w = kiln.var("w", shape=(30, 50), dtype="float32")
    fused = kiln.infer_types(kiln.optimize(kiln.IRModule.from_expr(
        kiln.Function([x, w], kiln.op.nn.dense(x, w)))))
    return next(f for f in post_order(fused["main"])
                if isinstance(f, kiln.Function) and f.attrs.get("Primitive"))


def test_overrides_are_scoped_and_change_the_cache_key() -> None:
    prim = _dense_primitive()
    plain = lower_primitive(prim, "d")
    (_, knobs), = plain.attrs["schedules"]
    space = gemm.space_of(1, 40, 30, 50)
    assert knobs["key"] == space.key and not knobs["tuned"]
    move = next(p for p in space.neighbours(space.default) if p["unroll"] != 1)
    tuned = lower_primitive(prim, "d", overrides=ScheduleOverrides({space.key: move}))
    (_, got), = tuned.attrs["schedules"]
    assert got["tuned"] and got["unroll"] == move["unroll"]
    assert fingerprint(tuned) != fingerprint(plain)  # machine code cached apart
    with overrides_scope(ScheduleOverrides({space.key: move})):
        (_, inside), = lower_primitive(prim, "d").attrs["schedules"]
    (_, after), = lower_primitive(prim, "d").attrs["schedules"]
    assert inside["tuned"] and not after["tuned"]  # nothing leaks out of the scope


def test_illegal_knobs_fall_back_to_the_default(caplog: pytest.LogCaptureFixture) -> None:
    prim = _dense_primitive()
    space = gemm.space_of(1, 40, 30, 50)
    bad = {**space.default, "nr": HOST.lanes("float32") + 1}  # not whole vectors
    with caplog.at_level("WARNING", logger="kiln"):
        kernel = lower_primitive(prim, "d", overrides=ScheduleOverrides({space.key: bad},
                                                                         "bad.tunelog"))
    (_, got), = kernel.attrs["schedules"]
    assert not got["tuned"] and got["nr"] == space.default["nr"]
    assert "not a legal schedule" in caplog.text
