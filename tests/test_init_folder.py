"""`--init` given a folder (a run's --out, say) is said to be a folder, and what it expects:
the weights file a run saved there. QA: `edge-remat run --init adir` said "--init adir: no
such file" of a folder that was there."""

from __future__ import annotations

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph, tiny_plan

CAPTURED = {"source": {"model": "mlp"}}


@pytest.mark.parametrize("holds_weights", [False, True], ids=["empty folder", "a run's out"])
@pytest.mark.parametrize("command", ["run", "deploy"])
def test_init_given_a_folder_says_so_and_names_the_file_it_wants(tmp_path, command,
                                                                 holds_weights):
    folder = tmp_path / "adir"
    folder.mkdir()
    if holds_weights:
        (folder / "weights.pt").write_bytes(b"")
    if command == "run":
        args = ["run", "--device", "local", "--model", "mlp", "--budget", "120%", "--steps",
                "1"]
    else:
        graph = tiny_graph(tmp_path, capture=CAPTURED)
        args = ["deploy", tiny_plan(tmp_path, graph), "--device", "local", "--graph", graph]
    line = refused(cli(*args, "--init", "adir", "--out", tmp_path / "out", cwd=tmp_path),
                   BAD_INPUT)
    wanted = "adir/weights.pt" if holds_weights else "OUT/weights.pt"
    assert line == f"error: --init adir is a folder: give the weights file a run saved in its " \
                   f"--out, {wanted}", line
    assert not (tmp_path / "out").exists()
