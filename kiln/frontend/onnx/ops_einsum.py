"""The converter of ONNX's Einsum, as broadcast products and sums of kiln's operators.

Every operand is brought to one axis order — the output's letters, then the summed ones —
by ``transpose`` and ``reshape`` (size-1 axes for the letters it lacks); the operands are
multiplied with broadcasting and the summed axes reduced. A letter repeated in one operand
(``ii->i``) first takes the diagonal: a product with an identity mask and a sum. ``...``
stands for the leading axes an operand has beyond its letters; without ``->`` the output is
the letters that occur once, in alphabetical order (numpy's rule, which ONNX follows).
This is the plain form of the contraction, not an optimized one: it materializes the
product of all operands' axes, which suits the small contractions models write with it.
"""

from __future__ import annotations

import string

import numpy as np

from kiln import op
from kiln.frontend.onnx.context import NodeContext
from kiln.frontend.onnx.table import converter
from kiln.ir.expr import Constant, Expr


def parse(ctx: NodeContext, equation: str, ranks: list[int]) -> tuple[list[str], str]:
    """Each operand's letters and the output's, with ``...`` spelled out as capitals."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    terms = lhs.split(",")
    if len(terms) != len(ranks):
        raise ctx.error(f"the equation {equation!r} names {len(terms)} operands; the node has "
                        f"{len(ranks)}")
    spare = [c for c in string.ascii_uppercase if c not in eq]
    ell_rank = 0
    for t, r in zip(terms, ranks):
        if "..." in t:
            ell_rank = max(ell_rank, r - (len(t) - 3))
    ell = "".join(spare[:ell_rank])
    out_terms = []
    for t, r in zip(terms, ranks):
        if "..." in t:
            n = r - (len(t) - 3)
            t = t.replace("...", ell[ell_rank - n:] if n else "")
        if len(t) != r or not all(c.isalpha() for c in t):
            raise ctx.error(f"operand term {t!r} of {equation!r} does not match an operand of "
                            f"rank {r}")
        out_terms.append(t)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        counts = {c: sum(t.count(c) for t in out_terms) for c in set("".join(out_terms))}
        out = ell + "".join(sorted(c for c, n in counts.items() if n == 1 and c not in ell))
    if any(c not in "".join(out_terms) for c in out) or len(set(out)) != len(out):
        raise ctx.error(f"the output {rhs!r} of {equation!r} names letters no operand has, or "
                        "names one twice")
    return out_terms, out


def diagonal(ctx: NodeContext, x: Expr, letters: str, shape: list[int], dtype: str
             ) -> tuple[Expr, str, list[int]]:
    """Take the diagonal of every repeated letter until each occurs once."""
    while True:
        repeated = next((c for c in letters if letters.count(c) > 1), None)
        if repeated is None:
            return x, letters, shape
        p = letters.index(repeated)
        q = letters.index(repeated, p + 1)
        n = shape[p]
        mask_shape = [1] * len(shape)
        mask_shape[p] = mask_shape[q] = n
        ctx.check_elements((n, n), f"the identity mask of the repeated letter {repeated!r}")
        mask = Constant(np.eye(n).reshape(mask_shape).astype(dtype))
        x = op.sum(op.multiply(x, mask), axis=[q])
        letters = letters[:q] + letters[q + 1:]
        shape = shape[:q] + shape[q + 1:]


@converter("Einsum", since=12)
def einsum(ctx: NodeContext) -> Expr:
    n = len(ctx.inputs)
    shapes = [list(ctx.shape(i)) for i in range(n)]
    terms, out = parse(ctx, ctx.need_attr("equation"), [len(s) for s in shapes])
    dtype = ctx.dtype(0)
    sizes: dict[str, int] = {}
    operands = []
    for i, (t, s) in enumerate(zip(terms, shapes)):
        x, letters, shape = ctx.x(i), t, s
        if len(set(letters)) != len(letters):
            x, letters, shape = diagonal(ctx, x, letters, shape, dtype)
        for c, d in zip(letters, shape):
            if sizes.setdefault(c, d) != d and d != 1 and sizes[c] != 1:
                raise ctx.error(f"letter {c!r} stands for sizes {sizes[c]} and {d}")
            sizes[c] = max(sizes[c], d)
        operands.append((x, letters, shape))
    summed = "".join(sorted({c for _, ls, _ in operands for c in ls} - set(out)))
    order = out + summed
    ctx.check_shape([sizes[c] for c in order], "the product of all operands' axes (which kiln "
                    "computes before summing)")
    product: Expr | None = None
    for x, letters, shape in operands:
        present = [c for c in order if c in letters]
        if present != list(letters):
            x = op.transpose(x, axes=[letters.index(c) for c in present])
        full = [shape[letters.index(c)] if c in letters else 1 for c in order]
        if len(full) != len(present):
            x = op.reshape(x, newshape=full)
        product = x if product is None else op.multiply(product, x)
    assert product is not None
    if summed:
        product = op.sum(product, axis=list(range(len(out), len(order))))
    if any(sizes[c] != 1 for c in out) and _needs_broadcast(operands, out, sizes):
        product = op.broadcast_to(product, shape=[sizes[c] for c in out])
    return product


def _needs_broadcast(operands: list, out: str, sizes: dict[str, int]) -> bool:
    """Whether no operand gives an output letter its full size (only after size-1 broadcast)."""
    return any(all(c not in ls or shape[ls.index(c)] != sizes[c] for _, ls, shape in operands)
               for c in out)
