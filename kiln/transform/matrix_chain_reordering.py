"""matrix-chain-reordering: multiply chains of matrices in the cheapest order (DLVM's pass).

``(A @ B) @ C`` and ``A @ (B @ C)`` are equal in exact arithmetic but can differ in cost by
orders of magnitude. A chain is a tree of ``nn.dense`` calls (``dense(X, W) = X @ W.T``), or
of ``nn.batch_matmul`` calls with equal batch sizes, whose inner results are used nowhere
else (in graph form, or through variables bound once by ``let`` in the same region, whose
operands are variables or constants). With every shape static, the classic O(n^3) dynamic
program over the factors' sizes picks the association with the fewest multiply-adds; the
chain is rebuilt that way only when strictly cheaper. Transposed factors are handled: a dense
chain needs an explicit ``transpose`` only where a weight ends up on the left of a product;
batch_matmul takes transpositions in its flags. The first factor of a dense chain may have
leading batch dimensions (``dense`` of an ``(n, s, k)`` tensor); it always stays leftmost.

Floating-point results change by rounding only. Chains longer than `MAX_FACTORS` are cut into
pieces. `chain_flops` counts the flops of a module's matrix products (the benchmark's
before/after report); `matrix_chain_order` is the dynamic program.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from kiln.ir.adt import Constructor
from kiln.ir.expr import (
    Call,
    Constant,
    Expr,
    Function,
    GlobalVar,
    Let,
    Op,
    RefCreate,
    RefRead,
    RefWrite,
    Var,
)
from kiln.ir.module import IRModule
from kiln.ir.traverse import children, post_order, with_children
from kiln.ir.ty import TensorType
from kiln.op import transpose
from kiln.op.nn import batch_matmul, dense
from kiln.transform.combine_parallel_conv2d import regions
from kiln.transform.pass_manager import PassContext, is_primitive, module_pass, typed
from kiln.transform.pattern import binders_unique, use_counts

MAX_FACTORS = 16  # the dynamic program is cubic in the number of factors
PRODUCTS = ("nn.dense", "nn.batch_matmul")


def matrix_chain_order(dims: Sequence[int]) -> tuple[int, list[list[int]]]:
    """The fewest multiply-adds for a chain of matrices of sizes dims[i] x dims[i+1], and the
    split table: ``split[i][j] = k`` means the best product of factors i..j is (i..k)(k+1..j).

    Ties go to the smallest k."""
    n = len(dims) - 1
    cost = [[0] * n for _ in range(n)]
    split = [[0] * n for _ in range(n)]
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length - 1
            best, best_k = math.inf, i
            for k in range(i, j):
                c = cost[i][k] + cost[k + 1][j] + dims[i] * dims[k + 1] * dims[j + 1]
                if c < best:
                    best, best_k = c, k
            cost[i][j], split[i][j] = int(best), best_k
    return (cost[0][n - 1] if n else 0), split


def product_flops(call: Call) -> int:
    """2 * m * k * n for one dense or batch_matmul call with static shapes (0 otherwise)."""
    a, out = call.args[0].checked_type_, call.checked_type_
    if not (isinstance(a, TensorType) and isinstance(out, TensorType)):
        return 0
    if not (a.is_static and out.is_static):
        return 0
    a_shape = a.static_shape
    reduction = a_shape[-1]
    if _product_op(call) == "nn.batch_matmul" and call.attrs.transpose_a:
        reduction = a_shape[-2]
    return 2 * math.prod(out.static_shape) * reduction


def chain_flops(mod: IRModule) -> int:
    """Flops (a multiply and an add each) of every dense and batch_matmul in ``mod``."""
    total = 0
    for fn in typed(mod).functions.values():
        for node in post_order(fn):
            product = _product(node)
            if product is not None:
                total += product_flops(product)
    return total


def _product(e: Expr) -> Call | None:
    """``e`` when it is a dense or batch_matmul call."""
    if isinstance(e, Call) and isinstance(e.op, Op) and e.op.name in PRODUCTS:
        return e
    return None


def _product_op(e: Expr) -> str | None:
    """The operator name of a dense or batch_matmul call, None for anything else."""
    if isinstance(e, Call) and isinstance(e.op, Op) and e.op.name in PRODUCTS:
        return e.op.name
    return None


@dataclass
class Leaf:
    """A factor of a chain: the matrix ``expr`` (``expr`` transposed when ``transposed``)."""

    expr: Expr
    transposed: bool
    rows: int
    cols: int
    batch: int = 1


class _Chains:
    """Finds the chains of one function and rebuilds them."""

    def __init__(self, func: Function) -> None:
        self.uses = use_counts(func)
        self.lets: dict[int, Expr] = {}
        self.region: dict[int, int] = {}
        self.let_region: dict[int, int] = {}
        self.impure: set[int] | None = None
        nodes = post_order(func)
        if any(isinstance(n, Let) for n in nodes) and binders_unique(func):
            self.region, self.let_region = regions(func)
            self.lets = {id(n.var): n.value for n in nodes if isinstance(n, Let)}

    def operand(self, e: Expr, kind: str, use_region: int) -> Call | None:
        """``e`` as a product to absorb into its user's chain, or None if it must stay a leaf."""
        if isinstance(e, Var):
            value = self.lets.get(id(e))
            if value is None or self.uses.get(id(e)) != 1:
                return None
            product = _product(value)
            if self.let_region.get(id(e)) != use_region or product is None:
                return None
            if not all(isinstance(a, (Var, Constant, GlobalVar)) for a in product.args):
                return None  # moving a compound operand could move an effect
            e = product
        elif self.uses.get(id(e)) != 1:
            return None
        product = _product(e)
        if product is None or _product_op(product) != kind or not _plain(product):
            return None
        return product

    def flatten(self, root: Call) -> tuple[list[Leaf] | None, list[Call]]:
        """The factors of the chain rooted at ``root``, left to right (None unless all have
        static shapes), and its products."""
        kind = _product_op(root)
        assert kind is not None  # the caller found root to be a product
        region = self.region.get(id(root), -1)
        found: list[tuple[Expr, bool]] = []
        products = [root]
        stack: list[tuple[Expr, bool, Call | None]] = [(root, False, root)]
        while stack:
            e, t, inner = stack.pop()
            if inner is None and len(products) + 1 < MAX_FACTORS:
                inner = self.operand(e, kind, region)
                if inner is not None:
                    products.append(inner)
            if inner is None:
                found.append((e, t))
                continue
            p, q = inner.args
            tp, tq = _operand_transposes(inner)
            parts = [(p, tp), (q, tq)] if not t else [(q, not tq), (p, not tp)]
            stack += [(x, tx, None) for x, tx in reversed(parts)]
        return _leaves(found, kind), products

    def may_reorder(self, leaves: list[Leaf], root: Call, func: Function) -> bool:
        """A dense chain evaluates its factors in a new order: at most one may have effects."""
        if _product_op(root) == "nn.batch_matmul":
            return True  # built left to right, in the original order
        compound = [f.expr for f in leaves if not isinstance(f.expr, (Var, Constant, GlobalVar))]
        if len(compound) < 2:
            return True
        if self.impure is None:
            self.impure = impure_nodes(func)
        return sum(id(e) in self.impure for e in compound) < 2


def impure_nodes(root: Expr) -> set[int]:
    """The nodes whose evaluation may have an effect: references, and calls of functions."""
    impure: set[int] = set()
    for node in post_order(root):
        if isinstance(node, Function):
            continue  # making a closure has no effect; calling it is a call
        if isinstance(node, (RefCreate, RefRead, RefWrite)) or (
            isinstance(node, Call) and not isinstance(node.op, (Op, Constructor))
        ):
            impure.add(id(node))
        elif any(id(k) in impure for k in children(node)):
            impure.add(id(node))
    return impure


def _build_dense(i: int, j: int, want_t: bool, split: list[list[int]], leaves: list[Leaf],
                 exprs: list[Expr]) -> Expr:
    """Factors i..j (transposed when ``want_t``) as dense calls; dense(p, q) = p @ q.T.

    Recursion depth is bounded by MAX_FACTORS, not by the size of the program."""
    if i == j:
        return exprs[i] if leaves[i].transposed == want_t else transpose(exprs[i])
    k = split[i][j]
    p = _build_dense(i, k, False, split, leaves, exprs)  # P = M_i..M_k
    q = _build_dense(k + 1, j, True, split, leaves, exprs)  # (M_k+1..M_j).T
    return dense(q, p) if want_t else dense(p, q)  # (P Q).T = Q.T P.T


def _build_batch(i: int, j: int, split: list[list[int]], leaves: list[Leaf],
                 exprs: list[Expr]) -> tuple[Expr, bool]:
    """Factors i..j as batch_matmul calls, and whether the result is meant transposed."""
    if i == j:
        return exprs[i], leaves[i].transposed
    k = split[i][j]
    a, ta = _build_batch(i, k, split, leaves, exprs)
    b, tb = _build_batch(k + 1, j, split, leaves, exprs)
    return batch_matmul(a, b, transpose_a=ta, transpose_b=tb), False


def reorder_chains(func: Function) -> Function:
    """``func`` with every chain that has a cheaper association rebuilt that way."""
    chains = _Chains(func)
    order = post_order(func)
    rebuilt: dict[int, list[Leaf]] = {}
    absorbed: set[int] = set()
    for node in reversed(order):  # users before their operands: outermost chains first
        product = _product(node)
        if product is None or id(node) in absorbed or not _plain(product):
            continue
        leaves, products = chains.flatten(product)
        absorbed.update(id(p) for p in products)  # each product is in one chain only
        if leaves is None or len(leaves) < 3:
            continue
        dims = [leaves[0].rows] + [f.cols for f in leaves]
        after = 2 * leaves[0].batch * matrix_chain_order(dims)[0]
        before = sum(product_flops(p) for p in products)
        if after < before and chains.may_reorder(leaves, product, func):
            rebuilt[id(node)] = leaves
    if not rebuilt:
        return func
    done: dict[int, Expr] = {}
    for node in order:
        leaves = rebuilt.get(id(node))
        if leaves is None:
            done[id(node)] = with_children(node, [done[id(k)] for k in children(node)])
            continue
        dims = [leaves[0].rows] + [f.cols for f in leaves]
        split = matrix_chain_order(dims)[1]
        exprs = [done.get(id(f.expr), f.expr) for f in leaves]
        if _product_op(node) == "nn.batch_matmul":
            done[id(node)] = _build_batch(0, len(leaves) - 1, split, leaves, exprs)[0]
        else:
            done[id(node)] = _build_dense(0, len(leaves) - 1, False, split, leaves, exprs)
    new = done[id(func)]
    assert isinstance(new, Function)  # with_children rebuilds a node as its own kind
    return new


@module_pass("matrix-chain-reordering", opt_level=2)
def MatrixChainReordering(mod: IRModule, ctx: PassContext) -> IRModule:
    """Re-associate chains of dense / batch_matmul calls to the fewest flops."""
    tmod = typed(mod)
    funcs = {gv: fn if is_primitive(fn) else reorder_chains(fn)
             for gv, fn in tmod.functions.items()}
    if all(funcs[gv] is tmod.functions[gv] for gv in funcs):
        return mod
    return IRModule(funcs, tmod.type_definitions)


def _plain(call: Call) -> bool:
    """A product computed in its inputs' dtype (so re-association keeps every type)."""
    operand = call.args[0].checked_type_
    assert isinstance(operand, TensorType)  # the function is type-checked
    return call.attrs.out_dtype in ("", operand.dtype)


def _operand_transposes(call: Call) -> tuple[bool, bool]:
    """Whether the product uses its first and second operands transposed."""
    if _product_op(call) == "nn.dense":
        return False, True
    return bool(call.attrs.transpose_a), bool(call.attrs.transpose_b)


def _leaves(found: list[tuple[Expr, bool]], kind: str) -> list[Leaf] | None:
    """The factors with their sizes; None unless every shape is static and usable."""
    out = []
    for i, (e, t) in enumerate(found):
        ty = e.checked_type_
        if not isinstance(ty, TensorType) or not ty.is_static:
            return None
        shape = ty.static_shape
        if kind == "nn.batch_matmul":
            batch, r, c = shape
        elif len(shape) == 2 or (i == 0 and not t and len(shape) > 2):
            batch, r, c = 1, math.prod(shape[:-1]), shape[-1]
        else:
            return None
        out.append(Leaf(e, t, *((c, r) if t else (r, c)), batch=batch))
    if len({f.batch for f in out}) > 1:
        return None  # batch broadcasting is left alone
    return out
