"""``kiln graph``: a picture of a model's graph as SVG, fused groups outlined.

The model (ONNX or Relay text) is optimized as ``kiln build`` would (weights bound, the standard
pipeline, ``fuse-ops`` last) and ``@main`` is drawn by `kiln.viz`: each operator a box with its
output type, each fused function a dashed box around its operators. ``--unfused`` draws the
program as imported or parsed, before any pass.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.cli.common import Progress, add_debug, add_progress, read_model, write_text


def cmd_graph(args: argparse.Namespace) -> int:
    from kiln.transform.pipeline import optimize
    from kiln.viz import dataflow_graph, render_svg

    progress = Progress(args.progress)
    model = read_model(args.model, args, "graph", progress)
    mod = model.module
    if not args.unfused:
        progress.step("optimizing")
        mod = optimize(mod, opt_level=args.opt_level, params=model.params or None)
    else:
        from kiln.infer import infer_types

        mod = infer_types(mod)
    graph = dataflow_graph(mod, args.function)
    progress.step(f"laying out {len(graph.nodes)} nodes, {len(graph.edges)} edges")
    svg = render_svg(graph, f"{Path(args.model).name} @{args.function}")
    out = args.output or str(Path(args.model).with_suffix(".svg"))
    write_text(svg, out)
    progress.step(f"wrote {out}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    graph = sub.add_parser("graph", help="draw a model's graph as SVG, fused groups outlined",
                           description="Draw @main of an ONNX model or Relay program as an SVG "
                           "picture: one box per operator (name and output type), inputs, "
                           "constants and outputs; after kiln.optimize (weights bound), each "
                           "fused function is a dashed box around its operators.")
    graph.add_argument("model", help="an ONNX model (.onnx) or a Relay text file (.rly)")
    graph.add_argument("-o", "--output", help="the SVG file to write (default: MODEL.svg; "
                       "'-' for stdout)")
    graph.add_argument("--unfused", action="store_true",
                       help="draw the program before optimization and fusion")
    graph.add_argument("--function", default="main", metavar="NAME",
                       help="the global function to draw (default: main)")
    graph.add_argument("--params", help="an .npz of weights to bind to @main's parameters")
    graph.add_argument("--opt-level", type=int, default=3, choices=range(5), metavar="N",
                       help="optimization level 0-4 (default 3)")
    add_progress(graph)
    add_debug(graph)
    graph.set_defaults(run=cmd_graph)
