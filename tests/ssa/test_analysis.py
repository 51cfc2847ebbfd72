"""Dominance and liveness on hand-built control-flow graphs."""

from kiln.ir.ty import TensorType
from kiln.ssa import UNIT, BlockArg, Builder, DominatorTree, Function, Liveness
from kiln.ssa.analysis import predecessors, reverse_post_order
from kiln.ssa.cleanup import simplify_cfg

I32 = TensorType((), "int32")
BOOL = TensorType((), "bool")


def cfg(edges: dict[str, list[str]]) -> tuple[Function, dict]:
    """A function whose blocks branch as ``edges`` says (cond_br on the bool parameter when a
    block has two successors, ret when it has none)."""
    fn = Function("f", [BlockArg(BOOL, "c")], UNIT)
    blocks = {"entry": fn.entry}
    for name in edges:
        if name != "entry":
            blocks[name] = fn.add_block(name)
    for name, succs in edges.items():
        b = Builder(fn, blocks[name])
        if not succs:
            b.ret(b.tuple([]))
        elif len(succs) == 1:
            b.br(blocks[succs[0]])
        else:
            b.cond_br(fn.params[0], blocks[succs[0]], [], blocks[succs[1]], [])
    return fn, blocks


def idoms(fn: Function) -> dict[str, str | None]:
    dom = DominatorTree(fn)
    return {b.name: (d.name if d is not None else None) for b, d in dom.idom.items()}


def test_diamond():
    fn, b = cfg({"entry": ["then", "else"], "then": ["join"], "else": ["join"], "join": []})
    assert idoms(fn) == {"entry": None, "then": "entry", "else": "entry", "join": "entry"}
    dom = DominatorTree(fn)
    assert dom.dominates(b["entry"], b["join"]) and dom.dominates(b["join"], b["join"])
    assert not dom.dominates(b["then"], b["join"])
    assert not dom.strictly_dominates(b["join"], b["join"])
    df = dom.frontier()
    assert df[b["then"]] == {b["join"]} and df[b["else"]] == {b["join"]}
    assert df[b["entry"]] == set()


def test_loop():
    fn, b = cfg({"entry": ["header"], "header": ["body", "exit"], "body": ["latch"],
                 "latch": ["header"], "exit": []})
    assert idoms(fn) == {"entry": None, "header": "entry", "body": "header",
                         "latch": "body", "exit": "header"}
    df = DominatorTree(fn).frontier()
    assert df[b["body"]] == {b["header"]} and df[b["latch"]] == {b["header"]}
    assert df[b["header"]] == {b["header"]}
    assert [x.name for x in reverse_post_order(fn)][:2] == ["entry", "header"]
    assert {p.name for p in predecessors(fn)[b["header"]]} == {"entry", "latch"}


def test_irreducible_graph():
    # a and b each reachable from the entry and from each other: neither dominates the other.
    fn, b = cfg({"entry": ["a", "b"], "a": ["b"], "b": ["a", "out"], "out": []})
    assert idoms(fn) == {"entry": None, "a": "entry", "b": "entry", "out": "b"}


def test_nested_branches():
    fn, b = cfg({"entry": ["l", "r"], "l": ["ll", "lr"], "ll": ["lj"], "lr": ["lj"],
                 "lj": ["j"], "r": ["j"], "j": []})
    d = idoms(fn)
    assert d["lj"] == "l" and d["j"] == "entry" and d["ll"] == "l"


def test_unreachable_blocks_are_outside_the_tree_and_cleaned_up():
    fn, b = cfg({"entry": ["x"], "x": [], "dead": ["x"]})
    dom = DominatorTree(fn)
    assert not dom.reachable(b["dead"])
    assert not dom.dominates(b["dead"], b["x"])
    simplify_cfg(fn)
    assert [blk.name for blk in fn.blocks] == ["entry"]  # 'x merged in, 'dead dropped


def test_liveness_across_a_loop():
    # entry: v = tuple(); br header(c) ; header(h): cond_br h, body, exit
    # body: w = tuple(v, h); br header(h) ; exit: ret v
    fn = Function("f", [BlockArg(BOOL, "c")], UNIT)
    entry = fn.entry
    header = fn.add_block("header", [BlockArg(BOOL, "h")])
    body, exit_ = fn.add_block("body"), fn.add_block("exit")
    b = Builder(fn)
    v = b.emit("tuple", [], UNIT)
    b.br(header, [fn.params[0]])
    b.position(header)
    h = header.params[0]
    b.cond_br(h, body, [], exit_, [])
    b.position(body)
    w = b.emit("tuple", [v, h], UNIT)
    b.br(header, [h])
    b.position(exit_)
    b.ret(v)
    live = Liveness(fn)
    assert live.live_in[header] == {v}  # h is a parameter of header: defined there
    assert live.live_out[entry] == {v}
    assert live.live_in[body] == {v, h} and live.live_out[body] == {v}
    assert live.live_in[exit_] == {v} and live.live_out[exit_] == set()
    points = dict(live.points(body))
    assert points[0] == {v, h, w}  # the instruction's operands and its own value
    assert points[1] == {v, h}  # the terminator passes h back
    assert live.live_across(v) and not live.live_across(w)


def test_liveness_in_straight_line_code_ends_at_the_last_use():
    fn = Function("f", [BlockArg(I32, "x")], UNIT)
    b = Builder(fn)
    x = fn.params[0]
    a = b.emit("tuple", [x], UNIT)
    c = b.emit("tuple", [a], UNIT)
    d = b.emit("tuple", [c], UNIT)
    b.ret(d)
    pts = dict(Liveness(fn).points(fn.entry))
    assert pts[0] == {x, a} and pts[1] == {a, c} and pts[2] == {c, d} and pts[3] == {d}
