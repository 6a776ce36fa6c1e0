"""MobileNetV2 (width 1.0): inverted residuals with linear bottlenecks and ReLU6."""

import torch
import torch.nn.functional as F
from torch import nn

# (expansion t, output channels c, repeats n, first stride s), as in the paper.
_SETTINGS = [(1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2),
             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


def _conv_bn_relu6(cin, cout, kernel, stride=1, groups=1):
    return nn.Sequential(
        nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
        nn.ReLU6(inplace=True),
    )


class InvertedResidual(nn.Module):
    def __init__(self, cin, cout, stride, expansion):
        super().__init__()
        hidden = cin * expansion
        layers = [] if expansion == 1 else [_conv_bn_relu6(cin, hidden, 1)]
        layers += [
            _conv_bn_relu6(hidden, hidden, 3, stride, groups=hidden),  # depthwise
            nn.Conv2d(hidden, cout, 1, bias=False),  # linear projection: no ReLU
            nn.BatchNorm2d(cout),
        ]
        self.block = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        return x + self.block(x) if self.residual else self.block(x)


class MobileNetV2(nn.Module):
    def __init__(self, num_classes=10, dropout=0.2, last_channels=1280):
        super().__init__()
        layers, cin = [_conv_bn_relu6(3, 32, 3, 2)], 32
        for t, c, n, s in _SETTINGS:
            for i in range(n):
                layers.append(InvertedResidual(cin, c, s if i == 0 else 1, t))
                cin = c
        layers.append(_conv_bn_relu6(cin, last_channels, 1))
        self.features = nn.Sequential(*layers)
        self.classifier = nn.Sequential(nn.Dropout(dropout), nn.Linear(last_channels, num_classes))

    def forward(self, images, labels):
        x = F.adaptive_avg_pool2d(self.features(images), 1).flatten(1)
        return F.cross_entropy(self.classifier(x), labels)


def mobilenet_v2(batch, image, seq, generator, *, num_classes=10):
    model = MobileNetV2(num_classes)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, num_classes, (batch,), generator=generator)
    return model, (images, labels)
