"""specialize-closures: a program whose closures and references are static made first order.

Relay's higher-order gradient (kiln/ad/higher_order.py) builds its backward pass out of
closures kept in references: ``ref_write(%bp, fn () { ...; %prev() })``. The VM runs that as
written, a closure call per operator. When the program's control does not depend on data —
the gradient of a network, a closure built and called in the same function — every closure
and reference is known at compile time, and Relay's partial evaluator (`partial-evaluate`)
runs them away: what is left is the straight-line adjoint code DLVM would have generated,
which the whole-program native executor runs in one call.

This pass runs the partial evaluator only on modules that use closures or references, and
keeps its result only when it is first order and free of them (no local function, no
reference, no constructor or match, no call of a global that is not a kernel) and not much
larger than the input; otherwise — recursion over data, a loop whose count is an input, fuel
spent, an effect shared in graph form that the evaluator cannot place — the module is
returned unchanged, for the VM.
"""

from __future__ import annotations

from kiln.ir.adt import Constructor
from kiln.ir.expr import Call, Expr, Function, GlobalVar, Match, RefCreate, RefRead, RefWrite
from kiln.ir.module import IRModule
from kiln.ir.traverse import post_order
from kiln.transform.partial_eval import DEFAULT_FUEL, partial_evaluate
from kiln.transform.partial_eval_branches import UndefinedSharing
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass

# The partial evaluator's result may grow (closures inlined at each call); beyond this
# factor of the input's nodes (plus a little), the unchanged module is kept.
MAX_GROWTH = 4
_REFS = (RefCreate, RefRead, RefWrite)


def _higher_order(body: Expr) -> bool:
    for n in post_order(body):
        if isinstance(n, _REFS) or (isinstance(n, Function) and not is_primitive(n)):
            return True
    return False


def _first_order(mod: IRModule, kernels: set[str]) -> bool:
    """Whether @main holds no reference, local function, constructor or match, and calls no
    global but fused kernels."""
    for n in post_order(mod["main"].body):
        if isinstance(n, (*_REFS, Match, Constructor)):
            return False
        if isinstance(n, Function) and not is_primitive(n):
            return False
        if isinstance(n, GlobalVar) and n.name not in kernels:
            return False
        if isinstance(n, Call) and isinstance(n.op, Function) and not is_primitive(n.op):
            return False
    return True


def _size(fn: Function) -> int:
    return sum(1 for _ in post_order(fn.body))


@module_pass("specialize-closures", opt_level=2)
def SpecializeClosures(mod: IRModule, ctx: PassContext) -> IRModule:
    """Partially evaluate a module whose @main uses closures or references, keeping the
    result only when that leaves it first order."""
    if "main" not in mod:
        return mod
    main = mod["main"]
    if not any(_higher_order(fn.body) for fn in mod.functions.values() if not is_primitive(fn)):
        return mod
    fuel = ctx.config.get("partial-evaluate.fuel", DEFAULT_FUEL)
    if isinstance(fuel, bool) or not isinstance(fuel, int) or fuel < 0:
        return mod  # partial-evaluate itself reports a bad fuel when it runs as a pass
    try:
        out = partial_evaluate(mod, fuel)
    except UndefinedSharing:
        return mod  # effects shared in graph form: the VM runs them as the program says
    kernels = {gv.name for gv, fn in out.functions.items() if is_primitive(fn)}
    if not _first_order(out, kernels):
        return mod
    if _size(out["main"]) > MAX_GROWTH * _size(main) + 1000:
        return mod
    return IRModule({gv: fn for gv, fn in out.functions.items()
                     if gv.name == "main" or is_primitive(fn)}, out.type_definitions)
