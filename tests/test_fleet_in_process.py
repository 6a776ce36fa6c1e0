"""`edge-remat fleet plan` without Ray (the fast tier; test_fleet.py runs it on a local Ray
instance): an infeasible budget is a result of the sweep, not a failed task, a manifest's
missing model file is refused before any work, and the shipped example's budgets are all above
its models' floors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph

REPO = Path(__file__).resolve().parents[1]


def small_fleet(folder: Path, budgets: list) -> Path:
    tiny_graph(folder)
    path = folder / "fleet.toml"
    path.write_text(f"""
budgets = {json.dumps(budgets)}
[plan]
solver = "heuristic:split"
[[models]]
graph = "tiny.json"
[[boards]]
profile = "{REPO / 'profiles' / 'rpi4.json'}"
name = "rpi4"
""")
    return path


def test_an_infeasible_budget_is_a_result_not_a_failure(tmp_path):
    manifest = small_fleet(tmp_path, ["10%", "97%"])  # 10%: below the tiny graph's floor
    proc = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert (report["status"], report["failed"], report["infeasible"]) == ("done", 0, 1)
    low, high = report["rows"]
    assert low["status"] == "infeasible" and low["plan"] is None
    assert low["budget_floor_bytes"] > low["budget_bytes"]
    assert low["smallest_feasible_budget_bytes"] == low["budget_floor_bytes"]  # older name
    assert "needs at least" in low["error"]  # the planner's why, kept for the table
    assert high["status"] != "infeasible" and high["budget_floor_bytes"] is None
    assert "infeasible: tiny on rpi4 at 10%: needs at least " \
        f"{low['budget_floor_bytes']} bytes" in proc.stderr

    again = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("2 tasks: 1 planned (1 kept from before), 1 infeasible, "
                                   "0 failed")
    line = next(line for line in again.stdout.splitlines() if line.startswith("tiny "))
    assert "infeasible" in line and "needs at least" in line and "node" not in line


def test_the_table_is_aligned_with_an_infeasible_deadline(tmp_path):
    manifest = small_fleet(tmp_path, ["97%"])
    manifest.write_text(manifest.read_text().replace("[plan]", "deadlines = [0.5, 3.0]\n[plan]"))
    proc = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray")
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    header = next(line for line in lines if line.startswith("model "))
    rows = [line for line in lines if line.startswith("tiny ")]
    assert any("infeasible_deadline" in row for row in rows)
    late = next(row for row in rows if "infeasible_deadline" in row)
    # the status column holds its widest entry: the header's next column starts after it
    assert header.index("peak") > late.index("infeasible_deadline") + len("infeasible_deadline")
    assert header.index("status") == late.index("infeasible_deadline")


def test_one_task_is_counted_in_the_singular(tmp_path):
    proc = cli("fleet", "plan", small_fleet(tmp_path, ["97%"]), "--out", tmp_path / "out",
               "--no-ray", "--threads", "1")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("1 task: 1 planned (0 kept from before), 0 infeasible, 0 failed")
    assert "(1 at a time, 1 solver thread each)" in proc.stdout.splitlines()[0]


def test_a_missing_model_file_is_refused_before_any_work(tmp_path):
    manifest = small_fleet(tmp_path, ["97%"])
    manifest.write_text(manifest.read_text() + '[[models]]\nmodel = "nosuch.py:make"\n')
    line = refused(cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray"),
                   BAD_INPUT, "models[1].model", f"no such file {tmp_path / 'nosuch.py'}")
    assert line.startswith(f"error: {manifest}: ")
    assert not (tmp_path / "out").exists()  # the tiny graph's task did not run either


def test_the_example_manifests_budgets_are_all_feasible():
    # Planning the whole example takes a minute; its budgets' floors take seconds, and a budget
    # below a floor is the one way a valid manifest's task is infeasible.
    from edge_remat.fleet.manifest import load_manifest
    from edge_remat.planner.build import build_problem
    from edge_remat_agent.capture import capture_model

    manifest = load_manifest(REPO / "examples" / "fleet.toml")
    for model in manifest.models:
        graph = capture_model(model.spec, **model.capture).graph
        for board in manifest.boards:
            for budget in manifest.budgets:
                build_problem(graph, budget, board.profile, manifest.plan.objective, None,
                              manifest.plan.paging, None, manifest.plan.paging_time
                              ).check_budget()


def test_a_profile_measured_for_another_model_is_said_as_plan_says_it(tmp_path):
    """QA: a fleet board whose measured profile timed another model's operators planned with
    estimated node times without a word (`edge-remat plan` warns)."""
    manifest = small_fleet(tmp_path, ["97%"])
    manifest.write_text(manifest.read_text().replace(
        str(REPO / "profiles" / "rpi4.json"), str(REPO / "profiles" / "this-machine.json")))
    proc = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray")
    assert proc.returncode == 0, proc.stderr
    assert "warning: rpi4's profile (" in proc.stderr
    assert "measured 0 of the 5 nodes of 'tiny' (it was measured for another model or " \
           "shapes)" in proc.stderr
    (tmp_path / "modelled").mkdir()  # a modelled profile times no operator: nothing to say
    quiet = cli("fleet", "plan", small_fleet(tmp_path / "modelled", ["97%"]), "--out",
                tmp_path / "out2", "--no-ray")
    assert quiet.returncode == 0 and "warning" not in quiet.stderr, quiet.stderr


def test_a_synthetic_graphs_costs_are_labelled_cost_units_as_plan_labels_them(tmp_path):
    """A random layered graph's costs are unitless (`cost_source: synthetic`): the table said
    "5.062e+04s 2.531e+05J" where `plan` says "cost units"."""
    from edge_remat.synthetic import random_layered
    random_layered(60, seed=1).save(tmp_path / "rl60.json")
    manifest = small_fleet(tmp_path, ["97%"])
    manifest.write_text(manifest.read_text().replace("tiny.json", "rl60.json"))
    proc = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray")
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("rl60 "))
    assert not row.rstrip().endswith("J") and "s " not in row.split("KiB", 1)[1], row
    assert "time and energy of rl60 are in the graph's cost units" in proc.stdout
    [result] = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    assert result["units"] == {"time": "cost units", "energy": "cost units"}

    (tmp_path / "tiny").mkdir()  # a graph in seconds keeps its s and J
    proc = cli("fleet", "plan", small_fleet(tmp_path / "tiny", ["97%"]), "--out",
               tmp_path / "tiny" / "out", "--no-ray")
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith("tiny "))
    assert row.rstrip().endswith("J") and "cost units" not in proc.stdout, proc.stdout


def test_a_kept_plan_missing_its_solvers_figures_is_planned_again(tmp_path):
    """A plan already written for a task is kept when it replays to the figures it promises;
    one whose `solver` lost its `status` (edited by hand, say) was kept too, and its row then
    ended the sweep in `internal error (KeyError: 'status')`, exit 70."""
    manifest = small_fleet(tmp_path, ["97%"])
    assert cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray").returncode == 0
    path = tmp_path / "out" / "tiny" / "rpi4" / "plan-97pct.json"
    plan = json.loads(path.read_text())
    del plan["solver"]["status"]
    path.write_text(json.dumps(plan))
    again = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray")
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith("1 task: 1 planned (0 kept from before), 0 infeasible")
    assert "status" in json.loads(path.read_text())["solver"]  # written again, whole


def test_a_bare_budget_read_as_bytes_is_warned_of_as_plan_warns(tmp_path):
    """`budgets = [50]` is 50 bytes, where 50% was almost surely meant: `plan --budget 50`
    said so, the fleet planned it in silence (and found it infeasible)."""
    manifest = small_fleet(tmp_path, [50, "97%"])
    proc = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray")
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert warnings == [f"warning: {manifest}: budgets[0] = 50 is read as 50 bytes (a bare "
                        "number below 16 is a fraction of the plain peak, from 16 up bytes): "
                        "for 50% of the plain peak, write 50%"]


def test_a_plan_above_its_boards_ram_is_marked_and_said(tmp_path):
    """QA: a 14.74 GiB plan of vgg16 for a 4 GiB rpi4 was "optimal" in the table and the
    results without a word, where `plan --profile` warns of it. Kept plans are judged too."""
    small = json.loads((REPO / "profiles" / "rpi4.json").read_text())
    small["ram_total_bytes"] = 1000  # a board far too small for the tiny graph's plan
    (tmp_path / "small.json").write_text(json.dumps(small))
    manifest = small_fleet(tmp_path, ["97%"])
    manifest.write_text(manifest.read_text() + f"""[[boards]]
profile = "{tmp_path / 'small.json'}"
name = "small"
""")
    for again in (False, True):  # planned, then kept from before
        proc = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray")
        assert proc.returncode == 0, proc.stderr
        # QA: a resume that kept every task said how many ran at a time
        assert ("at a time" in proc.stdout.splitlines()[0]) is not again, proc.stdout
        rows = {line.split()[1]: line for line in proc.stdout.splitlines()
                if line.startswith("tiny ")}
        assert rows["small"].endswith("  > board RAM") and "> board RAM" not in rows["rpi4"]
        assert "warning: 1 plan marked > board RAM: each peaks above the RAM of its board's " \
            "profile and will not fit there (fits_board false in the results)" in proc.stdout
    results = json.loads((tmp_path / "out" / "results.json").read_text())["rows"]
    fits = {row["board"]: (row["fits_board"], row["board_ram_bytes"]) for row in results}
    assert fits == {"rpi4": (True, 4 * 2**30), "small": (False, 1000)}


def test_names_shared_or_not_a_folder_name_are_said_once_as_written(tmp_path):
    """QA: three boards named rpi4 said so twice, and `name = "../x"` became "x" without a word
    (then "two entries are named 'x'", a name nobody wrote, beside a model named x)."""
    from edge_remat.fleet.manifest import ManifestError, load_manifest
    manifest = small_fleet(tmp_path, ["97%"])
    text = manifest.read_text()
    board = text[text.index("[[boards]]"):]
    manifest.write_text(text + board + board + '[[models]]\ngraph = "tiny.json"\nname = "../x"\n'
                        '[[models]]\ngraph = "tiny.json"\nname = "x"\n')
    with pytest.raises(ManifestError) as caught:
        load_manifest(manifest)
    said = str(caught.value)
    assert said.count("two entries are named 'rpi4'") == 1, said
    assert "models[1].name: expected letters, digits, '.', '_' and '-' only (it names the " \
        "entry's folder of results), got '../x'" in said
    assert "named 'x'" not in said


def test_a_bad_graph_file_is_refused_before_any_graph_is_copied(tmp_path):
    """QA: a truncated second graph file was refused (exit 2), but the first one's copy was
    left in OUT."""
    tiny_graph(tmp_path)
    (tmp_path / "cut.json").write_text((tmp_path / "tiny.json").read_text()[:200])
    manifest = tmp_path / "fleet.toml"
    manifest.write_text(f"""
budgets = ["97%"]
[[models]]
graph = "tiny.json"
name = "whole"
[[models]]
graph = "cut.json"
name = "cut"
[[boards]]
profile = "{REPO / 'profiles' / 'rpi4.json'}"
name = "rpi4"
""")
    out = tmp_path / "out"
    refused(cli("fleet", "plan", manifest, "--out", out, "--no-ray"), BAD_INPUT,
            "models[1].graph: ", "cut.json", "valid JSON")
    assert not (out / "whole").exists()


def test_a_graph_field_naming_no_graph_file_is_said_with_the_field(tmp_path):
    """QA: a manifest whose `graph =` named a plan file was refused naming the file alone
    ('p.json: field 'format': expected ...'), where every other mistake names the manifest's
    field (`fleet.toml: models[0]...`); it is now said with the manifest's other mistakes."""
    manifest = small_fleet(tmp_path, ["97%"])
    assert cli("plan", "--graph", tmp_path / "tiny.json", "--budget", "97%", "--solver",
               "heuristic:split", "-o", tmp_path / "p.json").returncode == 0
    manifest.write_text(manifest.read_text().replace('graph = "tiny.json"', 'graph = "p.json"')
                        .replace("[plan]", 'colour = "blue"\n[plan]'))
    proc = cli("fleet", "plan", manifest, "--out", tmp_path / "out", "--no-ray")
    assert proc.returncode == BAD_INPUT and "Traceback" not in proc.stderr, proc.stderr
    colour, graph = proc.stderr.splitlines()  # every mistake at once
    assert colour.startswith(f"error: {manifest}: colour: no such field")
    assert graph == (f"error: {manifest}: models[0].graph: {tmp_path / 'p.json'}: field "
                     "'format': expected 'edge-remat/graph', 'poet-benchmark-problem/1', or a "
                     "networkx node-link graph (with 'nodes' and 'links'), got "
                     "'edge-remat/plan'")
    assert not (tmp_path / "out").exists()
