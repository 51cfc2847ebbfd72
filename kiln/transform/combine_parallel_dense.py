"""combine-parallel-dense: parallel dense layers of one input become one wider dense layer.

When at least ``min_num_branches`` (default 3, as TVM) ``nn.dense`` calls read the same input
node with weights of the same input width and dtype, they become one ``nn.dense`` on the
weights concatenated along the units (axis 0), and each branch takes its columns back with a
field of one ``split`` along the last axis. The branches may have different widths (the
query, key and value projections of an attention layer, or unequal heads).

TVM offers two forms: stacking the branches into one ``batch_matmul`` (its default, which
needs equal widths and copies the input once per branch) or one dense on concatenated
weights. kiln does the latter: it allows unequal widths, and reads the input once.
Option: ``config={"combine-parallel-dense.min_num_branches": n}``. The same safety rules as
combine-parallel-conv2d apply (see `combine_parallel`).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

from kiln.ir.expr import Call, Expr, Tuple
from kiln.ir.module import IRModule
from kiln.op import concatenate
from kiln.op.nn import dense
from kiln.transform.combine_parallel_conv2d import combine_module, min_branches
from kiln.transform.pass_manager import PassContext, module_pass


def dense_key(call: Call) -> Hashable | None:
    """Dense layers combine when their weights share the input width and dtype."""
    data, weight = call.args[0].checked_type, call.args[1].checked_type
    if not weight.is_static:  # type: ignore[attr-defined]
        return None
    return (weight.shape[1], weight.dtype, call.attrs.out_dtype, data.ndim)  # type: ignore


def dense_build(data: Expr, calls: Sequence[Call]) -> tuple[Expr, list[int], int]:
    """One dense over the weights concatenated along the units (axis 0)."""
    sizes = [c.args[1].checked_type.shape[0] for c in calls]  # type: ignore[attr-defined]
    weight = concatenate(Tuple(tuple(c.args[1] for c in calls)), axis=0)
    units = sum(sizes) if all(c.attrs.units is not None for c in calls) else None
    out = dense(data, weight, units=units, out_dtype=calls[0].attrs.out_dtype)
    return out, sizes, calls[0].args[0].checked_type.ndim - 1  # type: ignore[attr-defined]


@module_pass("combine-parallel-dense", opt_level=4)
def CombineParallelDense(mod: IRModule, ctx: PassContext) -> IRModule:
    """Combine parallel dense calls on one input into one wider dense and a split."""
    least = min_branches(ctx, "combine-parallel-dense")
    return combine_module(mod, "nn.dense", dense_key, dense_build, least)
