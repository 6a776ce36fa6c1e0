"""Recurrent models: a conv front end with a GRU (keyword spotting on spectrogram-like input) and
an LSTM language model. cuDNN-free CPU recurrent layers run as many small ATen ops per time step,
which is where captured memory most easily drifts from what eager autograd keeps."""

import torch
from torch import nn
from torch.nn import functional as F


class ConvGRU(nn.Module):
    def __init__(self, mels=40, channels=32, hidden=64, layers=2, classes=12):
        super().__init__()
        self.conv = nn.Sequential(nn.Conv1d(mels, channels, 5, padding=2), nn.BatchNorm1d(channels),
                                  nn.ReLU(inplace=True), nn.MaxPool1d(2))
        self.gru = nn.GRU(channels, hidden, num_layers=layers, batch_first=True, dropout=0.1)
        self.head = nn.Linear(hidden, classes)

    def forward(self, features, labels):  # features [batch, mels, frames]
        x = self.conv(features).transpose(1, 2)  # [batch, frames / 2, channels]
        out, _ = self.gru(x)
        return F.cross_entropy(self.head(out[:, -1]), labels)


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab=256, width=64, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=layers, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, tokens, targets):
        out, _ = self.lstm(self.embed(tokens))
        return F.cross_entropy(self.head(out).flatten(0, 1), targets.flatten())


def conv_gru(batch, image, seq, generator, *, mels=40, classes=12):
    """``seq`` is the number of spectrogram frames."""
    features = torch.randn(batch, mels, seq, generator=generator)
    labels = torch.randint(0, classes, (batch,), generator=generator)
    return ConvGRU(mels=mels, classes=classes), (features, labels)


def lstm_lm(batch, image, seq, generator, *, vocab=256):
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    return LSTMLanguageModel(vocab=vocab), (tokens[:, :-1].clone(), tokens[:, 1:].clone())
