"""The way back after `run --keep-running` was stopped (SIGTERM, as Ctrl-C) while its job
trained on a real SSH board: `job-status ID --device B --wait --out OUT/board` completes OUT
as the uninterrupted run would have: report.json with the documented keys from the board's
result and what the host kept in OUT (plan.json, the profile), report.txt, the weights moved
to OUT/weights.pt, the plots. QA: report.json said "status": "finished", "steps_done": 6 but
"steps": null, and grad_check, predicted_*, recomputed, page_ins, plots and profile were
missing (the board's report had grad_check); weights.pt stayed in OUT/board."""

from __future__ import annotations

import json
import re
import signal
import subprocess
from pathlib import Path

import pytest

from helpers.bad_inputs import COMMAND, INTERRUPTED, cli, env, wait_for_line
from helpers.board_fixtures import loopback_ssh_board, needs_sshd

pytestmark = [pytest.mark.slow, pytest.mark.loopback, needs_sshd]

PROFILE = str(Path(__file__).resolve().parents[1] / "profiles" / "this-machine.json")
STEPS = 40  # mlp's steps take ms: enough that the SIGTERM finds the job training


def test_the_way_back_completes_the_report_as_the_uninterrupted_run(tmp_path):
    out = tmp_path / "r_kr"
    with loopback_ssh_board(tmp_path) as (config, sshd, workdir):
        environ = env(XDG_CACHE_HOME=str(tmp_path / "cache"))
        proc = subprocess.Popen([*COMMAND, "run", "--device", str(config), "--model", "mlp",
                                 "--budget", "100%", "--steps", str(STEPS), "--time-limit", "2",
                                 "--profile", PROFILE, "--keep-running", "--out", str(out)],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=environ)
        seen = wait_for_line(proc, f"/{STEPS}:", timeout=180)  # a step done: it trains
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        said = "".join(seen) + err
        assert proc.returncode == INTERRUPTED, said
        job_id = re.search(r"job (\S+) keeps running", said).group(1)
        stopped = json.loads((out / "report.json").read_text())
        assert stopped["status"] == "interrupted", stopped

        back = cli("job-status", job_id, "--device", config, "--wait", "--out", out / "board",
                   environ=environ, timeout=180)
    assert back.returncode == 0, back.stderr
    assert f"{out / 'report.json'} now says how job {job_id} ended: finished" in back.stderr
    report = json.loads((out / "report.json").read_text())
    assert report["status"] == "finished" and report["steps"] == STEPS, report
    assert report["steps_done"] == STEPS and len(report["loss"]) == STEPS, report
    # the keys docs/running.md lists, as the uninterrupted run writes them
    for key in ("killed_at_step", "stopped_at_step", "step_time_s", "measured_peak_bytes",
                "tensor_peak_bytes", "kernel_peak_bytes", "read_ahead_bytes",
                "predicted_peak_bytes", "predicted_time_s", "energy_j", "grad_check",
                "recomputed", "page_ins", "page_outs", "nonfinite_loss", "lr_history",
                "profile", "plots"):
        assert key in report, key
    assert report["grad_check"]["bitwise_equal"] is True, report["grad_check"]
    assert report["predicted_peak_bytes"] > 0 and report["predicted_time_s"] > 0, report
    assert report["profile"]["path"] == PROFILE, report["profile"]
    assert report["plan"] == str(out / "plan.json") and report["budget_bytes"] > 0, report
    assert sorted(Path(p).name for p in report["plots"]) == ["memory.png", "schedule.png"]
    assert all(Path(p).is_file() for p in report["plots"]), report["plots"]
    # the weights where the run puts them
    assert report["weights"]["file"] == str(out / "weights.pt"), report["weights"]
    assert (out / "weights.pt").is_file() and not (out / "board" / "weights.pt").exists()
    # the stop's words are kept, and the table is the report's
    assert report["interrupted"].startswith("interrupted"), report
    assert report["message"] == ("the run was interrupted and its job kept running, and the "
                                 "job then ended on the board: finished"), report["message"]
    text = (out / "report.txt").read_text()
    assert text.startswith("planned run of mlp on loopback: the run was interrupted"), text
    assert f"{STEPS:>4}  " in text, text
