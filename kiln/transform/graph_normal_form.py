"""to-graph-normal-form: replace let bindings of pure values by direct sharing.

The inverse of to-a-normal-form for pure code: ``let %a = add(%x, %y); multiply(%a, %a)``
becomes the dataflow graph ``%0 = add(%x, %y); multiply(%0, %0)``, where the one ``add`` node
is used twice (and evaluated once). Fusion and pattern-based rewrites see operators directly
connected this way.

A binding stays a ``let`` when dropping it could change the program:

- its value has effects (`kiln.transform.effects`): reading, allocating or writing a
  reference, or calling a function that may. The let fixes when the effect happens, relative
  to the other effects, so the order of effects is preserved;
- its variable is used inside a nested function (or, for a function, inside itself:
  recursion). Sharing in graph form holds within one function invocation, so substituting
  the value there would recompute it at every call of the closure.

A pure value bound to an unused variable disappears.
"""

from __future__ import annotations

from kiln.ir.expr import Expr, Function, Let, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.transform.effects import EffectAnalysis
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass


def _vars_used_in_other_frames(root: Function) -> set[Var]:
    """Let-bound variables used in a different function body than the let that binds them."""
    frame_of_let: dict[Var, int] = {}
    uses: list[tuple[Var, int]] = []
    seen: set[tuple[int, int]] = set()
    stack: list[tuple[Expr, int]] = [(root.body, id(root))]
    while stack:
        e, frame = stack.pop()
        if (id(e), frame) in seen:
            continue
        seen.add((id(e), frame))
        if isinstance(e, Var):
            uses.append((e, frame))
            continue
        if isinstance(e, Function):
            stack.append((e.body, id(e)))
            continue
        if isinstance(e, Let):
            frame_of_let[e.var] = frame
        stack.extend((k, frame) for k in children(e))
    return {v for v, frame in uses if v in frame_of_let and frame_of_let[v] != frame}


def to_graph_normal_form(fn: Function, analysis: EffectAnalysis) -> Function:
    """One function with its pure, same-frame let bindings replaced by sharing."""
    if is_primitive(fn):
        return fn
    effects = analysis.effects(fn)
    pinned = _vars_used_in_other_frames(fn)
    order = post_order(fn)
    value_of: dict[int, list[Var]] = {}
    for node in order:
        if isinstance(node, Let) and not effects[id(node.value)] and node.var not in pinned:
            value_of.setdefault(id(node.value), []).append(node.var)
    # A let's value is rebuilt before its body, where its variable first occurs.
    shared: dict[Var, Expr] = {}
    done: dict[int, Expr] = {}
    for node in order:
        if isinstance(node, Var):
            out: Expr = shared.get(node, node)
        elif isinstance(node, Let) and node.var in shared:
            out = done[id(node.body)]
        else:
            out = with_children(node, [done[id(k)] for k in children(node)])
        done[id(node)] = out
        for v in value_of.get(id(node), ()):
            shared[v] = out
    new = done[id(fn)]
    assert isinstance(new, Function)
    return new


@module_pass("to-graph-normal-form", opt_level=1)
def ToGraphNormalForm(mod: IRModule, ctx: PassContext) -> IRModule:
    """Replace let bindings of pure values by direct sharing (a dataflow graph)."""
    analysis = EffectAnalysis(mod)
    funcs = {gv: to_graph_normal_form(fn, analysis) for gv, fn in mod.functions.items()}
    return IRModule(funcs, mod.type_definitions)
