"""Transposes whose reads would thrash L1 run tiled (kiln/loops/transposed_nest.py): the same
values as numpy, fused consumers included, on one and two threads."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.codegen import threads
from kiln.loops.printer import kernel_text
from kiln.runtime.compiler import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")

RNG = np.random.default_rng(3)


@pytest.mark.parametrize("shape,axes,tiled", [
    ((1024, 256), (1, 0), True),  # rows 1 KB apart: the column walk thrashes
    ((8, 128, 4, 64), (0, 2, 3, 1), True),
    ((96, 2, 64), (2, 1, 0), True),
    ((8, 4, 128, 64), (0, 1, 3, 2), False),  # 128 rows 256 B apart fit L1: as it was
    ((100, 300), (1, 0), False),  # extents that tiles do not cover exactly
])
def test_transposes_tile_where_reads_thrash(shape: tuple, axes: tuple, tiled: bool) -> None:
    x = kiln.var("x", shape=shape, dtype="float32")
    b = kiln.var("b", shape=(shape[axes[-1]],), dtype="float32")
    body = kiln.op.nn.relu(kiln.op.add(kiln.op.transpose(x, axes=axes), b))
    exe = kiln.build(kiln.IRModule.from_expr(kiln.Function([x, b], body)))
    (f,) = exe.kernels.functions.values()
    assert ("b in [0, +" in kernel_text(f.kernel)) == tiled  # the blocks' loops
    a = RNG.standard_normal(shape).astype(np.float32)
    bias = RNG.standard_normal(shape[axes[-1]]).astype(np.float32)
    results = []
    for count in (1, 2):
        with threads(count):
            results.append(exe(a, bias))
    want = np.maximum(a.transpose(axes) + bias, 0)
    np.testing.assert_array_equal(results[0], want)
    np.testing.assert_array_equal(results[1], want)
