"""BERT encoder (post-LayerNorm) with a pooler + classifier over the [CLS] token."""

import torch
import torch.nn.functional as F
from torch import nn


class SelfAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.out = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape

        def split(t):  # (b, s, h) -> (b, heads, s, h / heads)
            return t.view(b, s, self.heads, h // self.heads).transpose(1, 2)

        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        p = self.dropout if self.training else 0.0  # dropout on attention probabilities
        ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=p)
        return self.out(ctx.transpose(1, 2).reshape(b, s, h))


class Layer(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.attention = SelfAttention(hidden, heads, dropout)
        self.attention_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, 4 * hidden)
        self.output = nn.Linear(4 * hidden, hidden)
        self.output_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = self.attention_norm(x + self.drop(self.attention(x)))
        return self.output_norm(x + self.drop(self.output(F.gelu(self.intermediate(x)))))


class BertClassifier(nn.Module):
    def __init__(self, layers, hidden, heads, vocab=30522, max_positions=512,
                 type_vocab=2, num_classes=2, dropout=0.1):
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_positions, hidden)
        self.token_type = nn.Embedding(type_vocab, hidden)
        self.embed_norm = nn.LayerNorm(hidden, eps=1e-12)
        self.drop = nn.Dropout(dropout)
        self.layers = nn.ModuleList(Layer(hidden, heads, dropout) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, num_classes)
        self.apply(_init)

    def forward(self, input_ids, labels):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        # Single-segment inputs: every token has type 0.
        x = self.word(input_ids) + self.position(positions) + self.token_type(torch.zeros_like(input_ids))
        x = self.drop(self.embed_norm(x))
        for layer in self.layers:
            x = layer(x)
        pooled = torch.tanh(self.pooler(x[:, 0]))  # the [CLS] position
        return F.cross_entropy(self.classifier(self.drop(pooled)), labels)


def _init(module):
    # BERT's init: N(0, 0.02) weights, zero biases; LayerNorm keeps 1 / 0.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear):
        nn.init.zeros_(module.bias)


def _make(layers, hidden, heads, batch, seq, generator, vocab=30522, num_classes=2, max_positions=512):
    if seq > max_positions:
        raise ValueError(f"seq {seq} is longer than max_positions {max_positions}")
    model = BertClassifier(layers, hidden, heads, vocab, max_positions, num_classes=num_classes)
    input_ids = torch.randint(0, vocab, (batch, seq), generator=generator)
    labels = torch.randint(0, num_classes, (batch,), generator=generator)
    return model, (input_ids, labels)


def bert_tiny(batch, image, seq, generator, **kw):
    return _make(2, 128, 2, batch, seq, generator, **kw)


def bert_mini(batch, image, seq, generator, **kw):
    return _make(4, 256, 4, batch, seq, generator, **kw)


def bert_base(batch, image, seq, generator, **kw):
    return _make(12, 768, 12, batch, seq, generator, **kw)
