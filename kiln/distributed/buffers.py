"""The running statistics of batch norms in training mode (a Step's buffers) kept identical
over the processes after every step.

Each rank normalizes with its own shard's statistics (as torch's DDP does without
SyncBatchNorm), so each rank's step updates its running statistics from other rows and the
replicas would drift apart. After every gradient program, before the update, one collective
per dtype makes them equal again:

- ``"broadcast"`` (the default): every rank takes rank 0's, as torch's DDP does with its
  default ``broadcast_buffers=True`` (it broadcasts rank 0's buffers before each forward;
  here right after the step, so that the replicas are equal between steps too);
- ``"average"``: every rank takes the mean over the ranks weighted by their shares of the
  batch (``n_r / N``). The running statistics are linear in the batch's, so the running
  mean is then exactly the one the whole batch would give; the running variance is the
  weighted mean of the shards' (unbiased) variances, without the spread of the shards'
  means.

All the buffers of one dtype travel in one flat array, started asynchronously so that it
overlaps the gradients' buckets (kiln/distributed/buckets.py)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.distributed.backend import torch_modules
from kiln.errors import Error

MODES = ("broadcast", "average")


class BufferSync:
    """Makes ``arrays`` (in place) equal on every rank of ``group``: rank ``src``'s
    (``"broadcast"``) or their mean weighted by ``share``, this rank's weight
    (``"average"``)."""

    def __init__(self, arrays: Sequence[np.ndarray], mode: str, *, share: float, src: int,
                 group: Any = None) -> None:
        if mode not in MODES:
            raise Error(f"buffers must be one of {', '.join(map(repr, MODES))}, not {mode!r}")
        self.torch, self.dist = torch_modules()
        self.mode, self.share, self.src, self.group = mode, share, src, group
        by_dtype: dict[np.dtype, list[np.ndarray]] = {}
        for a in arrays:
            if mode == "average" and a.dtype.kind != "f":
                raise Error(f"buffers='average' averages floating-point running statistics, "
                            f"not {a.dtype}")
            by_dtype.setdefault(a.dtype, []).append(a)
        self.groups = [(members, np.zeros(sum(a.size for a in members), dtype))
                       for dtype, members in by_dtype.items()]
        self.tensors = [self.torch.from_numpy(flat) for _, flat in self.groups]
        self._works: list[Any] = []

    def start(self) -> None:
        """Pack this rank's buffers and start the collectives."""
        for (members, flat), tensor in zip(self.groups, self.tensors):
            at = 0
            for a in members:
                part = flat[at: at + a.size]
                if self.mode == "average":
                    np.multiply(a.reshape(-1), a.dtype.type(self.share), out=part)
                else:
                    np.copyto(part, a.reshape(-1))
                at += a.size
            if self.mode == "average":
                work = self.dist.all_reduce(tensor, group=self.group, async_op=True)
            else:
                work = self.dist.broadcast(tensor, src=self.src, group=self.group,
                                           async_op=True)
            self._works.append(work)

    def finish(self) -> None:
        """Wait for the collectives and write the result into the buffers."""
        works, self._works = self._works, []
        for (members, flat), work in zip(self.groups, works):
            work.wait()
            at = 0
            for a in members:
                np.copyto(a, flat[at: at + a.size].reshape(a.shape))
                at += a.size

    def __repr__(self) -> str:
        count = sum(len(m) for m, _ in self.groups)
        return f"<BufferSync of {count} buffers by {self.mode}>"


__all__ = ["MODES", "BufferSync"]
