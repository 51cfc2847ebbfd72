"""Small torch models for the PyTorch importer's tests, written out in torch (no torchvision).

Each is a scaled-down relative of a model in benchmarks/: an MLP, a ResNet-18-shaped CNN
(BasicBlocks with downsampling), a MobileNetV2-shaped CNN (inverted residuals, depthwise
convolutions, ReLU6), LSTMs (``nn.LSTM`` and an explicit loop over time steps) and a
transformer encoder (``nn.TransformerEncoderLayer``). Sizes are parameters so the default test
run uses small ones and the slow forms the real ones.
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """Linear-ReLU-Linear-ReLU-Linear."""

    def __init__(self, sizes: tuple[int, ...] = (32, 64, 48, 10)) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        for i in range(len(sizes) - 1):
            layers.append(nn.Linear(sizes[i], sizes[i + 1]))
            if i < len(sizes) - 2:
                layers.append(nn.ReLU())
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class BasicBlock(nn.Module):
    """ResNet's two 3x3 convolutions with a residual connection (1x1 downsample if needed)."""

    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.downsample: nn.Module | None = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                            nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        skip = x if self.downsample is None else self.downsample(x)
        return self.relu(y + skip)


class ResNet(nn.Module):
    """ResNet-18's layout (stem, 4 stages of 2 BasicBlocks, pooling, classifier), any width."""

    def __init__(self, width: int = 8, classes: int = 10, blocks: int = 2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        stages = []
        cin = width
        for i, cout in enumerate([width, 2 * width, 4 * width, 8 * width]):
            stride = 1 if i == 0 else 2
            stage = [BasicBlock(cin, cout, stride)]
            stage += [BasicBlock(cout, cout, 1) for _ in range(blocks - 1)]
            stages.append(nn.Sequential(*stage))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(8 * width, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: 1x1 expand, 3x3 depthwise, 1x1 project; residual when shapes agree."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                       nn.ReLU6(inplace=True)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


class MobileNetV2(nn.Module):
    """MobileNetV2's layout; ``setting`` rows are (expansion, channels, repeats, stride)."""

    FULL = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
            (6, 160, 3, 2), (6, 320, 1, 1)]
    SMALL = [(1, 8, 1, 1), (4, 12, 2, 2), (4, 16, 2, 2), (4, 24, 1, 1)]

    def __init__(self, setting: list[tuple[int, int, int, int]] | None = None,
                 stem: int = 16, last: int = 64, classes: int = 10) -> None:
        super().__init__()
        setting = self.SMALL if setting is None else setting
        layers: list[nn.Module] = [nn.Conv2d(3, stem, 3, 2, 1, bias=False),
                                   nn.BatchNorm2d(stem), nn.ReLU6(inplace=True)]
        cin = stem
        for t, c, n, s in setting:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers += [nn.Conv2d(cin, last, 1, bias=False), nn.BatchNorm2d(last),
                   nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(last, classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.adaptive_avg_pool2d(self.features(x), (1, 1))
        return self.classifier(torch.flatten(x, 1))


class LSTMModel(nn.Module):
    """``nn.LSTM`` followed by a Linear on the last step's output; returns (logits, (h, c))."""

    def __init__(self, inputs: int = 8, hidden: int = 16, layers: int = 1,
                 batch_first: bool = False) -> None:
        super().__init__()
        self.batch_first = batch_first
        self.lstm = nn.LSTM(inputs, hidden, layers, batch_first=batch_first)
        self.fc = nn.Linear(hidden, 4)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        out, (h, c) = self.lstm(x)
        last = out[:, -1] if self.batch_first else out[-1]
        return self.fc(last), (h, c)


class LoopLSTM(nn.Module):
    """An LSTM written as a Python loop over time steps, with ``nn.LSTMCell`` or Linear gates."""

    def __init__(self, inputs: int = 8, hidden: int = 16, cell: bool = True) -> None:
        super().__init__()
        self.hidden = hidden
        self.cell = nn.LSTMCell(inputs, hidden) if cell else None
        self.gates_x = nn.Linear(inputs, 4 * hidden)
        self.gates_h = nn.Linear(hidden, 4 * hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: (batch, time, features)
        h = torch.zeros(x.shape[0], self.hidden)
        c = torch.zeros(x.shape[0], self.hidden)
        outs = []
        for t in range(x.shape[1]):
            if self.cell is not None:
                h, c = self.cell(x[:, t], (h, c))
            else:
                i, f, g, o = (self.gates_x(x[:, t]) + self.gates_h(h)).chunk(4, dim=1)
                c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
                h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs, dim=1)


class Encoder(nn.Module):
    """``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer``s (batch first)."""

    def __init__(self, d_model: int = 16, heads: int = 2, ff: int = 32, layers: int = 2,
                 norm_first: bool = False, activation: str = "relu") -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d_model, heads, ff, dropout=0.1, batch_first=True,
                                           norm_first=norm_first, activation=activation)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None,
                padding: torch.Tensor | None = None) -> torch.Tensor:
        # is_causal=False: otherwise torch compares the mask with a causal one, a test on
        # data that torch.export cannot trace.
        return self.encoder(x, mask=mask, src_key_padding_mask=padding,
                            is_causal=False if mask is not None else None)


def randomize_norms(model: nn.Module, seed: int = 0) -> nn.Module:
    """Give every batch norm random statistics and affine parameters (fresh ones are 0 and 1,
    which would hide mistakes in how they are imported); returns the model, in eval mode."""
    g = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            c = m.num_features
            with torch.no_grad():
                m.running_mean.copy_(torch.randn(c, generator=g) * 0.1)
                m.running_var.copy_(torch.rand(c, generator=g) + 0.5)
                m.weight.copy_(torch.rand(c, generator=g) + 0.5)
                m.bias.copy_(torch.randn(c, generator=g) * 0.1)
    return model.eval()
