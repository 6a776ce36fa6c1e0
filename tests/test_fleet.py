"""`edge-remat fleet plan` on a real local Ray instance (2 CPUs): three small models x two boards
x three budgets, every plan written, valid in the simulator and identical to what `edge-remat
graph` + `edge-remat plan` give for the same inputs; infeasible budgets recorded as results and
failures (a worker that dies) without stopping the others; a re-run resumes; the CLI against the
same Ray instance by address, the in-process path, and a bad manifest's error lines."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, env

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install -e '.[fleet]'")
pytestmark = pytest.mark.slow  # a local Ray instance and real solves: a minute or two

REPO = Path(__file__).resolve().parents[1]
PROFILES = {"rpi4": REPO / "profiles" / "rpi4.json",
            "orin-nano": REPO / "profiles" / "jetson-orin-nano.json"}
BUDGETS = ["80%", "90%", "97%"]
TIME_LIMIT = 20  # these tiny graphs are solved to optimality well within it
MODELS = {"mlp": ("mlp", ["--batch", "4"]),
          # at most 131 planner nodes (the graph before running statistics stopped being cloned
          # for backward: with 32 fewer ops, capture refines it to 200, which CP-SAT on one
          # worker does not prove optimal within TIME_LIMIT)
          "digits-cnn": ("digits-cnn", ["--batch", "4", "--image", "8", "--max-nodes", "131"]),
          "my-model": (str(REPO / "examples" / "my_model.py") + ":make_model",
                       ["--batch", "2", "--image", "8"])}
# Solver times differ from run to run; everything else in a plan file must be the same.
TIMINGS = ("solve_time_s", "first_plan_s", "best_plan_s")

CRASHER = '''
import os, signal


def make_model():
    os.kill(os.getpid(), signal.SIGKILL)  # the worker dies, as in a native solver crash
'''


def manifest_text(crasher: Path) -> str:
    return f"""
budgets = {json.dumps(BUDGETS)}

[plan]
objective = "energy"
time_limit = {TIME_LIMIT}

[[models]]
model = "mlp"
batch = 4

[[models]]
model = "digits-cnn"
batch = 4
image = 8
max_nodes = 131

[[models]]
model = "{REPO / 'examples' / 'my_model.py'}:make_model"
name = "my-model"
batch = 2
image = 8

[[models]]
model = "{crasher}:make_model"

[[boards]]
device = "rpi4"

[[boards]]
profile = "{PROFILES['orin-nano']}"
name = "orin-nano"
"""


@pytest.fixture(scope="module")
def local_ray():
    # Graphs and plans of these models are kilobytes: a small object store is plenty.
    context = ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                       logging_level="error", object_store_memory=256 * 2**20)
    yield context
    ray.shutdown()


@pytest.fixture(scope="module")
def fleet(local_ray, tmp_path_factory):
    from edge_remat.fleet.backends import RayBackend
    from edge_remat.fleet.manifest import load_manifest
    from edge_remat.fleet.runner import run_fleet

    folder = tmp_path_factory.mktemp("fleet")
    crasher = folder / "crasher.py"
    crasher.write_text(CRASHER)
    path = folder / "fleet.toml"
    path.write_text(manifest_text(crasher))
    manifest = load_manifest(path)
    lines: list[str] = []
    result = run_fleet(manifest, folder / "out", RayBackend(), say=lines.append, live=False)
    return manifest, folder / "out", result, lines


def without_timings(plan: dict) -> dict:
    plan = json.loads(json.dumps(plan))
    for key in TIMINGS:
        plan["solver"].pop(key, None)
    if "arena" in plan:  # the address layout's time too
        plan["arena"]["details"].pop("plan_time_s", None)
    return plan


def test_every_plan_written_valid_and_as_the_plan_command_gives(fleet, tmp_path):
    from typer.testing import CliRunner

    from edge_remat.checks import check_plan
    from edge_remat.cli import app
    from edge_remat.importers.graph_import import load_graph_file
    from edge_remat_agent.formats import load_plan

    manifest, out, result, _ = fleet
    assert result.workers == 1 and result.in_flight == 2  # 2 CPUs, many tasks: 1 thread each
    rows = {(r["model"], r["board"], r["budget"]): r for r in result.rows}
    assert len(rows) == 4 * 2 * 3
    runner = CliRunner()
    compared = 0
    for name, (spec, options) in MODELS.items():
        graph_file = tmp_path / f"{name}.json"
        captured = runner.invoke(app, ["graph", "--model", spec, *options, "-o", str(graph_file)])
        assert captured.exit_code == 0, captured.output
        graph = load_graph_file(graph_file)
        assert load_graph_file(out / name / "graph.json").fingerprint() == graph.fingerprint()
        for board, profile in PROFILES.items():
            for budget in BUDGETS:
                row = rows[(name, board, budget)]
                expected = tmp_path / f"{name}-{board}-{budget.rstrip('%')}.json"
                answer = runner.invoke(app, [
                    "plan", "--graph", str(graph_file), "--budget", budget, "--profile",
                    str(profile), "--objective", "energy", "--time-limit", str(TIME_LIMIT),
                    "--workers", "1", "-o", str(expected), "--json"])
                if answer.exit_code != 0:  # the same failure, the same one line
                    assert row["status"] == json.loads(answer.stdout)["status"] == "infeasible"
                    assert f"error: {row['error']}" in answer.output
                    assert row["plan"] is None and not expected.exists()
                    continue
                assert row["error"] is None and row["status"] == "optimal", row
                written = out / row["plan"]
                check_plan(load_plan(written), graph, str(written), str(graph_file))
                assert without_timings(json.loads(written.read_text())) == \
                    without_timings(json.loads(expected.read_text()))
                compared += 1
    assert compared == 14  # mlp cannot go below 95% of its plain peak: 4 infeasible tasks


def test_failures_are_recorded_and_do_not_stop_the_others(fleet):
    manifest, out, result, lines = fleet
    crashed = [r for r in result.rows if r["model"] == "crasher"]
    assert len(crashed) == 6
    for row in crashed:
        assert row["status"] == "capture failed" and row["plan"] is None
        assert row["error"].startswith("the Ray worker capturing the model was killed by a "
                                       "signal or crashed") and "\n" not in row["error"]
    infeasible = [r for r in result.rows if r["status"] == "infeasible"]
    assert {(r["model"], r["budget"]) for r in infeasible} == {("mlp", "80%"), ("mlp", "90%")}
    assert all("needs at least" in r["error"] for r in infeasible)
    assert all(r["budget_floor_bytes"] > r["budget_bytes"] for r in infeasible)
    assert result.infeasible == infeasible and len(result.failed) == 6  # the crasher's only
    assert any(line.startswith("failed: crasher on rpi4 at 80%: capture failed: ")
               for line in lines)
    # The table holds every task, and a plot per model with a plan.
    table = (out / "results.csv").read_text().splitlines()
    assert table[0].startswith("model,board,budget,deadline,status") and len(table) == 25
    assert json.loads((out / "results.json").read_text())["rows"] == result.rows
    for model in ("mlp", "digits-cnn", "my-model"):
        assert (out / model / "sweep.png").read_bytes()[:4] == b"\x89PNG"
    assert not (out / "crasher" / "sweep.png").exists()


def test_a_rerun_keeps_what_is_written_and_valid(fleet):
    from edge_remat.fleet.backends import RayBackend
    from edge_remat.fleet.runner import run_fleet

    manifest, out, result, _ = fleet
    plans = {r["plan"]: (out / r["plan"]).read_text() for r in result.rows if r["plan"]}
    stamps = {name: os.stat(out / name).st_mtime_ns for name in plans}
    # One plan deleted, one damaged (a stage dropped: it no longer replays), one for another
    # budget in its place: these three are planned again, the rest kept as they are.
    deleted, damaged, swapped = "digits-cnn/rpi4/plan-80pct.json", \
        "my-model/orin-nano/plan-90pct.json", "my-model/rpi4/plan-97pct.json"
    (out / deleted).unlink()
    broken = json.loads(plans[damaged])
    broken["stages"] = broken["stages"][1:]
    (out / damaged).write_text(json.dumps(broken))
    (out / swapped).write_text(plans["my-model/rpi4/plan-80pct.json"])

    again = run_fleet(manifest, out, RayBackend(), live=False)
    rerun = {r["plan"] for r in again.rows if r["plan"] and not r["resumed"]}
    assert rerun == {deleted, damaged, swapped}
    for name, text in plans.items():
        assert without_timings(json.loads((out / name).read_text())) == \
            without_timings(json.loads(text))
        if name not in rerun:
            assert os.stat(out / name).st_mtime_ns == stamps[name]
    assert len(again.failed) == 6  # failed tasks are tried again, and fail again
    assert len(again.infeasible) == 4


def test_cli_on_a_ray_cluster_by_address_and_in_process(fleet, local_ray, tmp_path):
    manifest, out, result, _ = fleet
    graph = out / "my-model" / "graph.json"
    (tmp_path / "small.toml").write_text(f"""
budgets = ["80%", "0.9", "10%"]
[plan]
objective = "energy"
time_limit = {TIME_LIMIT}
[[models]]
graph = "{graph}"
name = "my-model"
[[boards]]
profile = "{PROFILES['rpi4']}"
name = "rpi4"
""")
    for how in (["--ray-address", local_ray.address_info["address"]], ["--no-ray"]):
        target = tmp_path / how[0].strip("-")
        proc = cli("fleet", "plan", tmp_path / "small.toml", "--out", target, "--threads", "1",
                   "--json", *how, timeout=300)
        # 10% is below the graph's floor: recorded as a result, not a failure
        assert proc.returncode == 0, proc.stderr
        report = json.loads(proc.stdout)
        assert report["status"] == "done" and report["tasks"] == 3 and report["failed"] == 0
        assert report["infeasible"] == 1
        assert [r["status"] for r in report["rows"]] == ["optimal", "optimal", "infeasible"]
        for budget, name in (("80%", "plan-80pct.json"), ("0.9", "plan-0.9.json")):
            fleet_plan = out / "my-model" / "rpi4" / ("plan-80pct.json" if budget == "80%"
                                                      else "plan-90pct.json")
            assert without_timings(json.loads((target / "my-model" / "rpi4" / name)
                                              .read_text())) == \
                without_timings(json.loads(fleet_plan.read_text()))


def test_a_bad_manifest_is_refused_one_line_per_mistake(tmp_path):
    (tmp_path / "bad.toml").write_text("""
budgets = ["80%", "lots", "0.8"]
colour = "blue"
[plan]
objective = "speed"
solver = "magic"
time_limit = -3
[[models]]
model = "mlp"
batch = 0
[[models]]
model = "nosuchmodel"
[[boards]]
profile = "no-such-profile.json"
[[boards]]
profile = ""
[[boards]]
device = ""
""")
    proc = cli("fleet", "plan", tmp_path / "bad.toml", "--out", tmp_path / "out", "--no-ray",
               environ=env())
    assert proc.returncode == BAD_INPUT, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    errors = proc.stderr.strip().splitlines()
    assert all(line.startswith(f"error: {tmp_path / 'bad.toml'}: ") for line in errors), errors
    for word in ("colour", "budgets[1]", "plan.objective", "unknown solver 'magic'",
                 "time_limit must be", "models[0].batch", "no zoo model 'nosuchmodel'",
                 "boards[0]", "boards[1].profile: is empty",
                 "boards[2].device: no device named (an empty name)",
                 "budgets[2]: '0.8' is budgets[0] ('80%') again"):  # QA: planned twice
        assert sum(word in line for line in errors) == 1, (word, errors)
    assert len(errors) == 11  # every mistake at once, the zoo name's included
    assert not (tmp_path / "out").exists()  # nothing made before the manifest is right


def test_a_ray_address_nobody_answers_on_is_one_line(tmp_path):
    import socket

    from helpers.bad_inputs import refused

    with socket.socket() as probe:  # a port that was free a moment ago: nobody listens
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    _one_mlp_on_one_board(tmp_path / "fleet.toml")
    line = refused(cli("fleet", "plan", tmp_path / "fleet.toml", "--out", tmp_path / "out",
                       "--ray-address", f"127.0.0.1:{port}", timeout=120), BAD_INPUT,
                   "cannot reach the Ray cluster", f"127.0.0.1:{port}")
    assert "--ray-address" in line and not (tmp_path / "out").exists()


def _in_session(session: int) -> list:
    """The names of the live processes of a session (Linux /proc): a zombie, ended and
    waiting for init to reap it, is not one."""
    names = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and os.getsid(int(entry)) == session:
                state = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    names.append(Path(f"/proc/{entry}/comm").read_text().strip())
        except OSError:
            pass
    return names


def test_ctrl_c_while_ray_starts_exits_130_with_ray_gone_and_no_token_notice(tmp_path):
    """A terminal's Ctrl-C (the whole foreground group) while the local Ray instance starts:
    it exited 130, but Ray's dashboard and runtime-env agents lived on for 70 s after, and
    Ray's warning 'Token authentication is enabled for this Ray cluster. Set
    RAY_AUTH_MODE=disabled to opt out' came first, nothing a fleet's user can act on."""
    import signal
    import subprocess
    import sys
    import time
    _one_mlp_on_one_board(tmp_path / "fleet.toml")
    process = subprocess.Popen(
        [sys.executable, "-m", "edge_remat", "fleet", "plan", str(tmp_path / "fleet.toml"),
         "--out", str(tmp_path / "out")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, env=env(), start_new_session=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    began = time.monotonic()
    while "raylet" not in _in_session(process.pid):  # Ray's node is coming up
        assert process.poll() is None and time.monotonic() - began < 120, process.communicate()
        time.sleep(0.1)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip().splitlines() == ["error: interrupted (Ctrl-C)"], err
    time.sleep(1)  # the ones killed last: reaped
    assert _in_session(process.pid) == []  # before: the dashboard and runtime-env agents


@pytest.mark.parametrize("moment", ["while Ray starts", "while tasks run"])
def test_sigterm_is_an_interrupt_with_the_results_so_far_and_ray_gone(moment, tmp_path):
    """SIGTERM (`timeout`, a batch scheduler) to the fleet's process alone. While tasks ran,
    Ray's own handler dumped a crash report and exited 134 with no results.csv, its workers
    left running; while Ray started, Ray's handler exited 15 saying nothing. Now each is the
    Ctrl-C the other commands make of it: exit 130, its one line, Ray gone."""
    import signal
    import subprocess
    import sys
    import time
    path = tmp_path / "fleet.toml"
    _one_mlp_on_one_board(path)  # 60 tasks: most still to run when the signal comes
    budgets = [f"{percent}%" for percent in range(50, 110)]  # each once: a manifest's rule
    path.write_text(path.read_text().replace('budgets = ["80%"]', f"budgets = {budgets}"
                                             .replace("'", '"')))
    out = tmp_path / "out"
    process = subprocess.Popen(
        [sys.executable, "-m", "edge_remat", "fleet", "plan", str(path), "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env(),
        start_new_session=True)
    began = time.monotonic()

    def ready() -> bool:
        if moment == "while Ray starts":
            return "raylet" in _in_session(process.pid)
        return any((out / "mlp").glob("**/plan-*.json"))
    while not ready():
        assert process.poll() is None and time.monotonic() - began < 180, process.communicate()
        time.sleep(0.1)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=180)
    assert process.returncode == 130, err
    last = err.strip().splitlines()[-1]
    if moment == "while Ray starts":
        assert last == "error: interrupted (SIGTERM)", err
    else:
        assert last.startswith("error: interrupted (SIGTERM) with "), err
        assert "tasks recorded in" in last and (out / "results.csv").is_file()
    assert "SIGTERM received" not in err  # no crash report
    time.sleep(1)
    assert _in_session(process.pid) == []


def test_a_fleet_starts_ray_of_its_own_beside_one_already_running(local_ray, tmp_path):
    """Without --ray-address a fleet starts a local instance for itself, though another runs
    on this machine (here the tests' own, `local_ray`): ray.init without an address joined the
    last one started, and the fleet's end then shut down what it took for its own."""
    import subprocess
    import sys
    _one_mlp_on_one_board(tmp_path / "fleet.toml")
    done = subprocess.run(
        [sys.executable, "-m", "edge_remat", "fleet", "plan", str(tmp_path / "fleet.toml"),
         "--out", str(tmp_path / "out"), "--json"], capture_output=True, text=True, env=env(),
        timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["status"] == "done"
    joined = [job for job in ray._private.state.jobs()
              if str(tmp_path) in str(job.get("Entrypoint"))]
    assert joined == []  # the fleet was no job of this instance
    assert ray.get(ray.remote(lambda: 42).remote()) == 42  # and the instance still runs


def test_the_example_manifest_is_valid():
    from edge_remat.fleet.manifest import load_manifest

    manifest = load_manifest(REPO / "examples" / "fleet.toml")
    assert [m.name for m in manifest.models] == ["gpt-tiny", "digits-cnn", "my-model"]
    assert [b.name for b in manifest.boards] == ["rpi4", "orin-nano"]
    assert manifest.boards[0].profile_path == REPO / "profiles" / "rpi4.json"
    assert manifest.models[2].spec == f"{REPO / 'examples' / 'my_model.py'}:make_model"


def _one_mlp_on_one_board(path):
    """The smallest manifest: one model, one board, one budget."""
    path.write_text(f"""
budgets = ["80%"]
[[models]]
model = "mlp"
[[boards]]
profile = "{PROFILES['rpi4']}"
""")
