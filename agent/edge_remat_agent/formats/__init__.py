"""Formats shared by host and agent: graph, plan, profile (versioned JSON, validated on load)."""

from .errors import FormatError
from .graph import KINDS, Graph, Node, NodeId, graph_from_dict, load_graph
from .plan import HOME, OPS, Instruction, Plan, Stages, load_plan, plan_from_dict
from .profile import (TIER_NAMES, ComputeRates, OpCost, Profile, Tier, load_profile,
                      profile_from_dict)

__all__ = ["FormatError", "KINDS", "Graph", "Node", "NodeId", "graph_from_dict", "load_graph",
           "HOME", "OPS", "Instruction", "Plan", "Stages", "load_plan", "plan_from_dict",
           "TIER_NAMES", "ComputeRates", "OpCost", "Profile", "Tier", "load_profile",
           "profile_from_dict"]
