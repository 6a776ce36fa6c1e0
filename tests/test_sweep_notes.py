"""`plan --sweep` says each budget's explanation once: before, every budget without a plan
repeated the same long 'no plan' message under the table (QA: rl60 --sweep 0.5:1.0:0.1, two
identical paragraphs but for their figures)."""

from __future__ import annotations

import json

from helpers.bad_inputs import cli

from edge_remat.synthetic import random_layered


def test_budgets_below_the_floor_share_one_explanation(tmp_path):
    graph = tmp_path / "rl60.json"
    random_layered(60, seed=1).save(graph)
    done = cli("plan", "--graph", graph, "--sweep", "0.3:0.8:0.1", "--time-limit", "1",
               "--solver", "heuristic:peak-search")
    assert done.returncode == 0, done.stderr
    notes = done.stdout.splitlines()[-4:]
    # 0.30 and 0.40 are below the floor (24350 bytes): the explanation once, then 0.40 named
    assert done.stdout.count("needs its 6 inputs in RAM at once") == 1
    assert notes[0].startswith("0.30: budget 15588 bytes is too small")
    assert "0.40: the same as 0.30, with its own figures (--json has each budget's message)" \
        in notes
    assert not any(line.startswith("0.40: budget") for line in notes)


def test_json_rows_keep_each_budgets_own_message(tmp_path):
    graph = tmp_path / "rl60.json"
    random_layered(60, seed=1).save(graph)
    done = cli("plan", "--graph", graph, "--sweep", "0.3:0.8:0.1", "--time-limit", "1",
               "--solver", "heuristic:peak-search", "--json")
    rows = {row["fraction"]: row for row in json.loads(done.stdout)["sweep"]}
    assert "15588 bytes" in rows[0.3]["message"] and "20784 bytes" in rows[0.4]["message"]


def test_the_table_columns_stay_aligned_with_a_long_solver_name(tmp_path):
    """QA: `heuristic:keep-all` (18 characters) pushed its row's last column out of line with
    the header's (the solver column was 16 wide)."""
    graph = tmp_path / "rl60.json"
    random_layered(60, seed=1).save(graph)
    done = cli("plan", "--graph", graph, "--sweep", "0.9:1.1:0.1", "--time-limit", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = next(line for line in lines if line.lstrip().startswith("budget"))
    rows = [line for line in lines if line[:7].strip().replace(".", "").isdigit()]
    assert any("heuristic:keep-all" in row for row in rows), done.stdout
    assert rows and all(len(row) == len(header) for row in rows), done.stdout
