"""ResNet-18 and MobileNetV2 in plain PyTorch, for bench/e2e.py.

The published architectures (He et al. 2016; Sandler et al. 2018), layer for layer as torchvision
builds them, written out here because PyPI's torchvision does not import beside this machine's
CPU build of torch (torchvision::nms missing) and the build that does is a 5.5 GB CUDA one.
"""

from __future__ import annotations

import torch
from torch import nn


def _init_keeping_scale(model: nn.Module, linear_std: float | None) -> None:
    """He initialisation over each output's inputs (fan-in), so activations keep their scale.

    With PyTorch's default, and with torchvision's (fan-out, which gives a depthwise 3x3 filter of
    96 channels std 0.05 for 9 inputs), MobileNetV2's activations shrink to 1e-8 by the last layer:
    its output is then the classifier's bias, and comparing outputs across runtimes checks nothing.
    """
    for m in model.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear) and linear_std is not None:
            nn.init.normal_(m.weight, 0, linear_std)
            nn.init.zeros_(m.bias)


def _conv_bn(cin: int, cout: int, kernel: int, stride: int = 1, groups: int = 1,
             relu: str | None = "relu") -> nn.Sequential:
    layers: list[nn.Module] = [nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
                               nn.BatchNorm2d(cout)]
    if relu == "relu":
        layers.append(nn.ReLU(inplace=True))
    elif relu == "relu6":
        layers.append(nn.ReLU6(inplace=True))
    return nn.Sequential(*layers)


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.body = nn.Sequential(_conv_bn(cin, cout, 3, stride), _conv_bn(cout, cout, 3, relu=None))
        self.shortcut = _conv_bn(cin, cout, 1, stride, relu=None) if stride != 1 or cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


class ResNet18(nn.Module):
    def __init__(self, classes: int = 1000):
        super().__init__()
        blocks, cin = [], 64
        for cout, stride in ((64, 1), (128, 2), (256, 2), (512, 2)):
            blocks += [_BasicBlock(cin, cout, stride), _BasicBlock(cout, cout, 1)]
            cin = cout
        self.features = nn.Sequential(_conv_bn(3, 64, 7, 2), nn.MaxPool2d(3, 2, 1), *blocks)
        self.fc = nn.Linear(512, classes)
        _init_keeping_scale(self, linear_std=None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))


class _InvertedResidual(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int, expand: int):
        super().__init__()
        hidden = cin * expand
        layers = [_conv_bn(cin, hidden, 1, relu="relu6")] if expand != 1 else []
        layers += [_conv_bn(hidden, hidden, 3, stride, groups=hidden, relu="relu6"),
                   _conv_bn(hidden, cout, 1, relu=None)]
        self.body = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.body(x) if self.residual else self.body(x)


class MobileNetV2(nn.Module):
    # (expansion, output channels, repeats, first stride) per stage, as in the paper's table 2
    STAGES = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))

    def __init__(self, classes: int = 1000):
        super().__init__()
        layers: list[nn.Module] = [_conv_bn(3, 32, 3, 2, relu="relu6")]
        cin = 32
        for expand, cout, repeats, stride in self.STAGES:
            for i in range(repeats):
                layers.append(_InvertedResidual(cin, cout, stride if i == 0 else 1, expand))
                cin = cout
        layers.append(_conv_bn(cin, 1280, 1, relu="relu6"))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, classes))
        _init_keeping_scale(self, linear_std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(nn.functional.adaptive_avg_pool2d(self.features(x), 1), 1))
