"""GPT-2-small-shaped decoder (pre-LayerNorm, causal attention, tied LM head)."""

import torch
import torch.nn.functional as F
from torch import nn


class CausalSelfAttention(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = (t.view(b, s, self.heads, h // self.heads).transpose(1, 2)
                   for t in self.qkv(x).split(h, dim=2))
        p = self.dropout if self.training else 0.0
        ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        return self.proj(ctx.transpose(1, 2).reshape(b, s, h))


class Block(nn.Module):
    def __init__(self, hidden, heads, dropout):
        super().__init__()
        self.norm1 = nn.LayerNorm(hidden)
        self.attention = CausalSelfAttention(hidden, heads, dropout)
        self.norm2 = nn.LayerNorm(hidden)
        self.fc = nn.Linear(hidden, 4 * hidden)
        self.proj = nn.Linear(4 * hidden, hidden)
        self.drop = nn.Dropout(dropout)

    def forward(self, x):
        x = x + self.drop(self.attention(self.norm1(x)))
        return x + self.drop(self.proj(F.gelu(self.fc(self.norm2(x)), approximate="tanh")))


class GPT(nn.Module):
    def __init__(self, layers=12, hidden=768, heads=12, vocab=50257, n_ctx=1024, dropout=0.1):
        super().__init__()
        self.token = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(n_ctx, hidden)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(hidden, heads, dropout) for _ in range(layers))
        self.norm = nn.LayerNorm(hidden)
        self.apply(_init)
        # Residual output projections scaled by 1/sqrt(2L) so the residual stream
        # does not grow with depth (GPT-2's init).
        for block in self.blocks:
            for proj in (block.attention.proj, block.proj):
                nn.init.normal_(proj.weight, std=0.02 / (2 * layers) ** 0.5)

    def forward(self, input_ids, labels):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.token(input_ids) + self.position(positions))
        for block in self.blocks:
            x = block(x)
        logits = F.linear(self.norm(x), self.token.weight)  # tied LM head: no extra weights
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _init(module):
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, nn.Linear):
        nn.init.zeros_(module.bias)


def gpt2_small(batch, image, seq, generator, *, vocab=50257, n_ctx=None):
    """``seq`` is the context length; ``n_ctx`` (e.g. 1024, GPT-2's) may make the table longer."""
    n_ctx = n_ctx or seq
    if seq > n_ctx:
        raise ValueError(f"seq {seq} is longer than n_ctx {n_ctx}")
    model = GPT(vocab=vocab, n_ctx=n_ctx)
    # labels are the inputs shifted by one: the loss is next-token prediction.
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    return model, (tokens[:, :-1].clone(), tokens[:, 1:].clone())


def gpt_tiny(batch, image, seq, generator, *, vocab=1000):
    """A two-layer GPT of the same code (hidden 64), for fast tests."""
    model = GPT(layers=2, hidden=64, heads=4, vocab=vocab, n_ctx=seq)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    return model, (tokens[:, :-1].clone(), tokens[:, 1:].clone())


def gpt_mini(batch, image, seq, generator, *, vocab=8000):
    """A six-layer GPT of the same code (hidden 768, 48M parameters): big enough that its weights,
    gradients and AdamW state (~750 MiB) dominate a small board's memory, small enough for CI."""
    model = GPT(layers=6, hidden=768, heads=12, vocab=vocab, n_ctx=seq)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=generator)
    return model, (tokens[:, :-1].clone(), tokens[:, 1:].clone())


def with_lora(factory, rank=8):
    """The factory's model with LoRA adapters (rank `rank`) on every attention projection
    (qkv and its output), everything else frozen: the usual language-model LoRA."""
    from .lora import add_lora

    def build(batch, image, seq, generator, **keywords):
        model, args = factory(batch, image, seq, generator, **keywords)
        return add_lora(model, ("attention.qkv", "attention.proj"), rank), args
    build.__doc__ = f"{factory.__name__} with rank-{rank} LoRA adapters on attention."
    return build
