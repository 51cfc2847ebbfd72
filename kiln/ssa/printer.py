"""The SSA program as text, in DLVM's style (for `kiln show --level ssa`, tests and bugs).

```
kernel @fused_nn_dense_add: (Tensor[(1, 4), float32], Tensor[(3, 4), float32]) -> (...)
const #0: Tensor[(3, 4), float32]

func @main: (Tensor[(1, 4), float32]) -> Tensor[(1, 3), float32] {
'entry(%x: Tensor[(1, 4), float32]):
  %0 = const #0: Tensor[(3, 4), float32]
  %1 = alloc: Tensor[(1, 3), float32] @heap
  kernel @fused_nn_dense_add(%x, %0) -> (%1)
  ret %1
}
```

Block arguments keep their hints (``%x``); instruction results are numbered per function.
An instruction of unit type whose value is never used prints without ``%n =``.
"""

from __future__ import annotations

from kiln.ir.ty import Type
from kiln.ssa.ir import Block, Function, Instr, KernelDecl, Program, Terminator, Value, unit_type
from kiln.text.printer import type_text


def _types(ts: tuple[Type, ...] | list[Type]) -> str:
    return ", ".join(type_text(t) for t in ts)


class _Names:
    def __init__(self, fn: Function) -> None:
        self.names: dict[Value, str] = {}
        taken: set[str] = set()
        used: set[Value] = set()
        for b in fn.blocks:
            for ins in b.instrs:
                used.update(ins.operands)
            if b.terminator is not None:
                used.update(b.terminator.uses())
        self.used = used
        for b in fn.blocks:
            for p in b.params:
                base = p.hint if p.hint.isidentifier() else "arg"
                name, n = base, 1
                while name in taken:
                    name = f"{base}{n}"
                    n += 1
                taken.add(name)
                self.names[p] = name
        counter = 0
        for b in fn.blocks:
            for ins in b.instrs:
                self.names[ins] = str(counter)
                counter += 1

    def __call__(self, v: Value) -> str:
        name = self.names.get(v)
        return f"%{name}" if name is not None else f"%<undefined {type_text(v.type)}>"


def _target(names: _Names, block: Block, args: list[Value]) -> str:
    if not args:
        return f"'{block.name}"
    return f"'{block.name}({', '.join(names(a) for a in args)})"


def _instr_text(ins: Instr, names: _Names) -> str:
    ops = [names(v) for v in ins.operands]
    a = ins.attrs
    match ins.op:
        case "const":
            body = f"const #{a['index']}"
        case "alloc":
            off = a.get("offset")
            where = "@heap" if off is None else f"@arena+{off}"
            return f"{names(ins)} = alloc: {type_text(ins.type)} {where}"
        case "kernel":
            n = a["num_inputs"]
            return f"kernel @{a['kernel']}({', '.join(ops[:n])}) -> ({', '.join(ops[n:])})"
        case "kernel_dyn":
            body = f"kernel_dyn @{a['kernel']}({', '.join(ops)})"
        case "host":
            shown = "".join(f", {k}={v}" for k, v in a["op_attrs"])
            body = f"host {a['operator']}({', '.join(ops)}{shown})"
        case "tuple":
            body = f"tuple({', '.join(ops)})"
        case "get_field":
            body = f"get_field {ops[0]}, {a['index']}"
        case "construct":
            body = f"construct {a['ctor']}({', '.join(ops)})"
        case "get_tag":
            body = f"get_tag {ops[0]}"
        case "adt_field":
            body = f"adt_field {ops[0]}, {a['ctor']}, {a['index']}"
        case "make_closure":
            body = f"make_closure @{a['func']}({', '.join(ops)})"
        case "invoke_closure":
            body = f"invoke_closure {ops[0]}({', '.join(ops[1:])})"
        case "call":
            body = f"call @{a['func']}({', '.join(ops)})"
        case _:
            body = f"{ins.op} {', '.join(ops)}"
    if unit_type(ins.type) and ins not in names.used:
        return body
    return f"{names(ins)} = {body}: {type_text(ins.type)}"


def _terminator_text(t: Terminator, names: _Names) -> str:
    match t.op:
        case "br":
            return f"br {_target(names, t.targets[0].block, t.targets[0].args)}"
        case "cond_br":
            yes, no = t.targets
            return (f"cond_br {names(t.operands[0])}, {_target(names, yes.block, yes.args)}, "
                    f"{_target(names, no.block, no.args)}")
        case "switch":
            cases = t.attrs["cases"]
            arms = ", ".join(f"{c}: '{tgt.block.name}" for c, tgt in zip(cases, t.targets))
            text = f"switch {names(t.operands[0])} [{arms}]"
            if t.attrs.get("has_default"):
                text += f" default '{t.targets[-1].block.name}"
            return text
        case "ret":
            return f"ret {names(t.operands[0])}"
        case "fail":
            msg = str(t.attrs.get("message", "")).replace("\\", "\\\\").replace('"', '\\"')
            return f'fail "{msg}"'
    return t.op


def function_text(fn: Function) -> str:
    """One function as text."""
    names = _Names(fn)
    sig = f"({_types([p.type for p in fn.params])}) -> {type_text(fn.ret_type)}"
    tps = f"[{', '.join(fn.type_params)}]" if fn.type_params else ""
    lines = [f"func @{fn.name}{tps}: {sig} {{"]
    if fn.arena_bytes:
        lines[0] += f"  // arena {fn.arena_bytes} bytes"
    for b in fn.blocks:
        params = ", ".join(f"{names(p)}: {type_text(p.type)}" for p in b.params)
        lines.append(f"'{b.name}({params}):" if b.params else f"'{b.name}:")
        lines.extend("  " + _instr_text(ins, names) for ins in b.instrs)
        if b.terminator is not None:
            lines.append("  " + _terminator_text(b.terminator, names))
        else:
            lines.append("  <no terminator>")
    lines.append("}")
    return "\n".join(lines)


def kernel_decl_text(k: KernelDecl) -> str:
    head = f"kernel @{k.name}: ({_types(k.inputs)}) -> ({_types(k.outputs)})"
    return f"{head}  // {', '.join(k.ops)}" if k.ops else head


def program_text(prog: Program) -> str:
    """The whole program: kernels, constants, then functions (the entry first)."""
    parts = [kernel_decl_text(k) for k in prog.kernels.values()]
    parts += [f"const #{i}: {type_text(_const_type(c))}" for i, c in enumerate(prog.constants)]
    head = "\n".join(parts)
    order = [prog.entry] + [n for n in prog.functions if n != prog.entry]
    funcs = "\n\n".join(function_text(prog.functions[n]) for n in order if n in prog.functions)
    return f"{head}\n\n{funcs}\n" if head else f"{funcs}\n"


def _const_type(c: object) -> Type:
    from kiln.ir.ty import TensorType

    return TensorType(c.shape, c.dtype.name)  # type: ignore[attr-defined]
