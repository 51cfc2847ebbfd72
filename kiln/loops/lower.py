"""Lowering a fused primitive function (``Primitive=1``) to one loop-IR kernel.

Each operator call in the function's body is lowered by its operator's ``lower`` rule (which
stands beside the operator's other rules) to a `Tensor` (kiln/loops/compute.py). Elementwise,
broadcast and injective results are inlined into their consumers, so the kernel computes them
without intermediate buffers. A reduction or an extern operator (dense, conv2d, pooling, ...)
writes each element through a ``write`` callback that applies its fused elementwise consumers
before storing (the epilogue); only when its result is read other than elementwise, or by
several outputs, is it materialized into a local buffer first.

Kernels are static: every shape is known (a program with symbolic shapes is lowered once
its shapes are known at run time, or at stand-in sizes whose two lowerings
kiln/loops/generalize.py turns into one kernel taking its sizes at run time). A kernel's
inputs are its function's parameters, exactly:
scalar constants are folded in, and a non-scalar one (a weight) must have been made a
parameter first — the back end's `lift-constants` pass does that for a whole program,
`kiln.ssa.kernels.constants_as_params` for one function.

Kernels are scheduled for a `kiln.Target` (default: this machine): the lowering runs inside
`target_scope`, so the operators' lowering rules build their kernels (GEMM tiles, vector
widths, parallel loops) for it; the chosen knobs are in ``kernel.attrs["schedules"]``. Knobs
searched by `kiln.tune` come in the same way, through `overrides_scope`
(kiln/loops/tunable.py), keyed by each site's key.
"""

from __future__ import annotations

from typing import Any

from kiln.errors import Error, InternalError
from kiln.ir.expr import Call, Constant, Function, Op, Tuple, TupleGetItem, Var
from kiln.ir.traverse import post_order
from kiln.ir.ty import FuncType, TensorType, TupleType, Type
from kiln.loops.collapse import collapsed_nest, collapsible_axes, nests_kept
from kiln.loops.compute import (
    BufferTensor,
    ComputeTensor,
    MaterializedTensor,
    NeedsBuffer,
    Tensor,
    compute,
    new_epoch,
)
from kiln.loops.ir import (
    Allocate,
    Buffer,
    Const,
    Kernel,
    LetStmt,
    Seq,
    Stmt,
    Store,
)
from kiln.loops.ir import Var as LVar
from kiln.loops.schedule import loop_nest, lowering_target, target_scope
from kiln.loops.split_nest import split_divisor, split_nest
from kiln.loops.transposed_nest import transposed_axis, transposed_nest
from kiln.loops.tunable import ScheduleOverrides, overrides_scope
from kiln.loops.verify import verify
from kiln.op import registry
from kiln.target import Target

Lowered = Any  # a Tensor or a (nested) tuple of Tensors


def _static_tensor(t: Type, what: str) -> TensorType:
    if not isinstance(t, TensorType) or not t.is_static:
        raise Error(f"{what} has type {t}; kernels need tensors of static shape")
    return t


def _flatten(v: Lowered) -> list[Tensor]:
    out: list[Tensor] = []
    stack = [v]
    while stack:
        x = stack.pop()
        if isinstance(x, tuple):
            stack.extend(reversed(x))
        else:
            out.append(x)
    return out


def _param_buffers(fn: Function) -> tuple[list[Buffer], list[Lowered]]:
    buffers: list[Buffer] = []
    values: list[Lowered] = []
    for i, p in enumerate(fn.params):
        t = p.checked_type
        if isinstance(t, TupleType):
            fields = []
            for j, f in enumerate(t.fields):
                ft = _static_tensor(f, f"field {j} of parameter %{p.name_hint}")
                b = Buffer(f"p{i}_{j}", ft.static_shape, ft.dtype)
                buffers.append(b)
                fields.append(BufferTensor(b))
            values.append(tuple(fields))
        else:
            tt = _static_tensor(t, f"parameter %{p.name_hint}")
            b = Buffer(f"p{i}", tt.static_shape, tt.dtype)
            buffers.append(b)
            values.append(BufferTensor(b))
    return buffers, values


class _Lowering:
    def __init__(self, fn: Function, name: str) -> None:
        self.fn = fn
        self.name = name
        self.inputs, values = _param_buffers(fn)
        self.env: dict[int, Lowered] = {id(p): v for p, v in zip(fn.params, values)}
        self.locals: list[Buffer] = []
        self.prelude: list[Stmt] = []  # materializations, in order
        self.ops: list[str] = []
        self.schedules: list[tuple[str, dict[str, Any]]] = []

    # --- building the tensors ----------------------------------------------------------------

    def lower_body(self) -> Lowered:
        for node in post_order(self.fn.body):
            if id(node) in self.env:
                continue
            match node:
                case Var():
                    raise InternalError(f"primitive function uses free variable %{node.name_hint}")
                case Constant():
                    self.env[id(node)] = self.constant(node)
                case Call(op=Op(name=name)):
                    self.env[id(node)] = self.call(node, name)
                case Tuple(fields=fields):
                    self.env[id(node)] = tuple(self.env[id(f)] for f in fields)
                case TupleGetItem(tuple_value=t, index=i):
                    self.env[id(node)] = self.env[id(t)][i]
                case Op():
                    pass
                case _:
                    raise InternalError(f"a primitive function holds a {type(node).__name__}; "
                                        "only operator calls, constants and tuples can be fused")
        return self.env[id(self.fn.body)]

    def constant(self, c: Constant) -> Tensor:
        if c.data.ndim != 0:
            raise InternalError(
                f"kernel {self.name} holds a constant of shape {c.data.shape}; make it a "
                "parameter first (the lift-constants pass, or kiln.ssa.kernels."
                "constants_as_params)")
        value = c.data.item()
        return compute((), c.dtype, lambda: Const(value, c.dtype))

    def call(self, node: Call, name: str) -> Lowered:
        opdef = registry.get(name, node.span)
        if opdef.lower is None:
            raise Error(f"operator {name} cannot be compiled yet: it has no lowering to loops",
                        node.span)
        args = [self.env[id(a)] for a in node.args]
        out_type = node.checked_type
        self.ops.append(name)
        result = opdef.lower(args, node.attrs, out_type)
        for t in _flatten(result):
            if t.schedule:  # the knobs of a GEMM, for attrs
                self.schedules.append((name, t.schedule))
        for t, ty in zip(_flatten(result), _types(out_type)):
            if t.shape != tuple(ty.shape) or t.dtype != ty.dtype:
                raise InternalError(f"the lowering of {name} gives {t.dtype}{list(t.shape)} but "
                                    f"its type is {ty}")
        return result

    # --- emitting the loops ------------------------------------------------------------------

    def materialize(self, t: MaterializedTensor) -> None:
        """Write ``t`` into a local buffer; reads of it load from there afterwards."""
        buf = Buffer(f"t{len(self.locals)}", t.shape, t.dtype, "local")

        def store(idx: tuple, v) -> Stmt:  # noqa: ANN001
            new_epoch()
            return Store(buf, idx, v)

        stmt = self.attempt(lambda: t.emit(store))
        self.locals.append(buf)
        self.prelude.append(stmt)
        t.buffer = buf

    def attempt(self, build) -> Stmt:  # noqa: ANN001
        """Run ``build``, materializing whatever it needs in a buffer, until it succeeds."""
        for _ in range(10_000):
            new_epoch()
            try:
                return build()
            except NeedsBuffer as need:
                if need.tensor.buffer is not None:
                    raise InternalError("a materialized tensor asked to be materialized") from None
                self.materialize(need.tensor)
        raise InternalError("lowering did not converge")

    def output(self, t: Tensor, out: Buffer) -> Stmt:
        """The statement writing tensor ``t`` into the output buffer ``out``."""
        if isinstance(t, MaterializedTensor) and t.buffer is None:
            return self.attempt(lambda: t.emit(lambda idx, v: Store(out, idx, v)))
        master = self.epilogue_master(t)
        if master is not None:
            def write(idx: tuple, value) -> Stmt:  # noqa: ANN001
                new_epoch()
                v = LVar("v", value.dtype)
                master.current = (idx, v)
                try:
                    return LetStmt(v, value, Store(out, idx, t(*idx)))
                finally:
                    master.current = None

            for _ in range(1000):
                new_epoch()
                try:
                    return master.emit(write)
                except NeedsBuffer as need:
                    if need.tensor is master:
                        break  # read other than elementwise: plain loops below
                    self.materialize(need.tensor)
        return self.attempt(lambda: self._nest(t, out))

    def _nest(self, t: Tensor, out: Buffer) -> Stmt:
        """Loops over ``t``'s shape storing it into ``out``; trailing axes too short to
        vectorize run as one where the reads allow it (kiln/loops/collapse.py)."""
        count = collapsible_axes(t.shape, lambda idx: t(*idx))
        new_epoch()  # the probe's reads mention its variables
        if count:
            return collapsed_nest(t.shape, lambda idx: Store(out, idx, t(*idx)), count)
        axis = None if nests_kept() else transposed_axis(t.shape, lambda idx: t(*idx))
        new_epoch()
        if axis is not None:  # a read across the input's rows: tiled (transposed_nest.py)
            return transposed_nest(t.shape, lambda idx: Store(out, idx, t(*idx)), axis)
        # reads that divide the vectorized index: its runs a loop of their own (split_nest.py)
        run = False if nests_kept() else split_divisor(t.shape, lambda idx: Store(
            out, idx, t(*idx)))
        new_epoch()
        if run is not False:
            split = split_nest(t.shape, lambda idx: Store(out, idx, t(*idx)), run)
            new_epoch()
            if split is not None:
                return split
        return loop_nest(t.shape, lambda idx: Store(out, idx, t(*idx)))

    def epilogue_master(self, t: Tensor) -> MaterializedTensor | None:
        """The first unmaterialized reduce/extern tensor of ``t``'s shape that ``t`` reads
        elementwise: it will write its elements through ``t`` (the epilogue)."""
        if not isinstance(t, ComputeTensor):
            return None
        probe = tuple(LVar(f"q{k}") for k in range(len(t.shape)))
        seen: list[MaterializedTensor] = []
        new_epoch()
        try:
            for _ in range(1000):
                try:
                    t(*probe)
                    break
                except NeedsBuffer as need:
                    m = need.tensor
                    if any(m is x for x in seen) or m.shape != t.shape:
                        return None
                    seen.append(m)
                    m.current = (probe, LVar("probe", m.dtype))
            return seen[0] if seen else None
        finally:
            for m in seen:
                m.current = None
            new_epoch()  # reads made while probing mention the probe variables

    def run(self) -> Kernel:
        result = self.lower_body()
        outs = _flatten(result)
        fn_type = self.fn.checked_type
        if not isinstance(fn_type, FuncType):
            raise InternalError(f"primitive function {self.name} is typed {fn_type}")
        out_types = _types(fn_type.ret_type)
        out_bufs = [Buffer(f"out{i}", ty.static_shape, ty.dtype)
                    for i, ty in enumerate(out_types)]
        # A reduce/extern result read by several outputs is computed once, into a buffer.
        shared = [t for t in outs if isinstance(t, MaterializedTensor)]
        for t in shared:
            if shared.count(t) > 1 and t.buffer is None:
                self.materialize(t)
        writes = [self.output(t, b) for t, b in zip(outs, out_bufs)]
        stmts = self.prelude + writes
        body: Stmt = stmts[0] if len(stmts) == 1 else Seq(tuple(stmts))
        for buf in reversed(self.locals):
            body = Allocate(buf, body)
        attrs: dict[str, Any] = {"ops": tuple(self.ops)}
        if self.schedules:
            attrs["schedules"] = tuple(self.schedules)
        return verify(Kernel(self.name, tuple(self.inputs), tuple(out_bufs), body, attrs))


def _types(t: Type) -> list[TensorType]:
    if isinstance(t, TensorType):
        return [_static_tensor(t, "the result")]
    out: list[TensorType] = []
    stack: list[Type] = [t]
    while stack:
        x = stack.pop()
        if isinstance(x, TupleType):
            stack.extend(reversed(x.fields))
        else:
            out.append(_static_tensor(x, "a result field"))
    return out


def lower_primitive(fn: Function, name: str = "kernel",
                    target: Target | str | None = None,
                    overrides: ScheduleOverrides | None = None) -> Kernel:
    """The kernel computing a typed primitive function, scheduled for ``target`` (default:
    the enclosing `target_scope`'s, else this machine; see the module docstring), with the
    knobs ``overrides`` gives its sites (default: the enclosing `overrides_scope`'s;
    kiln/loops/tunable.py)."""
    if fn.checked_type_ is None:
        raise InternalError("lower_primitive needs a type-checked function")
    with target_scope(lowering_target(target)):
        if overrides is None:
            return _Lowering(fn, name).run()
        with overrides_scope(overrides):
            return _Lowering(fn, name).run()
