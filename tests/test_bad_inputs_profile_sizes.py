"""Bad-input catalogue: a profile's sizes are bounded as a graph's are (2**53 bytes,
formats/fields.py MAX_GRAPH_BYTES: Reader.size), and a graph node's `attrs.flops` as its
other figures are (1e18, MAX_FIGURE), each refused on load with exit 2 naming the file and the
field (the pattern of test_bad_inputs_profile_bounds.py). QA: ram_total_bytes,
runtime_baseline_bytes, a tier's capacity_bytes and an op's out, workspace and persistent bytes
were capped only at 2**63-1 each (a workspace of 2**60 was taken and planned), and a node of
1e300 FLOPs was taken."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph

PROFILE = {"format": "edge-remat/profile", "version": 1, "name": "p", "source": "measured",
           "device": {}, "power": {"idle_w": 1.0, "active_w": 3.0},
           "ops": {"forward": {"time_s": 0.5, "energy_j": 1.0}},
           "tiers": {"flash": {"read_bytes_per_s": 1e8, "write_bytes_per_s": 1e8}}}

SIZES = ["ram_total_bytes", "runtime_baseline_bytes", "tiers.flash.capacity_bytes",
         "ops.forward.out_bytes", "ops.forward.workspace_bytes", "ops.forward.persistent_bytes"]


def _profile(folder, field: str, value):
    profile = json.loads(json.dumps(PROFILE))
    *parents, last = field.split(".")
    place = profile
    for key in parents:
        place = place[key]
    place[last] = value
    path = folder / "profile.json"
    path.write_text(json.dumps(profile))
    return path


@pytest.mark.parametrize("field", SIZES)
def test_a_profile_size_past_2_53_bytes_is_refused(tmp_path, field):
    path = _profile(tmp_path, field, 2**60)
    refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "90%", "--profile", path),
            BAD_INPUT, f"profile.json: field '{field}'", "at most 2**53 bytes", str(2**60))


def test_a_profile_size_of_2_53_bytes_is_taken(tmp_path):
    # the bound itself, as a graph's total may be it (guard: passes before too)
    from edge_remat_agent.formats import load_profile
    for field in SIZES:
        load_profile(_profile(tmp_path, field, 2**53))


@pytest.mark.parametrize("flops", [1e19, 1e300])
def test_a_node_of_more_than_1e18_flops_is_refused(tmp_path, flops):
    graph = json.loads(tiny_graph(tmp_path).read_text())
    graph["nodes"][1]["attrs"] = {"flops": flops}
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(graph))
    refused(cli("plan", "--graph", path, "--budget", "90%"), BAD_INPUT,
            "graph.json: field 'nodes[1].attrs.flops'", "at most 1e18 FLOPs a node")
    graph["nodes"][1]["attrs"] = {"flops": 1e18}  # the bound itself is taken
    path.write_text(json.dumps(graph))
    assert cli("plan", "--graph", path, "--budget", "90%").returncode == 0
