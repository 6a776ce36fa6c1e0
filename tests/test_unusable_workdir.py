"""A local board whose workdir cannot be made: `devices --check` and `deploy` say it in one
line, the same words, exit 3 (the board cannot be used as configured; an SSH board's workdir
is said so too). QA, workdir = "/proc/xwd": `devices CFG --check` printed "x: [Errno 2] No
such file or directory: '/proc/xwd'" (raw errno, no remedy, exit 3), deploy "/proc/xwd: No
such file or directory (check the path and its permissions)" (exit 2)."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import UNREACHABLE, cli, refused, tiny_graph, tiny_plan

CAPTURED = {"source": {"model": "mlp"}}  # a graph deploy takes as far as reaching the board


@pytest.mark.parametrize("workdir, why", [
    ("/proc/edge-remat-xwd", "No such file or directory"),  # procfs makes no folder
    ("{tmp}/a-file/wd", "Not a directory"),
], ids=["under /proc", "under a file"])
def test_devices_check_and_deploy_say_one_line_exit_3(tmp_path, workdir, why):
    (tmp_path / "a-file").write_text("not a folder\n")
    workdir = workdir.format(tmp=tmp_path)
    config = tmp_path / "x.toml"
    config.write_text(f'name = "x"\n[connection]\nkind = "local"\nworkdir = "{workdir}"\n'
                      f'[hardware]\npage_dir = "{tmp_path}/pages"\nsensor = "none"\n')
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    plan = tiny_plan(tmp_path, graph)
    words = f"x (this machine) cannot use its workdir {workdir} ({why}): set workdir in " \
            f"[connection] of {config} to a folder you can create and write"

    deploy = cli("deploy", plan, "--device", config, "--graph", graph, "--out",
                 tmp_path / "out")
    assert refused(deploy, UNREACHABLE) == f"error: {words}", deploy.stderr
    assert not (tmp_path / "out").exists()

    check = cli("devices", config, "--check")
    assert check.returncode == UNREACHABLE, check.stderr
    # the line begins with the board, once (it was "x: x (this machine) cannot use ...")
    assert f"\n{words}\n" in check.stdout + check.stderr, (check.stdout, check.stderr)
    assert "[Errno" not in check.stdout + check.stderr

    as_json = cli("devices", config, "--check", "--json")
    assert as_json.returncode == UNREACHABLE, as_json.stderr
    row = json.loads(as_json.stdout)["devices"][0]
    assert row["check"] == {"ok": False, "error": words}, row
