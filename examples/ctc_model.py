"""CTC training that captures: the CTC loss in plain tensor ops (a model file, MODULE:FACTORY).

nn.CTCLoss (F.ctc_loss) cannot be captured: torch's op keeps, for backward, a table as long as
the longest target, a length read from the data, so its output shape is not static. The same
loss, -log of the summed probability of every alignment, written as the forward recursion over
a fixed number of time steps, has static shapes and captures:

    edge-remat graph --model examples/ctc_model.py:make_model --batch 4 -o ctc.json

Equal to nn.CTCLoss(reduction="mean") to float rounding (tests/test_capture.py).
"""

from __future__ import annotations

import torch
from torch import nn

UNREACHABLE = -1e30  # log(0) that keeps logsumexp's gradient finite (-inf would give NaN)


def ctc_loss(log_probs, targets, input_lengths, target_lengths, blank: int = 0):
    """nn.CTCLoss(blank, reduction="mean")'s value: log_probs (T, N, C), targets (N, S) padded,
    lengths (N,). Every shape is fixed by T, N and S: the lengths are read as values."""
    steps, batch, _ = log_probs.shape
    labels = targets.new_full((batch, 2 * targets.shape[1] + 1), blank)
    labels[:, 1::2] = targets  # blank, y1, blank, y2, ..., blank
    emit = log_probs.gather(2, labels.unsqueeze(0).expand(steps, -1, -1))  # (T, N, 2S+1)
    # a label may follow the one two back unless it is a blank or repeats it
    skip = torch.zeros_like(labels, dtype=torch.bool)
    skip[:, 2:] = (labels[:, 2:] != blank) & (labels[:, 2:] != labels[:, :-2])
    pad = emit.new_full((batch, 1), UNREACHABLE)
    alpha = torch.cat([emit[0, :, :2], emit.new_full((batch, labels.shape[1] - 2),
                                                     UNREACHABLE)], 1)
    for t in range(1, steps):
        one_back = torch.cat([pad, alpha[:, :-1]], 1)
        two_back = torch.where(skip, torch.cat([pad, pad, alpha[:, :-2]], 1), UNREACHABLE)
        moved = torch.logsumexp(torch.stack([alpha, one_back, two_back]), 0) + emit[t]
        alpha = torch.where((t < input_lengths).unsqueeze(1), moved, alpha)  # past its end: kept
    ends = torch.stack([2 * target_lengths, (2 * target_lengths - 1).clamp(min=0)], 1)
    final = alpha.gather(1, ends)
    final = torch.where(target_lengths.unsqueeze(1) > 0, final,
                        torch.stack([final[:, 0], emit.new_full((batch,), UNREACHABLE)], 1))
    nll = -torch.logsumexp(final, 1)
    return (nll / target_lengths.clamp(min=1)).mean()


class SpeechToLetters(nn.Module):
    """Frames of features -> per-frame letter log-probabilities, trained with CTC."""

    def __init__(self, features: int = 16, letters: int = 8, hidden: int = 32):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(features, hidden), nn.GELU(),
                                     nn.Linear(hidden, letters))

    def forward(self, frames, targets, input_lengths, target_lengths):
        log_probs = self.encoder(frames).log_softmax(-1).transpose(0, 1)  # (T, N, C)
        return ctc_loss(log_probs, targets, input_lengths, target_lengths)


def make_model(batch: int = 4, seq: int = 20, seed: int = 0):
    """seq frames per utterance; targets up to seq // 4 letters (1..7; 0 is the blank)."""
    generator = torch.Generator().manual_seed(seed)
    model = SpeechToLetters()
    frames = torch.randn(batch, seq, 16, generator=generator)
    letters = max(1, seq // 4)
    targets = torch.randint(1, 8, (batch, letters), generator=generator)
    input_lengths = torch.full((batch,), seq, dtype=torch.long)
    input_lengths[-1] = max(1, seq - 3)  # one shorter utterance
    target_lengths = torch.randint(1, letters + 1, (batch,), generator=generator)
    return model, (frames, targets, input_lengths, target_lengths)
