"""LLVM emission of `TileProduct`: 8-bit matrix products on Intel AMX tiles.

A `TileProduct` becomes a loop over its steps whose accumulators are ``x86_amx`` values
carried by phi nodes — in the 8 tile registers, never spilled, as long as at most 8 tiles are
live (the statement's own limit) — with a ``tileloadd`` of each A and B tile per step, one
``tdpb[su][su]d`` per accumulator, and a ``tilestored`` of each accumulator after the last
step. Every tile is 16 rows of 64 bytes. LLVM's AMX passes (pre-config and tile config)
write the tile configuration (``ldtilecfg``) at the start of the function from the shapes
the intrinsics are given, and ``tilerelease`` at its end; the ``.internal`` intrinsics take
the shapes as operands. The Target must have ``amx-tile`` and ``amx-int8`` (LLVM's names);
the process must be allowed to use the tile state (Linux's ``arch_prctl``), which
`kiln.target` asks for when it finds AMX on the host (`kiln.target.amx_usable`).
"""

from __future__ import annotations

from llvmlite import ir

from kiln.codegen.emit_expr import Memo
from kiln.codegen.function import FunctionState
from kiln.codegen.llvmtypes import I64, PTR, VOID, ModuleContext
from kiln.errors import InternalError
from kiln.loops.ir import TILE_FEATURES, TILE_ROWS, TILE_WORDS, Const, Load, TileProduct

I16 = ir.IntType(16)
ROW_BYTES = 4 * TILE_WORDS

# The product instruction by the signedness of A (first) and B: s = int8, u = uint8.
_PRODUCT = {("int8", "int8"): "tdpbssd", ("int8", "uint8"): "tdpbsud",
            ("uint8", "int8"): "tdpbusd", ("uint8", "uint8"): "tdpbuud"}


class _AMXType(ir.Type):
    """LLVM's ``x86_amx``: a tile register's value (llvmlite has no class for it)."""

    def _to_string(self) -> str:
        return "x86_amx"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _AMXType)

    def __hash__(self) -> int:
        return hash(_AMXType)


AMX = _AMXType()


def _shape() -> list[ir.Constant]:
    return [ir.Constant(I16, TILE_ROWS), ir.Constant(I16, ROW_BYTES)]


def emit_tile_product(mc: ModuleContext, f: FunctionState, s: TileProduct) -> None:
    """``s`` at the builder's position (see the module docstring)."""
    missing = [x for x in TILE_FEATURES if x not in mc.features]
    if missing:
        raise InternalError(f"codegen: a tile product for a Target without {', '.join(missing)}"
                            " (the lowering chose AMX for a Target that has none)")
    if not (isinstance(s.steps, Const) and isinstance(s.steps.value, int) and s.steps.value > 0):
        raise InternalError("codegen: a tile product needs a constant number of steps ≥ 1 "
                            "(the verifier requires one)")
    zero = mc.declare("llvm.x86.tilezero.internal", AMX, [I16, I16])
    load = mc.declare("llvm.x86.tileloadd64.internal", AMX, [I16, I16, PTR, I64])
    store = mc.declare("llvm.x86.tilestored64.internal", VOID, [I16, I16, PTR, I64, AMX])
    product = mc.declare(f"llvm.x86.{_PRODUCT[(s.a_dtype, s.b_dtype)]}.internal", AMX,
                         [I16, I16, I16, AMX, AMX, AMX])
    b = f.b
    nb = len(s.b)
    first = [b.call(zero, _shape()) for _ in s.c]
    before = b.block
    body, after = f.block(f"{s.var.name}.tiles"), f.block(f"{s.var.name}.tiles.end")
    b.branch(body)
    b.position_at_end(body)
    k = b.phi(I64, name=s.var.name)
    k.add_incoming(ir.Constant(I64, 0), before)
    accs = []
    for value in first:
        phi = b.phi(AMX)
        phi.add_incoming(value, before)
        accs.append(phi)
    f.env[id(s.var)] = k
    memo: Memo = {}

    def tile(ref: Load, stride: int) -> ir.Value:
        ptr = f.x.address(ref.buffer, ref.indices, memo)
        return b.call(load, [*_shape(), ptr, ir.Constant(I64, 4 * stride)])

    a_tiles = [tile(r, s.a_stride) for r in s.a]
    b_tiles = [tile(r, s.b_stride) for r in s.b]
    sums = [b.call(product, [*_shape(), ir.Constant(I16, ROW_BYTES), acc,
                             a_tiles[n // nb], b_tiles[n % nb]])
            for n, acc in enumerate(accs)]
    for phi, value in zip(accs, sums):
        phi.add_incoming(value, b.block)
    nxt = b.add(k, ir.Constant(I64, 1), flags=["nsw"])
    k.add_incoming(nxt, b.block)
    b.cbranch(b.icmp_signed("<", nxt, ir.Constant(I64, int(s.steps.value))), body, after)
    b.position_at_end(after)
    f.env.pop(id(s.var), None)
    memo = {}
    for ref, value in zip(s.c, sums):
        ptr = f.x.address(ref.buffer, ref.indices, memo)
        b.call(store, [*_shape(), ptr, ir.Constant(I64, 4 * s.c_stride), value])
