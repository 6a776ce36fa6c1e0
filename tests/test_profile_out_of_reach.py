"""A board that cannot hold a plain step of the graph still gets a measured profile.

The profile job times the graph's nodes inside plain steps. For a model the board can only train
with a plan, that job was killed by the out-of-memory killer (resnet18 b48 64x64 on the 600 MiB
emulated board, 2026-12-03: "killed by SIGKILL ... its log ends: memory: one plain step"), so
`run` on such a board failed before it planned. Now the host asks first: the board measures
what it can, with its compute rates, and the planner costs the nodes from the capture's
estimates at those rates. Where a plan fits there, `profile` then times the nodes in a short
planned run (tests/test_run_e2e.py); on this board none does, and it says so.
"""

from __future__ import annotations

import json
import math
import time

import pytest
import torch
from typer.testing import CliRunner

from helpers.board_fixtures import local_board
from edge_remat.cgroup import unavailable_reason
from edge_remat.cli import app
from edge_remat_agent.formats import load_profile
from edge_remat_agent.profiler.compute import measure_compute_rates

REASON = unavailable_reason()


def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


def matmul_best_s(n: int, tries: int = 5) -> float:
    a, b, out = torch.randn(n, n), torch.randn(n, n), torch.empty(n, n)
    torch.mm(a, b, out=out)
    best = math.inf
    for _ in range(tries):
        started = time.perf_counter()
        torch.mm(a, b, out=out)
        best = min(best, time.perf_counter() - started)
    return best


def test_the_measured_roofline_predicts_a_matmul_it_did_not_time():
    """512 x 512, 8 times the FLOPs of the one measured, within a factor of 4 either way (the
    capture's generic rates, a few Cortex-A7x cores', are 10x off or more here). On one
    thread: a matmul on both cores stalls whenever another process takes one (a pytest worker
    beside it), by up to 50x in one window. And three tries, each measuring both again."""
    n, seen = 512, []
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for _ in range(3):
            rates, method = measure_compute_rates(window_s=0.05)
            assert "on 1 thread:" in method
            predicted = max(2 * n ** 3 / rates.flops_per_s,
                            3 * 4 * n * n / rates.bytes_per_s) + rates.op_overhead_s
            best = matmul_best_s(n)
            seen.append((best, predicted))
            if predicted / 4 < best < predicted * 4:
                break
        else:
            raise AssertionError(f"measured vs predicted seconds, three tries: {seen}")
    finally:
        torch.set_num_threads(threads)
    assert all(math.isfinite(v) and v > 0 for v in
               (rates.flops_per_s, rates.bytes_per_s, rates.op_overhead_s))
    assert "torch.mm" in method and "copy_" in method


@pytest.mark.slow
@pytest.mark.cgroup
@pytest.mark.skipif(REASON is not None, reason=f"no memory cgroup: {REASON}")
def test_a_board_without_room_for_a_plain_step_profiles_its_rates_and_plans(tmp_path_factory):
    root = tmp_path_factory.mktemp("small")
    graph = root / "graph.json"
    # a plain step of about 1.1 GiB (planner's plain peak) on a board limited to 400 MiB
    code, out, err = cli("graph", "--model", "digits-cnn", "--batch", 512, "--image", 32,
                         "-o", graph, "--json")
    assert code == 0, (out, err)
    with local_board(root, "small-board", memory_limit_bytes=400 * 2**20):
        code, out, err = cli("profile", "--device", "small-board", "--graph", graph,
                             "--param", "idle_s=0.1", "--param", "busy_s=0.1",
                             "--param", "sizes=4KiB,8KiB", "--param", "share_s=0",
                             "--out", root / "profiles", "--json")
    assert code == 0, (out, err)
    assert "a plain step of 'digits-cnn' needs about" in err and "not timed there" in err, err
    # nor under a plan (profile_under_plan.py): none fits in what the 400 MiB board has left
    assert "warning: the nodes stay untimed in the profile: no plan fits there (budget" in err
    answer = json.loads(out)
    assert answer["status"] == "finished" and answer["result"]["ops"] == 0
    profile = load_profile(root / "profiles" / "profile.json")
    assert profile.source == "measured" and not profile.ops and profile.compute is not None
    assert "torch.mm" in profile.measurements["compute"]["method"]

    code, out, err = cli("plan", "--graph", graph, "--profile", root / "profiles" /
                         "profile.json", "--budget", "60%", "--paging", "none",
                         "--time-limit", 10, "-o", root / "plan.json", "--json")
    assert code == 0, (out, err)
    costs = json.loads((root / "plan.json").read_text())["problem"]["costs"]
    nodes = len(json.loads(graph.read_text())["nodes"])
    assert f"the board's roofline ({profile.name}) for {nodes}/{nodes} nodes" in \
        costs["time_source"], costs
