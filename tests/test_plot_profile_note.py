"""`plot --plan` without the profile the plan was made with says so, as `simulate` does (one
note, checks.replayed_profile_note): its memory traces are then the graph's own, without the
profile's workspaces. QA: `plot --plan r1/plan.json --graph r1/graph.json` drew a planned peak
of 92.39 MiB in the legend where the plan's predicted.peak_bytes was 92.415 MiB, and said
nothing; simulate on the same plan printed the note."""

from __future__ import annotations

import json

from helpers.bad_inputs import cli, tiny_graph

NOTE = ("note: the plan was made with the profile 'tiny board' and is replayed here with the "
        "graph's own costs; give --profile for its ")


def _profile(folder, name: str):
    path = folder / f"{name.replace(' ', '-')}.json"
    path.write_text(json.dumps({
        "format": "edge-remat/profile", "version": 1, "name": name, "source": "measured",
        "power": {"idle_w": 1.0, "active_w": 2.0},
        "ops": {op: {"time_s": 1.0, "workspace_bytes": 500_000}
                for op in ("forward", "loss", "backward")}}))
    return path


def test_plot_says_the_plan_is_drawn_without_its_profile(tmp_path):
    graph, profile = tiny_graph(tmp_path), _profile(tmp_path, "tiny board")
    plan = tmp_path / "plan.json"
    made = cli("plan", "--graph", graph, "--profile", profile, "--budget", "1.0", "--solver",
               "heuristic:split", "-o", plan)
    assert made.returncode == 0, made.stderr

    bare = cli("plot", "--plan", plan, "--graph", graph, "--out", tmp_path / "bare")
    assert bare.returncode == 0, bare.stderr
    assert (tmp_path / "bare" / "memory.png").is_file()
    assert NOTE + "workspaces in the memory traces" in bare.stderr.splitlines(), bare.stderr
    # the same note, worded for its figures, that simulate gives
    simulated = cli("simulate", plan, "--graph", graph)
    assert NOTE + "times and energy" in simulated.stderr.splitlines(), simulated.stderr

    own = cli("plot", "--plan", plan, "--graph", graph, "--profile", profile, "--out",
              tmp_path / "own")
    assert own.returncode == 0 and "note:" not in own.stderr, own.stderr

    other = cli("plot", "--plan", plan, "--graph", graph, "--profile",
                _profile(tmp_path, "other board"), "--out", tmp_path / "other")
    assert other.returncode == 0, other.stderr
    assert ("note: the plan was made with the profile 'tiny board' and is replayed here with "
            "'other board': its workspaces in the memory traces are that board's, not the "
            "plan's recorded ones") in other.stderr.splitlines(), other.stderr
