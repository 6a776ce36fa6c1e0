"""deploy says, before it ships, that a plan's predicted peak is above the RAM its device
config gives the board (it said nothing, and `run` warns of such a budget); the run goes on, as
`run`'s does."""

from __future__ import annotations

import json

import pytest
from helpers.bad_inputs import cli, env
from helpers.board_fixtures import local_board

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory):
    """(graph, plan, its predicted peak): one capture and plan for both boards (deploy only
    reads them)."""
    folder = tmp_path_factory.mktemp("mlp")
    graph, plan = folder / "graph.json", folder / "plan.json"
    assert cli("graph", "--model", "mlp", "--batch", "2", "-o", graph).returncode == 0
    assert cli("plan", "--graph", graph, "--budget", "100%", "-o", plan).returncode == 0
    return graph, plan, json.loads(plan.read_text())["predicted"]["peak_bytes"]


def test_deploy_warns_of_a_plan_above_the_boards_ram_before_shipping(mlp_plan, tmp_path):
    graph, plan, peak = mlp_plan
    with local_board(tmp_path, "small", ram_bytes=peak // 2):
        proc = cli("deploy", plan, "--device", "small", "--graph", graph, "--steps", "1",
                   "--out", tmp_path / "out", timeout=300,
                   environ=env(EDGE_REMAT_DEVICE_CONFIGS=str(tmp_path / "configs"),
                               XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    warning = [i for i, line in enumerate(lines) if line.startswith("warning: the plan's "
                                                                     "predicted peak")]
    assert len(warning) == 1, proc.stderr
    assert "device config 'small'" in lines[warning[0]]
    assert "this plan will not fit there" in lines[warning[0]]
    # said before anything went to the board (the agent's copy, the job's lines)
    assert all(not line.startswith("job ") for line in lines[:warning[0]]), proc.stderr


def test_deploy_says_nothing_of_a_plan_within_the_boards_ram(mlp_plan, tmp_path):
    graph, plan, peak = mlp_plan
    with local_board(tmp_path, "roomy", ram_bytes=peak * 4):
        proc = cli("deploy", plan, "--device", "roomy", "--graph", graph, "--steps", "1",
                   "--out", tmp_path / "out", timeout=300,
                   environ=env(EDGE_REMAT_DEVICE_CONFIGS=str(tmp_path / "configs"),
                               XDG_CACHE_HOME=str(tmp_path / "cache")))
    assert proc.returncode == 0, proc.stderr
    assert "warning: the plan's predicted peak" not in proc.stderr


def test_a_board_whose_config_names_no_ram_is_judged_by_what_its_agent_reports(tmp_path):
    """Connected, deploy reads the board's own figures where its device config names no RAM
    (QA: an 842 MiB plan went to an SSH board in a 450 MiB cgroup without a word, then was
    killed). The sysinfo dicts stand in for the agent's reply (daemon/sysinfo.py's fields)."""
    from edge_remat.checks import note_plan_above_board_ram
    from edge_remat.devices import load_device
    from edge_remat.devices import write_local_device
    silent = load_device(write_local_device(tmp_path / "a", "silent", tmp_path / "board"))
    named = load_device(write_local_device(tmp_path / "b", "named", tmp_path / "board",
                                           ram_bytes=2**30))
    mib = 2**20
    said = []
    note_plan_above_board_ram(silent, lambda: {"ram_limit_bytes": 450 * mib,
                                               "ram_total_bytes": 24 << 30}, 842 * mib,
                              said.append)
    assert len(said) == 1 and said[0].startswith("warning: the plan's predicted peak, "
                                                 "842.00 MiB, is more than the 450.00 MiB of "
                                                 "RAM silent has (its memory limit)"), said
    note_plan_above_board_ram(silent, lambda: {"ram_limit_bytes": None,
                                               "ram_total_bytes": 512 * mib}, 842 * mib,
                              said.append)
    assert len(said) == 2 and "512.00 MiB of RAM silent has: this plan" in said[1], said
    note_plan_above_board_ram(silent, lambda: {"ram_limit_bytes": None,
                                               "ram_total_bytes": 24 << 30}, 842 * mib,
                              said.append)
    note_plan_above_board_ram(named, lambda: {"ram_limit_bytes": 450 * mib}, 842 * mib,
                              said.append)
    assert len(said) == 2  # room enough; a config that names RAM was judged before connecting
