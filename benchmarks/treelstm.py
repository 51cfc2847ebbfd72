"""A dynamic program on kiln's VM against eager PyTorch: a binary TreeLSTM over a tree ADT.

``kiln.testing.models.tree_lstm`` (embeddings 300, hidden 150; recursion over ``Tree``, each
leaf and node cell a few kernels) on a random tree of 39 leaves, and its eager twin
(``torch_models.torch_tree_lstm``: the same recursion in Python over nested tuples, the same
weights), timed in interleaved rounds as peers.py times them, medians and p90; then where
kiln's time goes (``exe.profile``: kernel time against the whole run, the rest being the
VM's own work — dispatch, ADT matching, frames, calls into kernels).

    .venv/bin/python benchmarks/treelstm.py [--threads 2] [--repeat 200] [--leaves 39]
"""

from __future__ import annotations

import argparse

import numpy as np
from peers import time_rounds  # benchmarks/peers.py: the same interleaved rounds

import kiln
from kiln.codegen import set_num_threads
from kiln.testing import models, torch_models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=200)
    parser.add_argument("--leaves", type=int, default=39)
    args = parser.parse_args()

    import torch

    set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    mod, params = models.tree_lstm()
    exe = kiln.build(mod, params=params)
    tree = models.random_tree(mod, args.leaves)
    twin = torch_models.torch_tree_lstm(params)
    torch_tree = torch_models.as_torch_tree(tree)
    with torch.inference_mode():
        want = twin(torch_tree).numpy()
    error = float(np.abs(exe(tree) - want).max())
    print(f"{kiln.Target.host().describe()}; {args.threads} thread(s)")
    print(f"TreeLSTM, {args.leaves} leaves, embeddings 300, hidden 150: kiln "
          f"({exe.stats().executor} executor) vs eager torch, max error {error:.1e}")

    def torch_call() -> object:
        with torch.inference_mode():
            return twin(torch_tree)

    t = time_rounds({"kiln": lambda: exe(tree), "torch": torch_call}, args.repeat)
    print(f"  kiln {t.median['kiln'] * 1e3:.3f} ms (p90 {t.p90['kiln'] * 1e3:.3f}), torch "
          f"{t.median['torch'] * 1e3:.3f} ms (p90 {t.p90['torch'] * 1e3:.3f}): kiln/torch "
          f"{t.median['kiln'] / t.median['torch']:.2f}\n")
    print(exe.profile(tree, repeat=50))


if __name__ == "__main__":
    main()
