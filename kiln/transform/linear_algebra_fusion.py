"""linear-algebra-fusion: a matrix product and its elementwise epilogue become one kernel.

DLVM fuses linear algebra with what follows it, so that ``relu(dense(x, w) + b)`` runs as a
single kernel that applies the bias and the activation to each output element as the matrix
product produces it, instead of writing the product to memory and reading it back twice.

This is one rule of `FuseOps`' machinery, run on its own: the same dataflow graph, the same
post-dominator tree, the same group-growing partitioner, with a rule table of one entry —
FuseOps' first rule (an OUT_ELEMWISE_FUSABLE operator absorbs the elementwise and
broadcast operators that post-dominate it through elementwise edges), restricted to groups
anchored by a matrix product (`LINEAR_ALGEBRA_OPS`). Only those groups become primitive
functions; every other operator is left as it was. Running it before ``fuse-ops`` therefore
settles the matrix kernels first — FuseOps treats a call of a primitive function as opaque —
and FuseOps goes on to fuse the rest (conv2d epilogues, injective chains, reductions).
On the matrix products themselves the two agree: FuseOps run alone builds the same groups.
"""

from __future__ import annotations

from kiln.ir.module import IRModule
from kiln.op.registry import OpPattern
from kiln.transform.fuse_ops import (
    ELEMWISE,
    FusionRule,
    Partition,
    fuse_module,
    resolve_max_depth,
)
from kiln.transform.pass_manager import PassContext, module_pass

LINEAR_ALGEBRA_OPS = frozenset({"nn.dense", "nn.batch_matmul", "nn.matmul"})

LINEAR_ALGEBRA_RULES: tuple[FusionRule, ...] = (
    FusionRule(
        "a matrix product absorbs its elementwise epilogue",
        phases=frozenset({0}),
        kinds=frozenset({OpPattern.OUT_ELEMWISE_FUSABLE}),
        relation=lambda p: p == ELEMWISE,
        path=lambda p: p <= OpPattern.BROADCAST,
        sink=lambda p: p <= OpPattern.BROADCAST,
        anchors=LINEAR_ALGEBRA_OPS,
    ),
)


def _is_linear_algebra_kernel(part: Partition, root: int) -> bool:
    return part.anchor_op(root) in LINEAR_ALGEBRA_OPS


@module_pass("linear-algebra-fusion", opt_level=1)
def LinearAlgebraFusion(mod: IRModule, ctx: PassContext) -> IRModule:
    """Fuse each dense/batch_matmul with its elementwise epilogue into a primitive function."""
    depth = resolve_max_depth(None, ctx)
    return fuse_module(mod, LINEAR_ALGEBRA_RULES, depth, wrap=_is_linear_algebra_kernel)
