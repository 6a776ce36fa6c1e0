"""The user's files named by `run --model FILE.py:FN` and `--data FILE.py:FN` (or a module of
the current folder) on a board over SSH, which gets them with the job (pushed_files.py):

- relative paths and modules of the current folder are the host's files, named by their
  absolute paths and pushed (QA: a relative `--model my_model.py:make_model` was refused,
  "give the absolute path the file has on the board"; `--data mydata:batches` planned, was
  sent, and failed there: "cannot import mydata");
- the host checks the data it sends before any work, as for a local board: its function is
  imported (QA: `--data bad_data.py:nofn` captured, profiled, planned and sent, then failed
  on the board), its first batch drawn against the model after the capture;
- a data function that raises before its first batch is bad input on the board (exit 2,
  the host's words for a local board), not a failed job (exit 1, "RuntimeError: data boom"):
  the host leaves that error to the board, whose data only it may have.

A real sshd on loopback (helpers.board_fixtures); the refusals before any work need none."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import BAD_INPUT, REPO, cli, no_new_files, refused, tree
from helpers.board_fixtures import loopback_ssh_board, needs_sshd

PROFILE = REPO / "profiles" / "this-machine.json"  # given: no profiling on the board
MODEL_FILE = REPO / "examples" / "my_model.py"
DATA = """
import torch

def batches(batch, seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        yield (torch.randn(batch, 3, 8, 8, generator=g), torch.randint(0, 10, (batch,), generator=g))
"""
BOOM = "def batches(batch, seed):\n    raise RuntimeError('data boom')\n"
SHORT = "import torch\n\ndef batches(batch, seed):\n    while True:\n        yield (torch.zeros(batch, 4),)\n"


def _far_board(folder):
    """A board over SSH with a disk of its own; nothing here gets as far as connecting."""
    path = folder / "far-board.toml"
    path.write_text('name = "far-board"\n[connection]\nkind = "ssh"\nhost = "192.0.2.1"\n'
                    "connect_timeout_s = 2\nreconnect_timeout_s = 2\n")
    return path


def _user_folder(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    (code / "my_model.py").write_text(MODEL_FILE.read_text())
    for name, body in (("mydata.py", DATA), ("boom.py", BOOM), ("short.py", SHORT)):
        (code / name).write_text(body)
    return code


def _kind(job_id: str) -> str:
    return job_id.rsplit("-", 3)[0]  # run-20261207-130409-3838b9 -> run


def _run(device, code, *args, model=None, timeout=60):
    """A planned run of the user's model, given by its absolute path unless `model`."""
    model = model or f"{code}/my_model.py:make_model"
    return cli("run", "--device", device, "--model", model, "--batch", 2,
               "--image", 8, "--budget", "90%", "--steps", 1, "--profile", PROFILE,
               "--time-limit", 5, "--no-plots", *args, cwd=code, timeout=timeout)


@pytest.mark.parametrize("spec, words", [
    ("ABS/mydata.py:nofn", ["no function named 'nofn'"]),
    ("mydata.py:nofn", ["no function named 'nofn'"]),
    ("mydata:nofn", ["no function named 'nofn'"]),
    ("ABS/gone.py:batches", None),  # a path only the board may have: the board's to check
])
def test_data_the_host_sends_is_checked_before_any_work(tmp_path, spec, words):
    code = _user_folder(tmp_path)
    spec = spec.replace("ABS", str(code))
    before = tree(code)
    proc = _run(_far_board(tmp_path), code, "--data", spec)
    if words is None:  # got as far as the board, which does not answer
        assert proc.returncode == 3, proc.stderr
        return
    refused(proc, BAD_INPUT, spec, *words)
    assert "capturing" not in proc.stderr and "far-board" not in proc.stderr, proc.stderr
    no_new_files(before, code, allowed={"__pycache__"})


def test_a_module_or_relative_file_for_an_ssh_board_is_named_by_its_file_here(tmp_path,
                                                                             monkeypatch):
    from edge_remat.devices import find_device
    from edge_remat.run.options import RunOptions, for_board
    code = _user_folder(tmp_path)
    monkeypatch.chdir(code)
    far = find_device(str(_far_board(tmp_path)))
    for model, data in (("my_model.py:make_model", "mydata.py:batches"),
                        ("my_model:make_model", "mydata:batches"),
                        (f"{code}/my_model.py:make_model", f"{code}/mydata.py:batches")):
        opts = for_board(RunOptions(device="far-board", model=model, data=data), far)
        assert (opts.model, opts.data) == (f"{code}/my_model.py:make_model",
                                           f"{code}/mydata.py:batches")
    kept = for_board(RunOptions(device="far-board", model="mlp", data="json:loads"), far)
    assert (kept.model, kept.data) == ("mlp", "json:loads")  # no file of this folder


@pytest.mark.loopback
@needs_sshd
def test_relative_files_and_modules_train_over_ssh_from_the_pushed_files(tmp_path):
    """A planned run and a plain one, each given its model as a relative file and its data as
    a module of the current folder: trained; the job names both by absolute path and got
    both files with it."""
    code = _user_folder(tmp_path)
    with loopback_ssh_board(tmp_path) as (config, _, workdir):
        proc = _run(config, code, "--data", "mydata:batches", "--out", tmp_path / "out",
                    model="my_model.py:make_model", timeout=300)
        assert proc.returncode == 0, proc.stderr
        plain = cli("run", "--device", config, "--model", "my_model:make_model", "--batch", 2,
                    "--image", 8, "--plain", "--steps", 1, "--data", "mydata.py:batches",
                    "--out", tmp_path / "plain", cwd=code, timeout=300)
        assert plain.returncode == 0, plain.stderr
        jobs = {_kind(path.parent.name): json.loads(path.read_text())
                for path in (workdir / "jobs").glob("*/job.json")}
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["data"] == f"{code}/mydata.py:batches", report.get("data")
    for kind in ("run", "train-plain"):
        params = jobs[kind]["params"]
        assert params["data"] == f"{code}/mydata.py:batches", params
        assert set(params["pushed_copies"]) == {f"{code}/my_model.py", f"{code}/mydata.py"}, \
            params
        for host_path, copy in params["pushed_copies"].items():
            assert (workdir / copy).read_text() == (code / host_path.split("/")[-1]).read_text()
    assert jobs["train-plain"]["params"]["model"] == f"{code}/my_model.py:make_model"


@pytest.mark.loopback
@needs_sshd
def test_data_that_cannot_feed_the_model_over_ssh_is_bad_input(tmp_path):
    """Its batch of the wrong shape: refused on the host after the capture, before the plan
    (nothing sent). Its function raising: the board's job refuses it (exit 2) in the words
    the host says it for a local board, planned run and plain alike."""
    code = _user_folder(tmp_path)
    with loopback_ssh_board(tmp_path) as (config, _, workdir):
        short = _run(config, code, "--data", "short:batches", "--out", tmp_path / "short",
                     timeout=300)
        boom = _run(config, code, "--data", "boom.py:batches", "--out", tmp_path / "boom",
                    timeout=300)
        plain = cli("run", "--device", config, "--model", f"{code}/my_model.py:make_model",
                    "--batch", 2, "--image", 8, "--plain", "--steps", 1, "--data", "boom.py:batches",
                    "--out", tmp_path / "plain", cwd=code, timeout=300)
        sent = sorted(_kind(path.name) for path in (workdir / "jobs").iterdir())
    refused(short, BAD_INPUT, f"--data {code}/short.py:batches cannot feed this model",
            "gives 1 arguments; the model takes 2")
    assert "planning" not in short.stderr and not (tmp_path / "short").exists()
    for proc in (boom, plain):
        assert proc.returncode == BAD_INPUT, proc.stderr
        last = proc.stderr.strip().splitlines()[-1]
        assert last.endswith(f"data '{code}/boom.py:batches' failed on its first batch: "
                             "RuntimeError: data boom"), last
        assert "Traceback" not in proc.stderr and "DataFunctionFailed" not in last
    assert sent == ["run", "train-plain"], sent  # none for the short batch
