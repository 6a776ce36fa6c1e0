"""Bring your own model: a small CNN with a skip connection, dropout and batch norm.

The whole contract: `make_model()` returns `(module, example_args)`, and `module(*example_args)`
returns the scalar training loss. Capture and plan it with

    edge-remat graph --model examples/my_model.py:make_model --batch 16 -o my_model.json
    edge-remat plan --graph my_model.json --budget 0.8 -o my_plan.json

`--batch` and `--image` reach the factory because it has parameters with those names.
"""

import torch
import torch.nn.functional as F
from torch import nn


class ResidualBlock(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(channels)

    def forward(self, x):
        y = F.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        return F.relu(x + y)  # the skip connection


class SmallNet(nn.Module):
    def __init__(self, width=32, num_classes=10, dropout=0.2):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, width, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(width), nn.ReLU(inplace=True))
        self.block1 = ResidualBlock(width)
        self.pool = nn.MaxPool2d(2)
        self.block2 = ResidualBlock(width)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(width, num_classes)

    def forward(self, images, labels):
        x = self.block2(self.pool(self.block1(self.stem(images))))
        x = self.dropout(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return F.cross_entropy(self.head(x), labels)


def make_model(batch: int = 8, image: int = 32):
    model = SmallNet()
    images = torch.randn(batch, 3, image, image)
    labels = torch.randint(0, 10, (batch,))
    return model, (images, labels)
