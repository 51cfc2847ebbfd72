"""Passes: the pass manager (pass_manager.py), the standard pipeline (pipeline.py), and one
pass per file. Importing this package registers every pass under its kebab-case name."""

from kiln.transform.a_normal_form import ToANormalForm
from kiln.transform.algebra_simplification import AlgebraSimplification
from kiln.transform.alter_layout import AlterLayout
from kiln.transform.bind_params import bind_params
from kiln.transform.combine_parallel_conv2d import CombineParallelConv2D
from kiln.transform.combine_parallel_dense import CombineParallelDense
from kiln.transform.convert_layout import ConvertLayout
from kiln.transform.dead_code import DeadCodeElimination
from kiln.transform.defunctionalization import Defunctionalization
from kiln.transform.eliminate_common_subexpr import EliminateCommonSubexpr
from kiln.transform.eta_expand import EtaExpand
from kiln.transform.fold_constant import FoldConstant
from kiln.transform.fold_scale_axis import FoldScaleAxis
from kiln.transform.fold_transposes import FoldTransposes
from kiln.transform.fuse_ops import FuseOps, FusionStats, fusion_stats
from kiln.transform.graph_normal_form import ToGraphNormalForm
from kiln.transform.infer_type import InferType
from kiln.transform.inline import Inline
from kiln.transform.inline_partitions import InlinePartitions
from kiln.transform.lambda_lift import LambdaLift
from kiln.transform.linear_algebra_fusion import LinearAlgebraFusion
from kiln.transform.loop_invariant import LoopInvariantCodeMotion
from kiln.transform.matrix_chain_reordering import MatrixChainReordering, chain_flops
from kiln.transform.partial_eval import PartialEvaluate
from kiln.transform.pass_manager import (
    DumpIR,
    FunctionPass,
    ModulePass,
    Pass,
    PassContext,
    PassInfo,
    PassInstrument,
    PassTimingInstrument,
    Sequential,
    function_pass,
    get_pass,
    list_passes,
    module_pass,
    typed,
)
from kiln.transform.pipeline import STANDARD_PIPELINE, optimize, standard_pipeline
from kiln.transform.simplify_expr import SimplifyExpr
from kiln.transform.simplify_inference import SimplifyInference
from kiln.transform.split_to_slices import SplitToSlices

__all__ = [
    "STANDARD_PIPELINE",
    "AlgebraSimplification",
    "AlterLayout",
    "CombineParallelConv2D",
    "CombineParallelDense",
    "ConvertLayout",
    "DeadCodeElimination",
    "Defunctionalization",
    "DumpIR",
    "EliminateCommonSubexpr",
    "EtaExpand",
    "FoldConstant",
    "FoldScaleAxis",
    "FoldTransposes",
    "FunctionPass",
    "FuseOps",
    "FusionStats",
    "InferType",
    "Inline",
    "InlinePartitions",
    "LambdaLift",
    "LinearAlgebraFusion",
    "LoopInvariantCodeMotion",
    "MatrixChainReordering",
    "ModulePass",
    "PartialEvaluate",
    "Pass",
    "PassContext",
    "PassInfo",
    "PassInstrument",
    "PassTimingInstrument",
    "Sequential",
    "SimplifyExpr",
    "SimplifyInference",
    "SplitToSlices",
    "ToANormalForm",
    "ToGraphNormalForm",
    "bind_params",
    "chain_flops",
    "function_pass",
    "fusion_stats",
    "get_pass",
    "list_passes",
    "module_pass",
    "optimize",
    "standard_pipeline",
    "typed",
]
