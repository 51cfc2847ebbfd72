"""algebra-simplification: arithmetic identities, as DLVM's AlgebraSimplification pass.

``x*1``, ``x+0``, ``--x``, ``power(x, 2)`` and their kind become cheaper forms. Every row
keeps the result's shape and dtype: ``x*1`` becomes ``x`` only when the constant does not
broadcast ``x`` to a larger shape.

Two classes of rows:

- exact rows hold for every value, NaN and infinity included (``x*1 -> x``, ``--x -> x``,
  ``power(x, 0) -> ones_like(x)``); the one liberty, as in C compilers' ``nsz``, is that
  ``x+0 -> x`` keeps the sign of a negative zero;
- fast-math rows hold for finite values in their domain only (``x*0 -> 0`` is wrong for inf
  and NaN, ``exp(log x) -> x`` for negative x, ``log(exp x) -> x`` when exp overflows).
  They run on floating-point tensors only under
  ``PassContext(config={"algebra-simplification.fast_math": True})``, and always on
  integer tensors, where they are exact.

Rows that drop an operand drop only constants: ``x*0`` becomes ``zeros_like(x)``, which still
evaluates ``x``, so effects inside operands are never lost or reordered.
"""

from __future__ import annotations

from kiln.ir.dtype import dtype_of
from kiln.ir.expr import Expr
from kiln.ir.module import IRModule
from kiln.op import abs as abs_
from kiln.op import add, divide, multiply, negative, ones_like, sqrt, subtract, zeros_like
from kiln.transform.pass_manager import PassContext, module_pass
from kiln.transform.pattern import Pat, RewriteContext, RewriteTable
from kiln.transform.simplify_expr import compose_transposes

FAST_MATH = "algebra-simplification.fast_math"

x, y = Pat.var("x"), Pat.var("y")


def _same(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return x if ctx.same_type(x, root) else None


def _negated(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return negative(x) if ctx.same_type(x, root) else None


def _fast(x: Expr, root: Expr, ctx: RewriteContext) -> bool:
    """A fast-math row may fire: integers always, floats when the option allows."""
    t = ctx.tensor_type(x)
    if t is None or not ctx.same_type(x, root):
        return False
    return not dtype_of(t.dtype).is_float or bool(ctx.config(FAST_MATH, False))


def _zeros(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return zeros_like(x) if _fast(x, root, ctx) else None


def _ones(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return ones_like(x) if ctx.same_type(x, root) else None


def _fast_same(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return x if _fast(x, root, ctx) else None


def _square(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return multiply(x, x) if ctx.same_type(x, root) else None


def _sqrt(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return sqrt(x) if _fast(x, root, ctx) else None


def _float_fast(x: Expr, root: Expr, ctx: RewriteContext) -> bool:
    """A row that is wrong for integers (where it would hide a division by zero)."""
    t = ctx.tensor_type(x)
    return t is not None and dtype_of(t.dtype).is_float and _fast(x, root, ctx)


def _reciprocal(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return divide(ones_like(x), x) if _float_fast(x, root, ctx) else None


def _one(x: Expr, root: Expr, ctx: RewriteContext) -> Expr | None:
    return ones_like(x) if _float_fast(x, root, ctx) else None


def power(base: object, exponent: float) -> Pat:
    return Pat.op("power", base, exponent)


RULES = RewriteTable([
    # --- exact ---------------------------------------------------------------------------
    (x * 1, _same),                                   # x*1 -> x
    (1 * x, _same),                                   # 1*x -> x
    (x + 0, _same),                                   # x+0 -> x
    (0 + x, _same),                                   # 0+x -> x
    (x - 0, _same),                                   # x-0 -> x
    (x / 1, _same),                                   # x/1 -> x
    (0 - x, _negated),                                # 0-x -> -x
    (x * -1, _negated),                               # x*-1 -> -x
    (-1 * x, _negated),                               # -1*x -> -x
    (Pat.op("negative", -x), lambda x: x),            # --x -> x
    (x - (-y), lambda x, y: add(x, y)),               # x-(-y) -> x+y
    (x + (-y), lambda x, y: subtract(x, y)),          # x+(-y) -> x-y
    (power(x, 1), _same),                             # x**1 -> x
    (power(x, 2), _square),                           # x**2 -> x*x
    (power(x, 0), _ones),                             # x**0 -> 1
    (Pat.op("maximum", x, x), lambda x: x),           # max(x, x) -> x
    (Pat.op("minimum", x, x), lambda x: x),           # min(x, x) -> x
    (Pat.op("abs", -x), lambda x: abs_(x)),           # |-x| -> |x|
    (Pat.op("abs", Pat.op("abs", x, name="inner")),   # ||x|| -> |x|
     lambda inner: inner),
    (Pat.op("transpose", Pat.op("transpose", x, name="inner")),  # (x^T)^T -> x
     compose_transposes),
    # --- fast math (finite values; integers always) -------------------------------------
    (x * 0, _zeros),                                  # x*0 -> 0
    (0 * x, _zeros),                                  # 0*x -> 0
    (x - x, _zeros),                                  # x-x -> 0
    (x / x, _one),                                    # x/x -> 1 (floats only)
    (Pat.op("exp", Pat.op("log", x)), _fast_same),    # exp(log x) -> x
    (Pat.op("log", Pat.op("exp", x)), _fast_same),    # log(exp x) -> x
    (Pat.op("sqrt", x) * Pat.op("sqrt", x), _fast_same),  # sqrt(x)*sqrt(x) -> x
    (power(x, 0.5), _sqrt),                           # x**0.5 -> sqrt(x)
    (power(x, -1), _reciprocal),                      # x**-1 -> 1/x (floats only)
])


@module_pass("algebra-simplification", opt_level=1)
def AlgebraSimplification(mod: IRModule, ctx: PassContext) -> IRModule:
    """Simplify arithmetic identities (x*1, x+0, --x, x**2, ...); see the module docstring."""
    return RULES.apply_to_module(mod, ctx)
