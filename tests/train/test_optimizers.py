"""Each optimizer of kiln.train against torch.optim: the same MLP, initial weights and data,
the weights compared after every one of 25 steps (float32, 1e-5 of the largest weight)."""

from __future__ import annotations

import numpy as np
import pytest

import kiln
from kiln.train import SGD, Adam, AdamW
from tests.train.helpers import batches, mlp_loss, mlp_params, relative_error, torch_loss

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def one_torch_thread():
    """torch's small kernels on one thread: the machine's cores are shared with kiln's."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

STEPS = 25

# The plain forms are covered by the others in the default run (the clipping test runs SGD
# with momentum, the split one Adam); -m slow runs them on their own.
SLOW = {"sgd", "sgd-momentum", "adam"}

CASES = [
    ("sgd", lambda: SGD(lr=0.1), lambda p: torch.optim.SGD(p, lr=0.1)),
    ("sgd-momentum", lambda: SGD(lr=0.05, momentum=0.9),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9)),
    ("sgd-dampening-decay", lambda: SGD(lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.8, dampening=0.3, weight_decay=0.01)),
    ("sgd-nesterov", lambda: SGD(lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3),
     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9, nesterov=True, weight_decay=1e-3)),
    ("adam", lambda: Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01)),
    ("adam-l2", lambda: Adam(lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05),
     lambda p: torch.optim.Adam(p, lr=0.01, betas=(0.8, 0.99), eps=1e-6, weight_decay=0.05)),
    ("adamw", lambda: AdamW(lr=0.01, weight_decay=0.1),
     lambda p: torch.optim.AdamW(p, lr=0.01, weight_decay=0.1)),
]


def run_both(opt, torch_opt, *, clip=None, split=False, steps=STEPS, schedule=None):
    """Train with kiln and with torch side by side; the worst weight error over the steps."""
    params = mlp_params()
    step = kiln.train.Step(mlp_loss(), params, opt, clip_grad_norm=clip, split=split)
    tp = {k: torch.tensor(v, requires_grad=True) for k, v in params.items()}
    topt = torch_opt(list(tp.values()))
    sched = schedule(topt) if schedule is not None else None
    xs, ys = batches(steps)
    worst = 0.0
    for s in range(steps):
        loss = step(xs[s], ys[s])
        topt.zero_grad()
        tl = torch_loss(tp, xs[s], ys[s])
        tl.backward()
        if clip is not None:
            norm = torch.nn.utils.clip_grad_norm_(list(tp.values()), clip)
            assert step.grad_norm == pytest.approx(norm.item(), rel=1e-5)
        topt.step()
        if sched is not None:
            sched.step()
        assert loss == pytest.approx(tl.item(), rel=1e-5)
        for k in params:
            worst = max(worst, relative_error(step.params[k], tp[k].detach().numpy()))
    return worst


@pytest.mark.parametrize("name, make, make_torch", [
    pytest.param(*c, id=c[0], marks=[pytest.mark.slow] if c[0] in SLOW else []) for c in CASES])
def test_optimizer_matches_torch(name, make, make_torch) -> None:
    assert run_both(make(), make_torch) < 1e-5


def test_clipping_by_global_norm_matches_torch() -> None:
    # a max_norm below the gradients' norm, so that every step clips
    worst = run_both(SGD(lr=0.1, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
                     clip=0.5)
    assert worst < 1e-5


def test_split_step_with_clipping_matches_torch() -> None:
    worst = run_both(Adam(lr=0.01), lambda p: torch.optim.Adam(p, lr=0.01), clip=0.5, split=True)
    assert worst < 1e-5


def test_learning_rate_schedule_matches_torch_schedulers() -> None:
    sched = kiln.train.schedules.linear_warmup(
        kiln.train.schedules.cosine(0.05, total_steps=STEPS), warmup_steps=5)

    def torch_sched(opt):
        return torch.optim.lr_scheduler.ChainedScheduler([
            torch.optim.lr_scheduler.LinearLR(opt, start_factor=1 / 3, total_iters=5),
            torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)], optimizer=opt)

    worst = run_both(SGD(lr=sched, momentum=0.9),
                     lambda p: torch.optim.SGD(p, lr=0.05, momentum=0.9), schedule=torch_sched)
    assert worst < 1e-5


def test_each_schedule_is_torchs() -> None:
    from kiln.train import schedules

    pairs = [
        (schedules.constant(0.1), lambda o: torch.optim.lr_scheduler.ConstantLR(o, factor=1.0)),
        (schedules.step(0.1, step_size=4, gamma=0.5),
         lambda o: torch.optim.lr_scheduler.StepLR(o, step_size=4, gamma=0.5)),
        (schedules.cosine(0.1, total_steps=12, min_lr=0.01),
         lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, T_max=12, eta_min=0.01)),
        (schedules.linear_warmup(0.1, warmup_steps=6, start_factor=0.1),
         lambda o: torch.optim.lr_scheduler.LinearLR(o, start_factor=0.1, total_iters=6)),
    ]
    for ours, make in pairs:
        opt = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
        sched = make(opt)
        for t in range(13):  # (torch's cosine climbs again after T_max; kiln's stays at min_lr)
            assert ours(t) == pytest.approx(opt.param_groups[0]["lr"], rel=1e-9, abs=1e-12)
            opt.step()
            sched.step()


def test_lr_given_to_a_call_overrides_the_schedule() -> None:
    params = mlp_params()
    step = kiln.train.Step(mlp_loss(), params, SGD(lr=0.1))
    xs, ys = batches(1)
    step(xs[0], ys[0], lr=0.0)  # no change at lr 0
    for k, v in params.items():
        np.testing.assert_array_equal(step.params[k], v)


def test_bad_options_are_errors() -> None:
    with pytest.raises(kiln.Error, match="nesterov"):
        SGD(lr=0.1, nesterov=True)
    with pytest.raises(kiln.Error, match="beta1"):
        Adam(betas=(1.0, 0.9))
    with pytest.raises(kiln.Error, match="learning rate"):
        SGD(lr=-1.0)
    with pytest.raises(kiln.Error, match="clip_grad_norm"):
        kiln.train.Step(mlp_loss(), mlp_params(), SGD(), clip_grad_norm=0)
    with pytest.raises(kiln.Error, match="warmup_steps"):
        kiln.train.schedules.linear_warmup(0.1, warmup_steps=0)
