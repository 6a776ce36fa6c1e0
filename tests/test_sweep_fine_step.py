"""`plan --sweep` with a step finer than 0.01 keeps every budget apart: its labels, plan files
and sweep.json rows carry the decimals that tell them apart. QA: `--sweep 0.5:0.52:0.005 -o
DIR` showed 0.51 and 0.52 twice, said "5 plans of 5 budgets written", and wrote three files:
the 0.505 and 0.515 plans were overwritten by the next budget's, and sweep.json pointed two
rows at one file."""

from __future__ import annotations

import json

from helpers.bad_inputs import cli, tiny_graph


def test_a_fine_sweep_writes_one_plan_file_per_budget(tmp_path):
    graph, out = tiny_graph(tmp_path), tmp_path / "sw"
    done = cli("plan", "--graph", graph, "--sweep", "0.9:0.92:0.005", "-o", out,
               "--time-limit", "1")
    assert done.returncode == 0, done.stderr
    labels = ["0.900", "0.905", "0.910", "0.915", "0.920"]
    assert sorted(p.name for p in out.iterdir()) == \
        [f"plan-{label}.json" for label in labels] + ["sweep.json"]
    rows = json.loads((out / "sweep.json").read_text())["sweep"]
    assert [row["label"] for row in rows] == labels
    assert [row["plan"] for row in rows] == [str(out / f"plan-{x}.json") for x in labels]
    for row in rows:  # each file is its own budget's plan
        plan = json.loads((out / f"plan-{row['label']}.json").read_text())
        assert plan["budget_bytes"] == row["budget_bytes"]
    table = [line.split()[0] for line in done.stdout.splitlines()
             if line.strip().startswith("0.")]
    assert table == labels, done.stdout
    assert "5 plans of 5 budgets written to" in done.stdout


def test_two_decimals_where_they_tell_the_budgets_apart():
    from edge_remat.sweep import fraction_labels
    assert list(fraction_labels([0.3, 0.4, 1.0]).values()) == ["0.30", "0.40", "1.00"]
    assert list(fraction_labels([0.5, 0.5000001]).values()) == ["0.5000000", "0.5000001"]
    # as each is, not only apart: 0.505 beside 0.5 alone was "0.51"
    assert list(fraction_labels([0.5, 0.505]).values()) == ["0.500", "0.505"]


def test_a_step_finer_than_the_rounding_gives_each_budget_once():
    from edge_remat.sweep import parse_sweep
    assert parse_sweep("0.5:0.5000000001:1e-12") == [0.5, 0.5000000001]
