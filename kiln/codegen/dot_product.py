"""LLVM emission of `DotProduct` (int8 dot products in groups of 4), chosen from the Target.

Each int32 lane of the operands holds 4 bytes; the result adds their 4 products to the
accumulator lane. Three forms, all exact (the products of two bytes and their sums of 2 or 4
fit an int32; only the final accumulation wraps, as int32 addition does):

- ``vpdpbusd`` (uint8 × int8) where the Target has it: AVX-512-VNNI for 16 lanes (zmm),
  AVX-512-VNNI with VL or AVX-VNNI for 8 (ymm) and 4 (xmm) lanes;
- ``vpmaddwd`` on AVX2 / AVX-512BW: the bytes widened to int16 (zero- or sign-extended, so
  every value is in [-128, 255]), multiplied and summed in pairs exactly into int32 — never
  ``vpmaddubsw``, whose int16 sums of two uint8 × int8 products saturate (255·127·2 > 2¹⁵);
  then the two pair sums of each group added;
- elsewhere (another architecture, or a Target without AVX2): the bytes widened to int32,
  multiplied, and the four products of each group added — LLVM picks the instructions.

The choice (`kiln.loops.int8_gemm.dot_form`, which the kernel's schedule also reads) sees
only the features the kernel is compiled for (`ModuleContext.features`), never the host's:
code for a VNNI Target is built the same on any machine.
"""

from __future__ import annotations

from llvmlite import ir

from kiln.codegen.llvmtypes import I32, ModuleContext
from kiln.loops.int8_gemm import dot_form, madd_width

I8, I16 = ir.IntType(8), ir.IntType(16)


def _mask(values: list[int]) -> ir.Constant:
    return ir.Constant(ir.VectorType(I32, len(values)), values)


def _part(b: ir.IRBuilder, v: ir.Value, start: int, count: int) -> ir.Value:
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                            _mask(list(range(start, start + count))))


def _concat(b: ir.IRBuilder, parts: list[ir.Value]) -> ir.Value:
    while len(parts) > 1:  # a power of two of equal parts, joined pairwise in order
        n = parts[0].type.count
        parts = [b.shuffle_vector(parts[k], parts[k + 1], _mask(list(range(2 * n))))
                 for k in range(0, len(parts), 2)]
    return parts[0]


def _widen(b: ir.IRBuilder, v: ir.Value, dtype: str, to: ir.IntType) -> ir.Value:
    n = v.type.count
    bytes_ = b.bitcast(v, ir.VectorType(I8, 4 * n))
    t = ir.VectorType(to, 4 * n)
    return b.zext(bytes_, t) if dtype == "uint8" else b.sext(bytes_, t)


def _every(b: ir.IRBuilder, v: ir.Value, step: int, first: int) -> ir.Value:
    """Lanes first, first + step, ... of ``v``."""
    n = v.type.count // step
    return b.shuffle_vector(v, ir.Constant(v.type, ir.Undefined),
                            _mask([first + step * i for i in range(n)]))


def _int16_pairs(mc: ModuleContext, b: ir.IRBuilder, a: ir.Value, w: ir.Value, form: str
                 ) -> ir.Value:
    """``a[2l]·w[2l] + a[2l+1]·w[2l+1]`` per int32 lane, the operands int16 pairs."""
    lanes = a.type.count
    pairs = ir.VectorType(I16, 2 * lanes)
    a16, w16 = b.bitcast(a, pairs), b.bitcast(w, pairs)
    if form == "pmaddwd":
        width = madd_width(mc.features, lanes)
        name = "llvm.x86.avx512.pmaddw.d.512" if width == 32 else "llvm.x86.avx2.pmadd.wd"
        fn = mc.declare(name, ir.VectorType(I32, width // 2), [ir.VectorType(I16, width)] * 2)
        return _concat(b, [b.call(fn, [_part(b, a16, s, width), _part(b, w16, s, width)])
                           for s in range(0, 2 * lanes, width)])
    wide = ir.VectorType(I32, 2 * lanes)
    products = b.mul(b.sext(a16, wide), b.sext(w16, wide))  # exact: |x·y| ≤ 2³⁰
    return b.add(_every(b, products, 2, 0), _every(b, products, 2, 1))  # wraps at 2 · 2³⁰


def emit_dot(mc: ModuleContext, b: ir.IRBuilder, a: ir.Value, w: ir.Value, c: ir.Value,
             a_dtype: str, b_dtype: str) -> ir.Value:
    """``c + Σ_q a[g·l+q]·w[g·l+q]`` per lane (operands ``<L x i32>``, g = 4 bytes or 2
    int16 each), in the form `dot_form` picks for the module's features."""
    if not isinstance(c.type, ir.VectorType):  # scalars: as 1-lane vectors
        one = ir.VectorType(I32, 1)
        at = ir.Constant(I32, 0)
        a1, w1, c1 = (b.insert_element(ir.Constant(one, ir.Undefined), x, at)
                      for x in (a, w, c))
        return b.extract_element(emit_dot(mc, b, a1, w1, c1, a_dtype, b_dtype), at)
    lanes = c.type.count
    form = dot_form(mc.features, lanes, a_dtype, b_dtype)
    vt = c.type
    if form == "vnni":
        fn = mc.declare(f"llvm.x86.avx512.vpdpbusd.{32 * lanes}", vt, [vt, vt, vt])
        return b.call(fn, [c, a, w])
    if a_dtype == "int16":  # pairs: vpmaddwd is the whole product (it wraps, never saturates)
        return b.add(c, _int16_pairs(mc, b, a, w, form))
    if form == "pmaddwd":
        width = madd_width(mc.features, lanes)
        a16, w16 = _widen(b, a, a_dtype, I16), _widen(b, w, b_dtype, I16)
        name = "llvm.x86.avx512.pmaddw.d.512" if width == 32 else "llvm.x86.avx2.pmadd.wd"
        half = ir.VectorType(I32, width // 2)
        fn = mc.declare(name, half, [ir.VectorType(I16, width)] * 2)
        pairs = _concat(b, [b.call(fn, [_part(b, a16, s, width), _part(b, w16, s, width)])
                            for s in range(0, 4 * lanes, width)])  # <2L x i32> pair sums
        sums = b.add(_every(b, pairs, 2, 0), _every(b, pairs, 2, 1))
        return b.add(c, sums)
    products = b.mul(_widen(b, a, a_dtype, I32), _widen(b, w, b_dtype, I32))
    sums = b.add(b.add(_every(b, products, 4, 0), _every(b, products, 4, 1)),
                 b.add(_every(b, products, 4, 2), _every(b, products, 4, 3)))
    return b.add(c, sums)
