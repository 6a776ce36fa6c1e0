"""A FLOP- and bytes-based cost estimate for captured ops, used until a device profile replaces it.

Time per op is a roofline: max(FLOPs / compute rate, bytes moved / memory bandwidth) plus a fixed
dispatch overhead. The rates are deliberately modest, edge-board figures; they only need to rank
ops sensibly, and every graph built with them says `"cost_source": "estimate"`.
Everything here is a pure function of shapes, so re-capturing gives the same costs (and the same
graph fingerprint).
"""

from __future__ import annotations

import operator
from dataclasses import asdict, dataclass

import torch
from torch import fx
from torch.utils.flop_counter import flop_registry


@dataclass(frozen=True)
class Rates:
    flops_per_s: float = 2e10  # sustained fp32 matmul rate of a few Cortex-A7x cores
    bytes_per_s: float = 5e9  # LPDDR4/5 bandwidth a single process sees
    op_overhead_s: float = 5e-6  # dispatcher + kernel launch on a CPU
    view_overhead_s: float = 1e-6  # views, getitem: bookkeeping only

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


DEFAULT_RATES = Rates()


@dataclass(frozen=True)
class OpCost:
    flops: int
    bytes_moved: int
    time_s: float


def op_cost(node: fx.Node, is_alias: bool, rates: Rates = DEFAULT_RATES) -> OpCost:
    """Cost of one captured call_function node; aliases move no bytes."""
    if node.target is operator.getitem or is_alias:
        return OpCost(0, 0, rates.view_overhead_s)
    out_val = node.meta.get("val")
    flops = _flops(node, out_val)
    moved = sum(_nbytes(v) for v in _tensors(_vals(node.args)) + _tensors(_vals(node.kwargs)))
    moved += sum(_nbytes(v) for v in _tensors(out_val))
    time = max(flops / rates.flops_per_s, moved / rates.bytes_per_s) + rates.op_overhead_s
    return OpCost(flops, moved, time)


def round_time(seconds: float) -> float:
    """Seconds rounded to 6 significant digits: stable text in the file, stable fingerprints."""
    return float(f"{seconds:.6g}")


def _flops(node: fx.Node, out_val) -> int:
    target = node.target
    packet = getattr(target, "overloadpacket", None)
    formula = flop_registry.get(packet) if packet is not None else None
    if formula is not None:
        try:
            return int(formula(*_vals(node.args), **_vals(node.kwargs), out_val=out_val))
        except Exception:  # a formula that does not take this overload's arguments
            pass
    # Elementwise, reductions, normalizations: about one operation per element touched.
    return sum(t.numel() for t in _tensors(out_val)) + sum(
        t.numel() for t in _tensors(_vals(node.args)))


def _vals(obj):
    return fx.node.map_aggregate(obj, lambda a: a.meta.get("val") if isinstance(a, fx.Node) else a)


def _tensors(obj) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    fx.node.map_aggregate(obj, lambda a: found.append(a) if isinstance(a, torch.Tensor) else a)
    return found


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
