"""The host's capture handed to a board whose own trace of the graph would be the same
(edge_remat_agent.capture.handed, host run/handed.py): the key the host makes is the one the
board keeps its own trace under, and none where the board runs another torch, Python, machine
or agent build, or the key cannot see the model's code; the board keeps a handed answer only
under its own key; the host's program is the one a board's child traces, for the captures a
run makes (dtypes, LoRA, accumulation, clipping, parameters on flash, operator level); and a
run on a local board reads the host's trace back, its gradients still eager PyTorch's."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import platform
from pathlib import Path

import pytest
import torch

from edge_remat.run.handed import HandedCapture
from edge_remat_agent.capture import isolated, kept
from edge_remat_agent.capture.handed import HANDED_LINE, TRACED, TRACED_KEY, keep_handed
from edge_remat_agent.capture.pipeline import capture_model
from edge_remat_agent.capture.program import program_of
from edge_remat_agent.daemon.identity import code_digest
from edge_remat_agent.daemon.sysinfo import torch_version
from edge_remat_agent.formats import graph_from_dict


@pytest.fixture(scope="module")
def mlp(tmp_path_factory):
    """mlp's capture and its graph file."""
    captured = capture_model("mlp", batch=4)
    path = tmp_path_factory.mktemp("graph") / "graph.json"
    captured.graph.save(path)
    return captured, path


def this_machine(build: str = "the board's build") -> dict:
    """What a board of this machine's torch, Python and machine says in its hello."""
    return {"build": build, "torch": torch_version(), "python": platform.python_version(),
            "machine": platform.machine()}


def test_the_key_is_the_one_the_board_keeps_its_own_trace_under(mlp):
    captured, path = mlp
    handed = HandedCapture(captured, path)
    text = path.read_text()
    assert handed._key_for(this_machine("b" * 64), text) == kept.capture_key(text, False, "b" * 64)
    # a board running this very code keys it as this process does
    assert handed._key_for(this_machine(code_digest()), text) == kept.capture_key(text, False)
    for other in ({"torch": "2.0.0"}, {"python": "3.9.1"}, {"machine": "aarch64"},
                  {"build": ""}):
        assert handed._key_for({**this_machine(), **other}, text) is None, other
    with_file = dataclasses.replace(captured, graph=graph_from_dict(
        {**captured.graph.to_dict(), "capture": {**captured.graph.capture, "source": {
            **captured.graph.capture["source"], "model": "/tmp/my_model.py:build"}}}))
    assert HandedCapture(with_file, path)._key_for(this_machine(), text) is None


class Read:
    """A job's params as the job reads them (registry.JobParams): the pushed answer's path."""

    def __init__(self, answer: Path, key):
        self.params, self._answer = {TRACED: "inputs/traced.pickle", TRACED_KEY: key}, answer

    def input_path(self, name):
        return self._answer if name == TRACED else None


def test_the_board_keeps_a_handed_answer_only_under_its_own_key(mlp, tmp_path, monkeypatch,
                                                                 capsys):
    captured, path = mlp
    folder = tmp_path / "captures"
    monkeypatch.setenv(kept.FOLDER_VARIABLE, str(folder))
    answer = tmp_path / "traced.pickle"
    answer.write_bytes(b"the host's answer")
    text = path.read_text()
    for wrong in ("0" * 64, None, kept.capture_key(text, True)):  # another build; in RAM
        assert not keep_handed(Read(answer, wrong), path)
    assert not list(folder.glob("*")) and HANDED_LINE not in capsys.readouterr().err
    assert keep_handed(Read(answer, kept.capture_key(text, False)), path)
    assert kept.kept_answer(folder, text, False) == b"the host's answer"
    assert HANDED_LINE in capsys.readouterr().err
    (file,) = folder.glob("*.pickle")
    inode = file.stat().st_ino
    answer.write_bytes(b"handed again")  # one kept already is left as it is
    assert keep_handed(Read(answer, kept.capture_key(text, False)), path)
    assert file.stat().st_ino == inode and kept.kept_answer(folder, text, False) == \
        b"the host's answer"


def same_program(mine, theirs) -> bool:
    """Field by field; the lifted tensor constants by value (== on tensors is elementwise)."""
    for field in dataclasses.fields(mine):
        a, b = getattr(mine, field.name), getattr(theirs, field.name)
        if field.name == "constants":
            if a.keys() != b.keys() or not all(torch.equal(a[k], b[k]) for k in a):
                return False
        elif a != b:
            return False
    return True


@pytest.mark.slow  # eight captures, four of them in a child process
@pytest.mark.parametrize("model, options", [
    ("gpt-tiny-lora", {"dtype": "bf16", "trainable_dtype": "fp32"}),
    ("digits-cnn", {"batch": 8, "accumulate": 2, "clip_grad_norm": 1.0, "optimizer": "adam"}),
    ("gpt-tiny", {"params_home": "flash"}),
    ("mlp", {"operator_level": True}),
], ids=["lora-mixed", "accumulate-clip-adam", "flash", "operator-level"])
def test_the_hosts_program_is_the_one_the_boards_child_traces(model, options, monkeypatch):
    monkeypatch.delenv(kept.FOLDER_VARIABLE, raising=False)  # the child traces: nothing kept
    capture_model("mlp", batch=2)  # a capture before, as run's second capture has one
    captured = capture_model(model, **options)
    text = json.dumps(captured.graph.to_dict())
    import pickle
    answer = pickle.loads(isolated.trace_in_child(text, captured.graph.name))
    assert same_program(program_of(captured.trace), answer["program"])
    assert answer["graph"]["nodes"] == captured.graph.to_dict()["nodes"]


@pytest.mark.loopback
def test_a_run_on_a_local_board_reads_the_hosts_trace_back(tmp_path):
    from helpers.board_fixtures import local_board
    from helpers.local_runs import run_report
    with local_board(tmp_path, "bench"):
        report = run_report("--device", "bench", "--model", "mlp", "--steps", 2,
                            "--budget", "95%", "--time-limit", 5, "--out", tmp_path / "out")
    assert report["grad_check"]["bitwise_equal"] and len(report["loss"]) == 2
    (log,) = (tmp_path / "board" / "jobs").glob("run-*/log.txt")
    assert HANDED_LINE in log.read_text()
    (handed,) = (tmp_path / "board" / "inputs").glob("*-traced.pickle")
    (answer,) = (tmp_path / "board" / "captures").glob("*.pickle")
    host_bytes = handed.read_bytes()
    assert answer.read_bytes() == hashlib.sha256(host_bytes).digest() + host_bytes
