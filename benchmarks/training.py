"""One training step with kiln.train.Step against PyTorch eager autograd and torch.optim.

Each model is written once in PyTorch and imported into kiln with from_torch (eval mode: batch
norm from its running statistics, no dropout), so both train the same network from the same
weights: forward, cross-entropy loss, gradients of every parameter, and the optimizer's update
(SGD with momentum 0.9, or --optimizer adam). kiln's step is one compiled program that updates
the weights in place; PyTorch's is ``zero_grad``, forward, ``backward``, ``opt.step()``. The two
are timed alternately, one step each, and the medians reported, with the bytes a kiln step
allocates after the first (tracemalloc). With ``--threads 1`` the medians of the CPU time of
the calling thread (which runs both frameworks' kernels then) are reported too: on a machine
other jobs share, they leave out the time a step waits for a core.

Both run with subnormal numbers flushed to zero: kiln's Step does so by default
(docs/training.md, "Subnormal numbers") and PyTorch is given ``torch.set_flush_denormal(True)``,
so that neither is timed on the slow path the other skips. The gradients of these nearly
constant losses decay through the subnormal range after a few steps: PyTorch's ResNet-18 steps
then took 3-18 s instead of 0.4 s on a Sapphire Rapids-class VM. ``--torch-subnormals``
leaves PyTorch in its default mode.

    .venv/bin/python benchmarks/training.py                 # MLP, small CNN, 2-layer encoder
    .venv/bin/python benchmarks/training.py --full          # + ResNet-18 b8, 4-layer encoder
    .venv/bin/python benchmarks/training.py --models mlp --repeat 50 --threads 1
    .venv/bin/python benchmarks/training.py --models resnet18-b2 --repeat 6 --profile

``--profile`` also prints the per-kernel profile of the step's program (`Executable.profile`,
docs/runtime.md "Profiling"); ``resnet18-64`` and ``resnet18-b2`` are ResNet-18 on smaller
inputs, quicker to build and profile than the full one.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

import kiln


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


class MLP(nn.Module):
    def __init__(self, sizes: tuple[int, ...] = (784, 512, 512, 10)) -> None:
        super().__init__()
        self.fc1, self.fc2, self.fc3 = (nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(torch.relu(self.fc2(torch.relu(self.fc1(x)))))


class SmallCNN(nn.Module):
    """conv-bn-relu, pool, a ResNet basic block, global pool, linear (CIFAR-sized input)."""

    def __init__(self, c: int = 32, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(c)
        self.conv1 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(c)
        self.fc = nn.Linear(c, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn(self.stem(x))), 2)
        x = torch.relu(x + self.bn2(self.conv2(torch.relu(self.bn1(self.conv1(x))))))
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Encoder(nn.Module):
    """``layers`` of nn.TransformerEncoderLayer over embedded tokens, mean-pooled, linear."""

    def __init__(self, d: int, heads: int, layers: int, classes: int = 10) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.fc = nn.Linear(d, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.encoder(x).mean(1))


@dataclass
class Case:
    name: str
    make: Callable[[], nn.Module]
    shape: tuple[int, ...]
    classes: int = 10


def resnet18() -> nn.Module:
    """ResNet-18 (kiln.testing's PyTorch twin of kiln.testing.models.resnet18: its output
    goes through a softmax, which the loss then takes the log-softmax of); its weights do not
    depend on the batch or the image size (global pooling before the classifier)."""
    from kiln.testing import models
    from kiln.testing.torch_models import torch_resnet18

    return torch_resnet18(models.resnet18(batch=1, image=224, classes=1000)[1])


CASES = {
    "mlp": Case("MLP 784-512-512-10, batch 64", MLP, (64, 784)),
    "cnn": Case("small CNN (32 channels, one basic block), batch 16, 3x32x32",
                SmallCNN, (16, 3, 32, 32)),
    "encoder": Case("2-layer transformer encoder (d 64, 4 heads), batch 8, seq 32",
                    lambda: Encoder(64, 4, 2), (8, 32, 64)),
    "resnet18": Case("ResNet-18, batch 8, 3x224x224", resnet18, (8, 3, 224, 224), 1000),
    # the same network on small images: its layers' shapes scaled down, quick to build and
    # to profile (--profile)
    "resnet18-64": Case("ResNet-18, batch 2, 3x64x64", resnet18, (2, 3, 64, 64), 1000),
    "resnet18-b2": Case("ResNet-18, batch 2, 3x224x224", resnet18, (2, 3, 224, 224), 1000),
    "encoder4": Case("4-layer transformer encoder (d 256, 4 heads), batch 8, seq 128",
                     lambda: Encoder(256, 4, 4), (8, 128, 256)),
}
DEFAULT = ["mlp", "cnn", "encoder"]
FULL = ["resnet18", "encoder4"]


def optimizers(name: str, model: nn.Module) -> tuple[kiln.train.Optimizer, Any]:
    if name == "adam":
        return kiln.train.Adam(lr=1e-3), torch.optim.Adam(model.parameters(), lr=1e-3)
    return (kiln.train.SGD(lr=0.01, momentum=0.9),
            torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))


def run(case: Case, optimizer: str, repeat: int, threads: int | None,
        profile: bool = False) -> None:
    torch.manual_seed(0)
    model = case.make().eval()
    rng = np.random.default_rng(0)
    x = rng.standard_normal(case.shape).astype("float32")
    y = rng.integers(0, case.classes, case.shape[0]).astype("int64")
    start = time.perf_counter()
    mod, params = kiln.frontend.from_torch(model, (torch.from_numpy(x),))
    names = [n.replace(".", "_") for n, _ in model.named_parameters()]
    ours, theirs = optimizers(optimizer, model)
    step = kiln.train.Step(kiln.train.with_loss(mod, "cross_entropy"), params, ours,
                           trainable=names, threads=threads)
    built = time.perf_counter() - start
    tx, ty = torch.from_numpy(x), torch.from_numpy(y)

    def torch_step() -> None:
        theirs.zero_grad()
        nn.functional.cross_entropy(model(tx), ty).backward()
        theirs.step()

    step(x, y)
    torch_step()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    step(x, y)
    allocated = tracemalloc.get_traced_memory()[1] - base
    tracemalloc.stop()
    kiln_t, torch_t, kiln_c, torch_c = [], [], [], []
    for _ in range(repeat):
        c0, t0 = time.thread_time(), time.perf_counter()
        step(x, y)
        c1, t1 = time.thread_time(), time.perf_counter()
        torch_step()
        c2, t2 = time.thread_time(), time.perf_counter()
        kiln_t.append(t1 - t0)
        torch_t.append(t2 - t1)
        kiln_c.append(c1 - c0)
        torch_c.append(c2 - c1)
    k, t = 1000 * statistics.median(kiln_t), 1000 * statistics.median(torch_t)
    kc, tc = 1000 * statistics.median(kiln_c), 1000 * statistics.median(torch_c)
    cpu = threads == 1
    print(f"{case.name}")
    print(f"  kiln.train.Step   {k:9.3f} ms" + (f"  cpu {kc:9.3f} ms" if cpu else "")
          + f"   (import and build {built:.1f} s; {allocated} bytes traced per step, "
          f"{step.results_allocated} result arrays)")
    print(f"  torch eager       {t:9.3f} ms" + (f"  cpu {tc:9.3f} ms" if cpu else "")
          + f"   torch/kiln {t / k:.2f}x" + (f" (cpu {tc / kc:.2f}x)" if cpu else ""))
    if profile:  # the step's program, on the inputs of its last call, in the step's mode
        from kiln.codegen import flush_denormals

        for program in step._programs:
            with flush_denormals(step.flush_denormals):
                print(program.exe.profile(*program.inputs, repeat=max(3, repeat // 2)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(CASES), default=None)
    parser.add_argument("--full", action="store_true",
                        help="also ResNet-18 (batch 8) and a 4-layer encoder (seq 128)")
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    parser.add_argument("--repeat", type=int, default=30)
    parser.add_argument("--profile", action="store_true",
                        help="also print the step's per-kernel profile (exe.profile)")
    parser.add_argument("--torch-subnormals", action="store_true",
                        help="leave PyTorch computing subnormals (its default; slow once the "
                        "gradients decay into them)")
    parser.add_argument("--threads", type=int, default=None,
                        help="threads for both kiln and torch (default: each its own default)")
    args = parser.parse_args()
    # before PyTorch starts its threads, which take the mode of the thread that creates them
    flush = not args.torch_subnormals and torch.set_flush_denormal(True)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    names = args.models or (DEFAULT + FULL if args.full else DEFAULT)
    print(f"CPU: {cpu_name()}; {kiln.Target.host().describe()}")
    kiln_threads = args.threads or "default"
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, kiln {kiln_threads}; "
          f"optimizer {args.optimizer}; median of {args.repeat} steps each, interleaved; "
          f"PyTorch {'flushes subnormals to zero' if flush else 'computes subnormals'}")
    for name in names:
        run(CASES[name], args.optimizer, args.repeat, args.threads, args.profile)


if __name__ == "__main__":
    main()
