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
