"""POET's own problems (shared/benchmarks/poet) import with their per-node costs and paging tier."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from edge_remat.importers.graph_import import load_graph_file
from edge_remat.planner.build import build_problem
from edge_remat.planner.problem import InfeasibleBudget
from edge_remat.planner.solve import solve

POET = Path(__file__).resolve().parents[1].parent / "shared" / "benchmarks" / "poet"
pytestmark = pytest.mark.skipif(not POET.is_dir(), reason=f"{POET} not found (shared/ missing)")


def test_costs_and_tier_come_from_the_file():
    raw = json.loads((POET / "linear__m4.json").read_text())
    graph = load_graph_file(POET / "linear__m4.json")
    assert len(graph) == raw["n_nodes"]
    p = build_problem(graph, 0.7, objective="energy", deadline=1.5)
    assert p.tiers == ("flash",)  # the file carries paging costs, so paging is on by default
    node = raw["nodes"][3]
    assert p.costs.time_s[3] == node["runtime_s"]
    assert p.costs.tiers["flash"].in_energy_j[3] == node["pagein_energy_j"]
    # a fraction is relative to the file's own plain peak (rounded up, as the published
    # benchmarks define it; POET's suggested budgets round down)
    assert p.budget_bytes == math.ceil(0.7 * raw["totals"]["noremat_peak_bytes"])
    # our smallest feasible budget agrees with the file's own lower bound
    assert p.smallest_budget()[0] == raw["totals"]["min_budget_lower_bound_bytes"]


def test_linear_m4_is_solved_to_optimality():
    graph = load_graph_file(POET / "linear__m4.json")
    p = build_problem(graph, 0.5, objective="energy", deadline=1.5, io="sync")  # POET's model
    report = solve(p, "milp", time_limit=60, workers=1)
    assert report.evaluation.feasible
    solver = report.plan.solver
    assert solver["status"] == "optimal" and solver["gap"] <= 0.01
    assert solver["lower_bound"] <= report.evaluation.value * (1 + 1e-6)


def test_budget_below_one_layer_is_refused_with_the_smallest():
    graph = load_graph_file(POET / "linear__m4.json")
    with pytest.raises(InfeasibleBudget) as err:
        build_problem(graph, 0.3, objective="energy", deadline=1.5).check_budget()
    assert err.value.smallest_bytes == 3256 and "3256" in str(err.value)


@pytest.mark.parametrize("edit,words", [
    (lambda raw: raw["edges"].append([5, 2]), ["[5, 2] in 'edges' but not in node 2's preds"]),
    (lambda raw: raw["edges"].append([5, 5]), ["[5, 5]"]),
    (lambda raw: raw["edges"].append([0, 999]), ["[0, 999]"]),
    (lambda raw: raw["edges"].insert(0, [0]), ["edges[0]", "a pair of node ids"]),
    (lambda raw: raw["edges"].remove(raw["edges"][-1]), ["in node", "preds but not in 'edges'"]),
], ids=["a cycle", "a node reading itself", "a node not there", "not a pair", "an edge gone"])
def test_edges_that_disagree_with_the_preds_are_refused(tmp_path, edit, words):
    """The graph is built from the nodes' preds: an edge edited in `edges` alone (a cycle, a
    self-loop, a missing node) planned as if never made, without a word."""
    from edge_remat_agent.formats import FormatError
    raw = json.loads((POET / "linear__m4.json").read_text())
    edit(raw)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(FormatError, match="field 'edges") as caught:
        load_graph_file(path)
    assert all(word in str(caught.value) for word in words), caught.value


def _node3(key, value):
    return lambda raw: raw["nodes"][3].__setitem__(key, value)


@pytest.mark.parametrize("edit, field, words", [
    (_node3("preds", ["x"]), "nodes[3].preds[0]", "a node id"),
    (_node3("preds", [999]), "nodes[3].preds", "ids of nodes in this graph"),
    (_node3("preds", [3]), "nodes[3].preds", "no self-loop"),
    (lambda raw: raw["nodes"].__setitem__(slice(2, 4), [raw["nodes"][3], raw["nodes"][2]]),
     "nodes[2].preds", "come earlier"),
    (_node3("backward", "no"), "nodes[3].backward", "true or false"),
    (lambda raw: raw.__setitem__("format", "poet-benchmark-problem/9"), "format",
     "poet-benchmark-problem/1"),
], ids=["a pred not an id", "a pred not there", "a node its own pred", "out of order",
        "backward not a boolean", "another format version"])
def test_a_malformed_problem_names_the_field_that_is_wrong(tmp_path, edit, field, words):
    """The errors named our format's field (`inputs`) for POET's `preds`, accepted any truthy
    `backward`, and read a file of another format version as a node-link graph ('out_cost')."""
    from edge_remat_agent.formats import FormatError
    raw = json.loads((POET / "linear__m4.json").read_text())
    edit(raw)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(FormatError) as caught:
        load_graph_file(path)
    assert f"field {field!r}:" in str(caught.value) and words in str(caught.value), caught.value
