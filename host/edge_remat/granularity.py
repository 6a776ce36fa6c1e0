"""How fine a captured graph is, as `graph`, `run` and fleet manifests ask for it: module-level
groups within a node cap (max_nodes; level fixes the module-tree depth), or one planner node
per ATen op that allocates (operator_level), where neither applies."""

from __future__ import annotations

import re
from typing import Optional


def granularity_mistake(operator_level: bool, max_nodes: Optional[int],
                        level: Optional[int]) -> Optional[str]:
    """Why these capture options cannot go together (None: they can). `max_nodes` and `level`
    are None where not given: their defaults go with every granularity, but a cap or a depth
    the user gave would be dropped in silence by the operator-level graph, whose node count is
    the model's own (hundreds to thousands of nodes)."""
    if not operator_level:
        return None
    if level is not None:
        return ("--level picks the module-tree depth of the planner's nodes; "
                "--operator-level makes one node per ATen op, where no level applies: "
                "give one of them")
    if max_nodes is not None:
        return ("--max-nodes caps the planner nodes of module-level grouping; "
                "--operator-level makes one node per ATen op that allocates, as many as the "
                "model has, with no cap: give one of them")
    return None


def as_manifest_keys(mistake: str) -> str:
    """The same words for a fleet manifest, whose keys are the options' names in snake case
    (`--max-nodes` -> `max_nodes`)."""
    return re.sub(r"--([a-z-]+)", lambda m: m.group(1).replace("-", "_"), mistake)
