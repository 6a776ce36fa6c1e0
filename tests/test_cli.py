"""The `edge-remat` command line, run for real as a subprocess: answers, exit codes, files."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from helpers.bad_inputs import tiny_graph

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
GRAPHS = SHARED / "benchmarks" / "graphs"
VGG16 = GRAPHS / "vgg16_train.json"
needs_shared = pytest.mark.skipif(not VGG16.is_file(),
                                  reason=f"benchmark graph not found at {VGG16} (shared/ sits "
                                         "beside the repository root)")

PLAN_KEYS = {"status", "budget_bytes", "peak_bytes", "tdi_percent", "time_s", "energy_j",
             "lower_bound", "gap", "solve_time_s"}


def _command() -> list[str]:
    probe = subprocess.run([sys.executable, "-m", "edge_remat.cli", "version"],
                           capture_output=True, text=True)
    if probe.returncode == 0:
        return [sys.executable, "-m", "edge_remat.cli"]
    exe = shutil.which("edge-remat")
    if exe is None:
        pytest.skip("neither `python -m edge_remat.cli` nor an `edge-remat` executable works")
    return [exe]


@pytest.fixture(scope="module")
def cli():
    command = _command()

    def run(*args, cwd=None, timeout=120) -> subprocess.CompletedProcess:
        env = dict(os.environ, COLUMNS="100", NO_COLOR="1")
        return subprocess.run([*command, *map(str, args)], capture_output=True, text=True,
                              cwd=cwd, timeout=timeout, env=env)
    return run


def one_json(stdout: str) -> dict:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, stdout
    obj = json.loads(lines[0])
    assert isinstance(obj, dict)
    return obj


def clean_error(proc: subprocess.CompletedProcess) -> str:
    """Exit status 2, one `error:` line on stderr, no traceback anywhere."""
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr + proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("error: "), proc.stderr
    return lines[0]


# --- help --------------------------------------------------------------------------------------

HEAVY_MODULES = ("torch", "ortools", "pulp", "numpy", "highspy", "paramiko", "matplotlib")


def test_help_is_fast(cli):
    """--help imports none of the heavy packages (torch alone takes seconds to import): checked
    by the modules loaded, not by a wall clock, which a loaded host stretches (4.1 s once)."""
    proc = cli("--help")
    assert proc.returncode == 0, proc.stderr
    assert "plan" in proc.stdout and "simulate" in proc.stdout
    probe = ("import runpy, sys\n"
             "sys.argv = ['edge-remat', '--help']\n"
             "try:\n    runpy.run_module('edge_remat', run_name='__main__')\n"
             "except SystemExit:\n    pass\n"
             f"print([m for m in {HEAVY_MODULES!r} if m in sys.modules], file=sys.stderr)")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                            timeout=120, env=dict(os.environ, COLUMNS="100", NO_COLOR="1"))
    assert loaded.stderr.strip().splitlines()[-1] == "[]", loaded.stderr


def test_the_command_lists_give_each_summary_as_one_paragraph(cli):
    """The fleet's `plan` row broke after "with the board's" and "a plot per": the
    docstring's own line breaks, kept in --help's command lists."""
    proc = cli("fleet", "--help")
    assert proc.returncode == 0, proc.stderr
    words = " ".join(line.strip("│ ") for line in proc.stdout.splitlines() if "│" in line)
    assert "with the board's profile, check each plan" in " ".join(words.split())
    from edge_remat.cli import app
    from edge_remat.fleet.cli import app as fleet_app
    for info in app.registered_commands + fleet_app.registered_commands:
        assert info.short_help and "\n" not in info.short_help, info.name


def test_plan_help(cli):
    proc = cli("plan", "--help")
    assert proc.returncode == 0, proc.stderr
    for option in ("--graph", "--budget", "--solver", "--paging", "--json"):
        assert option in proc.stdout


# --- planning the VGG16 benchmark --------------------------------------------------------------

@needs_shared
def test_plan_vgg16_then_simulate(cli, tmp_path):
    plan_file = tmp_path / "plan.json"
    proc = cli("plan", "--graph", VGG16, "--budget", "0.9", "-o", plan_file, "--json")
    assert proc.returncode == 0, proc.stderr
    out = one_json(proc.stdout)
    assert PLAN_KEYS <= set(out), PLAN_KEYS - set(out)
    assert out["status"] in ("optimal", "feasible", "timeout")
    assert 0 < out["peak_bytes"] <= out["budget_bytes"]
    assert out["tdi_percent"] >= 0 and out["time_s"] > 0
    if out["lower_bound"] is not None:
        assert out["lower_bound"] <= out["time_s"] * (1 + 1e-6)
    assert plan_file.is_file()
    saved = json.loads(plan_file.read_text())
    assert saved["format"] == "edge-remat/plan"
    assert saved["budget_bytes"] == out["budget_bytes"]

    sim = cli("simulate", plan_file, "--graph", VGG16, "--json")
    assert sim.returncode == 0, sim.stderr
    replay = one_json(sim.stdout)
    assert replay["valid"] is True and replay["fits_budget"] is True
    assert replay["peak_bytes"] == out["peak_bytes"]
    assert replay["tdi_percent"] == pytest.approx(out["tdi_percent"])
    # replayed as it was scored (QA: nothing to page, so the plan said sync and no step
    # time, and simulate said overlap with one)
    assert replay["io"] == saved["predicted"]["io"] == "sync"
    assert replay["step_time_s"] == saved["predicted"]["step_time_s"] is None


@needs_shared
def test_infeasible_budget(cli, tmp_path):
    plan_file = tmp_path / "plan.json"
    proc = cli("plan", "--graph", VGG16, "--budget", "0.7", "-o", plan_file)
    line = clean_error(proc)
    assert "needs at least" in line and "lower bound" in line
    assert not plan_file.exists()

    proc = cli("plan", "--graph", VGG16, "--budget", "0.7", "-o", plan_file, "--json")
    assert proc.returncode == 2
    out = one_json(proc.stdout)
    assert out["status"] == "infeasible"
    smallest = out["budget_floor_bytes"]
    assert isinstance(smallest, int) and smallest > 0
    assert out["smallest_feasible_budget_bytes"] == smallest  # the older name, kept
    assert f"{smallest} bytes" in line  # the text names the same number, in bytes
    assert not plan_file.exists()

    # The budget asked for (0.7 x the plain peak) is named too, and is below that smallest one.
    assert out["error"].startswith("budget ")
    assert int(out["error"].split()[1]) < smallest


# --- bad input ---------------------------------------------------------------------------------

def test_malformed_graph_file(cli, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"format": "edge-remat/graph", "version": 1, "nodes": [')
    line = clean_error(cli("plan", "--graph", bad, "--budget", "0.8"))
    assert str(bad) in line and "valid JSON" in line


def test_graph_file_cut_mid_utf8_character(cli, tmp_path):
    bad = tmp_path / "cut.json"
    raw = '{"format": "edge-remat/graph", "name": "r\u00e9seau"'.encode()
    bad.write_bytes(raw[: raw.index("\u00e9".encode()) + 1])  # half of the two-byte character
    clean_error(cli("plan", "--graph", bad, "--budget", "0.8"))


def test_graph_capture_not_an_object(cli, tmp_path):
    path = tiny_graph(tmp_path)
    graph = json.loads(path.read_text()) | {"capture": ["torch.fx"]}
    path.write_text(json.dumps(graph))
    line = clean_error(cli("plan", "--graph", path, "--budget", "0.8"))
    assert "capture" in line


def test_plan_problem_not_an_object(cli, tmp_path):
    graph = tiny_graph(tmp_path)
    plan_file = tmp_path / "plan.json"
    assert cli("plan", "--graph", graph, "--budget", "1.0", "-o", plan_file).returncode == 0
    plan = json.loads(plan_file.read_text()) | {"problem": ["flash"]}
    plan_file.write_text(json.dumps(plan))
    line = clean_error(cli("simulate", plan_file, "--graph", graph))
    assert "problem" in line


def test_graph_with_cycle(cli, tmp_path):
    graph = {"directed": True, "graph": {}, "nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 8},
                                                      {"id": 1, "cost_cpu": 1, "cost_ram": 8}],
             "links": [{"source": 0, "target": 1}, {"source": 1, "target": 0}]}
    path = tmp_path / "cycle.json"
    path.write_text(json.dumps(graph))
    line = clean_error(cli("plan", "--graph", path, "--budget", "0.8"))
    assert "cycle" in line


def test_missing_graph_file(cli, tmp_path):
    line = clean_error(cli("plan", "--graph", tmp_path / "nope.json", "--budget", "0.8"))
    assert "nope.json" in line


def test_bad_budget_text(cli, tmp_path):
    graph = tiny_graph(tmp_path)
    line = clean_error(cli("plan", "--graph", graph, "--budget", "lots"))
    assert "lots" in line and "budget" in line


def test_bad_budget_text_blames_the_budget(cli, tmp_path):
    line = clean_error(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "lots"))
    assert "--paging" not in line


def test_bad_budget_unit(cli, tmp_path):
    line = clean_error(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "3parsecs"))
    assert "parsecs" in line


def test_budget_in_bytes_with_unit(cli, tmp_path):
    proc = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "512MiB", "--json")
    assert proc.returncode == 0, proc.stderr
    out = one_json(proc.stdout)
    assert out["budget_bytes"] == 512 * 2**20
    assert out["peak_bytes"] == 3_100_000  # the plain schedule fits: nothing is recomputed
    assert out["tdi_percent"] == pytest.approx(0.0)


def test_a_budget_is_read_once_and_resolved_by_the_planner():
    from edge_remat.planner.build import build_problem, plain_peak_bytes
    from edge_remat.units import Budget, UnitError
    from helpers.small_graphs import training_chain
    assert Budget.parse("30%") == Budget(fraction=0.3) == Budget.parse(0.3)
    assert Budget.parse("512MiB") == Budget(bytes=512 * 2**20) == Budget.parse("536870912")
    assert Budget(fraction=0.5).resolve(1001) == 501 and Budget(bytes=7).resolve(1001) == 7
    with pytest.raises(UnitError, match="parsecs"):
        Budget.parse("3parsecs")
    graph = training_chain(3, 1)
    peak = plain_peak_bytes(graph)
    assert build_problem(graph, Budget(fraction=0.8)).budget_bytes == Budget(
        fraction=0.8).resolve(peak) == build_problem(graph, "80%").budget_bytes
    # A caller that has the plain peak passes it: a fraction is of that reference.
    assert build_problem(graph, Budget(fraction=0.5), plain_peak=10**9).budget_bytes == 5 * 10**8


def test_simulate_plan_for_another_graph(cli, tmp_path):
    graph = tiny_graph(tmp_path)
    plan_file = tmp_path / "plan.json"
    assert cli("plan", "--graph", graph, "--budget", "1.0", "-o", plan_file).returncode == 0
    other = json.loads(graph.read_text())
    other["nodes"][0]["out_bytes"] += 1
    other_file = tmp_path / "other.json"
    other_file.write_text(json.dumps(other))
    line = clean_error(cli("simulate", plan_file, "--graph", other_file))
    assert "graph_fingerprint" in line and "another graph" in line


def test_simulate_warns_where_the_plans_recorded_figures_are_not_its_replays(cli, tmp_path):
    """A plan whose `predicted.peak_bytes` said 5 replayed as "valid plan", exit 0, with no
    word that the plan claims what its schedule does not do."""
    graph = tiny_graph(tmp_path)
    plan_file = tmp_path / "plan.json"
    assert cli("plan", "--graph", graph, "--budget", "0.8", "-o", plan_file).returncode == 0
    honest = cli("simulate", plan_file, "--graph", graph)
    assert honest.returncode == 0 and "warning" not in honest.stderr, honest.stderr
    plan = json.loads(plan_file.read_text())
    peak = plan["predicted"]["peak_bytes"]
    plan["predicted"].update(peak_bytes=5, time_s=plan["predicted"]["time_s"] * 2)
    plan_file.write_text(json.dumps(plan))
    proc = cli("simulate", plan_file, "--graph", graph)
    assert proc.returncode == 0, proc.stderr
    warning = proc.stderr.strip()
    assert warning.startswith("warning: ") and "\n" not in warning, proc.stderr
    assert f"peak_bytes 5 (the replay: {peak})" in warning and "time_s" in warning
    assert "tdi_percent" not in warning and "the figures shown are the replay's" in warning


def test_costs_that_are_not_seconds_are_shown_in_the_files_units(cli, tmp_path):
    """A node-link benchmark graph's FLOP-like costs printed as "time 1.029e+13 s" and
    "energy 1.029e+13 J" (fcn8_vgg_train.json), in plan's table and simulate's."""
    def rows(stdout: str) -> str:  # the time and energy rows
        return "\n".join(line for line in stdout.splitlines()
                         if line.startswith(("time", "energy")))

    graph = tmp_path / "nl.json"
    graph.write_text(json.dumps({
        "directed": True, "multigraph": False, "graph": {"name": "nl"},
        "nodes": [{"id": i, "cost_cpu": 1000 * (i + 1), "cost_ram": 10} for i in range(3)],
        "links": [{"source": 0, "target": 1}, {"source": 1, "target": 2}]}))
    plan_file = tmp_path / "plan.json"
    planned = cli("plan", "--graph", graph, "--budget", "1.0", "--time-limit", "3",
                  "-o", plan_file)
    assert planned.returncode == 0, planned.stderr
    simulated = cli("simulate", plan_file, "--graph", graph)
    assert simulated.returncode == 0, simulated.stderr
    for proc in (planned, simulated):
        shown = rows(proc.stdout)
        assert shown.count("cost units") >= 2 and not re.search(r"\d (s|J)\b", shown), shown
    # a graph in our own format gives time_s: seconds, as before
    own = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "1.0", "--time-limit", "3")
    assert re.search(r"^time +[\d.e+-]+ s ", rows(own.stdout), re.M), own.stdout
    assert "cost units" not in own.stdout


def test_simulate_plan_with_unknown_node(cli, tmp_path):
    graph = tiny_graph(tmp_path)
    plan_file = tmp_path / "plan.json"
    assert cli("plan", "--graph", graph, "--budget", "1.0", "-o", plan_file).returncode == 0
    plan = json.loads(plan_file.read_text())
    plan["graph_fingerprint"] = ""  # skip the fingerprint check to reach the simulator
    plan["stages"][0].append({"op": "free", "node": "phantom"})
    plan_file.write_text(json.dumps(plan))
    line = clean_error(cli("simulate", plan_file, "--graph", graph))
    assert "invalid plan" in line and "'phantom'" in line


# --- our own format, heuristics and MILP, paging -----------------------------------------------

@pytest.mark.parametrize("solver", ["heuristic:dtr", "milp", "cpsat", "auto"])
def test_small_graph_each_solver(cli, tmp_path, solver):
    graph = tiny_graph(tmp_path)
    plan_file = tmp_path / "plan.json"
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "--solver", solver, "-o", plan_file,
               "--json")
    assert proc.returncode == 0, proc.stderr
    out = one_json(proc.stdout)
    assert out["budget_bytes"] == 2_480_000  # ceil(0.8 x 3.1 MB)
    assert out["peak_bytes"] <= out["budget_bytes"]
    if solver != "auto":
        assert out["solver"].startswith(solver.split(":")[0])
    assert out["recomputed"] >= 1  # at 0.8 without paging, something must be recomputed

    sim = cli("simulate", plan_file, "--graph", graph, "--json")
    assert sim.returncode == 0, sim.stderr
    replay = one_json(sim.stdout)
    assert replay["valid"] is True and replay["fits_budget"] is True
    assert replay["peak_bytes"] == out["peak_bytes"]
    assert replay["recomputed"] == out["recomputed"]

    text = cli("simulate", plan_file, "--graph", graph)
    assert text.returncode == 0 and "valid plan" in text.stdout


def test_highs_prints_no_banner_among_the_commands_lines(cli, tmp_path):
    """HiGHS prints a copyright banner the first time a process makes a solver (planner/highs.py
    spends it on /dev/null): it came before the plan's lines and before --json's object."""
    graph = tiny_graph(tmp_path)
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "--solver", "milp", "--backend",
               "highs", "--arena", "none", "-o", tmp_path / "plan.json")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("status") and "milp:highs" in proc.stdout.splitlines()[0]
    assert "HiGHS" not in proc.stdout + proc.stderr and proc.stderr == ""
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "--solver", "milp", "--backend",
               "highs", "--arena", "none", "-o", tmp_path / "plan.json", "--force", "--json")
    assert json.loads(proc.stdout)["solver"] == "milp:highs"  # one object, nothing before it


def test_sweep_prints_the_curve_and_writes_each_plan(cli, tmp_path):
    graph = tiny_graph(tmp_path)
    proc = cli("plan", "--graph", graph, "--sweep", "0.3:1.0:0.1", "--time-limit", "10",
               "-o", tmp_path / "plans", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = one_json(proc.stdout)["sweep"]
    assert [round(r["fraction"], 2) for r in rows] == [0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0]
    solved = [r for r in rows if r["status"] in ("optimal", "feasible", "timeout")]
    assert solved and rows[-1]["status"] == "optimal" and rows[-1]["tdi_percent"] == 0
    for row in rows:
        if row["status"] == "infeasible":
            assert "needs at least" in row["message"]
    # more memory never costs more time, and every plan replays within its budget
    tdis = [r["tdi_percent"] for r in solved]
    assert tdis == sorted(tdis, reverse=True)
    for row in solved:
        assert row["peak_bytes"] <= row["budget_bytes"]
        replay = cli("simulate", row["plan"], "--graph", graph, "--json")
        assert replay.returncode == 0 and one_json(replay.stdout)["fits_budget"] is True
    text = cli("plan", "--graph", graph, "--sweep", "0.5:1.0:0.25", "--time-limit", "10")
    assert text.returncode == 0 and "TDI %" in text.stdout and "gap %" in text.stdout


@pytest.mark.skipif(not (GRAPHS / "rl100.json").is_file(), reason="shared/ graphs not found")
def test_a_sweep_in_memory_aware_orders_plans_each_budget(cli, tmp_path):
    # rl100 plans 0.8 and 0.9 in different memory-aware orders. Before, the plan of 0.8 was the
    # start of 0.9 as it stood, its node indices in the other order: exit 70 (LoweringError).
    proc = cli("plan", "--graph", GRAPHS / "rl100.json", "--sweep", "0.8:0.9:0.1",
               "--time-limit", "5", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = one_json(proc.stdout)["sweep"]
    assert [r["status"] for r in rows] and all(r["peak_bytes"] <= r["budget_bytes"] for r in rows)


@pytest.mark.skipif(not (GRAPHS / "rl100.json").is_file(), reason="shared/ graphs not found")
def test_plan_json_says_what_the_table_says_beside_the_figures(cli, tmp_path):
    # Before, --json left out the bound's scope, the plan times, the order and the units.
    proc = cli("plan", "--graph", GRAPHS / "rl100.json", "--budget", "0.8", "--time-limit", "3",
               "--json")
    assert proc.returncode == 0, proc.stderr
    out = one_json(proc.stdout)
    assert out["bound_scope"] and out["first_plan_s"] <= out["best_plan_s"] <= out["solve_time_s"]
    assert out["order"] == "memory"
    assert out["units"] == {"time": "cost units", "energy": "cost units"}  # a published graph


def test_sweep_and_budget_together_is_an_error(cli, tmp_path):
    line = clean_error(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.8",
                           "--sweep", "0.5:1:0.1"))
    assert "--sweep" in line


def test_bad_sweep_text(cli, tmp_path):
    line = clean_error(cli("plan", "--graph", tiny_graph(tmp_path), "--sweep", "0.5-1"))
    assert "START:STOP:STEP" in line


def test_paging_to_flash(cli, tmp_path):
    graph = tiny_graph(tmp_path)
    plan_file = tmp_path / "plan.json"
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "--paging", "flash",
               "--flash-read-bw", "90MB", "--flash-write-bw", "40MB", "-o", plan_file, "--json")
    assert proc.returncode == 0, proc.stderr
    out = one_json(proc.stdout)
    assert out["peak_bytes"] <= out["budget_bytes"]

    saved = json.loads(plan_file.read_text())
    assert saved["problem"]["paging"] == ["flash"]
    flash = saved["tiers"]["flash"]
    assert flash["read_bytes_per_s"] == 90e6 and flash["write_bytes_per_s"] == 40e6

    sim = cli("simulate", plan_file, "--graph", graph, "--json")
    assert sim.returncode == 0, sim.stderr
    replay = one_json(sim.stdout)
    assert replay["valid"] is True and replay["fits_budget"] is True
    assert replay["peak_bytes"] == out["peak_bytes"]
    assert replay["page_outs"] == out["page_outs"] and replay["page_ins"] == out["page_ins"]
    assert replay["time_s"] == pytest.approx(out["time_s"])  # paging costs from the plan's tiers
    if out["page_ins"]:
        assert replay["paging_time_s"] > 0


def test_paging_needs_both_bandwidths(cli, tmp_path):
    line = clean_error(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.8",
                           "--paging", "flash", "--flash-read-bw", "90MB"))
    assert "--flash-write-bw" in line


def test_paging_without_tier_costs(cli, tmp_path):
    line = clean_error(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.8",
                           "--paging", "flash"))
    assert "bandwidth" in line


# --- planning stays light ----------------------------------------------------------------------

def test_planning_imports_neither_torch_nor_ortools(tmp_path):
    graph = tiny_graph(tmp_path)
    plan_file = tmp_path / "plan.json"
    script = textwrap.dedent(f"""
        import sys
        from typer.testing import CliRunner
        from edge_remat.cli import app
        runner = CliRunner()
        result = runner.invoke(app, ["plan", "--graph", {str(graph)!r}, "--budget", "0.8",
                                     "--solver", "milp", "-o", {str(plan_file)!r}])
        assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
        result = runner.invoke(app, ["simulate", {str(plan_file)!r}, "--graph", {str(graph)!r}])
        assert result.exit_code == 0, (result.exit_code, result.output, result.exception)
        heavy = sorted(m for m in ("torch", "ortools") if m in sys.modules)
        assert not heavy, heavy
        print("light")
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().endswith("light")
    assert plan_file.is_file()


def _imports_torch(script: str) -> bool:
    """Whether `script`, run in a fresh Python, leaves torch imported."""
    proc = subprocess.run([sys.executable, "-c", f"import sys; {script}; "
                           "print('torch' in sys.modules)"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip() == "True"


def test_host_page_service_imports_without_torch():
    # The host keeps a board's `host` pages as opaque bytes: its service must not pull torch in.
    assert not _imports_torch("import edge_remat.transport.host_pages; "
                              "from edge_remat_agent.pages import PageService")


def test_what_the_run_job_reads_before_its_capture_imports_no_torch():
    """The board's run job traces its capture in a child while it has not imported torch
    (executor/jobs.py); the --save choices it checks first once came with torch, and a
    150 MiB board was killed capturing a model it had captured before."""
    assert not _imports_torch("import edge_remat_agent.executor.jobs; "
                              "from edge_remat_agent.executor.save_choice import "
                              "check_save_choice; check_save_choice('trained')")


def test_a_sweep_where_no_budget_plans_is_an_error_and_writes_nothing(cli, tmp_path):
    """It exited 0, printed "plans written to DIR/" and left DIR empty."""
    graph, out = tiny_graph(tmp_path), tmp_path / "plans"
    line = clean_error(cli("plan", "--graph", graph, "--sweep", "0.01:0.05:0.02", "-o", out))
    assert "no budget of the sweep" in line and "every schedule needs at least" in line
    assert not out.exists()
    some = cli("plan", "--graph", graph, "--sweep", "0.05:1.0:0.95", "--time-limit", "10",
               "-o", out)
    assert some.returncode == 0, some.stderr
    assert f"1 plan of 2 budgets written to {out}/, with the table in sweep.json" \
        in some.stdout
    assert sorted(p.name for p in out.iterdir()) == ["plan-1.00.json", "sweep.json"]
    # the folder is what `plot --sweep` takes (QA: only --json's stdout could be drawn)
    drawn = cli("plot", "--sweep", out, "--out", tmp_path / "drawn")
    assert drawn.returncode == 0 and (tmp_path / "drawn" / "sweep.png").is_file(), drawn.stderr


def test_a_budget_that_misses_the_deadline_is_a_row_of_the_sweep(cli, tmp_path):
    """An unmeetable deadline at 0.7 stopped the whole sweep (exit 2, nothing written) though
    1.0 plans; it is now a row, as an infeasible budget is, with the smallest deadline."""
    graph, out = tiny_graph(tmp_path), tmp_path / "plans"
    sweep = ["plan", "--graph", graph, "--sweep", "0.4:1.0:0.3", "--deadline", "1.0",
             "--time-limit", "3"]
    proc = cli(*sweep, "-o", out, "--json")
    assert proc.returncode == 0, proc.stderr
    rows = one_json(proc.stdout)["sweep"]
    assert [r["status"] for r in rows] == ["infeasible", "infeasible_deadline", "optimal"]
    assert rows[1]["smallest_feasible_deadline"] > 1.0
    assert "smallest deadline that can be met" in rows[1]["message"]
    assert sorted(p.name for p in out.iterdir()) == ["plan-1.00.json", "sweep.json"]
    table = cli(*sweep)
    assert table.returncode == 0 and "infeasible_deadline" in table.stdout
    # where no budget meets it, the sweep is the error a single budget's would be
    proc = cli("plan", "--graph", graph, "--sweep", "0.7:0.7:0.1", "--deadline", "1.0",
               "--time-limit", "3", "--json")
    assert proc.returncode == 2 and "smallest deadline" in proc.stderr
    assert one_json(proc.stdout)["status"] == "infeasible_deadline"


def test_run_help_says_the_real_defaults(cli):
    """--data's help said "digits for digits-cnn, else example" (the llama models get text);
    --budget's did not say that a bare number below 16 is a fraction; --lr's said sgd 0.1."""
    from edge_remat.run.options import DEFAULT_DATA
    from edge_remat_agent.capture.optimizer import TORCH_OPTIMIZERS
    text = " ".join(cli("run", "--help").stdout.replace("│", " ").split())
    for model, data in DEFAULT_DATA.items():
        assert model in text and f"{data} for" in text
    for name, (_, settings) in TORCH_OPTIMIZERS.items():  # what the board trains with
        assert f"{name} {settings['lr']:g}" in text
    assert "a bare number below 16 is a fraction" in text
    plan_help = " ".join(cli("plan", "--help").stdout.replace("│", " ").split())
    assert "a bare number below 16 is a fraction" in plan_help


def test_run_refuses_profile_with_reprofile(cli, tmp_path):
    """Both together were accepted, the profile used and --reprofile dropped in silence."""
    line = clean_error(cli("run", "--device", "local", "--model", "digits-cnn", "--profile",
                           "profiles/this-machine.json", "--reprofile", "--out", tmp_path / "o",
                           cwd=Path(__file__).resolve().parents[1]))
    assert "--profile and --reprofile are alternatives" in line
    assert not (tmp_path / "o").exists()


def test_graph_stores_a_model_file_by_its_absolute_path(cli, tmp_path):
    """`graph --model examples/my_model.py:make_model` stored the path as given; the board,
    rebuilding the model in its own folder for `deploy`, could not find the file."""
    root = Path(__file__).resolve().parents[1]
    made = cli("graph", "--model", "examples/my_model.py:make_model", "--batch", "4",
               "-o", tmp_path / "g.json", cwd=root)
    assert made.returncode == 0, made.stderr
    stored = json.loads((tmp_path / "g.json").read_text())["capture"]["source"]["model"]
    assert stored == f"{root / 'examples' / 'my_model.py'}:make_model"


def test_an_operator_level_graph_shows_no_level_and_refuses_one(cli, tmp_path):
    """It printed "level 3" (the module level it split, no figure of its nodes) and ignored
    --level in silence."""
    made = cli("graph", "--model", "mlp", "--operator-level", "-o", tmp_path / "g.json")
    assert made.returncode == 0, made.stderr
    nodes = next(line for line in made.stdout.splitlines() if line.startswith("nodes"))
    assert "level" not in nodes and "one per ATen op" in nodes
    line = clean_error(cli("graph", "--model", "mlp", "--operator-level", "--level", "2",
                           "-o", tmp_path / "h.json"))
    assert "--level" in line and "--operator-level" in line and "give one of them" in line
    assert not (tmp_path / "h.json").exists()


def test_status_labels_do_not_contradict_themselves(cli, tmp_path):
    """my_model at 50% with paging: "optimal (heuristic:paging, fallback from cpsat optimal)"
    and gap 3.33% beside "optimal", unexplained."""
    root = Path(__file__).resolve().parents[1]
    graph = tmp_path / "my_model.json"
    made = cli("graph", "--model", f"{root / 'examples' / 'my_model.py'}:make_model",
               "--batch", "16", "-o", graph)
    assert made.returncode == 0, made.stderr
    proc = cli("plan", "--graph", graph, "--profile", root / "profiles" / "jetson-orin-nano.json",
               "--budget", "50%", "--solver", "cpsat", "--time-limit", "10", "--arena", "none",
               "-o", tmp_path / "plan.json")
    assert proc.returncode == 0, proc.stderr
    rows = {line.split("  ", 1)[0]: line for line in proc.stdout.splitlines()}
    solver = json.loads((tmp_path / "plan.json").read_text())["solver"]
    assert "fallback from cpsat optimal" not in rows["status"]
    if solver["name"] != "cpsat" and solver["status"] == "optimal":
        assert solver["proven_optimal_by"] == "cpsat" and "fallback_from" not in solver
        assert "proven optimal by cpsat" in rows["status"]
    if solver["status"] == "optimal" and solver["gap"] > 1e-6:
        assert "optimal in the solver's own model" in rows["gap"]


def test_simulate_with_another_boards_profile_says_so(cli, tmp_path):
    """QA: a plan made with the Pi 4's profile, replayed with the Orin Nano's, gave another
    step time with no word of it (without --profile it says which profile made the plan)."""
    graph = Path(__file__).resolve().parents[1] / "examples" / "graphs" / "tiny_cnn_train.json"
    profiles = Path(__file__).resolve().parents[1] / "profiles"
    plan = tmp_path / "plan.json"
    made = cli("plan", "--graph", graph, "--budget", "0.9", "--profile", profiles / "rpi4.json",
               "--time-limit", 3, "-o", plan)
    assert made.returncode == 0, made.stderr
    other = cli("simulate", plan, "--graph", graph, "--profile",
                profiles / "jetson-orin-nano.json")
    assert other.returncode == 0, other.stderr
    assert "the plan was made with the profile 'Raspberry Pi 4" in other.stderr
    assert "replayed here with 'Jetson Orin Nano" in other.stderr
    same = cli("simulate", plan, "--graph", graph, "--profile", profiles / "rpi4.json")
    assert "the plan was made with" not in same.stderr and "warning" not in same.stderr
    # QA: "valid plan" on a board whose RAM cannot hold the plan, where `plan` warns of it
    small = cli("simulate", plan, "--graph", graph, "--profile", profiles / "cortex-m4.json")
    assert small.returncode == 0 and "valid plan" in small.stdout, small.stderr
    assert "warning: the plan's peak, " in small.stderr
    assert "is more than the 192.00 KiB of RAM " in small.stderr


@needs_shared
def test_a_bandwidth_beside_a_graph_in_cost_units_is_a_warning(cli, tmp_path):
    """QA: on rl100 (cost units) --flash-read-bw made paging '0.0006767 cost units', nearly
    free, with no word that seconds were set beside cost units."""
    graph = GRAPHS / "rl100.json"
    given = cli("plan", "--graph", graph, "--budget", "0.6", "--paging", "flash",
                "--flash-read-bw", "90MB", "--flash-write-bw", "40MB", "--time-limit", 3)
    assert given.returncode == 0, given.stderr
    assert "node costs are cost units, not seconds; --flash-read-bw" in given.stderr
    plan = tmp_path / "plan.json"
    alone = cli("plan", "--graph", graph, "--budget", "0.9", "--time-limit", 3, "-o", plan)
    assert alone.returncode == 0, alone.stderr
    assert "cost units, not seconds" not in alone.stderr
    replayed = cli("simulate", plan, "--graph", graph, "--profile",
                   Path(__file__).resolve().parents[1] / "profiles" / "rpi4.json")
    assert "node costs are cost units, not seconds; the profile" in replayed.stderr

