"""A board's torch device: `[hardware] torch_device = "cuda"` sends its run and profile jobs to
its GPU (a Jetson's). No GPU here: the tests check that the config reaches the jobs, and that a
board whose torch has no CUDA refuses the job in one line that says what to do."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.board_fixtures import local_board
from edge_remat.devices import Hardware, load_device, with_torch_device
from edge_remat_agent.devices import unavailable

DATA = Path(__file__).parent / "data"


def test_the_config_names_the_device_and_the_run_and_profile_jobs_get_it(tmp_path):
    path = tmp_path / "orin.toml"
    path.write_text('[connection]\nkind = "local"\n[hardware]\ntorch_device = "cuda"\n')
    gpu = load_device(path).hardware
    assert gpu.torch_device == "cuda" and Hardware().torch_device == "cpu"
    assert with_torch_device("run", {"steps": 3}, gpu) == {"steps": 3, "device": "cuda"}
    assert with_torch_device("profile", {}, gpu) == {"device": "cuda"}
    # jobs without a torch device, a device asked for, and a CPU board: as they were
    assert with_torch_device("train-plain", {"steps": 3}, gpu) == {"steps": 3}
    assert with_torch_device("run", {"device": "cpu"}, gpu) == {"device": "cpu"}
    assert with_torch_device("run", {"steps": 3}, Hardware()) == {"steps": 3}


def test_a_device_torch_cannot_use_is_named_with_the_remedy():
    assert unavailable("cpu") is None
    assert "use cpu or cuda" in unavailable("gpu")
    if not torch.cuda.is_available():
        why = unavailable("cuda")
        assert "cannot use CUDA" in why and 'torch_device = "cpu"' in why


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a board without CUDA")
def test_a_board_configured_for_cuda_without_it_refuses_the_profile_job_in_one_line(tmp_path):
    """Through the CLI and the board's daemon: the job fails before it measures anything,
    the host prints one error line (the board's words) and exits 1."""
    with local_board(tmp_path, "orin-like", torch_device="cuda"):
        proc = subprocess.run([sys.executable, "-m", "edge_remat", "profile", "--device",
                               "orin-like", "--out", str(tmp_path / "profiles")],
                              capture_output=True, text=True, timeout=300)
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert proc.returncode == 1, proc.stderr
    assert len(errors) == 1 and "cannot use CUDA" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    assert not list((tmp_path / "profiles").glob("*.json"))


def test_a_cuda_runs_summary_shows_the_devices_peaks():
    """A real report: the agent's `run --device cuda` of operator-level bert-mini b16 s128
    (parameters and Adam on flash, a 200 MB plan) on an H200, 2026-12-04, before the
    gradient check took the replay as its reference (so it names eager, and differs)."""
    from edge_remat.reports.run_report import build_report, report_text
    from edge_remat_agent.run_command import summary_text
    report = json.loads((DATA / "h200_bert_mini_run.json").read_text())
    text = summary_text(report)
    assert "device       255.66 MiB allocated, 656 MiB reserved at most" in text
    assert "DIFFER from eager PyTorch" in text  # a report without `reference` names eager
    host = report_text(build_report(mode="planned", status="done", device="h200",
                                    model="bert-mini", steps=5, data="example",
                                    result=report))
    assert "device peak   255.66 MiB allocated, 656 MiB reserved at most" in host
    cpu = {**report, "steps": [{**s, "device_peak_bytes": None,
                                "device_reserved_peak_bytes": None} for s in report["steps"]]}
    assert "device " not in summary_text(cpu)


@pytest.mark.slow
def test_plain_training_on_a_board_configured_for_cuda_says_it_runs_on_the_cpu(tmp_path):
    """`run --plain` (the comparison with plain PyTorch) has no device path: on a board whose
    config names its GPU it trains on the CPU, and says so rather than compare silently."""
    with local_board(tmp_path / "bench", "orin-like", torch_device="cuda"):
        proc = subprocess.run([sys.executable, "-m", "edge_remat", "run", "--device",
                               "orin-like", "--model", "mlp", "--steps", "1", "--plain",
                               "--no-plots", "--out", str(tmp_path / "out")],
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if line.startswith("warning:")]
    assert any("plain training runs on orin-like's CPU, not its cuda device" in line
               for line in warnings), proc.stderr
