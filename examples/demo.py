"""kiln's main job on a bundled example: parse, type-check, print, run and compile a Relay program.

    python examples/demo.py [path/to/program.rly]
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np

import kiln
from kiln.eval import adt_to_list
from kiln.ir.traverse import post_order

HERE = Path(__file__).parent


def section(title: str) -> None:
    print(f"\n=== {title} " + "=" * max(0, 70 - len(title)))


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else HERE / "demo.rly"
    text = path.read_text()

    section(f"1. parse {path.name}")
    mod = kiln.parse(text, source_name=str(path))
    print(f"{len(mod.functions)} global functions, {len(mod.type_definitions)} type definitions")

    section("2. infer types")
    mod = kiln.infer_types(mod)
    for gv in mod.global_vars:
        print(f"@{gv.name}: {mod[gv].checked_type}")

    section("3. print it back (inferred types in comments)")
    printed = kiln.astext(mod)
    print(printed)
    assert kiln.structural_equal(kiln.parse(printed), mod), "the text round trip must be exact"

    section("4. run @main with the reference interpreter")
    rng = np.random.default_rng(0)
    args = []
    for p in mod["main"].params:
        t = p.checked_type
        scale = 1.0 if p.name_hint in ("a", "b") else 0.4  # inputs, then weights
        args.append((rng.standard_normal([int(d) for d in t.shape]) * scale).astype(t.dtype))
        print(f"%{p.name_hint}: random {t}")
    result = kiln.interpret(mod, *args)
    items = adt_to_list(result) if isinstance(result, kiln.ConstructorValue) else [result]
    for i, item in enumerate(items):
        if isinstance(item, tuple) and len(item) == 2:
            probs, label = item
            print(f"input {i}: class {int(label[0])}, probabilities {np.round(probs[0], 4)}")
        else:
            print(f"result {i}: {item}")

    section("5. optimize: fold, simplify and fuse operators into kernels")
    optimized = kiln.optimize(mod, opt_level=3)
    stats = kiln.transform.fusion_stats(optimized)
    print(f"{stats.calls_inside} operator calls in {stats.primitive_functions} fused kernels "
          f"(Primitive=1 functions); the optimized @classify:")
    print(kiln.astext(optimized["classify"]))
    again = kiln.interpret(optimized, *args)
    first = adt_to_list(again)[0] if isinstance(again, kiln.ConstructorValue) else again
    print(f"same result after optimizing: {np.allclose(first[0], items[0][0])}")

    section("6. compile to machine code, run it, save it and load it back")
    exe = kiln.build(mod, opt_level=3)
    compiled = exe(*args)
    first = adt_to_list(compiled)[0] if isinstance(compiled, kiln.ConstructorValue) else compiled
    print(exe.stats())
    print(f"same result as the interpreter: {np.allclose(first[0], items[0][0], atol=1e-6)}")
    with tempfile.TemporaryDirectory() as tmp:
        exe.save(Path(tmp) / "demo.kiln")
        size = (Path(tmp) / "demo.kiln").stat().st_size
        loaded = kiln.load(Path(tmp) / "demo.kiln")
    again = loaded(*args)
    first = adt_to_list(again)[0] if isinstance(again, kiln.ConstructorValue) else again
    print(f"saved to a {size}-byte file and loaded back: same result "
          f"{np.allclose(first[0], items[0][0], atol=1e-6)}")

    section("7. and a mistake, as kiln reports it")
    broken = text.replace("%w2: Tensor[(3, 16), float32]) {", "%w2: Tensor[(3, 12), float32]) {", 1)
    try:
        kiln.infer_types(kiln.parse(broken, source_name=str(path)))
    except kiln.Error as err:
        print(err)

    section("8. differentiate, and train an MLP with the gradients (examples/train_mlp.py)")
    import train_mlp  # beside this file

    body = train_mlp.gradient_program(batch=100)["main"].body
    calls = sum(isinstance(n, kiln.Call) and isinstance(n.op, kiln.Op) for n in post_order(body))
    print(f"kiln.grad made one program of {calls} operator calls: the loss and 6 gradients")
    train_mlp.train(steps=200, every=50)


if __name__ == "__main__":
    main()
