"""LoRA adapters (Hu et al., 2021) of our own: a frozen base linear layer plus a trainable
low-rank update, y = base(x) + (x A^T B^T) * alpha / r. B starts at zero, so the adapted model
starts as the base model. Everything but the adapters is frozen."""

import math

import torch
from torch import nn


class LoRALinear(nn.Module):
    def __init__(self, base: nn.Linear, rank: int = 8, alpha: float = 16.0, init: bool = True):
        super().__init__()
        self.base = base
        self.lora_a = nn.Parameter(torch.empty(rank, base.in_features))
        self.lora_b = nn.Parameter(torch.zeros(base.out_features, rank))
        if init:  # else the caller gives the values (zoo/llama.py: made per tensor)
            nn.init.kaiming_uniform_(self.lora_a, a=math.sqrt(5))
        self.scale = alpha / rank

    def forward(self, x):
        # PEFT's casts: the input in the adapters' dtype, the sum back in the base's (both
        # no-ops in one dtype; float32 adapters on a bf16 base: --trainable-dtype fp32)
        result = self.base(x)
        update = (x.to(self.lora_a.dtype) @ self.lora_a.t() @ self.lora_b.t()) * self.scale
        return (result + update).to(result.dtype)


def add_lora(model: nn.Module, targets: tuple[str, ...], rank: int = 8,
             alpha: float = 16.0) -> nn.Module:
    """Wrap every nn.Linear whose name ends with one of `targets`; freeze all else."""
    for param in model.parameters():
        param.requires_grad_(False)
    wrapped = 0
    for name, module in list(model.named_modules()):
        for child_name, child in list(module.named_children()):
            full = f"{name}.{child_name}" if name else child_name
            if isinstance(child, nn.Linear) and full.endswith(targets):
                setattr(module, child_name, LoRALinear(child, rank, alpha))
                wrapped += 1
    if not wrapped:
        raise ValueError(f"no linear layer named like {targets} to adapt")
    return model
