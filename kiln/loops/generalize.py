"""A kernel compiled once for every size: two lowerings at stand-in sizes, compared.

The operators' lowering rules build kernels of static shape. For a kernel whose inputs have
symbolic dimensions, `generalize` takes the kernel lowered twice — with each symbolic size
given a stand-in value, once from `STAND_INS_A` and once from `STAND_INS_B` — and walks the
two loop nests side by side. Where they differ only by an index constant that is the
stand-in of one size in the first (and of the same size in the second), the constant is
that size: it becomes the kernel's dimension variable (`Kernel.dims`), passed at run time.
Any other difference (a constant derived from a size, ``n * 768`` or ``n // 8``, a float
``1 / n``, a loop split differently, a local buffer whose shape depends on a size) means the
lowering depends on the size in a way a runtime extent cannot express: `generalize` gives
None and the kernel is specialized per concrete shape instead.

The result is then checked by the loop verifier, which proves every access in bounds for
*every* value of the dims (kiln/loops/verify.py), so a kernel that fails that check is
specialized too. Stand-ins are distinct primes far from one another, so that a static size
or an unrelated constant is never mistaken for one.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from typing import Any, cast

from kiln.errors import InternalError
from kiln.loops.ir import INDEX, Buffer, Const, Expr, Kernel, Stmt, Var
from kiln.loops.verify import verify

STAND_INS_A = (1009, 1013, 1019, 1021, 1031, 1033, 1039, 1049)
STAND_INS_B = (2003, 2011, 2017, 2027, 2029, 2039, 2053, 2063)


class _Differs(Exception):
    """The two lowerings differ other than by a size."""


class _Walk:
    def __init__(self, sizes: dict[tuple[int, int], Var]) -> None:
        self.sizes = sizes  # (stand-in a, stand-in b) -> the dim
        self.done: dict[int, Any] = {}  # id(node of a) -> its generalized node
        self.partner: dict[int, int] = {}  # id(var/buffer of a) -> id(its partner in b)
        self.used: dict[int, Var] = {}  # the dims met

    def pair(self, a: object, b: object) -> None:
        """Var and Buffer objects of the two kernels correspond one to one."""
        got = self.partner.setdefault(id(a), id(b))
        if got != id(b):
            raise _Differs

    def dim(self, da: int | Var, db: int | Var) -> int | Var:
        if da == db:
            return da
        d = self.sizes.get((da, db))  # type: ignore[arg-type]
        if d is None:
            raise _Differs
        self.used[id(d)] = d
        return d

    def buffer(self, a: Buffer, b: Buffer) -> Buffer:
        self.pair(a, b)
        got = self.done.get(id(a))
        if got is None:
            if a.dtype != b.dtype or a.scope != b.scope or a.ndim != b.ndim:
                raise _Differs
            shape = tuple(self.dim(x, y) for x, y in zip(a.shape, b.shape))
            if a.scope != "global" and shape != a.shape:
                raise _Differs  # a local buffer of a size's shape
            got = a if shape == a.shape else Buffer(a.name, cast(tuple[int, ...], shape),
                                                    a.dtype, a.scope)
            self.done[id(a)] = got
        return got

    def node(self, root_a: object, root_b: object) -> Any:
        """The generalized ``root_a`` (iterative post-order over the pair of trees)."""
        stack: list[tuple[object, object, bool]] = [(root_a, root_b, False)]
        while stack:
            a, b, ready = stack.pop()
            if id(a) in self.done and not isinstance(a, (Var, Buffer)):
                continue
            if type(a) is not type(b):
                raise _Differs
            if isinstance(a, Buffer):
                self.buffer(a, b)  # type: ignore[arg-type]
                continue
            if isinstance(a, Var):
                self.pair(a, b)
                if a.name != b.name or a.dtype != b.dtype or a.lanes != b.lanes:  # type: ignore
                    raise _Differs
                self.done[id(a)] = a
                continue
            if isinstance(a, Const):
                self.done[id(a)] = self.const(a, b)  # type: ignore[arg-type]
                continue
            if not is_dataclass(a):
                raise InternalError(f"generalize: a {type(a).__name__} in the loop IR")
            pairs = self.children(a, b)
            if not ready:
                stack.append((a, b, True))
                stack.extend((x, y, False) for x, y in reversed(pairs))
                continue
            self.done[id(a)] = self.rebuild(a)
        return self.done[id(root_a)]

    def const(self, a: Const, b: Const) -> Expr:
        if a.dtype != b.dtype or a.lanes != b.lanes or type(a.value) is not type(b.value):
            raise _Differs
        if a.value == b.value or (a.value != a.value and b.value != b.value):
            return a  # equal (NaN, which a log's expansion holds, equal to itself too)
        d = (self.sizes.get((int(a.value), int(b.value)))
             if a.dtype == INDEX and a.lanes == 1 else None)
        if d is None:
            raise _Differs
        self.used[id(d)] = d
        return d

    @staticmethod
    def children(a: Any, b: Any) -> list[tuple[object, object]]:
        out: list[tuple[object, object]] = []
        for f in fields(a):
            if f.name == "uid":
                continue
            va, vb = getattr(a, f.name), getattr(b, f.name)
            if isinstance(va, tuple):
                if not isinstance(vb, tuple) or len(va) != len(vb):
                    raise _Differs
                for x, y in zip(va, vb):
                    if _is_node(x):
                        out.append((x, y))
                    elif x != y:
                        raise _Differs
            elif _is_node(va):
                out.append((va, vb))
            elif va != vb:
                raise _Differs
        return out

    def rebuild(self, a: Any) -> Any:
        changed = False
        values: dict[str, Any] = {}
        for f in fields(a):
            v = getattr(a, f.name)
            if isinstance(v, tuple):
                nv: Any = tuple(self.done[id(x)] if _is_node(x) else x for x in v)
                changed |= any(x is not y for x, y in zip(v, nv))
            elif _is_node(v):
                nv = self.done[id(v)]
                changed |= nv is not v
            else:
                nv = v
            values[f.name] = nv
        return type(a)(**values) if changed else a


def _is_node(x: object) -> bool:
    return isinstance(x, (Expr, Stmt, Buffer))


def generalize(ka: Kernel, kb: Kernel, sizes: dict[tuple[int, int], Var],
               name: str) -> Kernel | None:
    """The symbolic kernel that ``ka`` and ``kb`` (one kernel lowered at stand-in sizes
    ``a`` and ``b``, ``sizes[(a, b)]`` being the dim) are two instances of, verified for
    every value of its dims; None where they differ other than by the sizes."""
    w = _Walk(sizes)
    try:
        if len(ka.inputs) != len(kb.inputs) or len(ka.outputs) != len(kb.outputs):
            raise _Differs
        params = [w.buffer(x, y) for x, y in zip(ka.params, kb.params)]
        in_shapes = {id(d) for b in params for d in b.shape if isinstance(d, Var)}
        body = w.node(ka.body, kb.body)
    except _Differs:
        return None
    dims = [d for d in sizes.values() if id(d) in w.used]
    if any(id(d) not in in_shapes for d in dims) or not dims:
        return None  # a size no argument's shape gives, or none at all
    n_in = len(ka.inputs)
    kernel = Kernel(name, tuple(params[:n_in]), tuple(params[n_in:]), body,
                    {**ka.attrs, "dims": tuple(d.name for d in dims)}, tuple(dims))
    try:
        return verify(kernel)
    except InternalError:
        return None


def instantiate(kernel: Kernel, values: tuple[int, ...], name: str) -> Kernel:
    """The static kernel that symbolic ``kernel`` is at dims ``values``: each dim a constant,
    each buffer of its concrete shape (for profiles and messages, which count its loops)."""
    const = {id(d): Const(int(n)) for d, n in zip(kernel.dims, values)}
    done: dict[int, Any] = {}

    def buffer(b: Buffer) -> Buffer:
        got = done.get(id(b))
        if got is None:
            shape = tuple(const[id(d)].value if isinstance(d, Var) else d for d in b.shape)
            got = done[id(b)] = (b if not b.is_symbolic else
                                 Buffer(b.name, cast(tuple[int, ...], shape), b.dtype, b.scope))
        return got

    stack: list[tuple[Any, bool]] = [(kernel.body, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in done:
            continue
        if isinstance(node, Var):
            done[id(node)] = const.get(id(node), node)
            continue
        if isinstance(node, Buffer):
            buffer(node)
            continue
        kids = [v for f in fields(node) for v in (getattr(node, f.name)
                if isinstance(getattr(node, f.name), tuple) else (getattr(node, f.name),))
                if _is_node(v)]
        if not ready:
            stack.append((node, True))
            stack.extend((k, False) for k in kids if id(k) not in done)
            continue
        values_: dict[str, Any] = {}
        changed = False
        for f in fields(node):
            v = getattr(node, f.name)
            if isinstance(v, tuple):
                nv: Any = tuple(done[id(x)] if _is_node(x) else x for x in v)
                changed |= any(x is not y for x, y in zip(v, nv))
            elif _is_node(v):
                nv = done[id(v)]
                changed |= nv is not v
            else:
                nv = v
            values_[f.name] = nv
        done[id(node)] = type(node)(**values_) if changed else node
    return Kernel(name, tuple(buffer(b) for b in kernel.inputs),
                  tuple(buffer(b) for b in kernel.outputs), done[id(kernel.body)],
                  {**kernel.attrs, "symbolic": kernel.name})
