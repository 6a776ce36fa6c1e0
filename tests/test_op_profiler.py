"""The op profiler: every planner node timed on real inputs for a window the clock can resolve,
its bytes read from the real tensors (and its workspace from the allocator, scratch inside
kernels included), written as a measured profile that the planner takes
(`edge-remat plan --profile`: cost_source "profile"), on this machine and through the daemon."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from helpers.board_fixtures import stop_agent
from edge_remat.cli import app
from edge_remat_agent import cli as agent_cli
from edge_remat_agent.capture import capture_model
from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import load_graph, load_profile
from edge_remat_agent.formats.profile import Profile
from edge_remat_agent.profiler.allocations import AllocatorPeak
from edge_remat_agent.profiler.ops import CONTEXT_STEPS, measure_nodes, ops_from, profile_key

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = f"{ROOT / 'examples' / 'my_model.py'}:make_model"
QUICK_BOARD = ["--sensor", "model", "--idle-s", "0.1", "--busy-s", "0.1", "--no-footprint",
               "--sizes", "4KiB,64KiB"]


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("graph") / "graph.json"
    capture_model(EXAMPLE, batch=4, image=16).graph.save(path)
    return path


@pytest.fixture(scope="module")
def measured():
    # Module-level groups: a refined graph's single-op node for a batch norm's
    # num_batches_tracked increment counts its 8-byte result as workspace, which the ledger
    # holds as step state (left open).
    captured = capture_model(EXAMPLE, batch=4, image=16, refined=False)
    return captured.graph, measure_nodes(captured, min_window_s=0.01)


def test_every_node_is_timed_for_a_measurable_window_with_its_real_bytes(measured):
    graph, nodes = measured
    assert [m.id for m in nodes] == [n.id for n in graph.nodes]
    for m, node in zip(nodes, graph.nodes):
        # The isolated window is long enough for the clock; time_s is the in-context median.
        assert m.runs >= 1 and m.isolated_time_s * m.runs >= 0.01, m
        assert m.time_s > 0 and m.context_runs == CONTEXT_STEPS, m
        assert m.key == profile_key(node)
        if node.kind in ("forward", "backward"):  # real storages, as the capture sized them
            assert m.out_bytes == node.out_bytes, (node.name, m.out_bytes, node.out_bytes)
            assert m.ledger_workspace_bytes == node.workspace_bytes, node.name
    ops = ops_from(nodes)
    assert set(ops) == {profile_key(n) for n in graph.nodes}
    assert len(ops) < len(nodes)  # the two residual blocks' twin layers share a signature


def test_allocator_peak_counts_scratch_a_call_frees_before_returning():
    def kernel():  # 1 MiB of scratch, 4 KiB kept
        scratch = torch.empty(2**18)
        return scratch[:1024].clone()

    kernel()
    with AllocatorPeak() as meter:
        kept = kernel()
    assert meter.measured and meter.retained_bytes == kept.untyped_storage().nbytes() == 4096
    assert meter.peak_bytes == 2**20 + 4096


def test_workspace_includes_the_scratch_kernels_allocate_inside_themselves(measured):
    """convolution_backward allocates scratch inside ATen, which no ledger of the runner's
    tensors sees: the allocator pass does, and the profile's op carries the larger figure."""
    graph, nodes = measured
    by_id = {n.id: n for n in graph.nodes}
    conv_backward = [m for m in nodes if by_id[m.id].op == "convolution_backward"]
    assert conv_backward
    for m in conv_backward:
        assert m.allocator_workspace_bytes > m.ledger_workspace_bytes, m
        assert m.workspace_bytes >= m.allocator_workspace_bytes, m
    for m in nodes:
        if m.kind != "update":  # the optimizer step is not metered: the graph's workspace
            assert m.allocator_peak_bytes is not None, m
            assert m.resident_workspace_bytes is not None, m
            assert m.workspace_bytes == max(m.ledger_workspace_bytes,
                                            m.allocator_workspace_bytes,
                                            m.resident_workspace_bytes), m
    ops = ops_from(nodes)
    for key in {m.key for m in conv_backward}:
        assert ops[key].workspace_bytes == max(m.workspace_bytes for m in nodes if m.key == key)
    # The planner takes it: a node's workspace in the cost model is the profile's.
    profile = Profile("measured", {}, idle_w=0.0, active_w=1.0, ops=ops)
    costs = build_costs(graph, profile)
    assert costs.workspace_source == f"profile:profile for {len(graph)}/{len(graph)} nodes"
    for node, workspace in zip(graph.nodes, costs.workspace(graph)):
        assert workspace == ops[profile_key(node)].workspace_bytes >= node.workspace_bytes


def test_measured_profile_changes_the_planners_costs(graph_file, tmp_path, capsys):
    profile_file = tmp_path / "profile.json"
    code = agent_cli.main(["profile", "--graph", str(graph_file), "-o", str(profile_file),
                           "--page-dir", str(tmp_path / "pages"), *QUICK_BOARD])
    out = json.loads(capsys.readouterr().out)
    assert code == 0 and out["nodes"] == len(load_graph(graph_file))
    profile = load_profile(profile_file)
    assert profile.source == "measured" and profile.device["cpu"] and "flash" in profile.tiers
    assert profile.measurements["ops"]["graph_fingerprint"] == load_graph(graph_file).fingerprint()

    plans = {}
    for label, extra in (("estimate", []), ("profile", ["--profile", str(profile_file)])):
        plan_file = tmp_path / f"plan-{label}.json"
        result = CliRunner().invoke(app, ["plan", "--graph", str(graph_file), "--budget", "0.95",
                                          "--solver", "heuristic:dtr", "-o", str(plan_file),
                                          *extra])
        assert result.exit_code == 0, result.output
        plans[label] = json.loads(plan_file.read_text())
        check = CliRunner().invoke(app, ["simulate", str(plan_file), "--graph", str(graph_file),
                                         *extra, "--json"])
        assert check.exit_code == 0 and json.loads(check.stdout)["valid"], check.output
    costs = plans["profile"]["problem"]["costs"]
    n = len(load_graph(graph_file))
    assert costs["cost_source"] == "profile" and f"for {n}/{n} nodes" in costs["time_source"]
    assert plans["estimate"]["problem"]["costs"]["cost_source"] == "estimate"
    assert plans["profile"]["predicted"]["time_s"] != plans["estimate"]["predicted"]["time_s"]


def test_profile_job_on_the_board_through_the_daemon_says_each_phase_as_it_starts(
        graph_file, tmp_path, monkeypatch):
    """One profile job through the daemon (a local board), two checks of it: (1) the measured
    profile comes back (the job's record, read again with job-status --json as the profile
    command's --json prints it); (2) each phase is a progress line of its own. On the emulated
    arm64 board the job said 'measuring the board (flash, power, footprint)' and then nothing
    while it captured the graph there (6 min under load) and measured flash, power and the
    footprint. One job for both: each is a board's whole profile (tens of seconds here)."""
    folder = tmp_path / "configs"  # the least a local board's config needs: no [hardware]
    folder.mkdir()
    workdir = tmp_path / "board"
    (folder / "bench.toml").write_text(
        f'name = "bench"\n[connection]\nkind = "local"\nworkdir = "{workdir}"\n')
    monkeypatch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(folder))
    params = [arg for pair in ("sensor=model", "idle_s=0.1", "busy_s=0.1", "sizes=4KiB,8KiB")
              for arg in ("--param", pair)]
    try:
        result = CliRunner().invoke(app, ["profile", "--device", "bench", "--graph",
                                          str(graph_file), *params, "--out", str(tmp_path / "out")])
        # its state line, said once, on stderr with the progress: "job ID finished ..."
        job = re.search(r"^job (\S+) finished", result.stderr, re.MULTILINE)
        job = job.group(1) if job else "(none)"
        status = CliRunner().invoke(app, ["job-status", job, "--device", "bench", "--json"])
    finally:
        stop_agent(workdir)
    assert result.exit_code == 0, result.output
    phases = [line.split(" running ", 1)[1].split(":")[0]  # a phase: no share of the whole
              for line in result.stderr.splitlines()
              if " running " in line and "(still " not in line and "%" not in line]
    assert phases == ["capture", "memory", "flash", "host link", "power", "footprint",
                      "compute", "ops"], result.stderr

    assert status.exit_code == 0, status.output
    answer = json.loads(status.stdout)
    assert answer["status"] == "finished" and answer["job"] == job
    assert answer["result"]["nodes"] == len(load_graph(graph_file))
    profile = load_profile(tmp_path / "out" / "profile.json")
    assert profile.source == "measured" and profile.ops and "flash" in profile.tiers


def test_resident_peak_counts_memory_the_allocator_events_do_not_see():
    """Scratch malloc'd outside c10's allocator (as oneDNN may) raises the resident set: the
    resident measure sees it, the allocator's events do not."""
    import ctypes
    import ctypes.util

    from edge_remat_agent.profiler.memory import resident_peak_bytes
    libc = ctypes.CDLL(ctypes.util.find_library("c"))
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]

    def kernel():  # 8 MiB written and freed outside torch
        block = libc.malloc(8 * 2**20)
        ctypes.memset(block, 1, 8 * 2**20)
        libc.free(block)

    with AllocatorPeak() as meter:
        kernel()
    assert meter.measured and meter.peak_bytes == 0
    risen = resident_peak_bytes(kernel)
    if risen is None:
        pytest.skip("no resettable resident high-water mark here")
    assert 7.5 * 2**20 <= risen < 12 * 2**20  # to the page: the start is read after the reset


def test_a_call_that_touches_nothing_does_not_rise_where_the_reset_mark_starts_high():
    """The kernel's resident high-water mark, reset, may start above the exact resident set
    (in one read of /proc/self/status; seen after torch's threads freed memory). Counted from
    the resident set, a call that touches nothing rose by that gap: 60-150 KiB for every
    tiny op of a small model's profile. Counted from the mark as the reset left it, it does
    not rise."""
    from edge_remat_agent.allocator import give_back_freed_memory
    from edge_remat_agent.profiler.memory import reset_kernel_peak, resident_peak_bytes
    page = 4096

    def mark_above_resident() -> int:
        with open("/proc/self/status") as handle:
            fields = dict(line.split(":", 1) for line in handle if line.startswith("Vm"))
        return 1024 * (int(fields["VmHWM"].split()[0]) - int(fields["VmRSS"].split()[0]))

    for size in range(800):  # torch's threads allocate and free until the mark starts high
        x = torch.randn(size % 256 + 32, 256)
        (x @ x.T).sum()
        pieces = [torch.randn(size % 50 + 8, 8) for _ in range(20)]
        torch.cat(pieces).mean()
        del x, pieces
        give_back_freed_memory()
        if not reset_kernel_peak():
            pytest.skip("no resettable resident high-water mark here")
        gap = mark_above_resident()
        if gap >= 8 * page:
            break
    else:
        pytest.skip("the reset mark started at the resident set every time here")
    assert resident_peak_bytes(lambda: None) <= page, gap


def test_measure_workspace_is_the_profilers_memory_half():
    from edge_remat_agent.profiler.ops import measure_workspace
    captured = capture_model(EXAMPLE, batch=4, image=16)
    found = measure_workspace(captured)
    graph = captured.graph
    assert set(found) == {n.id for n in graph.nodes if n.kind != "update"}
    for node in graph.nodes:
        if node.kind in ("forward", "backward"):
            sizes = found[node.id]
            assert sizes.out_bytes == node.out_bytes, node.name
            assert sizes.workspace_bytes >= sizes.ledger_workspace_bytes
            assert sizes.resident_workspace_bytes is not None
    assert any(found[n.id].workspace_bytes > n.workspace_bytes for n in graph.nodes
               if n.op == "convolution_backward")


def test_first_calls_memory_is_measured_in_a_fresh_process():
    """What the nodes' first calls leave for the process (oneDNN's primitives): found in a
    process where the ops have not run, not again in one where they have."""
    import json
    import subprocess
    import sys
    probe = (
        "import json, torch\n"
        "from edge_remat_agent.capture import capture_model\n"
        "from edge_remat_agent.profiler.ops import measure_workspace, runtime_warm_bytes\n"
        f"c = capture_model({EXAMPLE!r}, batch=4, image=16)\n"
        "first = runtime_warm_bytes(measure_workspace(c).values())\n"
        "again = runtime_warm_bytes(measure_workspace(c).values())\n"
        "print(json.dumps([first, again]))\n")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          check=True)
    first, again = json.loads(done.stdout.splitlines()[-1])
    if first is None:
        pytest.skip("no RssAnon in /proc/self/status here")
    assert first > 64 * 1024  # primitives for every convolution shape, forward and backward
    assert again < first / 2


@pytest.mark.parametrize("update", ["fused", "step"])
def test_a_profile_leaves_the_model_one_step_on_however_long_its_windows(update):
    """Timing an update repeats the optimizer's step on the same gradients (a small group's
    hundreds of times in a window): those steps are undone, so the model a profile leaves,
    and the one its in-context steps run on, has taken one step per step, whatever the
    window. Kept, they saturated bert-mini's classifier and its backward timed 25x slow on
    subnormal gradients."""
    def profiled(window_s: float) -> dict[str, torch.Tensor]:
        torch.manual_seed(0)
        captured = capture_model(EXAMPLE, batch=4, image=16, update=update)
        start = {name: p.detach().clone() for name, p in captured.module.named_parameters()}
        measure_nodes(captured, min_window_s=window_s, context_steps=0, allocator_pass=False,
                      first_step={})  # one step: the isolated pass's
        after = {name: p.detach().clone() for name, p in captured.module.named_parameters()}
        assert all(not torch.equal(start[n], after[n]) for n in after)  # stepped once
        return after

    short, long = profiled(0.001), profiled(0.03)
    assert short.keys() == long.keys()
    for name in short:
        assert torch.equal(short[name], long[name]), name
