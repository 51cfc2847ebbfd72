"""Gradients summed over the processes in buckets: ``torch.distributed.all_reduce`` on flat
float32 buffers of about ``bucket_bytes`` each, started asynchronously one after another so
that packing bucket i+1 (and unpacking bucket i) overlaps bucket i's communication.

A gradient kiln's compiled step gives back is an array of the Step's; a bucket copies each of
its gradients, scaled (the shard's share of the batch), into its buffer, and the sum back out
(``torch.from_numpy`` shares the buffer's memory: torch copies nothing more). Gradients go into
buckets last first, as torch's DDP orders them (the order a backward pass produces them in).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from kiln.distributed.backend import torch_modules
from kiln.errors import Error

DEFAULT_BUCKET_BYTES = 25 * 1024 * 1024  # torch DDP's bucket_cap_mb=25


class _Bucket:
    def __init__(self, members: list[int], sizes: Sequence[int], extra: int) -> None:
        self.members = members
        self.offsets: list[int] = []
        at = extra
        for i in members:
            self.offsets.append(at)
            at += sizes[i]
        self.extra = extra  # leading scalars carried with the gradients (the loss)
        self.flat = np.zeros(at, np.float32)
        self.tensor: Any = None


class GradientBuckets:
    """All-reduces (sums) a fixed list of gradient arrays over ``group`` in buckets; one
    float32 scalar (the loss) travels in the first bucket for free."""

    def __init__(self, shapes: Sequence[tuple[int, ...]], *, bucket_bytes: int =
                 DEFAULT_BUCKET_BYTES, group: Any = None) -> None:
        if not isinstance(bucket_bytes, int) or bucket_bytes <= 0:
            raise Error(f"bucket_bytes must be a positive integer, got {bucket_bytes!r}")
        self.torch, self.dist = torch_modules()
        self.group = group
        self.shapes = [tuple(s) for s in shapes]
        sizes = [int(np.prod(s)) for s in self.shapes]
        groups: list[list[int]] = []
        used = bucket_bytes  # start a new bucket at the first gradient
        for i in reversed(range(len(sizes))):
            if used + 4 * sizes[i] > bucket_bytes and (not groups or groups[-1]):
                groups.append([])
                used = 0
            groups[-1].append(i)
            used += 4 * sizes[i]
        self.buckets = [_Bucket(g, sizes, 1 if k == 0 else 0) for k, g in enumerate(groups)]
        for b in self.buckets:
            b.tensor = self.torch.from_numpy(b.flat)

    def all_reduce(self, grads: Sequence[np.ndarray], scale: float = 1.0,
                   scalar: float = 0.0) -> float:
        """Replace each of ``grads`` (in place) by the sum over the processes of ``scale``
        times it; returns the sum of ``scalar`` (times ``scale``) over the processes."""
        if [g.shape for g in grads] != self.shapes:
            raise Error("the gradients' shapes changed since the buckets were made")
        s = np.float32(scale)
        works = []
        for b in self.buckets:
            if b.extra:
                b.flat[0] = s * np.float32(scalar)
            for i, at in zip(b.members, b.offsets):
                g = grads[i]
                np.multiply(g.reshape(-1), s, out=b.flat[at: at + g.size])
            works.append(self.dist.all_reduce(b.tensor, group=self.group, async_op=True))
        total = 0.0
        for b, work in zip(self.buckets, works):
            work.wait()
            if b.extra:
                total = float(b.flat[0])
            for i, at in zip(b.members, b.offsets):
                g = grads[i]
                np.copyto(g, b.flat[at: at + g.size].reshape(g.shape))
        return total

    def __repr__(self) -> str:
        sizes = ", ".join(f"{4 * b.flat.size / 2**20:.2f} MiB" for b in self.buckets)
        return f"<GradientBuckets of {len(self.shapes)} gradients in [{sizes}]>"


__all__ = ["DEFAULT_BUCKET_BYTES", "GradientBuckets"]
