"""ResNet-18/50 (v1.5: the stride sits on the 3x3 conv) with a CIFAR or ImageNet stem."""

import torch
import torch.nn.functional as F
from torch import nn


def _conv_bn(cin, cout, kernel, stride=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, bias=False),
        nn.BatchNorm2d(cout),
    )


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = _conv_bn(cin, width, 3, stride)
        self.conv2 = _conv_bn(width, width, 3)
        self.shortcut = _shortcut(cin, width * self.expansion, stride)

    def forward(self, x):
        out = F.relu(self.conv1(x))
        return F.relu(self.conv2(out) + self.shortcut(x))


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        self.conv1 = _conv_bn(cin, width, 1)
        self.conv2 = _conv_bn(width, width, 3, stride)
        self.conv3 = _conv_bn(width, width * self.expansion, 1)
        self.shortcut = _shortcut(cin, width * self.expansion, stride)

    def forward(self, x):
        out = F.relu(self.conv1(x))
        out = F.relu(self.conv2(out))
        return F.relu(self.conv3(out) + self.shortcut(x))


def _shortcut(cin, cout, stride):
    # Projection only where the shape changes; identity otherwise.
    return _conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else nn.Identity()


class ResNet(nn.Module):
    def __init__(self, block, depths, num_classes=10, imagenet_stem=False):
        super().__init__()
        if imagenet_stem:  # 224px inputs: downsample 4x before the first stage
            self.stem = nn.Sequential(
                _conv_bn(3, 64, 7, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2, padding=1)
            )
        else:  # 32px inputs: keep full resolution
            self.stem = nn.Sequential(_conv_bn(3, 64, 3), nn.ReLU(inplace=True))
        stages, cin = [], 64
        for i, depth in enumerate(depths):
            width = 64 * 2**i
            for j in range(depth):
                stride = 2 if i > 0 and j == 0 else 1
                stages.append(block(cin, width, stride))
                cin = width * block.expansion
        self.stages = nn.Sequential(*stages)
        self.fc = nn.Linear(cin, num_classes)

    def forward(self, images, labels):
        x = self.stages(self.stem(images))
        logits = self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))
        return F.cross_entropy(logits, labels)


def _make(block, depths, imagenet_stem, batch, image, generator, num_classes=10):
    model = ResNet(block, depths, num_classes, imagenet_stem)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, num_classes, (batch,), generator=generator)
    return model, (images, labels)


def resnet18(batch, image, seq, generator, **kw):
    return _make(BasicBlock, (2, 2, 2, 2), False, batch, image, generator, **kw)


def resnet18_imagenet(batch, image, seq, generator, **kw):
    return _make(BasicBlock, (2, 2, 2, 2), True, batch, image, generator, **kw)


def resnet50(batch, image, seq, generator, **kw):
    return _make(Bottleneck, (3, 4, 6, 3), False, batch, image, generator, **kw)


def resnet50_imagenet(batch, image, seq, generator, **kw):
    return _make(Bottleneck, (3, 4, 6, 3), True, batch, image, generator, **kw)
