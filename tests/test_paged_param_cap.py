"""Coarsening with parameters homed on flash: no planner node reads more parameters than the
heaviest group at the finest level, whatever the node budget leaves to coarsening (a model
whose layers would otherwise share one group, and one load node holding all their weights)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from edge_remat_agent.capture import capture_module
from edge_remat_agent.capture.pipeline import recapture
from edge_remat_agent.floor import floor_node

WIDTH, LAYERS = 64, 12


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, WIDTH)

    def forward(self, x, scale):
        return x + torch.relu(self.fc(self.norm(x))) * scale


class Stack(nn.Module):
    """Twelve blocks of frozen weights under one ModuleList, a trainable head."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(WIDTH, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.head = nn.Linear(WIDTH, 4)
        for p in [*self.embed.parameters(), *self.blocks.parameters()]:
            p.requires_grad_(False)

    def forward(self, x, labels):
        # computed once and read by every block, as a Llama's rotary tables are
        scale = torch.cos(torch.arange(WIDTH, dtype=x.dtype) / WIDTH)
        x = self.embed(x)
        for block in self.blocks:
            x = block(x, scale)
        return F.cross_entropy(self.head(x), labels)


def make_stack():
    torch.manual_seed(0)
    return Stack(), (torch.randn(8, WIDTH), torch.randint(0, 4, (8,)))


def _capture(params_home: str, max_nodes: int = 80, refined: bool = True, level=None):
    module, args = make_stack()
    source = {"model": f"{__file__}:make_stack"}
    return capture_module(module, args, source["model"], optimizer="adamw",
                          max_nodes=max_nodes, level=level, params_home=params_home,
                          source=source, refined=refined)


# Refined: coarsening's half of the node budget chooses level 1 (all blocks in one group).
# Level 1 fixed: no refinement to split them afterwards.
@pytest.mark.parametrize("refined,level", [(True, None), (False, 1)])
def test_no_load_node_holds_more_than_one_block(refined, level):
    block = sum(p.numel() * p.element_size() for p in Block().parameters())
    graph = _capture("flash", 80, refined, level).graph
    assert graph.capture["level"] == 1
    loads = [n.out_bytes for n in graph.nodes if n.kind == "param"]
    assert len(graph) <= 80
    assert max(loads) <= block, (max(loads), block)  # was all twelve blocks' weights at once
    assert sum(loads) >= LAYERS * block  # every block's weights are loaded, one by one
    assert floor_node(graph)[0] < LAYERS * block
    # The board captures again from what the graph records and must get the same graph.
    assert recapture(graph).graph.fingerprint() == graph.fingerprint()


def test_the_node_budget_still_bounds_the_split():
    graph = _capture("flash", max_nodes=24).graph
    assert len(graph) <= 24
