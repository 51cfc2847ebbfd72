"""dead-code-elimination: drop let bindings whose value is never used and has no effect.

``let %x = v; body`` becomes ``body`` when ``%x`` is not used and evaluating ``v`` writes no
reference and calls no function that might (see `kiln.transform.effects`: reading a
reference or allocating one is dropped with its unused value; ``ref_write`` and calls of
unknown functions are kept, bound to their unused variable, in their place).

Liveness is found by a mark phase that follows the program from its result, reaching a let's
value only through a use of its variable (TVM's ``CalcDep``). Chains of dead bindings, where
one binding is used only by the value of another dead one, therefore vanish in one run.

Only lets are removed, as in TVM. Global functions are kept even when nothing calls them:
they are the module's interface (``kiln.interpret(mod, entry="f")`` may run any of them).
"""

from __future__ import annotations

from kiln.ir.expr import Expr, Function, GlobalVar, Let, Var
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.transform.effects import REMOVABLE, Effect, EffectAnalysis
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass


def _live_vars(root: Expr, effects: dict[int, Effect]) -> set[Var]:
    """The let-bound variables whose binding must stay: used, or bound to an effect."""
    lets_of: dict[Var, list[Let]] = {}
    for node in post_order(root):
        if isinstance(node, Let):
            lets_of.setdefault(node.var, []).append(node)
    live: set[Var] = set()
    seen: set[int] = set()
    stack: list[Expr] = [root]

    def keep(v: Var) -> None:
        if v not in live:
            live.add(v)
            stack.extend(let.value for let in lets_of.get(v, ()))

    while stack:
        e = stack.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        if isinstance(e, Var):
            keep(e)
        elif isinstance(e, Let):
            stack.append(e.body)
            if effects[id(e.value)] & ~REMOVABLE:
                keep(e.var)
        else:
            stack.extend(children(e))
    return live


def eliminate(root: Expr, effects: dict[int, Effect]) -> Expr:
    """``root`` without its dead let bindings."""
    live = _live_vars(root, effects)

    def kids(e: Expr) -> tuple[Expr, ...]:
        if isinstance(e, Let) and e.var not in live:
            return (e.body,)
        return children(e)

    # Post-order over what survives: a dead binding's value is never visited.
    done: dict[int, Expr] = {}
    for node in post_order(root, kids=kids):
        if isinstance(node, Let) and node.var not in live:
            done[id(node)] = done[id(node.body)]
        else:
            done[id(node)] = with_children(node, [done[id(k)] for k in children(node)])
    return done[id(root)]


@module_pass("dead-code-elimination", opt_level=1)
def DeadCodeElimination(mod: IRModule, ctx: PassContext) -> IRModule:
    """Remove let bindings whose variable is unused and whose value has no effect."""
    analysis = EffectAnalysis(mod)
    funcs: dict[GlobalVar, Function] = {}
    for gv, func in mod.functions.items():
        if is_primitive(func):
            funcs[gv] = func
            continue
        new = eliminate(func, analysis.effects(func))
        assert isinstance(new, Function)  # with_children rebuilds a node as its own kind
        funcs[gv] = new
    if all(funcs[gv] is f for gv, f in mod.functions.items()):
        return mod
    return IRModule(funcs, mod.type_definitions)
