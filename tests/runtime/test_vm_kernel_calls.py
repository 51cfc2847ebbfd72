"""The VM's calls into compiled kernels: unchecked where every register is the VM's own
(allocated to the kernel's shapes, results of kernels, inputs checked at the boundary),
checked where the program reads references, whose contents a caller may have swapped."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.runtime.compiler import native_available

pytestmark = pytest.mark.skipif(not native_available(), reason="needs llvmlite")


def test_a_reference_holding_a_wrong_array_is_an_error_not_a_crash() -> None:
    exe = kiln.build(kiln.parse("""
    def @main(%r: ref(Tensor[(64), float32])) -> Tensor[(64), float32] {
      nn.relu(ref_read(%r))
    }
    """))
    assert exe.stats().executor == "vm"
    np.testing.assert_array_equal(exe(kiln.RefValue(np.full(64, -1.0, "float32"))),
                                  np.zeros(64, "float32"))
    for bad in (np.ones(3, "float32"), np.ones(64, "float64"), np.ones(128, "float32")[::2]):
        with pytest.raises(kiln.Error, match="p0 (must be a float32\\[64\\]|is not C-contig)"):
            exe(kiln.RefValue(bad))


def test_adt_fields_are_checked_at_the_boundary() -> None:
    # no references: the kernels take the registers unchecked, so a leaf of the wrong shape
    # must be refused when the tree comes in
    from kiln.eval.values import ConstructorValue
    from kiln.testing import models

    mod, params = models.tree_lstm(embed=12, hidden=8)
    exe = kiln.build(mod, params=params)
    leaf, node = mod.get_constructor("Leaf"), mod.get_constructor("Node")
    good = ConstructorValue(leaf, (np.ones((1, 12), "float32"),))
    assert exe(ConstructorValue(node, (good, good))).shape == (1, 8)
    bad = ConstructorValue(leaf, (np.ones((1, 11), "float32"),))
    with pytest.raises(kiln.Error, match="field 0 of Leaf"):
        exe(ConstructorValue(node, (good, bad)))
