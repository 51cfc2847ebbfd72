"""inline-partitions: functions partitioned for an external compiler run through kiln itself.

Relay's BYOC flow (TVM's ``PartitionGraph``) leaves a region meant for another compiler as a
function marked ``Primitive=1, Compiler="dnnl", global_symbol="..."`` (a global or a literal),
whose body calls ``Composite="dnnl.conv2d_relu"`` functions, one per matched pattern::

    %2 = fn (%a, %b, Primitive=1, Compiler="dnnl", global_symbol="...") {
      %0 = fn (%p0, %p1, Composite="dnnl.add_relu") { nn.relu(add(%p0, %p1)) };
      %0(%a, %b)
    };
    %2(%x, %y)

kiln has no external compilers, so such a function is an ordinary function: it loses
``Primitive``, ``Compiler`` and ``global_symbol`` (a log message says which compiler it was
meant for), and a composite function loses ``Composite`` and ``PartitionedFromPattern``. A call
of either kind of function literal is replaced by its body, the arguments bound by lets, so that
kiln's own fusion groups the operators. The interpreter already ran these programs; without
this pass the back end took the outer function for a fused kernel and found a nested function
in it. The pass runs at every opt level, first in the pipeline (it needs no types).
"""

from __future__ import annotations

import logging

from kiln.ir.attrs import Attrs
from kiln.ir.expr import Call, Expr, Function
from kiln.ir.module import IRModule
from kiln.ir.traverse import post_order, rewrite
from kiln.transform.inline import beta_reduce
from kiln.transform.pass_manager import PassContext, module_pass

logger = logging.getLogger(__name__)

# What marks a function for another compiler, and a pattern's function inside it.
_EXTERNAL_KEYS = ("Primitive", "Compiler", "global_symbol")
_COMPOSITE_KEYS = ("Composite", "PartitionedFromPattern", "Primitive")


def _is_external(fn: Function) -> bool:
    return "Compiler" in fn.attrs


def _is_composite(fn: Function) -> bool:
    return "Composite" in fn.attrs


def _without(fn: Function, keys: tuple[str, ...]) -> Function:
    attrs = Attrs({k: v for k, v in fn.attrs.items() if k not in keys})
    return Function(fn.params, fn.body, fn.ret_type, fn.type_params, attrs, span=fn.span)


def _note(fn: Function, where: str) -> None:
    logger.info(
        "kiln has no %r compiler: %s (Compiler=%r) runs through kiln",
        fn.attrs["Compiler"], where, fn.attrs["Compiler"],
    )


def _plain(fn: Function, where: str) -> Function:
    """``fn`` with the external-compiler and composite markers of itself and its body gone."""
    unmarked: set[int] = set()  # functions that lost their markers: their calls are inlined

    def rule(e: Expr) -> Expr | None:
        if isinstance(e, Function) and (_is_external(e) or _is_composite(e)):
            if _is_external(e):
                name = e.attrs.get("global_symbol")
                _note(e, f"function {name}" if name else f"a function in {where}")
            out = _without(e, _EXTERNAL_KEYS if _is_external(e) else _COMPOSITE_KEYS)
            unmarked.add(id(out))
            return out
        if isinstance(e, Call) and id(e.op) in unmarked and isinstance(e.op, Function):
            if len(e.args) == len(e.op.params):
                return beta_reduce(e.op, e.args)
        return None

    if _is_external(fn):
        _note(fn, where)
        fn = _without(fn, _EXTERNAL_KEYS)
    out = rewrite(fn, rule)
    assert isinstance(out, Function)
    return out


def _marked(fn: Function) -> bool:
    return any(isinstance(n, Function) and (_is_external(n) or _is_composite(n))
               for n in post_order(fn))


@module_pass("inline-partitions", opt_level=0)
def InlinePartitions(mod: IRModule, ctx: PassContext) -> IRModule:
    """Run functions partitioned for external compilers (Compiler=, Composite=) through kiln."""
    functions = {gv.name: fn for gv, fn in mod.functions.items()}
    marked = [name for name, fn in functions.items() if _marked(fn)]
    if not marked:
        return mod
    for name in marked:
        functions[name] = _plain(functions[name], f"@{name}")
    return IRModule(functions, mod.type_definitions)
