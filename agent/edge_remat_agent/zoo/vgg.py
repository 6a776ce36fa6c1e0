"""VGG-11/16, optionally with batch norm; classifier sized from the input side."""

import torch
import torch.nn.functional as F
from torch import nn

# Output channels per 3x3 conv; "M" is a 2x2 max pool.
_CONFIGS = {
    "vgg11": [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"],
    "vgg16": [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"],
}


class VGG(nn.Module):
    def __init__(self, config, image, num_classes=10, batch_norm=False):
        super().__init__()
        layers, cin = [], 3
        for v in config:
            if v == "M":
                layers.append(nn.MaxPool2d(2))
                continue
            layers.append(nn.Conv2d(cin, v, 3, padding=1, bias=not batch_norm))
            if batch_norm:
                layers.append(nn.BatchNorm2d(v))
            layers.append(nn.ReLU(inplace=True))
            cin = v
        self.features = nn.Sequential(*layers)
        # No adaptive pooling: the first linear layer sees the real feature map, so
        # 224px inputs give the classic 512*7*7 -> 4096 layer and 32px gives 512 -> 4096.
        side = image // 32
        self.classifier = nn.Sequential(
            nn.Linear(512 * side * side, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(4096, num_classes),
        )

    def forward(self, images, labels):
        return F.cross_entropy(self.classifier(self.features(images).flatten(1)), labels)


def _make(name, batch, image, generator, num_classes=10, batch_norm=False):
    if image % 32:
        raise ValueError(f"image side must be a multiple of 32 (five 2x pools), got {image}")
    model = VGG(_CONFIGS[name], image, num_classes, batch_norm)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, num_classes, (batch,), generator=generator)
    return model, (images, labels)


def vgg11(batch, image, seq, generator, **kw):
    return _make("vgg11", batch, image, generator, **kw)


def vgg16(batch, image, seq, generator, **kw):
    return _make("vgg16", batch, image, generator, **kw)
