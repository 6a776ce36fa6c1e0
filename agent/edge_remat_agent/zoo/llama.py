"""A Llama decoder (RMSNorm, rotary positions, grouped-query attention, SwiGLU, untied LM head)
with TinyLlama-1.1B's shape, and LoRA adapters (r = 8 on q and v) as PEFT puts them.

Its weights are made **per tensor** (`init_tensor`: a generator seeded from the model's seed and
the tensor's name), never from the global random stream, so any one tensor can be made on its
own: the weight page store (weights/) writes them one at a time, a model built on the `meta`
device (weights.deferred) gets only its small trainable tensors made in RAM, and plain PyTorch,
which makes them all, gets the very same values.
"""

from __future__ import annotations

import math
import zlib

import torch
import torch.nn.functional as F
from torch import nn

from .lora import LoRALinear

TINYLLAMA = dict(layers=22, hidden=2048, intermediate=5632, heads=32, kv_heads=4, vocab=32000)
LORA_TARGETS = ("q_proj", "v_proj")


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x):
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def rotate(x, cos, sin):
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, heads: int, kv_heads: int):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * self.head_dim, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)

    def forward(self, x, cos, sin):
        b, s, h = x.shape
        q = self.q_proj(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.kv_heads, self.head_dim).transpose(1, 2)
        q, k = rotate(q, cos, sin), rotate(k, cos, sin)
        repeat = self.heads // self.kv_heads
        k = k.repeat_interleave(repeat, dim=1)
        v = v.repeat_interleave(repeat, dim=1)
        ctx = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(ctx.transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, hidden, intermediate, heads, kv_heads):
        super().__init__()
        self.input_layernorm = RMSNorm(hidden)
        self.self_attn = Attention(hidden, heads, kv_heads)
        self.post_attention_layernorm = RMSNorm(hidden)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x, cos, sin):
        x = x + self.self_attn(self.input_layernorm(x), cos, sin)
        return x + self.mlp(self.post_attention_layernorm(x))


class Llama(nn.Module):
    def __init__(self, layers, hidden, intermediate, heads, kv_heads, vocab, rope_theta=10000.0):
        super().__init__()
        self.head_dim, self.rope_theta = hidden // heads, rope_theta
        self.embed_tokens = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(DecoderLayer(hidden, intermediate, heads, kv_heads)
                                    for _ in range(layers))
        self.norm = RMSNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, input_ids, labels):
        # Rotary tables computed in the step (no buffers: a meta-built model has nothing to fill)
        positions = torch.arange(input_ids.shape[1], dtype=torch.float32,
                                 device=input_ids.device)
        inv = 1.0 / self.rope_theta ** (torch.arange(0, self.head_dim, 2, dtype=torch.float32,
                                                     device=input_ids.device) / self.head_dim)
        angles = torch.outer(positions, inv)
        angles = torch.cat((angles, angles), dim=-1)
        # in the model's dtype, as transformers' Llama does (a no-op in float32): bf16 weights
        # would otherwise promote every layer's activations to float32 at the rotation
        dtype = self.embed_tokens.weight.dtype
        cos, sin = angles.cos().to(dtype), angles.sin().to(dtype)
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin)
        logits = self.lm_head(self.norm(x))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def init_tensor(name: str, shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    """The initial value of the parameter `name`, made on its own: the same bytes whichever
    other tensors exist, in whatever order they are made. Drawn in float32 and then converted
    to `dtype`, as `model.to(dtype)` converts a model built in float32 (--dtype bf16: the
    weight file and plain training hold the same values)."""
    return _init_float32(name, shape, seed).to(dtype)


def _init_float32(name: str, shape, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("layernorm.weight") or name == "norm.weight":
        return torch.ones(shape)
    if leaf == "lora_b":
        return torch.zeros(shape)
    if leaf == "lora_a":  # PEFT's kaiming-uniform(a=sqrt(5)) bound: 1 / sqrt(fan_in)
        bound = 1.0 / math.sqrt(shape[1])
        return torch.empty(shape).uniform_(-bound, bound, generator=generator)
    return torch.empty(shape).normal_(0.0, 0.02, generator=generator)


def build_llama(shape: dict, lora_rank: int | None, batch, seq, generator, seed: int,
                deferred: bool):
    """The model and a batch of token ids (next-token labels). `deferred`: parameters on the
    `meta` device (nothing allocated; the caller fills them), else every one made here;
    None: as weights.deferred says (capture and the executor build on meta)."""
    from ..weights.deferred import deferring, make_missing
    if deferred is None:
        deferred = deferring()
    with torch.device("meta"):
        model = Llama(**shape)
        if lora_rank:
            adapt(model, lora_rank)
    model.weight_seed = seed  # weights/deferred.py makes tensors from it
    if not deferred:
        make_missing(model)
    tokens = torch.randint(0, shape["vocab"], (batch, seq + 1), generator=generator)
    return model, (tokens[:, :-1].clone(), tokens[:, 1:].clone())


def adapt(model: nn.Module, rank: int) -> None:
    """LoRA on q and v (PEFT's defaults for Llama: alpha 16), everything else frozen."""
    for param in model.parameters():
        param.requires_grad_(False)
    for layer in model.layers:
        attn = layer.self_attn
        for name in LORA_TARGETS:
            setattr(attn, name, LoRALinear(getattr(attn, name), rank, 16.0, init=False))


def tinyllama_lora(batch, image, seq, generator, *, seed=0, deferred=None,
                   layers=None, vocab=None):
    """TinyLlama-1.1B's shape (22 layers, hidden 2048) with r=8 LoRA on q and v, ~4.4 GB of
    fp32 weights; `layers` (the CI's variant) and `vocab` scale it down."""
    shape = dict(TINYLLAMA, layers=layers or TINYLLAMA["layers"],
                 vocab=vocab or TINYLLAMA["vocab"])
    return build_llama(shape, 8, batch, seq, generator, seed, deferred)


def llama_tiny_lora(batch, image, seq, generator, *, seed=0, deferred=None):
    """The same code at a toy shape (2 layers, hidden 64), for fast tests."""
    shape = dict(layers=2, hidden=64, intermediate=160, heads=4, kv_heads=2, vocab=512)
    return build_llama(shape, 8, batch, seq, generator, seed, deferred)
