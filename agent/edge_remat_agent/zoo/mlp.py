"""A plain MLP classifier over flattened images: the smallest model, for smoke tests."""

import torch
import torch.nn.functional as F
from torch import nn


class MLP(nn.Module):
    def __init__(self, in_features, hidden=(512, 512), num_classes=10):
        super().__init__()
        layers, width = [], in_features
        for h in hidden:
            layers += [nn.Linear(width, h), nn.ReLU(inplace=True)]
            width = h
        layers.append(nn.Linear(width, num_classes))
        self.net = nn.Sequential(*layers)

    def forward(self, images, labels):
        return F.cross_entropy(self.net(images.flatten(1)), labels)


def mlp(batch, image, seq, generator, *, hidden=(512, 512), num_classes=10):
    model = MLP(3 * image * image, hidden, num_classes)
    images = torch.randn(batch, 3, image, image, generator=generator)
    labels = torch.randint(0, num_classes, (batch,), generator=generator)
    return model, (images, labels)
