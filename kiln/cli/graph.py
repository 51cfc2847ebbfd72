"""``kiln graph``: a picture of a model's graph as SVG, PNG or PDF, fused groups outlined.

The model (ONNX or Relay text) is optimized as ``kiln build`` would (weights bound, the standard
pipeline, ``fuse-ops`` last) and ``@main`` is drawn by `kiln.viz`: each operator a box with its
output type and the weights it reads (their logical shapes, not the packed ones), each fused
function a dashed box around its operators and the edges between them. ``--unfused`` draws the
program as imported or parsed, before any pass; ``--attrs`` and ``--names`` add each operator's
attributes and where it came from (its ONNX node, or file and line); ``--collapse`` draws each
ONNX node that became several operators (an LSTM, a GRU, an attention) as one box.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from kiln.cli.common import (
    SOURCE_SUFFIXES,
    Progress,
    add_debug,
    add_progress,
    file_kind,
    read_npz,
    read_relay,
)


def cmd_graph(args: argparse.Namespace) -> int:
    from kiln.infer import infer_types
    from kiln.transform.pipeline import optimize
    from kiln.viz import DrawOptions, picture, render_svg
    from kiln.viz.export import check_output, export

    progress = Progress(args.progress)
    kind = file_kind(args.model, SOURCE_SUFFIXES, "graph")
    out = args.output or str(Path(args.model).with_suffix(".svg"))
    if out != "-":
        check_output(out)  # before the model is read: a wrong extension fails at once
    params = read_npz(args.params, "parameters") or {}
    origins = None
    if kind == ".onnx":
        from kiln.cli.common import import_onnx
        from kiln.frontend.onnx import load_model
        from kiln.viz.origin import model_origins

        imported = import_onnx(args.model, progress)
        mod, origins = model_origins(imported.module, load_model(args.model),
                                     imported.onnx_names, Path(args.model).name)
        params = {**imported.params, **params}
    else:
        mod = read_relay(args.model)
    if args.unfused:
        mod = infer_types(mod)
        weights = set(params)
    else:
        progress.step("optimizing")
        mod = optimize(mod, opt_level=args.opt_level, params=params or None)
        weights = set()
    collapse = None if args.collapse is None else [w for c in args.collapse
                                                   for w in c.split(",") if w]
    scene = picture(mod, args.function, weights=weights, origins=origins,
                    options=DrawOptions(attrs=args.attrs, names=args.names),
                    collapse_what=collapse)
    progress.step(f"laid out {len(scene.graph.nodes)} nodes, {len(scene.graph.edges)} edges")
    svg = render_svg(scene, f"{Path(args.model).name} @{args.function}")
    if out == "-":
        sys.stdout.write(svg)
    else:
        export(svg, out)
        progress.step(f"wrote {out}")
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:
    graph = sub.add_parser("graph", help="draw a model's graph (SVG, PNG, PDF), fused groups "
                           "outlined",
                           description="Draw @main of an ONNX model or Relay program as a "
                           "picture: one box per operator (name, output type, the weights it "
                           "reads), inputs and outputs; after kiln.optimize (weights bound), "
                           "each fused function is a dashed box around its operators.")
    graph.add_argument("model", help="an ONNX model (.onnx) or a Relay text file (.rly)")
    graph.add_argument("-o", "--output", help="the file to write: .svg, or .png and .pdf "
                       "with cairosvg installed (pip install 'kiln[graph]'); default "
                       "MODEL.svg; '-' for SVG on stdout")
    graph.add_argument("--unfused", action="store_true",
                       help="draw the program before optimization and fusion")
    graph.add_argument("--attrs", action="store_true",
                       help="show each operator's attributes that differ from their defaults "
                       "(strides, padding, groups, ...)")
    graph.add_argument("--names", action="store_true",
                       help="show where each operator came from: its ONNX node's name and "
                       "type, or the Relay file and line")
    graph.add_argument("--collapse", nargs="?", action="append", const="", metavar="WHAT",
                       help="draw blocks as one box each: alone, every ONNX node that became "
                       "several operators (LSTM, GRU, attention); with ONNX operator types "
                       "(LSTM,GRU) only those; with a name scope (/encoder/layer.0/attn) all "
                       "the nodes under it, as one box. For Relay text: each fused group")
    graph.add_argument("--function", default="main", metavar="NAME",
                       help="the global function to draw (default: main)")
    graph.add_argument("--params", help="an .npz of weights to bind to @main's parameters")
    graph.add_argument("--opt-level", type=int, default=3, choices=range(5), metavar="N",
                       help="optimization level 0-4 (default 3)")
    add_progress(graph)
    add_debug(graph)
    graph.set_defaults(run=cmd_graph)
