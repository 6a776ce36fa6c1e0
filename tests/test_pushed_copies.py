"""The user's own files travel with a job to a board that does not share the host's files.

A graph names its model by the path of the model's file on the host (`my_model.py:make`,
made absolute); the board captures the model again from that spec. An SSH board elsewhere
(a Jetson, the emulated arm64 board) has no file at that path: its run failed with "no such
file" unless the user copied the file to the same path by hand. The host now pushes the
files a job's specs name (a model's or data's Python file, an hf: spec's config and adapter
files) to any board that is not this machine, and the board reads each from its copy where
the path is not there.

Here the board is the local machine: the model file is moved away after the capture, so the
path the graph names is not on the board, as on a board elsewhere; the job gets the copy the
way the host passes it (param `pushed_copies`), through a real daemon and a real run. The
host's side over SSH is in test_pushed_copies_ssh (a real sshd on loopback), and a board
that truly lacks the file in test_arm_board.py."""

from __future__ import annotations

import json
import shutil

import pytest

from edge_remat.devices import find_device
from edge_remat.transport import Board
from edge_remat.transport.errors import JobFailed
from edge_remat.transport.pushed_files import user_files
from helpers.bad_inputs import cli
from helpers.board_fixtures import loopback_ssh_board, needs_sshd
from helpers.user_model_file import MODEL, captured_and_planned

def test_a_board_without_the_model_file_runs_it_from_the_pushed_copy(tmp_path, bench):
    model_file, graph, plan = captured_and_planned(tmp_path)
    assert user_files({}, {"graph": graph}) == [str(model_file)]
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    copy = shutil.move(str(model_file), elsewhere / "tiny_net.py")  # not at the graph's path
    inputs = {"plan": plan, "graph": graph}
    with Board(find_device("bench")) as board:
        with pytest.raises(JobFailed) as failed:  # as on a board elsewhere before
            board.run_job("run", {"steps": 1}, inputs)
        assert f"no such file: {model_file}" in str(failed.value), str(failed.value)
        pushed = board.push_input(copy)
        record = board.run_job("run", {"steps": 2, "pushed_copies": {str(model_file): pushed}},
                               inputs, out_dir=tmp_path / "out")
    assert record["state"] == "finished", record
    report = json.loads((tmp_path / "out" / "run_report.json").read_text())
    assert len(report["steps"]) == 2
    assert report["grad_check"]["bitwise_equal"] is True


@pytest.mark.loopback
@needs_sshd
def test_deploy_over_ssh_pushes_the_model_file_with_the_job(tmp_path):
    """The host's side: a deploy to an SSH board sends the graph's model file and names its
    copy in the job's params (on loopback the board also has the file where the graph says,
    and then reads that one)."""
    model_file, graph, plan = captured_and_planned(tmp_path)
    with loopback_ssh_board(tmp_path) as (config, _, workdir):
        proc = cli("deploy", plan, "--device", config, "--graph", graph, "--steps", 1,
                   "--out", tmp_path / "out", "--json", timeout=300)
        assert proc.returncode == 0, proc.stderr
        job = json.loads(proc.stdout)["job"]
        params = json.loads((workdir / "jobs" / job / "job.json").read_text())["params"]
    pushed = params["pushed_copies"]
    assert list(pushed) == [str(model_file)], params
    assert (workdir / pushed[str(model_file)]).read_text() == MODEL


def test_a_pushed_copies_param_that_is_no_mapping_of_pushed_files_is_bad_input(tmp_path, bench):
    for value, words in (("abc", "give an object of host paths"),
                         ({"/x/m.py": "inputs/missing.py"}, "is no file in the agent's workdir"),
                         ({"/x/m.py": "/etc/passwd"}, "param 'pushed_copies'")):
        with Board(find_device("bench")) as board:
            with pytest.raises(JobFailed) as failed:
                board.run_job("echo", {"pushed_copies": value})
        assert failed.value.record["bad_input"] is True, failed.value.record
        assert words in str(failed.value), str(failed.value)


def test_the_files_a_jobs_specs_name(tmp_path):
    """Files only, by absolute path, once each: a model's and data's Python file, an hf:
    spec's config and adapter files; not a folder, inline JSON, a zoo name or a module name."""
    (tmp_path / "m.py").write_text("")
    (tmp_path / "data.py").write_text("")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "lora.json").write_text("{}")
    (tmp_path / "adapter").mkdir()
    m, data = tmp_path / "m.py", tmp_path / "data.py"
    config, lora = tmp_path / "config.json", tmp_path / "lora.json"
    assert user_files({"model": f"{m}:make", "data": f"{data}:batches"}, {}) == [str(m),
                                                                                 str(data)]
    assert user_files({"model": f"hf:gpt2?config={config}&adapter={lora}"}, {}) == \
        [str(config), str(lora)]
    assert user_files({"model": f"hf:gpt2?config={{\"n_layer\": 2}}&adapter={tmp_path}/adapter"},
                      {}) == []
    assert user_files({"model": "digits-cnn", "data": "digits"}, {}) == []
    assert user_files({"model": "my_pkg.models:make", "data": f"{m}:make"}, {}) == [str(m)]
    assert user_files({"model": f"{tmp_path}/gone.py:make"}, {}) == []
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps({"capture": {"source": {"model": f"{m}:make"}}}))
    assert user_files({"model": f"{m}:make"}, {"graph": graph}) == [str(m)]
    graph.write_text("not json")  # the board's job refuses it in its own words
    assert user_files({}, {"graph": graph}) == []
