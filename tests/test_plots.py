"""The run's pictures: a schedule, memory over a step, and a budget sweep, as non-empty PNGs."""

from __future__ import annotations

import pytest

pytest.importorskip("matplotlib")

from edge_remat.reports import plots  # noqa: E402
from edge_remat.planner.build import build_problem  # noqa: E402
from edge_remat.planner.solve import solve  # noqa: E402
from edge_remat_agent.formats import Tier  # noqa: E402
from helpers.small_graphs import training_chain  # noqa: E402

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def planned():
    graph = training_chain(6, seed=3)
    flash = {"flash": Tier(read_bytes_per_s=10.0, write_bytes_per_s=10.0)}
    report = solve(build_problem(graph, 0.75, tiers=flash), "heuristic:paging")
    return graph, report.plan  # it carries the flash figures it was costed with


def is_png(path) -> bool:
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) > 2000


def test_schedule_matrix_marks_computed_kept_and_paged(planned):
    graph, plan = planned
    matrix = plots.schedule_matrix(graph, plan)
    assert len(matrix) == len(plan.stages) and all(len(row) == len(graph) for row in matrix)
    cells = {cell for row in matrix for cell in row}
    assert {plots.COMPUTED, plots.IN_RAM} <= cells
    assert any(ins.op == "page_out" for ins in plan.instructions())
    assert plots.ON_FLASH in cells


def test_schedule_and_memory_plots_are_written(planned, tmp_path):
    graph, plan = planned
    assert is_png(plots.plot_schedule(graph, plan, tmp_path / "schedule.png"))
    planned_trace, plain_trace = plots.memory_traces(graph, plan)
    assert max(planned_trace) <= plan.budget_bytes < max(plain_trace)
    path = plots.plot_memory(planned_trace, plan.budget_bytes, tmp_path / "memory.png",
                             plain=plain_trace, measured={"tensor_peak_bytes": 30,
                                                          "kernel_peak_bytes": 60,
                                                          "limit_bytes": 64})
    assert is_png(path)


def test_sweep_plot_takes_the_plan_commands_json(tmp_path):
    rows = [{"fraction": 0.2, "budget_bytes": 20 * 2**20, "status": "infeasible"}]
    rows += [{"fraction": f, "budget_bytes": int(f * 100 * 2**20), "status": "optimal",
              "energy_j": 2.0 / f, "time_s": 1.0 / f} for f in (0.4, 0.6, 0.8, 1.0)]
    assert is_png(plots.plot_sweep(rows, tmp_path / "sweep.png"))


def test_a_sweep_in_a_graph_files_cost_units_is_labelled_in_them(tmp_path):
    """A published or random layered graph's costs are its file's units: `plan` said so, but
    the sweep's JSON did not, and its plot labelled 14,000 "cost units" a step as seconds and
    joules. The labels are read from the SVG, where matplotlib keeps each text."""
    import json
    import subprocess
    import sys

    from edge_remat.synthetic import random_layered
    graph = tmp_path / "rl.json"
    random_layered(20, seed=0).save(graph)
    proc = subprocess.run([sys.executable, "-m", "edge_remat", "plan", "--graph", str(graph),
                           "--sweep", "0.9:1.0:0.1", "--solver", "heuristic:split", "--json"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads(proc.stdout)
    assert sweep["units"] == {"time": "cost units", "energy": "cost units"}
    (tmp_path / "sweep.json").write_text(proc.stdout)
    proc = subprocess.run([sys.executable, "-m", "edge_remat", "plot", "--sweep",
                           str(tmp_path / "sweep.json"), "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and is_png(tmp_path / "sweep.png"), proc.stderr
    svg = plots.plot_sweep(sweep["sweep"], tmp_path / "sweep.svg",
                           units=(sweep["units"]["time"], sweep["units"]["energy"]))
    text = svg.read_text()
    assert "energy per step (cost units)" in text and "time per step (cost units)" in text
    assert "(J)" not in text and "(s)" not in text


def test_memory_traces_peak_where_the_plan_and_the_report_say(tmp_path):
    # A profile whose measured workspace the graph does not know: the traces drawn beside a
    # run's report peak at the plan's predicted peak and at the plain peak the report names.
    from edge_remat.planner.build import plain_peak_bytes
    from edge_remat_agent.formats import OpCost, Profile
    graph = training_chain(6, seed=3)
    ops = {node.op: OpCost(time_s=1.0, workspace_bytes=5) for node in graph.nodes}
    profile = Profile("measured", {}, 1.0, 2.0, ops=ops)
    plan = solve(build_problem(graph, 0.8, profile=profile), "heuristic:split").plan
    planned_trace, plain_trace = plots.memory_traces(graph, plan, profile)
    assert max(planned_trace) == plan.predicted["peak_bytes"]
    assert max(plain_trace) == plain_peak_bytes(graph, profile)
    assert max(plots.memory_traces(graph, plan)[0]) < plan.predicted["peak_bytes"]


LARGE_PLOT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, 3 * 2**30))  # a broken cap fails, not the host
from edge_remat.reports import plots
from edge_remat.synthetic import random_layered
from edge_remat_agent.formats import Instruction, Plan
graph = random_layered(3000, seed=1)
# the plain schedule that never frees: every stage holds every node before it
plan = Plan([[Instruction("compute", node.id)] for node in graph.nodes], "", 0)
plots.plot_schedule(graph, plan, sys.argv[1])
# this image's own peak (VmHWM starts again at exec; ru_maxrss keeps the forking parent's,
# the test runner's, which grows through a full run)
print(next(line.split()[1] for line in open("/proc/self/status") if line.startswith("VmHWM")))
"""


def test_schedule_of_a_large_plan_is_bounded_and_binned(tmp_path):
    # 3000 stages x 3000 nodes drew a 40000 x 33000 px figure (1050 nodes: 11244 x 9155 px,
    # 4 GB; 5000: the OOM killer; QA): now at most MAX_INCHES a side, binned to MAX_CELLS
    import os
    import subprocess
    import sys
    from pathlib import Path
    from PIL import Image
    root = Path(__file__).resolve().parents[1]
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/tmp"),
           "OPENBLAS_NUM_THREADS": "1", "MPLBACKEND": "Agg", "PYTHONPATH": os.pathsep.join(
               [str(root / "host"), str(root / "agent"), os.environ.get("PYTHONPATH", "")])}
    path = tmp_path / "schedule.png"
    done = subprocess.run([sys.executable, "-c", LARGE_PLOT, str(path)], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    # peak RSS in KiB: 0.25 GB here; the unbinned drawing failed at its 3 GB cap
    assert int(done.stdout.split()[-1]) < 600 * 1024
    with Image.open(path) as image:
        assert max(image.size) <= 3000


def test_a_binned_schedule_cell_is_the_most_notable_of_those_it_covers(planned):
    graph, plan = planned
    full = plots.schedule_matrix(graph, plan)
    binned = plots.schedule_matrix(graph, plan, 2, 3)
    assert binned.shape == (-(-full.shape[0] // 2), -(-full.shape[1] // 3))
    for r, row in enumerate(binned):
        for c, cell in enumerate(row):
            assert cell == full[2 * r:2 * r + 2, 3 * c:3 * c + 3].max()


def test_a_sweep_without_a_plan_keeps_its_cost_axes_at_zero_and_up(tmp_path, monkeypatch):
    """QA: with no budget planned the axes ran from -0.04 to 0.04 J and s."""
    limits = []
    save = plots._save

    def kept(fig, path):
        limits.extend(ax.get_ylim() for ax in fig.axes)
        return save(fig, path)
    monkeypatch.setattr(plots, "_save", kept)
    plots.plot_sweep([{"budget_bytes": 2 * 2**20, "energy_j": None, "time_s": None}],
                     tmp_path / "sweep.png")
    assert len(limits) == 2 and all(low == 0 < high for low, high in limits), limits


def test_a_sweeps_highest_marker_has_room_above_it_and_the_legend_is_beside_the_axes(
        tmp_path, monkeypatch):
    """QA: from 0, a sweep over a narrow range kept the autoscaled top, a margin of that range:
    the top markers were cut in half; and the fleet's legend sat on a board's points."""
    kept = []
    save = plots._save

    def keep(fig, path):
        for ax in fig.axes:
            legend = ax.get_legend()
            anchor = legend and legend.get_bbox_to_anchor().transformed(ax.transAxes.inverted())
            kept.append((ax.get_ylim(), anchor))
        return save(fig, path)
    monkeypatch.setattr(plots, "_save", keep)
    rows = [{"budget_bytes": b * 2**20, "energy_j": 1.0 + b / 1000, "time_s": 2.0 + b / 1000}
            for b in (10, 20, 30)]
    plots.plot_sweeps({"rpi4": rows, "orin-nano": rows}, tmp_path / "sweep.png")
    (energy, anchor), (time, _) = kept
    assert energy[0] == 0 and energy[1] >= 1.07 * 1.03, energy
    assert time[0] == 0 and time[1] >= 1.07 * 2.03, time
    assert anchor is not None and anchor.x0 > 1.0, anchor  # right of the axes, not on them
