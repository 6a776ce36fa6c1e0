"""The arena executor under another malloc (jemalloc, preloaded; executor/allocator.py): the
daemon's run job process starts again under it (a real job process, a real LD_PRELOAD), its
report says which malloc ran, and the gradients stay bitwise equal to eager PyTorch's; the
benchmark's children are started the same way."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from edge_remat.planner.arena import plan_arena
from edge_remat_agent.allocator import malloc_library, preload_environment, running_malloc
from edge_remat_agent.daemon.layout import Layout
from edge_remat_agent.daemon.store import JobStore

from helpers.executor_plans import every_forward_recomputed, with_paging

pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    malloc_library("jemalloc") is None, reason="libjemalloc2 is not installed")]

ROOT = Path(__file__).resolve().parents[1]


def _child_env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "host"), str(ROOT / "agent"),
                                         env.get("PYTHONPATH", "")])
    return env


def _run_job(workdir: Path, params: dict) -> tuple[dict, dict]:
    """The run job in its own job process, as the daemon's worker starts it; (the job's
    outcome, its run report)."""
    layout = Layout(workdir).ensure()
    record = JobStore(layout).create("run", params)
    done = subprocess.run([sys.executable, "-m", "edge_remat_agent", "_run-job", "--workdir",
                           str(workdir), "--job", record["id"]], env=_child_env(),
                          capture_output=True, text=True, timeout=600)
    job_dir = layout.job_dir(record["id"])
    assert done.returncode == 0, done.stderr[-3000:]
    outcome = json.loads((job_dir / "outcome.json").read_text())
    assert outcome["ok"], outcome
    return outcome, json.loads((job_dir / "files" / "run_report.json").read_text())


@pytest.fixture(scope="module")
def job_inputs(user_capture, tmp_path_factory):
    """A plan of the example model (dropout, batch norm) that recomputes and pages, with an
    arena layout, and its graph, where a job finds them."""
    captured = user_capture()
    graph = captured.graph
    plan = with_paging(every_forward_recomputed(graph), graph, every=3)
    plan = dataclasses.replace(plan, arena=plan_arena(graph, plan, None, "best-fit", 5.0))
    folder = tmp_path_factory.mktemp("inputs")
    graph.save(folder / "graph.json")
    plan.save(folder / "plan.json")
    return folder


def _workdir(tmp_path: Path, inputs: Path) -> Path:
    (tmp_path / "inputs").mkdir()
    for name in ("graph.json", "plan.json"):
        (tmp_path / "inputs" / name).write_bytes((inputs / name).read_bytes())
    return tmp_path


def test_an_arena_job_runs_under_jemalloc_with_bitwise_gradients(job_inputs, tmp_path):
    assert running_malloc() == "glibc"  # the job process is started under glibc's
    outcome, report = _run_job(_workdir(tmp_path, job_inputs), {
        "plan": "inputs/plan.json", "graph": "inputs/graph.json", "steps": 3, "seed": 5,
        "allocator": "arena"})
    assert report["malloc"] == {"requested": "jemalloc", "running": "jemalloc"}
    assert outcome["result"]["malloc"] == report["malloc"]
    assert report["allocator"] == {"malloc": "jemalloc"}  # no glibc settings made
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    # jemalloc's purge stands for glibc's heap trim: the step still starts trimmed.
    assert all(step["arena"]["heap_trims"] >= 1 for step in report["steps"])


def test_an_arena_job_asked_for_glibc_stays_under_it(job_inputs, tmp_path):
    _, report = _run_job(_workdir(tmp_path, job_inputs), {
        "plan": "inputs/plan.json", "graph": "inputs/graph.json", "steps": 2, "seed": 5,
        "allocator": "arena", "malloc": "glibc"})
    assert report["malloc"] == {"requested": "glibc", "running": "glibc"}
    assert report["allocator"]["malloc"] == "glibc"
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]


def test_a_child_started_under_jemalloc_says_so():
    env, library = preload_environment("jemalloc", _child_env())
    assert library is not None and env["LD_PRELOAD"].split(":")[0] == library
    said = subprocess.run([sys.executable, "-c", (
        "from edge_remat_agent.allocator import running_malloc, give_back_freed_memory, "
        "map_large_blocks; print(running_malloc(), give_back_freed_memory(), "
        "map_large_blocks())")], env=env, capture_output=True, text=True, check=True)
    assert said.stdout.split(None, 2) == ["jemalloc", "True", "{'malloc': 'jemalloc'}\n"]
    unchanged, none = preload_environment("glibc", {"PATH": "/bin"})
    assert unchanged == {"PATH": "/bin"} and none is None


def test_an_unknown_malloc_is_one_clear_error(job_inputs, tmp_path):
    layout = Layout(_workdir(tmp_path, job_inputs)).ensure()
    record = JobStore(layout).create("run", {"plan": "inputs/plan.json",
                                             "graph": "inputs/graph.json",
                                             "allocator": "arena", "malloc": "mimalloc"})
    subprocess.run([sys.executable, "-m", "edge_remat_agent", "_run-job", "--workdir",
                    str(tmp_path), "--job", record["id"]], env=_child_env(), check=True,
                   timeout=300)
    outcome = json.loads((layout.job_dir(record["id"]) / "outcome.json").read_text())
    assert not outcome["ok"]
    assert "unknown malloc 'mimalloc': use glibc, jemalloc, tcmalloc" in outcome["error"]
