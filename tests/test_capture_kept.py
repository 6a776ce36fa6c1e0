"""Captures kept on the board (capture/kept.py): a job that traces a graph this board has traced
before reads the child's answer back instead of starting the child again; a damaged answer is
traced again; an error is never kept; the key changes with whatever decides the answer, and
is None where the model's code lies outside what it sees; only the newest answers stay."""

from __future__ import annotations

import json
import os
import pickle
import subprocess

import pytest

from edge_remat_agent.capture import isolated, kept
from edge_remat_agent.capture.errors import GraphMismatch
from edge_remat_agent.capture.pipeline import capture_model
from edge_remat_agent.formats import graph_from_dict


@pytest.fixture(scope="module")
def mlp_graph():
    return capture_model("mlp", batch=4).graph


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(kept.FOLDER_VARIABLE, str(tmp_path / "captures"))
    return tmp_path / "captures"


@pytest.fixture
def children(monkeypatch):
    """How many capture children start (each one a real child process)."""
    started = []
    real = subprocess.run

    def counted(*args, **kwargs):
        started.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(isolated.subprocess, "run", counted)
    return started


def test_a_graph_traced_once_is_read_back_without_a_child(mlp_graph, folder, children):
    text = json.dumps(mlp_graph.to_dict(), indent=1)  # a graph file's text
    first = isolated.trace_in_child(text, mlp_graph.name)
    assert len(children) == 1 and len(list(folder.glob("*.pickle"))) == 1
    again = isolated.trace_in_child(json.dumps(mlp_graph.to_dict()), mlp_graph.name)
    assert len(children) == 1, "the same graph, written otherwise, was traced again"
    assert again == first
    captured = isolated.capture_isolated(mlp_graph, traced=again)
    assert captured.graph.fingerprint() == mlp_graph.fingerprint()
    assert [node.name for node in captured.trace.graph_module.graph.nodes] == \
        [node.name for node in isolated.capture_isolated(mlp_graph, traced=first)
         .trace.graph_module.graph.nodes]


def test_a_damaged_answer_is_traced_again_and_kept_anew(mlp_graph, folder, children):
    text = json.dumps(mlp_graph.to_dict())
    first = isolated.trace_in_child(text, mlp_graph.name)
    (path,) = folder.glob("*.pickle")
    damaged = bytearray(path.read_bytes())
    damaged[-10] ^= 0xFF
    path.write_bytes(bytes(damaged))
    assert kept.kept_answer(folder, text, False) is None
    assert not path.exists(), "a damaged answer stays to be read again"
    traced_again = isolated.trace_in_child(text, mlp_graph.name)
    assert len(children) == 2 and kept.kept_answer(folder, text, False) == traced_again
    assert same_answer(traced_again, first)


def same_answer(one: bytes, other: bytes) -> bool:
    """The same graph and program (the bytes may differ: the trace's timing, sets' order)."""
    one, other = pickle.loads(one), pickle.loads(other)
    return (graph_from_dict(one["graph"], "one").fingerprint()
            == graph_from_dict(other["graph"], "other").fingerprint()
            and one["program"].ops == other["program"].ops)


def test_a_capture_that_fails_is_not_kept(mlp_graph, folder, children):
    wrong = mlp_graph.to_dict()
    wrong["nodes"][0]["out_bytes"] += 4  # not what this machine captures: GraphMismatch
    wrong_text = json.dumps(wrong)
    with pytest.raises(GraphMismatch, match="different graph"):
        isolated.capture_isolated(graph_from_dict(wrong, "test"))
    assert not list(folder.glob("*.pickle"))
    assert kept.kept_answer(folder, wrong_text, False) is None


def test_nothing_is_kept_without_a_folder(mlp_graph, monkeypatch, children):
    monkeypatch.delenv(kept.FOLDER_VARIABLE, raising=False)
    assert kept.kept_folder() is None
    assert kept.kept_answer(None, json.dumps(mlp_graph.to_dict()), False) is None
    kept.keep_answer(None, json.dumps(mlp_graph.to_dict()), False, b"answer")  # no error


def graph_text(model: str, **source) -> str:
    return json.dumps({"name": "g", "capture": {"source": {"model": model, **source}}})


def test_the_key_changes_with_what_decides_the_answer(tmp_path):
    base = kept.capture_key(graph_text("mlp", batch=4), False)
    assert base is not None and base == kept.capture_key(graph_text("mlp", batch=4), False)
    assert kept.capture_key(graph_text("mlp", batch=8), False) != base
    assert kept.capture_key(graph_text("mlp", batch=4), True) != base
    timed = json.loads(graph_text("mlp", batch=4))
    timed["capture"].update(trace_s=0.75, capture_s=3.16)  # another capture's times
    assert kept.capture_key(json.dumps(timed), False) == base
    model_file, helper = tmp_path / "mine.py", tmp_path / "layers.py"
    model_file.write_text("def make(): ...\n")
    helper.write_text("WIDTH = 4\n")
    spec = f"{model_file}:make"
    with_file = kept.capture_key(graph_text(spec), False)
    assert with_file is not None
    helper.write_text("WIDTH = 8\n")  # a file beside it, which the model may import
    assert kept.capture_key(graph_text(spec), False) != with_file


@pytest.mark.parametrize("model", ["hf:gpt2?layers=2", "my_pkg.models:make", "mine.py:make",
                                   f"{os.sep}no{os.sep}such{os.sep}file.py:make", None])
def test_no_key_where_the_models_code_is_out_of_sight(model):
    assert kept.capture_key(graph_text(model), False) is None
    assert kept.capture_key("{not json", False) is None


def test_only_the_newest_answers_stay(tmp_path):
    texts = [graph_text("mlp", batch=b) for b in range(kept.KEEP + 3)]
    for when, text in enumerate(texts):
        if when == 4:  # read before three more are kept: it is then recently used
            assert kept.kept_answer(tmp_path, texts[0], False) == b"answer 0"
        kept.keep_answer(tmp_path, text, False, f"answer {when}".encode())
        path = tmp_path / f"{kept.capture_key(text, False)}.pickle"
        os.utime(path, (1000 + when, 1000 + when))
    assert len(list(tmp_path.glob("*.pickle"))) == kept.KEEP
    assert kept.kept_answer(tmp_path, texts[0], False) == b"answer 0"  # read: recently used
    assert kept.kept_answer(tmp_path, texts[-1], False) == f"answer {kept.KEEP + 2}".encode()
    for dropped in texts[1:4]:
        assert kept.kept_answer(tmp_path, dropped, False) is None


@pytest.mark.loopback
def test_a_boards_second_run_of_a_graph_reads_its_capture_back(tmp_path):
    from helpers.board_fixtures import local_board
    from helpers.local_runs import run_report
    seen, reports = [], []
    with local_board(tmp_path, "bench"):
        for _ in range(2):
            reports.append(run_report("--device", "bench", "--model", "mlp", "--steps", 2,
                                      "--budget", "95%", "--time-limit", 5,
                                      "--out", tmp_path / "out"))
            (answer,) = (tmp_path / "board" / "captures").glob("*.pickle")
            seen.append(answer.stat())
    assert seen[1].st_ino == seen[0].st_ino, "the second run traced and kept its graph again"
    assert seen[1].st_mtime_ns > seen[0].st_mtime_ns, "the second run did not read it back"
    assert reports[1]["loss"] == reports[0]["loss"] and len(reports[0]["loss"]) == 2
    assert all(report["grad_check"]["bitwise_equal"] for report in reports)


def test_a_folder_that_cannot_be_written_keeps_nothing_and_leaves_no_partial_file(tmp_path):
    text = graph_text("mlp", batch=4)
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("")
    kept.keep_answer(blocked, text, False, b"answer")  # mkdir fails: nothing kept, no error
    assert kept.kept_answer(blocked, text, False) is None
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / f"{kept.capture_key(text, False)}.pickle").mkdir()  # replace fails
    kept.keep_answer(tmp_path / "full", text, False, b"answer")
    assert [p.name for p in (tmp_path / "full").iterdir()] == \
        [f"{kept.capture_key(text, False)}.pickle"]
