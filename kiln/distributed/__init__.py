"""Data-parallel training on torch.distributed: every process runs a `kiln.train.Step` on its
shard of the batch and the gradients are all-reduced (in buckets, through gloo on CPU)
between the gradient and the update. PyTorch is imported only when this package is used.
docs/training.md describes it.

    kiln.distributed.init_process_group()       # torchrun --nproc-per-node 2 script.py
    dp = kiln.distributed.DataParallel(make_loss, params, kiln.train.SGD(lr=0.1),
                                       batch_size=64)
    loss = dp(x, y)
"""

from kiln.distributed.backend import destroy_process_group, init_process_group, rank_and_world
from kiln.distributed.buckets import DEFAULT_BUCKET_BYTES, GradientBuckets
from kiln.distributed.buffers import BufferSync
from kiln.distributed.data_parallel import DataParallel, shard_sizes

__all__ = ["DEFAULT_BUCKET_BYTES", "BufferSync", "DataParallel", "GradientBuckets",
           "destroy_process_group", "init_process_group", "rank_and_world", "shard_sizes"]
