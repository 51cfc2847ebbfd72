"""torch.distributed, imported only when kiln.distributed is used: kiln itself never needs
PyTorch, and without it a data-parallel call is a `kiln.Error` that says what to install."""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

from kiln.errors import Error


def torch_modules() -> tuple[ModuleType, ModuleType]:
    """``(torch, torch.distributed)``; a `kiln.Error` when PyTorch or its distributed package
    is missing."""
    try:
        import torch
        import torch.distributed as dist
    except ImportError as e:
        raise Error("kiln.distributed communicates through torch.distributed, and PyTorch is "
                    f"not installed ({e}): pip install torch (the CPU build has gloo)") from None
    if not dist.is_available():
        raise Error("this PyTorch was built without torch.distributed; kiln.distributed "
                    "needs it (the standard CPU and CUDA builds have it)")
    return torch, dist


def init_process_group(backend: str = "gloo", *, rank: int | None = None,
                       world_size: int | None = None, timeout_s: float = 300.0) -> None:
    """Join the process group, unless this process already has: from torchrun's environment
    (``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) or the ``rank`` and
    ``world_size`` given. ``backend`` is torch's (``"gloo"`` on CPU)."""
    import datetime

    _, dist = torch_modules()
    if dist.is_initialized():
        return
    if backend == "gloo" and not dist.is_gloo_available():
        raise Error("this PyTorch has no gloo backend, which kiln.distributed uses on CPU")
    env = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    if rank is None and "RANK" not in os.environ:
        raise Error("no process group to join: run under torchrun (which sets RANK, "
                    "WORLD_SIZE, MASTER_ADDR and MASTER_PORT) or give rank= and world_size=")
    missing = [k for k, v in env.items() if not v]
    if missing:
        raise Error(f"the environment lacks {', '.join(missing)}, which torch.distributed "
                    "needs to find rank 0 (torchrun sets them)")
    kwargs: dict[str, Any] = {"timeout": datetime.timedelta(seconds=timeout_s)}
    if rank is not None:
        kwargs["rank"] = rank
    if world_size is not None:
        kwargs["world_size"] = world_size
    dist.init_process_group(backend, **kwargs)


def destroy_process_group() -> None:
    """Leave the process group (a no-op when there is none)."""
    _, dist = torch_modules()
    if dist.is_initialized():
        dist.destroy_process_group()


def rank_and_world(group: Any = None) -> tuple[int, int]:
    """This process's rank in ``group`` (default: the whole job) and the group's size; a
    `kiln.Error` outside a process group."""
    _, dist = torch_modules()
    if not dist.is_initialized():
        raise Error("no process group: call kiln.distributed.init_process_group() first "
                    "(under torchrun)")
    return dist.get_rank(group), dist.get_world_size(group)


__all__ = ["destroy_process_group", "init_process_group", "rank_and_world", "torch_modules"]
