"""kiln.optimize: the standard pipeline for inference, as a straight list of named passes."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kiln.errors import Error
from kiln.ir.module import IRModule
from kiln.transform import (  # noqa: F401 - registers the passes
    qdq_to_qnn,
    qnn_canonicalize,
    static_closures,
)
from kiln.transform.bind_params import bind_params
from kiln.transform.pass_manager import PassContext, Sequential, get_pass

# The standard inference pipeline (TVM's relay.build order, plus DLVM's algebraic passes).
# Each step is a registered pass name; a step whose opt_level exceeds the context's is skipped.
STANDARD_PIPELINE = (
    "inline-partitions",  # functions meant for external compilers (BYOC) run through kiln
    "infer-type",
    "specialize-closures",  # static closures and references (higher-order AD) evaluated away
    "to-graph-normal-form",  # pure lets become dataflow, so fusion sees across them
    "qdq-to-qnn",  # ONNX QDQ: dequantize -> conv/dense -> quantize as integer arithmetic
    "simplify-inference",
    "eliminate-common-subexpr",
    "fold-constant",
    "qnn-canonicalize",  # qnn.* as core integer operators (the int8 kernels)
    "simplify-expr",
    "fold-transposes",  # exporters' transposes around attention: into batch_matmul's flags
    "algebra-simplification",
    "fold-scale-axis",
    "combine-parallel-conv2d",
    "combine-parallel-dense",
    "matrix-chain-reordering",
    "fold-constant",
    "dead-code-elimination",
    "convert-layout",  # CNNs in channel blocks (NCHW16c) between their convolutions
    "alter-layout",  # constant dense/conv2d weights packed for the GEMM (op/nn/packed.py)
    "split-to-slices",  # a split feeding fusible operators: slices that fuse into them
    "fuse-ops",
    "infer-type",
)


def standard_pipeline() -> Sequential:
    """The passes `optimize` runs, in order."""
    return Sequential([get_pass(name) for name in STANDARD_PIPELINE], name="optimize")


def optimize(
    mod: IRModule,
    opt_level: int | None = 3,
    params: Mapping[str, Any] | None = None,
) -> IRModule:
    """Optimize a module for inference: bind ``params`` (weights) as constants, then run the
    standard pipeline at ``opt_level`` (default 3; None keeps the current PassContext's).

    The surrounding `PassContext` still applies: its disabled passes, config, instruments and
    debug mode.
    """
    if not isinstance(mod, IRModule):
        raise Error(f"optimize takes an IRModule, not {type(mod).__name__}")
    if params:
        mod = bind_params(mod, params)
    outer = PassContext.current()
    ctx = PassContext(
        opt_level=outer.opt_level if opt_level is None else opt_level,
        required_pass=outer.required_pass,
        disabled_pass=outer.disabled_pass,
        config=outer.config,
        instruments=outer.instruments,
        debug=outer.debug,
    )
    return ctx.run_pass(standard_pipeline(), mod)
