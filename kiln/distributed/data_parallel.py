"""`DataParallel`: a `kiln.train.Step` on every process, each on its shard of the batch, the
gradients averaged over the processes between the gradient and the update.

    kiln.distributed.init_process_group()          # under torchrun: gloo on CPU
    dp = kiln.distributed.DataParallel(make_loss, params, kiln.train.SGD(lr=0.1),
                                       batch_size=64)
    for x, y in batches:                            # the same global batch on every rank
        loss = dp(x, y)                             # this rank trains on its rows of it

Each process compiles a split Step (``Step(..., split=True)``) for its shard's size and, in
the Step's ``grad_hook``, all-reduces the gradients in buckets (kiln/distributed/buckets.py).
With a mean loss, the full batch's gradient is the sum over the shards of ``n_r / N`` times
the shard's gradient (``n_r`` its rows, ``N`` the batch's), which holds for unequal shards too,
so a batch that does not divide by the number of processes is split as evenly as it goes
(the first ``N % world`` ranks take one row more) and each rank compiles its own size: give
``model`` as a function of the shard's size for that. ``loss_reduction="sum"`` is for a loss
that sums over the batch (every shard's gradient then counts whole).

Every process then applies the same update to the same weights with the same summed
gradients (a sum that every rank receives bit for bit the same from the all-reduce), so the
replicas stay identical; the weights and optimizer state are broadcast from rank 0 when the
wrapper is made and when a checkpoint is loaded, and `check_replicas` (every
``check_every`` steps, or when called) compares a digest of every rank's weights.

Batch norms in training mode normalize with the statistics of the rank's own shard (torch's
DDP without SyncBatchNorm), so each rank updates its running statistics from other rows:
after every step they are made equal again (kiln/distributed/buffers.py), rank 0's by
default (``buffers="broadcast"``, torch DDP's ``broadcast_buffers=True``) or the ranks'
mean weighted by their shares (``buffers="average"``).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from kiln.distributed.backend import rank_and_world, torch_modules
from kiln.distributed.buckets import DEFAULT_BUCKET_BYTES, GradientBuckets
from kiln.distributed.buffers import MODES as BUFFER_MODES
from kiln.distributed.buffers import BufferSync
from kiln.errors import Error
from kiln.ir.expr import Function
from kiln.ir.module import IRModule
from kiln.train.checkpoint import read_checkpoint, save_checkpoint
from kiln.train.optimizers import Optimizer
from kiln.train.step import Step

Model = IRModule | Function | Callable[[int], IRModule | Function]


def shard_sizes(batch: int, world: int) -> list[int]:
    """The rows of each rank's shard of a batch of ``batch`` rows: as even as it goes, the
    first ``batch % world`` ranks one row more; a `kiln.Error` if a rank would get none."""
    if batch < world:
        raise Error(f"a batch of {batch} rows cannot be split over {world} processes: each "
                    "needs at least one row")
    return [batch // world + (1 if r < batch % world else 0) for r in range(world)]


class DataParallel:
    """Data-parallel training of a loss function (see the module docstring).

    ``model``: the loss function for this rank's shard — an IRModule or Function whose batch
    inputs have the shard's rows on axis 0, or a function from the shard's rows to one (needed
    when the shards differ in size). ``params``, ``optimizer`` and ``step_options``
    (``trainable``, ``clip_grad_norm``, ``target``, ``opt_level``, ``threads``) are
    `kiln.train.Step`'s. ``batch_size``: the global batch's rows. ``loss_reduction``: ``"mean"``
    (the loss is a mean over the batch's rows, as ``with_loss`` makes it) or ``"sum"``.
    ``bucket_bytes``: the size of a gradient bucket (torch DDP's 25 MiB). ``check_every``:
    compare the replicas every that many steps (0: only when `check_replicas` is called).
    ``buffers``: how the running statistics of batch norms in training mode are kept equal
    after each step: ``"broadcast"`` (rank 0's, as torch's DDP) or ``"average"`` (the mean
    weighted by the shards' rows). ``group``: a torch.distributed process group (default: the
    whole job).
    """

    def __init__(self, model: Model, params: Mapping[str, Any], optimizer: Optimizer, *,
                 batch_size: int, loss_reduction: str = "mean",
                 bucket_bytes: int = DEFAULT_BUCKET_BYTES, check_every: int = 0,
                 buffers: str = "broadcast", group: Any = None, **step_options: Any) -> None:
        self.torch, self.dist = torch_modules()
        self.group = group
        self.rank, self.world_size = rank_and_world(group)
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise Error(f"batch_size must be a positive integer, got {batch_size!r}")
        if loss_reduction not in ("mean", "sum"):
            raise Error(f"loss_reduction must be 'mean' or 'sum', not {loss_reduction!r}")
        if buffers not in BUFFER_MODES:
            raise Error(f"buffers must be 'broadcast' or 'average', not {buffers!r}")
        if not isinstance(check_every, int) or check_every < 0:
            raise Error(f"check_every must be a non-negative integer, got {check_every!r}")
        for name in ("split", "grad_hook"):
            if name in step_options:
                raise Error(f"DataParallel sets the Step's {name} itself")
        self.batch_size = batch_size
        self.shards = shard_sizes(batch_size, self.world_size)
        self.local_batch = self.shards[self.rank]
        self.offset = sum(self.shards[: self.rank])
        self.scale = self.local_batch / batch_size if loss_reduction == "mean" else 1.0
        self.check_every = check_every
        self._agree("the global batch size", batch_size)
        fn = model(self.local_batch) if callable(model) and not isinstance(
            model, (IRModule, Function)) else model
        self.step = Step(fn, params, optimizer, split=True, grad_hook=self._reduce,
                         **step_options)
        for t in self.step.batch_types:
            rows = t.static_shape[0] if t.static_shape else None
            if rows != self.local_batch:
                raise Error(f"rank {self.rank}'s shard has {self.local_batch} rows but the loss "
                            f"function takes a batch input of type {t}; give model as a "
                            "function of the shard's rows")
        arrays = self._weights()
        self._agree("the number of weights and state arrays", len(arrays))
        self._agree("the number of weight and state elements", sum(a.size for a in arrays))
        self.buckets = GradientBuckets([w.shape for w in self.step.params.values()],
                                       bucket_bytes=bucket_bytes, group=group)
        self.buffer_sync = BufferSync(list(self.step.buffers.values()), buffers,
                                      share=self.local_batch / batch_size, src=self._src(),
                                      group=group)
        self._loss = float("nan")
        self.broadcast_from_rank0()

    # -- training ------------------------------------------------------------------------

    def __call__(self, *batch: Any, lr: float | None = None) -> float:
        """One step on the global ``batch`` (every rank given the same arrays, or at least
        the same shape): this rank trains on its rows. Returns the global batch's loss."""
        shard = []
        for i, b in enumerate(batch):
            a = np.asarray(b)
            if a.ndim == 0 or a.shape[0] != self.batch_size:
                raise Error(f"batch input {i} has shape {a.shape}; DataParallel was made for a "
                            f"global batch of {self.batch_size} rows (axis 0)")
            shard.append(a[self.offset: self.offset + self.local_batch])
        return self.local_step(*shard, lr=lr)

    def local_step(self, *shard: Any, lr: float | None = None) -> float:
        """One step on this rank's own ``shard`` (for a loader that gives each rank its own
        rows): the global batch's loss."""
        self.step(*shard, lr=lr)
        if self.check_every and self.step.steps_taken % self.check_every == 0:
            self.check_replicas()
        return self._loss

    def _reduce(self, grads: list[np.ndarray]) -> None:
        # the gradient program has updated the running statistics: theirs travel beside the
        # gradients' buckets
        self.buffer_sync.start()
        self._loss = self.buckets.all_reduce(grads, self.scale, self.step.loss)
        self.buffer_sync.finish()

    # -- replicas ------------------------------------------------------------------------

    def _weights(self) -> list[np.ndarray]:
        """The weights, the optimizer state and the running statistics."""
        out = list(self.step.params.values())
        for slots in self.step.optimizer_state.values():
            out.extend(slots)
        out.extend(self.step.buffers.values())
        return out

    def _src(self) -> int:
        """Rank 0 of the group, as a global rank (what torch.distributed's calls take)."""
        return self.dist.get_global_rank(self.group, 0) if self.group is not None else 0

    def _agree(self, what: str, value: int) -> None:
        """A `kiln.Error` on every rank unless every rank has the same ``value``."""
        t = self.torch.tensor([value, -value], dtype=self.torch.int64)
        self.dist.all_reduce(t, op=self.dist.ReduceOp.MAX, group=self.group)
        if int(t[0]) != -int(t[1]):
            raise Error(f"the processes disagree on {what} (from {-int(t[1])} to {int(t[0])}; "
                        f"rank {self.rank} has {value}): every rank must build the same model")

    def broadcast_from_rank0(self) -> None:
        """Give every rank rank 0's weights, optimizer state, running statistics and step
        count."""
        src = self._src()
        for a in self._weights():
            self.dist.broadcast(self.torch.from_numpy(a), src=src, group=self.group)
        steps = self.torch.tensor([self.step.steps_taken], dtype=self.torch.int64)
        self.dist.broadcast(steps, src=src, group=self.group)
        self.step.steps_taken = int(steps[0])

    def digest(self) -> int:
        """A 56-bit digest of this rank's weights, optimizer state, running statistics and
        step count."""
        h = hashlib.blake2b(digest_size=7)
        for a in self._weights():
            h.update(a.tobytes())
        h.update(str(self.step.steps_taken).encode())
        return int.from_bytes(h.digest(), "little")

    def check_replicas(self) -> None:
        """Compare every rank's weights, optimizer state and running statistics (one
        all-reduce of a digest); a `kiln.Error` on every rank when they differ (the replicas
        diverged: a rank given other data or weights)."""
        self._agree("the weights (the replicas diverged)", self.digest())

    # -- checkpoints ---------------------------------------------------------------------

    def save(self, path: str | os.PathLike[str]) -> None:
        """Rank 0 writes the checkpoint (kiln/train/checkpoint.py); every rank waits for it."""
        error = ""
        if self.rank == 0:
            try:
                save_checkpoint(self.step, path)
            except OSError as e:
                error = str(e)
        self._rank0_ok(error, f"rank 0 could not write checkpoint {os.fspath(path)!r}")

    def load(self, path: str | os.PathLike[str]) -> None:
        """Rank 0 reads and validates the checkpoint, then every rank gets its weights,
        optimizer state and step count (only rank 0 needs the file)."""
        error = ""
        state = None
        if self.rank == 0:
            try:
                state = read_checkpoint(self.step, path)
            except Error as e:
                error = str(e)
        self._rank0_ok(error, f"rank 0 could not load checkpoint {os.fspath(path)!r}")
        if state is not None:
            self.step.load_state_dict(state)
        self.broadcast_from_rank0()

    def _rank0_ok(self, error: str, what: str) -> None:
        flag = self.torch.tensor([1 if error else 0], dtype=self.torch.int64)
        self.dist.all_reduce(flag, op=self.dist.ReduceOp.MAX, group=self.group)
        if int(flag[0]):
            raise Error(f"{what}: {error}" if error else what)

    def __repr__(self) -> str:
        return (f"<kiln.distributed.DataParallel rank {self.rank} of {self.world_size}, "
                f"{self.local_batch} of {self.batch_size} rows, {self.buckets!r}>")


__all__ = ["DataParallel", "shard_sizes"]
