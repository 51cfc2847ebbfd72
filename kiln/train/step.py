"""`kiln.train.Step`: a training step compiled into one executable, its weights kept in place.

    step = kiln.train.Step(mod, params, optimizer=kiln.train.Adam(lr=1e-3))
    for x, y in batches:
        loss = step(x, y)          # forward, gradients, clipping and update: one native call
    step.params["fc1_weight"]      # the weights, in the Step's own arrays

``mod``'s @main is a loss function: its parameters named in ``params`` are weights (trained,
or frozen when left out of ``trainable``), the others are the batch, given to each call in
order. The Step owns the weights and the optimizer's state as numpy arrays and each step's
results overwrite them (donation): the compiled program's results for the new weights and
state are written into the memory of the inputs they replace, so after the first call a
step allocates nothing (the native executor; the VM, for programs it cannot compile whole,
returns new arrays that are copied into the Step's).

A model with batch norms in training mode keeps their running statistics as parameters (given
in ``params``, like torch's buffers): the step updates them in place, as it does the weights,
and ``step.buffers`` holds them. A dropout key parameter (``nn.dropout_train(x, %key)``) is
filled by the Step before each step from ``seed`` and the step count (kiln/train/buffers.py),
so that a run is reproducible from its seed.

``split=True`` compiles the step as two executables, gradients then update, and calls
``grad_hook(grads)`` between them with the gradient arrays (the Step's, to change in place):
where a data-parallel wrapper all-reduces them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from kiln.errors import Error, InternalError
from kiln.infer import infer_types
from kiln.ir.expr import Function
from kiln.ir.module import IRModule
from kiln.ir.ty import TensorType, TupleType, Type
from kiln.runtime.build import Executable, build
from kiln.runtime.native import NativeExecutor
from kiln.ssa.memory import donation_hazards
from kiln.target import Target
from kiln.train.buffers import check_other_functions, find_buffers
from kiln.train.clip import check_max_norm
from kiln.train.optimizers import Optimizer
from kiln.train.program import gradient_function, step_function, update_function

GradHook = Callable[[list[np.ndarray]], None]


def _leaves(t: Type) -> list[TensorType]:
    stack, out = [t], []
    while stack:
        x = stack.pop()
        if isinstance(x, TupleType):
            stack.extend(reversed(x.fields))
        elif isinstance(x, TensorType) and x.is_static:
            out.append(x)
        else:
            raise Error(f"a training step's values must be tensors of static shape, not {x}")
    return out


def _empty(t: TensorType) -> np.ndarray:
    return np.zeros(t.static_shape, t.dtype)


class _Program:
    """One compiled executable run on buffers: the input arrays in a fixed list (the batch's
    places filled per call), the outputs in arrays made once, donated ones in the inputs'."""

    def __init__(self, exe: Executable, inputs: list[np.ndarray | None],
                 donate: Mapping[int, int]) -> None:
        self.exe = exe
        main = exe.program.main
        in_types = [t for p in main.params for t in _leaves(p.type)]
        out_types = _leaves(main.ret_type)
        if len(in_types) != len(inputs):
            raise Error(f"the compiled step takes {len(in_types)} tensors where the Step has "
                        f"{len(inputs)}: a parameter was bound or removed by the build")
        self.inputs = inputs
        self.in_types = in_types
        self.outputs: list[np.ndarray] = []
        self.copy_back: list[tuple[np.ndarray, np.ndarray]] = []  # (scratch, destination)
        executor = exe.executor
        self.native: NativeExecutor | None = (executor if isinstance(executor, NativeExecutor)
                                              else None)
        hazards = donation_hazards(exe.program, dict(donate)) if self.native else set(donate)
        for j, t in enumerate(out_types):
            if j in donate:
                target = inputs[donate[j]]
                assert target is not None
                if target.shape != t.static_shape or target.dtype != np.dtype(t.dtype):
                    raise Error(f"result {j} of the step ({t}) cannot replace input "
                                f"{donate[j]} of shape {target.shape} and dtype {target.dtype}")
                if j in hazards:
                    scratch = _empty(t)
                    self.copy_back.append((scratch, target))
                    self.outputs.append(scratch)
                else:
                    self.outputs.append(target)
            else:
                self.outputs.append(_empty(t))

    def __call__(self) -> None:
        ins: list[Any] = self.inputs
        if self.native is not None:
            threads = self.exe.threads
            if threads is None:
                self.native.run_into(ins, self.outputs)
            else:  # as Executable's own calls do
                from kiln.codegen.threads import run_threads

                with run_threads(threads):
                    self.native.run_into(ins, self.outputs)
        else:
            flat: list[np.ndarray] = []
            stack = [self.exe(*ins)]
            while stack:
                v = stack.pop()
                if isinstance(v, tuple):
                    stack.extend(reversed(v))
                else:
                    flat.append(v)
            # a result the VM hands back may be an input itself (or a view of one), which a
            # copy into a donated input could overwrite before it is read: copy those first
            inputs = [a for a in ins if a is not None]
            flat = [f.copy() if any(np.may_share_memory(f, a) for a in inputs) else f
                    for f in flat]
            for dst, src in zip(self.outputs, flat):
                np.copyto(dst, src)
        for src, dst in self.copy_back:
            np.copyto(dst, src)


class Step:
    """A compiled training step of a loss function (see the module docstring).

    ``model``: an IRModule (its @main) or a Function returning a float32 scalar loss, or a
    tuple whose field 0 is the loss and whose other fields are outputs (`outputs`).
    ``params``: weights by parameter name (copied into the Step's own arrays). ``trainable``:
    the names to train (default: every float32 one of ``params``); the others are frozen,
    compiled in as constants. ``optimizer``: `SGD`, `Adam` or `AdamW` (kiln/train/optimizers.py),
    its learning rate a number or a schedule (kiln/train/schedules.py) read before each step
    and given to the program as an input. ``clip_grad_norm``: the largest global 2-norm of
    the gradients (torch's ``clip_grad_norm_``), None for no clipping. ``split`` and
    ``grad_hook``: see the module docstring. ``seed``: where the dropout keys start (see the
    module docstring). ``target``, ``opt_level`` and ``threads`` are `kiln.build`'s.
    ``flush_denormals`` (default True): the step's kernels treat subnormal floats (below
    1.2e-38) as zero, as TensorFlow and oneDNN do by default — gradients that decay through
    that range otherwise run a hundred times slower on x86 (`kiln.codegen.flush_denormals`).
    """

    def __init__(self, model: IRModule | Function, params: Mapping[str, Any],
                 optimizer: Optimizer, *, trainable: Iterable[str] | None = None,
                 clip_grad_norm: float | None = None, split: bool = False,
                 grad_hook: GradHook | None = None, seed: int = 0,
                 target: Target | str = "llvm", opt_level: int = 3,
                 threads: int | None = None, flush_denormals: bool = True) -> None:
        if not isinstance(optimizer, Optimizer):
            raise Error(f"optimizer must be a kiln.train optimizer (SGD, Adam, AdamW), not "
                        f"{type(optimizer).__name__}")
        if grad_hook is not None and not split:
            raise Error("grad_hook runs between the gradient and the update: give split=True")
        fn, mod = _loss_function(model)
        names = [p.name_hint for p in fn.params]
        unknown = sorted(set(params) - set(names))
        if unknown:
            raise Error(f"params names {', '.join(unknown)}, which the loss function does not "
                        f"take (its parameters: {', '.join(names)})")
        if len(set(names)) != len(names):
            raise Error("the loss function has two parameters of the same name")
        check_other_functions(mod)
        buffers = find_buffers(fn)
        stat_names = [names[i] for i, _ in buffers.stats]
        key_names = [names[i] for i in buffers.keys]
        for n in stat_names:
            if n not in params:
                raise Error(f"params must give %{n}, a running statistic of a batch norm in "
                            "training mode (torch starts the mean at 0, the variance at 1)")
        for n in key_names:
            if n in params:
                raise Error(f"%{n} is a dropout key, which the Step fills before each step "
                            "(from seed=): leave it out of params")
        chosen = ([n for n in names if n in params and n not in stat_names
                   and np.asarray(params[n]).dtype == np.float32]
                  if trainable is None else list(trainable))
        for n in chosen:
            if n not in params:
                raise Error(f"trainable names {n!r}, which is not among the params given")
            if n in stat_names:
                raise Error(f"trainable names {n!r}, a running statistic of a batch norm in "
                            "training mode (the step updates it from the batch, not by its "
                            "gradient)")
        if not chosen:
            raise Error("nothing to train: no float32 weight among the params given")
        from kiln.codegen.threads import flush_denormals as fp_mode  # (kiln.codegen imports us)

        self.optimizer = optimizer
        self.flush_denormals = bool(flush_denormals)
        self._fp_mode = fp_mode
        self.clip_grad_norm = check_max_norm(clip_grad_norm)
        self.grad_hook = grad_hook
        self._trainable = [names.index(n) for n in sorted(set(chosen), key=names.index)]
        frozen = {n: params[n] for n in params
                  if names.index(n) not in self._trainable and n not in stat_names}
        self._batch = [i for i, n in enumerate(names) if n not in params and n not in key_names]
        self._names = names
        self._fn = fn
        types = [p.checked_type for p in fn.params]
        self.seed = int(seed)
        self._buffers: dict[str, np.ndarray] = {}
        for n in stat_names:
            t = types[names.index(n)]
            assert isinstance(t, TensorType)
            value = np.array(params[n], dtype=t.dtype, order="C", copy=True)
            if value.shape != t.static_shape:
                raise Error(f"params[{n!r}] has shape {value.shape}; the loss function's %{n} "
                            f"is {t}")
            self._buffers[n] = value
        self._keys = {n: np.zeros(2, np.int64) for n in key_names}
        self._weights: dict[str, np.ndarray] = {}
        for i in self._trainable:
            t = types[i]
            value = np.array(params[names[i]], dtype=np.float32, order="C", copy=True)
            if not isinstance(t, TensorType) or value.shape != t.static_shape:
                raise Error(f"params[{names[i]!r}] has shape {value.shape}; the loss function's "
                            f"%{names[i]} is {t}")
            self._weights[names[i]] = value
        self._state: dict[str, list[np.ndarray]] = {
            names[i]: [np.zeros_like(self._weights[names[i]]) for _ in optimizer.slots]
            for i in self._trainable}
        self._lr = np.zeros((), np.float32)
        self._step_no = np.zeros((), np.float32)
        self.steps_taken = 0
        self._ran = False  # whether the gradient program has run (the loss is valid)
        # the global norm of the last step's gradients before clipping (NaN without clipping)
        self.grad_norm = float("nan")
        kept = [i for i in range(len(names))
                if i in self._trainable or names[i] not in params
                or names[i] in self._buffers]
        self._in_types = {i: types[i] for i in kept}

        def compile_(f: Function, bound: Mapping[str, Any]) -> Executable:
            return build(IRModule.from_expr(f, mod), target=target, opt_level=opt_level,
                         params=bound, threads=threads)

        weights = [self._weights[names[i]] for i in self._trainable]
        state = [s for i in self._trainable for s in self._state[names[i]]]
        # the loss function's kept parameters, in order (the batch's places filled per call)
        front: list[np.ndarray | None] = [None if i in self._batch else
                                          self._held(names[i]) for i in kept]
        self._slots = [kept.index(i) for i in self._batch]
        n_w, n_s, n_b = len(weights), len(state), len(stat_names)
        where = {i: kept.index(i) for i in self._trainable}
        # the results that replace the running statistics, after the others of their tuple
        stat_at = {k: kept.index(names.index(n)) for k, n in enumerate(stat_names)}
        if not split:
            sf, layout = step_function(fn, self._trainable, optimizer,
                                       clip_grad_norm=self.clip_grad_norm, mod=mod)
            _check_layout(layout.stats, [names.index(n) for n in stat_names])
            exe = compile_(sf, frozen)
            inputs = [*front, *state, self._lr, self._step_no]
            donate = {1 + j: where[i] for j, i in enumerate(self._trainable)}
            donate.update({1 + n_w + k: len(front) + k for k in range(n_s)})
            donate.update({1 + n_w + n_s + k: at for k, at in stat_at.items()})
            self._main = _Program(exe, inputs, donate)
            self._programs = [self._main]
            self._has_outputs = layout.has_outputs
            self._norm_at = 1 + n_w + n_s + n_b
            self._outputs_at = self._norm_at + 1
            self._grads: list[np.ndarray] = []
        else:
            gf, layout = gradient_function(fn, self._trainable, mod=mod)
            _check_layout(layout.stats, [names.index(n) for n in stat_names])
            gexe = compile_(gf, frozen)
            self._main = _Program(gexe, list(front),
                                  {1 + n_w + k: at for k, at in stat_at.items()})
            self._grads = self._main.outputs[1: 1 + n_w]
            uf = update_function([fn.params[i] for i in self._trainable], optimizer,
                                 clip_grad_norm=self.clip_grad_norm)
            uexe = compile_(uf, {})
            u_inputs: list[np.ndarray | None] = [*weights, *self._grads, *state, self._lr,
                                                 self._step_no]
            u_donate = {j: j for j in range(n_w)}
            u_donate.update({n_w + k: 2 * n_w + k for k in range(n_s)})
            self._update = _Program(uexe, u_inputs, u_donate)
            self._programs = [self._main, self._update]
            self._has_outputs = layout.has_outputs
            self._norm_at = -1
            self._outputs_at = 1 + n_w + n_b

    def _held(self, name: str) -> np.ndarray:
        """The Step's array for a weight, a running statistic or a dropout key."""
        for arrays in (self._weights, self._buffers, self._keys):
            if name in arrays:
                return arrays[name]
        raise InternalError(f"the Step holds no array for %{name}")

    # -- running ---------------------------------------------------------------------

    def __call__(self, *batch: Any, lr: float | None = None) -> float:
        """One training step on ``batch`` (the loss function's other parameters, in order):
        the loss, before the update."""
        if len(batch) != len(self._batch):
            want = ", ".join(f"%{self._names[i]}" for i in self._batch) or "nothing"
            raise Error(f"the step takes {len(self._batch)} batch input(s) ({want}), "
                        f"got {len(batch)}")
        ins = self._main.inputs
        for slot, i, value in zip(self._slots, self._batch, batch):
            ins[slot] = self._checked(i, value)
        self._lr[...] = self.optimizer.rate(self.steps_taken) if lr is None else lr
        self._step_no[...] = self.steps_taken + 1
        for j, key in enumerate(self._keys.values()):
            key[0] = self.seed
            key[1] = self.steps_taken * len(self._keys) + j
        with self._fp_mode(self.flush_denormals):
            self._main()
        self._ran = True
        if self.grad_hook is not None:
            self.grad_hook(self._grads)
        if len(self._programs) > 1:
            with self._fp_mode(self.flush_denormals):
                self._update()
            self.grad_norm = float(self._update.outputs[-1])
        else:
            self.grad_norm = float(self._main.outputs[self._norm_at])
        self.steps_taken += 1
        return float(self._main.outputs[0])

    def _checked(self, i: int, value: Any) -> np.ndarray:
        t = self._in_types[i]
        assert isinstance(t, TensorType)
        if (type(value) is np.ndarray and value.dtype == np.dtype(t.dtype)
                and value.shape == t.static_shape and value.flags.c_contiguous
                and value.flags.aligned):
            return value
        try:
            a = np.ascontiguousarray(value, dtype=t.dtype)
        except (TypeError, ValueError) as e:
            raise Error(f"batch input %{self._names[i]} must be {t}: {e}") from None
        if a.shape != t.static_shape:
            raise Error(f"batch input %{self._names[i]} must be {t}, got shape {a.shape}")
        if value is not a and isinstance(value, np.ndarray) and value.dtype.kind != a.dtype.kind:
            raise Error(f"batch input %{self._names[i]} must be {t}, got dtype {value.dtype}")
        return a

    # -- what it holds ------------------------------------------------------------------

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The trained weights by name: the Step's own arrays, updated in place by each step
        (copy one to keep it)."""
        return dict(self._weights)

    @property
    def buffers(self) -> dict[str, np.ndarray]:
        """The running statistics of the batch norms in training mode by name: the Step's own
        arrays, updated in place by each step (torch's module buffers)."""
        return dict(self._buffers)

    @property
    def optimizer_state(self) -> dict[str, list[np.ndarray]]:
        """The optimizer's state by weight name, a list in ``optimizer.slots`` order: the
        Step's own arrays, updated in place by each step."""
        return {n: list(ss) for n, ss in self._state.items()}

    @property
    def loss(self) -> float:
        """The loss of the last step run (inside ``grad_hook``: of this step, before the
        update); NaN before the first."""
        return float(self._main.outputs[0]) if self._ran else float("nan")

    @property
    def batch_types(self) -> list[TensorType]:
        """The types of the batch inputs ``step(*batch)`` takes, in order."""
        out = []
        for i in self._batch:
            t = self._in_types[i]
            assert isinstance(t, TensorType)
            out.append(t)
        return out

    @property
    def outputs(self) -> Any:
        """The loss function's other outputs at the last step (the Step's arrays, overwritten
        by the next step); None when it returns only the loss."""
        if not self._has_outputs:
            return None
        rest = self._main.outputs[self._outputs_at:]
        return rest[0] if len(rest) == 1 else tuple(rest)

    @property
    def gradients(self) -> dict[str, np.ndarray]:
        """The last step's gradients by weight name (``split=True`` only: the one-program
        step never stores them)."""
        if not self._grads:
            raise Error("the gradients are kept only by a split step: Step(..., split=True)")
        return {self._names[i]: g for i, g in zip(self._trainable, self._grads)}

    @property
    def executables(self) -> list[Executable]:
        """The compiled programs: one, or gradient then update when split."""
        return [p.exe for p in self._programs]

    @property
    def results_allocated(self) -> int:
        """Result arrays the executors allocated since building (0 when donation holds)."""
        return sum(p.native.results_allocated if p.native is not None else -1
                   for p in self._programs)

    def state_dict(self) -> dict[str, Any]:
        """Copies of the weights, the optimizer state, the running statistics (where the
        model has any) and the step count."""
        out: dict[str, Any] = {
            "params": {n: w.copy() for n, w in self._weights.items()},
            "state": {n: {slot: s.copy() for slot, s in zip(self.optimizer.slots, ss)}
                      for n, ss in self._state.items()},
            "steps_taken": self.steps_taken,
        }
        if self._buffers:
            out["buffers"] = {n: b.copy() for n, b in self._buffers.items()}
        return out

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Set the weights (and, where given, the optimizer state and step count) from a
        `state_dict`; written into the Step's arrays."""
        params = state.get("params", state)
        for name, value in params.items():
            if name not in self._weights:
                raise Error(f"{name!r} is not a trained weight of this step "
                            f"({', '.join(self._weights)})")
            _assign(self._weights[name], value, name)
        for name, slots in state.get("state", {}).items():
            if name not in self._state:
                raise Error(f"{name!r} is not a trained weight of this step")
            for slot, value in slots.items():
                if slot not in self.optimizer.slots:
                    raise Error(f"{type(self.optimizer).__name__} keeps no {slot!r}")
                _assign(self._state[name][self.optimizer.slots.index(slot)], value,
                        f"{name}.{slot}")
        for name, value in state.get("buffers", {}).items():
            if name not in self._buffers:
                raise Error(f"{name!r} is not a running statistic of this step "
                            f"({', '.join(self._buffers) or 'it has none'})")
            _assign(self._buffers[name], value, name)
        if "steps_taken" in state:
            self.steps_taken = int(state["steps_taken"])

    def __repr__(self) -> str:
        return (f"<kiln.train.Step of {len(self._weights)} weights, {self.optimizer!r}, "
                f"{self.steps_taken} steps taken>")


def _check_layout(found: tuple[int, ...], expected: list[int]) -> None:
    if list(found) != expected:
        raise InternalError(f"the step program updates running statistics {found}, the Step "
                            f"holds {expected}")


def _assign(dst: np.ndarray, value: Any, name: str) -> None:
    a = np.asarray(value, dtype=np.float32)
    if a.shape != dst.shape:
        raise Error(f"{name} has shape {dst.shape}, the state dict gives {a.shape}")
    np.copyto(dst, a)


def _loss_function(model: IRModule | Function) -> tuple[Function, IRModule | None]:
    if isinstance(model, IRModule):
        if "main" not in model:
            raise Error("the module has no @main to train")
        mod = model if model.is_typed else infer_types(model)
        fn = mod["main"]
        return fn, mod
    if isinstance(model, Function):
        out = infer_types(model) if model.checked_type_ is None else model
        assert isinstance(out, Function)
        return out, None
    raise Error(f"kiln.train.Step takes an IRModule or a Function, not {type(model).__name__}")


__all__ = ["GradHook", "Step"]
