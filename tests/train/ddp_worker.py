"""One rank of the data-parallel test (tests/train/test_distributed.py starts two):

    RANK=r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=p \
        python -m tests.train.ddp_worker OUT_DIR MODEL:ROWS:OPTIMIZER[:BUFFERS] ...

trains each model for STEPS steps with kiln.distributed.DataParallel on the global batches of
tests/train/ddp_models.py (every rank draws the same ones) and writes, per model, this rank's
weights, running statistics (BUFFERS: DataParallel's ``buffers``) and losses
(``<tag>-rank<r>.npz``) and rank 0's checkpoint (``<tag>-ckpt.npz``); then checks that a
checkpoint loaded back on every rank gives rank 0's weights, that a replica whose weight or
running statistic is changed by one ulp is caught by check_replicas on both ranks, and that a
batch of the wrong size and an unknown way of keeping the running statistics are
refused."""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np

import kiln
from tests.train.ddp_models import MODELS, data

STEPS = 6


def optimizer(name: str) -> kiln.train.Optimizer:
    if name == "adam":
        return kiln.train.Adam(lr=0.01)
    return kiln.train.SGD(lr=0.1, momentum=0.9)


def main() -> None:
    out = sys.argv[1]
    kiln.distributed.init_process_group("gloo", timeout_s=60)
    rank = int(os.environ["RANK"])
    try:  # refused before anything is compiled
        kiln.distributed.DataParallel(MODELS["mlp"][0], MODELS["mlp"][1](), optimizer("sgd"),
                                      batch_size=4, buffers="sync")
        raise AssertionError("an unknown buffers mode was taken")
    except kiln.Error as e:
        assert "'broadcast' or 'average'" in str(e), e
    for spec in sys.argv[2:]:
        name, rows_s, opt, *mode = spec.split(":")
        rows = int(rows_s)
        buffers = mode[0] if mode else "broadcast"
        make_loss, make_params = MODELS[name]
        # rank 1 starts from other weights: the broadcast from rank 0 must replace them
        dp = kiln.distributed.DataParallel(make_loss, make_params(seed=rank), optimizer(opt),
                                           batch_size=rows, check_every=2, threads=1,
                                           bucket_bytes=512, buffers=buffers)
        xs, ys = data(name, STEPS, rows)
        losses = [dp(xs[s], ys[s]) for s in range(STEPS)]
        dp.check_replicas()
        tag = spec.replace(":", "-")
        arrays: dict[str, Any] = {"losses": np.array(losses), "steps": dp.step.steps_taken,
                                  **dp.step.params, **dp.step.buffers}
        np.savez(os.path.join(out, f"{tag}-rank{rank}.npz"), **arrays)
        ckpt = os.path.join(out, f"{tag}-ckpt.npz")
        dp.save(ckpt)
        saved = {k: v.copy() for k, v in dp.step.params.items()}
        dp(xs[0], ys[0])  # move on, then load back
        dp.load(ckpt)
        assert dp.step.steps_taken == STEPS
        for k, v in dp.step.params.items():
            assert np.array_equal(v, saved[k]), k
        # a replica whose weight or running statistic drifts by one ulp is caught, on every
        # rank
        for arrays_of in (dp.step.params, dp.step.buffers):
            if not arrays_of:
                continue
            w = next(iter(arrays_of.values()))
            if rank == 1:
                w.flat[0] = np.nextafter(w.flat[0], np.float32(np.inf))
            try:
                dp.check_replicas()
                raise AssertionError("check_replicas missed a diverged replica")
            except kiln.Error as e:
                assert "diverged" in str(e), e
            dp.broadcast_from_rank0()
            dp.check_replicas()
        try:
            dp(xs[0][:-1], ys[0][:-1])
            raise AssertionError("a batch of the wrong size was taken")
        except kiln.Error as e:
            assert "global batch" in str(e), e
    kiln.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
