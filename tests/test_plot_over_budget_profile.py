"""`plot --plan ... --profile P` says a plan is over its budget from the replay it draws: the
profile's costs (its workspaces), as `simulate --profile P` refuses it. QA: the warning replayed
the plan with the graph's own costs whatever --profile said, so a memory plot drawn over the
budget line came without a word, and one drawn under it was said to be over."""

from __future__ import annotations

import json
import re

from helpers.bad_inputs import cli, tiny_graph

WARNING = re.compile(r"^warning: (\S+) peaks at (\d+) bytes, over its budget of (\d+) bytes "
                     r"\(`edge-remat simulate` refuses it\)$", re.M)


def _profile(folder, name: str, workspace: int):
    path = folder / f"{name}.json"
    path.write_text(json.dumps({
        "format": "edge-remat/profile", "version": 1, "name": name, "source": "measured",
        "power": {"idle_w": 1.0, "active_w": 2.0},
        "ops": {op: {"time_s": 1.0, "workspace_bytes": workspace}
                for op in ("forward", "loss", "backward")}}))
    return path


def _plan(folder, graph, *profile):
    plan = folder / "plan.json"
    made = cli("plan", "--graph", graph, *profile, "--budget", "1.0", "--solver",
               "heuristic:split", "-o", plan)
    assert made.returncode == 0, made.stderr
    return plan


def test_a_profile_that_puts_the_plan_over_its_budget_is_warned_of(tmp_path):
    """A plan made on the graph's own costs at its plain peak, drawn with a profile whose
    workspaces take it past the budget: the warning names the peak simulate refuses."""
    graph = tiny_graph(tmp_path)
    plan, profile = _plan(tmp_path, graph), _profile(tmp_path, "big-workspaces", 500_000)
    plotted = cli("plot", "--plan", plan, "--graph", graph, "--profile", profile, "--out",
                  tmp_path / "png")
    assert plotted.returncode == 0, plotted.stderr
    assert (tmp_path / "png" / "memory.png").is_file()
    simulated = cli("simulate", plan, "--graph", graph, "--profile", profile)
    assert simulated.returncode == 2, simulated.stderr
    refused_peak = re.search(r"the plan's peak, (\d+) bytes, is over its budget of (\d+)",
                             simulated.stderr)
    assert refused_peak, simulated.stderr
    said = WARNING.search(plotted.stderr)
    assert said, plotted.stderr
    assert (said[2], said[3]) == refused_peak.groups(), (plotted.stderr, simulated.stderr)
    assert int(said[2]) > int(said[3])
    # drawn without the profile the same plan fits: no warning
    bare = cli("plot", "--plan", plan, "--graph", graph, "--out", tmp_path / "bare")
    assert bare.returncode == 0 and "warning:" not in bare.stderr, bare.stderr


def test_a_plan_that_fits_with_its_profile_is_not_said_to_be_over(tmp_path):
    """The graph's own workspaces are large, the profile's none: the plan made with the profile
    fits its budget there, and plot with that profile says nothing (before: 'peaks at ...,
    over its budget', from a replay on the graph's workspaces)."""
    data = json.loads(tiny_graph(tmp_path).read_text())
    for node in data["nodes"]:
        node["workspace_bytes"] = 500_000
    graph = tmp_path / "workspaces.json"
    graph.write_text(json.dumps(data))
    profile = _profile(tmp_path, "no-workspaces", 0)
    plan = _plan(tmp_path, graph, "--profile", profile)
    assert cli("simulate", plan, "--graph", graph, "--profile", profile).returncode == 0

    plotted = cli("plot", "--plan", plan, "--graph", graph, "--profile", profile, "--out",
                  tmp_path / "png")
    assert plotted.returncode == 0, plotted.stderr
    assert "warning:" not in plotted.stderr and "note:" not in plotted.stderr, plotted.stderr
    assert (tmp_path / "png" / "memory.png").is_file()
