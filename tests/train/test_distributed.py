"""kiln.distributed: two ranks on loopback (spawned here, gloo, bounded in time) train an MLP
and a CNN to the weights single-process training on the full batch reaches, and a CNN with
batch norms in training mode to the weights and running statistics of single-process torch
training that normalizes each shard apart (what torch's DDP computes); a batch that does not
divide by the ranks; replicas kept identical; checkpoints through rank 0; kiln without
PyTorch."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import kiln
from kiln.distributed import shard_sizes
from tests.train.ddp_models import BN_MOMENTUM, MODELS, bn_cnn_params, data
from tests.train.ddp_worker import STEPS, optimizer
from tests.train.helpers import relative_error

ROOT = Path(__file__).resolve().parents[2]
TIMEOUT_S = 420  # both ranks together (90 s seen under a load of 7); a hang fails the test
# model:global batch rows:optimizer[:buffers]. 9 rows over 2 ranks: shards of 5 and 4
RUNS = ["mlp:9:adam", "cnn:6:sgd"]
# batch norms in training mode, their running statistics kept equal by each of
# DataParallel's two ways; 5 rows: shards of 3 and 2
BN_RUNS = ["bncnn:6:sgd:broadcast", "bncnn:5:sgd:average"]


def _free_port() -> int:
    try:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return int(s.getsockname()[1])
    except OSError as e:
        pytest.skip(f"no loopback TCP port for the ranks to meet on: {e}")


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Path:
    torch = pytest.importorskip("torch")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this PyTorch has no torch.distributed gloo backend")
    out = tmp_path_factory.mktemp("ddp")
    port = _free_port()
    procs = []
    for rank in (0, 1):
        env = dict(os.environ, RANK=str(rank), WORLD_SIZE="2", LOCAL_RANK=str(rank),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.train.ddp_worker", str(out), *RUNS, *BN_RUNS],
            cwd=ROOT,
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    logs = []
    try:
        for p in procs:
            logs.append(p.communicate(timeout=TIMEOUT_S)[0])
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the two ranks did not finish in {TIMEOUT_S} s")
    for rank, (p, log) in enumerate(zip(procs, logs)):
        assert p.returncode == 0, f"rank {rank} failed:\n{log[-4000:]}"
    return out


def _single_process(spec: str) -> tuple[kiln.train.Step, list[float]]:
    name, rows_s, opt = spec.split(":")
    rows = int(rows_s)
    make_loss, make_params = MODELS[name]
    step = kiln.train.Step(make_loss(rows), make_params(seed=0), optimizer(opt), threads=1)
    xs, ys = data(name, STEPS, rows)
    return step, [step(xs[s], ys[s]) for s in range(STEPS)]


@pytest.mark.parametrize("spec", RUNS)
def test_two_ranks_train_as_one_process_on_the_full_batch(two_ranks, spec) -> None:
    tag = spec.replace(":", "-")
    ranks = [np.load(two_ranks / f"{tag}-rank{r}.npz") for r in (0, 1)]
    step, losses = _single_process(spec)
    for name, want in step.params.items():
        assert relative_error(ranks[0][name], want) < 1e-5, name
        # the replicas are identical, bit for bit (rank 1 began from other weights)
        assert np.array_equal(ranks[0][name], ranks[1][name]), name
    # the loss each rank returns is the global batch's
    np.testing.assert_allclose(ranks[0]["losses"], losses, rtol=1e-5)
    np.testing.assert_array_equal(ranks[0]["losses"], ranks[1]["losses"])
    assert int(ranks[0]["steps"]) == STEPS


def test_two_ranks_match_torch_on_the_full_batch(two_ranks) -> None:
    # an oracle outside kiln: torch.optim.Adam on the whole batch of 9
    torch = pytest.importorskip("torch")
    from torch.nn import functional as F

    from tests.train.ddp_models import mlp_params

    tp = {k: torch.tensor(v, requires_grad=True) for k, v in mlp_params(seed=0).items()}
    opt = torch.optim.Adam(tp.values(), lr=0.01)
    xs, ys = data("mlp", STEPS, 9)
    for s in range(STEPS):
        opt.zero_grad()
        h = torch.relu(F.linear(torch.from_numpy(xs[s]), tp["w1"], tp["b1"]))
        F.cross_entropy(F.linear(h, tp["w2"], tp["b2"]), torch.from_numpy(ys[s])).backward()
        opt.step()
    got = np.load(two_ranks / "mlp-9-adam-rank0.npz")
    for name, w in tp.items():
        assert relative_error(got[name], w.detach().numpy()) < 1e-5, name


def _torch_sharded_bn_cnn(rows: int, mode: str) -> tuple[dict[str, np.ndarray], list[float]]:
    """The oracle of the batch-norm runs: torch on one process, the global batch's shards
    (rows as DataParallel splits them) each through the network with its own batch norm
    statistics, the loss their mean over all rows, torch.optim.SGD; after each step the
    running statistics are shard 0's (``"broadcast"``) or the shards' means weighted by
    their rows (``"average"``). Returns the weights and running statistics, and the losses."""
    torch = pytest.importorskip("torch")
    from torch.nn import functional as F

    given = bn_cnn_params(seed=0)
    stats = {k: torch.tensor(v) for k, v in given.items() if k[0] in "mv"}
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in given.items() if k not in stats}
    opt = torch.optim.SGD(tp.values(), lr=0.1, momentum=0.9)
    shards = shard_sizes(rows, 2)
    xs, ys = data("bncnn", STEPS, rows)
    losses = []
    for s in range(STEPS):
        opt.zero_grad()
        x, y = torch.from_numpy(xs[s]), torch.from_numpy(ys[s])
        loss, start, updated = torch.zeros(()), 0, []
        for n in shards:
            own = {k: v.clone() for k, v in stats.items()}  # updated in place by batch_norm
            h = F.conv2d(x[start: start + n], tp["c1"], padding=1)
            h = F.relu(F.batch_norm(h, own["m1"], own["v1"], tp["g1"], tp["be1"],
                                    training=True, momentum=BN_MOMENTUM))
            h = F.conv2d(h, tp["c2"], padding=1, stride=2)
            h = F.relu(F.batch_norm(h, own["m2"], own["v2"], tp["g2"], tp["be2"],
                                    training=True, momentum=BN_MOMENTUM))
            logits = F.linear(h.mean((2, 3)), tp["fc"], tp["fcb"])
            loss = loss + F.cross_entropy(logits, y[start: start + n]) * (n / rows)
            updated.append(own)
            start += n
        loss.backward()
        opt.step()
        losses.append(loss.item())
        for k in stats:
            stats[k] = (updated[0][k] if mode == "broadcast" else
                        sum(u[k] * (n / rows) for u, n in zip(updated, shards)))
    out = {k: v.detach().numpy() for k, v in tp.items()}
    out.update({k: v.numpy() for k, v in stats.items()})
    return out, losses


@pytest.mark.parametrize("spec", BN_RUNS)
def test_two_ranks_with_batch_norm_train_as_torch_on_the_shards(two_ranks, spec) -> None:
    """Each rank normalizes with its shard's statistics, as torch's DDP without
    SyncBatchNorm: the weights equal one torch process's that normalizes each shard apart,
    and the running statistics equal shard 0's (broadcast, torch DDP's default) or the
    shards' weighted mean (average), on both ranks bit for bit."""
    _, rows_s, _, mode = spec.split(":")
    tag = spec.replace(":", "-")
    ranks = [np.load(two_ranks / f"{tag}-rank{r}.npz") for r in (0, 1)]
    want, losses = _torch_sharded_bn_cnn(int(rows_s), mode)
    for name, w in want.items():
        assert relative_error(ranks[0][name], w) < 1e-5, name
        assert np.array_equal(ranks[0][name], ranks[1][name]), name
    np.testing.assert_allclose(ranks[0]["losses"], losses, rtol=1e-5)
    # the running statistics moved from torch's start, and the two ways differ
    assert relative_error(want["v2"], np.ones_like(want["v2"])) > 1e-2


def test_rank0_checkpoint_holds_the_trained_weights(two_ranks) -> None:
    step, _ = _single_process("cnn:6:sgd")
    fresh = kiln.train.Step(MODELS["cnn"][0](6), MODELS["cnn"][1](seed=5), optimizer("sgd"),
                            threads=1)
    kiln.train.load_checkpoint(fresh, two_ranks / "cnn-6-sgd-ckpt.npz")
    assert fresh.steps_taken == STEPS
    for name, want in step.params.items():
        assert relative_error(fresh.params[name], want) < 1e-5, name
    for name, slots in step.optimizer_state.items():
        for got, want in zip(fresh.optimizer_state[name], slots):
            assert relative_error(got, want) < 1e-5, name


def test_shards_split_a_batch_as_evenly_as_it_goes() -> None:
    assert shard_sizes(8, 2) == [4, 4]
    assert shard_sizes(9, 2) == [5, 4]
    assert shard_sizes(10, 4) == [3, 3, 2, 2]
    with pytest.raises(kiln.Error, match="at least one row"):
        shard_sizes(1, 2)


def test_kiln_imports_without_torch_and_kiln_distributed_explains() -> None:
    # kiln and kiln.distributed import without loading torch; where `import torch` fails,
    # using kiln.distributed is a kiln.Error that says what is missing
    code = """
import sys
import kiln
kiln.distributed.shard_sizes(4, 2)
assert "torch" not in sys.modules, "kiln imported torch"
sys.modules["torch"] = None   # import torch -> ImportError
try:
    kiln.distributed.init_process_group()
except kiln.Error as e:
    assert "PyTorch" in str(e), e
    print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120, env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_no_process_group_is_a_clear_error(monkeypatch) -> None:
    pytest.importorskip("torch")
    import torch.distributed as dist

    if dist.is_initialized():
        pytest.skip("this process is in a process group already")
    with pytest.raises(kiln.Error, match="no process group"):
        kiln.distributed.DataParallel(MODELS["mlp"][0], MODELS["mlp"][1](), optimizer("sgd"),
                                      batch_size=8)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(kiln.Error, match="torchrun"):
        kiln.distributed.init_process_group()
