"""benchmarks/first_calls.py: the first step's warm-up taken apart by ATen call and by node,
on a real graph file, node by node and plain; bad input is one line, exit 2."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "first_calls.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory) -> Path:
    from edge_remat_agent.capture import capture_model
    path = tmp_path_factory.mktemp("first_calls") / "graph.json"
    capture_model("llama-tiny-lora", seq=16).graph.save(path)
    return path


@pytest.mark.slow  # two fresh processes, each capturing the graph again (~20 s together)
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssAnon is Linux's")
def test_it_takes_the_first_step_apart_by_call_and_by_node(graph_file):
    done = _run(str(graph_file), "--top", "3", "--steps", "2")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert re.fullmatch(r"step 1: left \d+\.\d\d MiB beyond the optimizer state it made",
                        lines[0])
    assert lines[1].startswith("  by op: aten.")
    calls = [line for line in lines if re.match(r" +-?\d+\.\d\d MiB  aten\.", line)]
    assert 1 <= len(calls) <= 3
    by_node = lines.index("  by node (the profile's persistent_bytes):")
    assert 1 <= len(lines[by_node + 1:-1]) <= 3  # the graph's nodes by name
    assert re.fullmatch(r"step 2: left \d+\.\d\d MiB", lines[-1])


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RssAnon is Linux's")
def test_eager_runs_the_same_model_in_plain_pytorch(graph_file):
    done = _run(str(graph_file), "--eager", "--top", "2", "--steps", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("step 1: left ")
    assert "by node" not in done.stdout  # plain PyTorch has no nodes


def test_a_missing_graph_file_is_one_line_and_exit_2(tmp_path):
    for extra in ([], ["--eager"]):
        done = _run(str(tmp_path / "none.json"), *extra)
        assert done.returncode == 2
        assert done.stderr.startswith("error: ") and len(done.stderr.splitlines()) == 1
        assert "Traceback" not in done.stderr
