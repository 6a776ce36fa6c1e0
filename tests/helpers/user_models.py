"""Models as users write them, for the bring-your-own-model tests (MODULE:FACTORY specs)."""

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

HERE = str(Path(__file__).resolve())


class TiedLM(nn.Module):
    """A small language model whose output head shares the embedding's weight."""

    def __init__(self, vocab=100, width=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.mix = nn.Linear(width, width)
        self.head = nn.Linear(width, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, ids):
        logits = self.head(torch.tanh(self.mix(self.emb(ids[:, :-1]))))
        return F.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten())


def make_tied_lm(batch: int = 4, seq: int = 16, seed: int = 0):
    torch.manual_seed(seed)
    return TiedLM(), (torch.randint(0, 100, (batch, seq)),)


def spec(factory: str) -> str:
    return f"{HERE}:{factory}"
