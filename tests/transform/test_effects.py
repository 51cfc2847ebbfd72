"""The effect analysis passes rely on: references, calls, recursion, closures."""

import kiln
from kiln.ir.traverse import post_order
from kiln.transform.effects import Effect, EffectAnalysis


def calls_in(mod: kiln.IRModule, name: str) -> dict[str, Effect]:
    """The effect of each call in @name, by the printed callee."""
    analysis = EffectAnalysis(mod)
    out = {}
    for e in post_order(mod[name]):
        if isinstance(e, kiln.Call):
            callee = e.op.name if isinstance(e.op, (kiln.GlobalVar, kiln.Op, kiln.Constructor)) \
                else getattr(e.op, "name_hint", type(e.op).__name__)
            out[callee] = analysis.call_effect(e)
    return out


MOD = kiln.parse("""
type Box[A] { Box(A) }
def @write(%r: ref(int32)) { ref_write(%r, 1) }
def @read(%r: ref(int32)) -> int32 { ref_read(%r) }
def @fresh() -> ref(int32) { ref(0) }
def @calls_write(%r: ref(int32)) { @write(%r) }
def @ping(%n: int32, %r: ref(int32)) -> int32 {
  if (%n == 0) { @read(%r) } else { @pong(%n - 1, %r) }
}
def @pong(%n: int32, %r: ref(int32)) -> int32 { @ping(%n, %r) }
def @loop(%n: int32) -> int32 { if (%n == 0) { 0 } else { @loop(%n - 1) } }
def @higher(%f: fn (int32) -> int32) -> int32 { %f(1) }
def @main(%r: ref(int32)) {
  let %pure = fn (%x: int32) { %x + 1 };
  let %bump = fn (%x: int32) { ref_write(%r, %x) };
  let %rec = fn (%x: int32) -> int32 { if (%x == 0) { 0 } else { %rec(%x - 1) } };
  (@write(%r), @read(%r), @fresh(), @calls_write(%r), @ping(3, %r), @loop(3),
   @higher(%pure), %pure(1), %bump(2), %rec(3), Box(1), add(1, 2),
   fn (%y: int32) { %y }(4))
}
""")


def test_calls_have_the_effects_of_what_they_call_transitively():
    eff = calls_in(MOD, "main")
    assert eff["write"] == Effect.WRITE
    assert eff["read"] == Effect.READ
    assert eff["fresh"] == Effect.ALLOC
    assert eff["calls_write"] == Effect.WRITE
    assert eff["ping"] == Effect.READ  # through the mutual recursion with @pong
    assert eff["loop"] == Effect.NONE  # recursion alone is pure
    assert eff["higher"] == Effect.WRITE  # it calls a function it does not know
    assert eff["pure"] == Effect.NONE and eff["rec"] == Effect.NONE
    assert eff["bump"] == Effect.WRITE
    assert eff["Box"] == Effect.NONE and eff["add"] == Effect.NONE
    assert eff["Function"] == Effect.NONE  # a literal applied on the spot


def test_expression_effects_include_their_parts_but_not_function_bodies():
    mod = kiln.parse("""
    def @main(%r: ref(int32)) {
      let %f = fn () { ref_write(%r, 2) };
      (add(ref_read(%r), 1), %f, %f())
    }""")
    fn = mod["main"]
    effects = EffectAnalysis(mod).effects(fn)
    let = fn.body
    tup = let.body
    assert effects[id(let.value)] == Effect.NONE  # making the closure does nothing
    assert effects[id(tup.fields[0])] == Effect.READ
    assert effects[id(tup.fields[2])] == Effect.WRITE
    assert effects[id(tup)] == Effect.READ | Effect.WRITE
