"""A 10,000-operator graph in TVM's printed form reads and prints back exactly.

Its speed is measured by benchmarks/frontend.py, not here.
"""

import kiln
from kiln.text import astext, parse


def mlp_text(layers: int) -> str:
    """A residual MLP in TVM's printed form: dense, bias_add, relu, add per layer."""
    params = ["%x: Tensor[(1, 64), float32]"]
    lines = []
    prev, n = "%x", 0
    for i in range(layers):
        params += [f"%w{i}: Tensor[(64, 64), float32]", f"%b{i}: Tensor[(64), float32]"]
        lines += [
            f"  %{n} = nn.dense({prev}, %w{i}, units=64);",
            f"  %{n + 1} = nn.bias_add(%{n}, %b{i});",
            f"  %{n + 2} = nn.relu(%{n + 1});",
            f"  %{n + 3} = add(%{n + 2}, {prev});",
        ]
        prev, n = f"%{n + 3}", n + 4
    result = lines.pop().split(" = ", 1)[1].rstrip(";")
    head = '#[version = "0.0.5"]\ndef @main(' + ", ".join(params) + ") {\n"
    return head + "\n".join(lines) + f"\n  {result}\n}}\n"


def test_a_10000_operator_graph_prints_back_exactly():
    text = mlp_text(2500)
    mod = parse(text)
    assert astext(mod) == text  # the printer writes exactly what TVM's printer wrote
    assert len(mod["main"].params) == 5001


def test_typed_graph_prints_its_types():
    mod = kiln.infer_types(parse(mlp_text(250)))
    printed = astext(mod)
    assert printed.count("/* ty=Tensor[(1, 64), float32] */") == 1000  # 999 bindings + result
