"""`plan --json` carries the table's figures: the step time's paging part and the energy's
static part with the others, so energy_j is compute + paging + static as the table shows it.
QA: the README says --json "prints the table's figures", but it had no paging_time_s nor
energy_static_j, and its energy_j was not energy_compute_j + energy_paging_j."""

from __future__ import annotations

import json
import math

from helpers.bad_inputs import cli, tiny_graph


def test_plan_json_has_the_tables_time_and_energy_parts(tmp_path):
    graph, profile = tiny_graph(tmp_path), tmp_path / "board.json"
    profile.write_text(json.dumps({  # idle power, so static energy; flash, so paging time
        "format": "edge-remat/profile", "version": 1, "name": "board", "source": "measured",
        "power": {"idle_w": 1.0, "active_w": 2.0},
        "ops": {op: {"time_s": 1.0} for op in ("forward", "loss", "backward")}}))
    args = ("plan", "--graph", graph, "--profile", profile, "--budget", "0.8", "--paging",
            "flash", "--flash-read-bw", "1e8", "--flash-write-bw", "1e8", "--solver",
            "heuristic:paging")
    printed = cli(*args, "--json")
    assert printed.returncode == 0, printed.stderr
    figures = json.loads(printed.stdout)
    assert figures["paging_time_s"] > 0 and figures["energy_static_j"] > 0, figures
    assert math.isclose(figures["energy_j"], figures["energy_compute_j"]
                        + figures["energy_paging_j"] + figures["energy_static_j"])
    assert figures["paging_hidden_share"] == 0.5
    assert figures["home_io_time_s"] == 0 and figures["home_io_energy_j"] == 0
    table = cli(*args)
    assert table.returncode == 0, table.stderr
    assert f"paging {figures['paging_time_s']:g} s" in table.stdout, table.stdout
    assert f"static {figures['energy_static_j']:g})" in table.stdout, table.stdout
