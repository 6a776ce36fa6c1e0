"""A small CNN for the bundled handwritten digits (edge_remat_agent.data): real data, offline.

The 8x8 digits are enlarged (nearest neighbour) to `image` x `image` before the convolutions,
as a board's camera pipeline would resize to a network's input: the activations then weigh
hundreds of MB while the weights stay tiny, which is the training job rematerialization is for.
The head keeps a 4x4 map (not a global pool) so that where a stroke is still tells the digits
apart, and a batch norm before it lets SGD at lr 0.01 take the loss from 2.3 to under 1 in about
ten steps.
"""

import torch
import torch.nn.functional as F
from torch import nn

SIDE = 8
CLASSES = 10


class DigitsCNN(nn.Module):
    def __init__(self, image=24, width=16, depth=16):
        super().__init__()
        if image % SIDE:
            raise ValueError(f"image must be a multiple of {SIDE}, got {image}")
        self.scale = image // SIDE
        self.stem = nn.Conv2d(1, width, 3, padding=1)
        self.blocks = nn.Sequential(*[
            nn.Sequential(nn.Conv2d(width, width, 3, padding=1, bias=False),
                          nn.BatchNorm2d(width), nn.ReLU())
            for _ in range(depth)])
        self.norm = nn.BatchNorm1d(width * 16)  # lets SGD at the executor's lr 0.01 learn fast
        self.head = nn.Linear(width * 16, CLASSES)

    def forward(self, images, labels):
        x = F.interpolate(images, scale_factor=self.scale, mode="nearest")
        x = self.blocks(F.relu(self.stem(x)))
        features = self.norm(torch.flatten(F.adaptive_avg_pool2d(x, 4), 1))
        return F.cross_entropy(self.head(features), labels)


def digits_cnn(batch, image, seq, generator, *, width=16, depth=16):
    """Example batch: `batch` real digits drawn with `generator`."""
    from ..data import load_digits
    model = DigitsCNN(image, width, depth)
    images, labels = load_digits()
    pick = torch.randint(0, len(labels), (batch,), generator=generator)
    return model, (images[pick], labels[pick])
