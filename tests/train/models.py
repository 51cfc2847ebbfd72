"""Small PyTorch models for the fine-tuning tests and the benchmark: a ResNet-style CNN and a
transformer encoder, each ending in a classifier."""

from __future__ import annotations

import torch
from torch import nn


class BasicBlock(nn.Module):
    """ResNet's basic block: two 3x3 convolutions with batch norm and a skip connection."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(y)))


class SmallResNet(nn.Module):
    """conv-bn-relu, max pool, ``blocks`` basic blocks, global average pool, linear."""

    def __init__(self, channels: int = 8, blocks: int = 1, classes: int = 5,
                 batch_norm: bool = True) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, channels, 3, padding=1)
        self.bn = nn.BatchNorm2d(channels) if batch_norm else nn.Identity()
        self.pool = nn.MaxPool2d(2)
        self.blocks = nn.Sequential(*(BasicBlock(channels) for _ in range(blocks)))
        self.fc = nn.Linear(channels, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.pool(torch.relu(self.bn(self.stem(x))))
        x = self.blocks(x)
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(x, 1), 1))


class Encoder(nn.Module):
    """A linear embedding, ``layers`` of nn.TransformerEncoderLayer, mean over the sequence,
    linear."""

    def __init__(self, features: int = 6, d_model: int = 16, heads: int = 2, ff: int = 32,
                 layers: int = 1, classes: int = 5) -> None:
        super().__init__()
        self.embed = nn.Linear(features, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.fc = nn.Linear(d_model, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.encoder(self.embed(x)).mean(1))


def randomize_batch_norm(model: nn.Module, seed: int = 0) -> None:
    """Running statistics other than 0 and 1, so that eval-mode batch norm does something."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.copy_(0.4 * torch.rand(m.running_mean.shape, generator=g) - 0.2)
                m.running_var.copy_(0.5 + torch.rand(m.running_var.shape, generator=g))


def trainable_names(model: nn.Module) -> list[str]:
    """The model's parameters (not its buffers) as from_torch names them."""
    return [name.replace(".", "_") for name, _ in model.named_parameters()]
