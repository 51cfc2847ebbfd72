"""A readable text form of loop-IR kernels (for `kiln show --level loops` and for tests)."""

from __future__ import annotations

from kiln.loops.ir import (
    CHUNKS_PER_THREAD,
    FMA,
    Allocate,
    Binary,
    Bitcast,
    Broadcast,
    Cast,
    Check,
    Const,
    DotProduct,
    Expr,
    For,
    IfThenElse,
    Kernel,
    LetStmt,
    Load,
    Prefetch,
    Select,
    Seq,
    Stmt,
    Store,
    TileProduct,
    Unary,
    Var,
)

_INFIX = {"add": "+", "sub": "-", "mul": "*", "div": "/", "floordiv": "//", "floormod": "%",
          "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!=", "and": "&&",
          "or": "||"}


def _ty(e: Expr) -> str:
    return e.dtype if e.lanes == 1 else f"{e.dtype}x{e.lanes}"


def expr_text(e: Expr) -> str:
    """An expression as text (expressions are shallow, so this may recurse)."""
    match e:
        case Const(value=v, dtype=dt, lanes=n):
            text = repr(v) if dt in ("int64", "bool") else f"{v!r}:{dt}"
            return text if n == 1 else f"x{n}({text})"
        case Var(name=name):
            return name
        case Load(buffer=b, indices=idx, lanes=n):
            inner = ", ".join(expr_text(i) for i in idx)
            return f"{b.name}[{inner}]" if n == 1 else f"{b.name}[{inner}:+{n}]"
        case Binary(op=op, a=a, b=b):
            if op in _INFIX:
                return f"({expr_text(a)} {_INFIX[op]} {expr_text(b)})"
            return f"{op}({expr_text(a)}, {expr_text(b)})"
        case Unary(op=op, a=a):
            return f"{op}({expr_text(a)})"
        case Cast(a=a):
            return f"{_ty(e)}({expr_text(a)})"
        case Bitcast(a=a):
            return f"bitcast<{_ty(e)}>({expr_text(a)})"
        case Select(cond=c, a=a, b=b):
            return f"select({expr_text(c)}, {expr_text(a)}, {expr_text(b)})"
        case Broadcast(value=v, lanes=n):
            return f"x{n}({expr_text(v)})"
        case FMA(a=a, b=b, c=c):
            return f"fma({expr_text(a)}, {expr_text(b)}, {expr_text(c)})"
        case DotProduct(a=a, b=b, c=c, a_dtype=ta, b_dtype=tb):
            return f"dot4<{ta}, {tb}>({expr_text(a)}, {expr_text(b)}, {expr_text(c)})"
    return f"<{type(e).__name__}>"


def stmt_text(s: Stmt, indent: int = 0) -> str:
    """A statement as indented text, without recursion over nesting."""
    lines: list[str] = []
    stack: list[tuple[Stmt | str, int]] = [(s, indent)]
    while stack:
        node, depth = stack.pop()
        pad = "  " * depth
        if isinstance(node, str):
            lines.append(pad + node)
            continue
        match node:
            case For(var=v, start=start, extent=ext, body=body, kind=kind, chunks=chunks):
                mark = "" if kind == "serial" else f" {kind}"
                if kind == "parallel" and chunks != CHUNKS_PER_THREAD:
                    mark += f"({chunks} a thread)"
                lines.append(f"{pad}for{mark} {v.name} in [{expr_text(start)}, +{expr_text(ext)}):")
                stack.append((body, depth + 1))
            case Store(buffer=b, indices=idx, value=val):
                inner = ", ".join(expr_text(i) for i in idx)
                span = "" if val.lanes == 1 else f":+{val.lanes}"
                lines.append(f"{pad}{b.name}[{inner}{span}] = {expr_text(val)}")
            case LetStmt(var=v, value=val, body=body):
                lines.append(f"{pad}let {v.name}: {_ty(v)} = {expr_text(val)}")
                stack.append((body, depth))
            case Allocate(buffer=b, body=body):
                lines.append(f"{pad}alloc {b.name}: {b.dtype}{list(b.shape)} ({b.scope})")
                stack.append((body, depth))
            case Seq(stmts=stmts):
                stack.extend((x, depth) for x in reversed(stmts))
            case IfThenElse(cond=c, then_case=t, else_case=f):
                lines.append(f"{pad}if {expr_text(c)}:")
                if f is not None:
                    stack.append((f, depth + 1))
                    stack.append(("else:", depth))
                stack.append((t, depth + 1))
            case Check(cond=c, message=msg):
                lines.append(f"{pad}check {expr_text(c)}, {msg!r}")
            case TileProduct():
                def refs(rs: tuple, stride: int) -> str:
                    return ", ".join(f"&{expr_text(r)}" for r in rs) + f" (rows {stride} apart)"
                lines.append(f"{pad}tiles<{node.a_dtype}, {node.b_dtype}> over {node.var.name} "
                             f"in [0, {expr_text(node.steps)}): A {refs(node.a, node.a_stride)}; "
                             f"B {refs(node.b, node.b_stride)} -> C {refs(node.c, node.c_stride)}")
            case Prefetch(ref=r):
                lines.append(f"{pad}prefetch &{expr_text(r)}")
            case _:
                lines.append(f"{pad}<{type(node).__name__}>")
    return "\n".join(lines)


def kernel_text(k: Kernel) -> str:
    """A whole kernel: its signature, then its body."""
    def sig(b) -> str:  # noqa: ANN001
        return f"{b.name}: {b.dtype}{list(b.shape)}"

    head = (f"kernel {k.name}({', '.join(sig(b) for b in k.inputs)}) -> "
            f"({', '.join(sig(b) for b in k.outputs)}):")
    return head + "\n" + stmt_text(k.body, 1)
