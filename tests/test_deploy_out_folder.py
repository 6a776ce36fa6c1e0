"""What `deploy` does with what its --out already holds, as `run` does with an earlier run's
outputs: an earlier deploy's files are replaced and said so (a warning line naming them), and
those this deploy does not write again are said to be kept; a `run` folder is refused (its
report.json beside a deploy's run_report.json and weights.pt would mix two trainings);
--resume OUT goes on in OUT without a word about it. Real CLI, real local board."""

from __future__ import annotations

import signal
import subprocess

import pytest

from helpers.bad_inputs import BAD_INPUT, COMMAND, INTERRUPTED, cli, env, refused, tree
from test_deploy_json_jobs import digits  # noqa: F401 - fixture: a digits-cnn graph and plan

pytestmark = [pytest.mark.slow, pytest.mark.loopback]


def _deploy(digits, out, *extra):
    graph, plan = digits
    return cli("deploy", plan, "--device", "bench", "--graph", graph, "--steps", "1", "--out",
               out, *extra, timeout=300)


def test_a_deploy_over_an_earlier_one_says_what_it_replaces_and_keeps(tmp_path, bench,
                                                                      digits):
    """QA: a second deploy into the same --out wrote over the first's weights.pt and
    run_report.json in silence."""
    out = tmp_path / "out"
    first = _deploy(digits, out)
    assert first.returncode == 0 and "warning:" not in first.stderr, first.stderr
    weights = (out / "weights.pt").read_bytes()
    second = _deploy(digits, out, "--save", "none")
    assert second.returncode == 0, second.stderr
    assert f"warning: --out {out} holds an earlier deploy's run_report.json, weights.pt: " \
           "this deploy writes over them" in second.stderr, second.stderr
    assert f"note: weights.pt in {out} is an earlier deploy's, kept: this deploy did not " \
           "write it again" in second.stderr, second.stderr
    assert (out / "weights.pt").read_bytes() == weights


def test_a_deploy_into_a_run_folder_is_refused(tmp_path, bench, digits):
    """A real `run` folder: one the run's Ctrl-C left as it captured (report.json says
    interrupted), the quickest to make."""
    out = tmp_path / "run"
    ran = subprocess.Popen([*COMMAND, "run", "--device", "bench", "--model", "mlp", "--budget",
                            "0.9", "--steps", "2", "--out", str(out)], stderr=subprocess.PIPE,
                           stdout=subprocess.DEVNULL, text=True, env=env())
    for line in ran.stderr:
        if "capturing" in line:
            ran.send_signal(signal.SIGINT)
            break
    ran.communicate(timeout=120)
    assert ran.returncode == INTERRUPTED and (out / "report.json").is_file()
    before = tree(out)
    refused(_deploy(digits, out), BAD_INPUT, "outputs of `edge-remat run`", "report.json",
            "give another --out")
    assert tree(out) == before


def test_resume_goes_on_in_its_folder_without_a_warning(tmp_path, bench, digits):
    out = tmp_path / "out"
    graph, plan = digits
    first = cli("deploy", plan, "--device", "bench", "--graph", graph, "--steps", "2",
                "--checkpoint-every", "1", "--out", out, timeout=300)
    assert first.returncode == 0, first.stderr
    resumed = cli("deploy", plan, "--device", "bench", "--graph", graph, "--steps", "3",
                  "--checkpoint-every", "1", "--resume", out, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "earlier deploy" not in resumed.stderr, resumed.stderr
