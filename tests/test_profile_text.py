"""`profile` without --json prints readable lines, as the other commands' tables do; --json
keeps the one JSON object. Real CLI, real local board (a quick profile: tiny idle and busy
windows, two flash sizes, no footprint)."""

from __future__ import annotations

import json

import pytest

from helpers.bad_inputs import cli

pytestmark = [pytest.mark.slow, pytest.mark.loopback]

QUICK = ["idle_s=0.1", "busy_s=0.1", "sizes=4KiB,8KiB", "no_footprint=true", "share_s=0"]


def test_profile_prints_lines_not_a_json_dict(tmp_path, bench):
    """QA: `profile` printed the job's raw JSON dict as its normal output."""
    params = [a for p in QUICK for a in ("--param", p)]
    proc = cli("profile", "--device", "bench", *params, "--out", tmp_path / "p", timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "{" not in proc.stdout and "\"" not in proc.stdout, proc.stdout
    labels = [line.split()[0] for line in proc.stdout.splitlines() if line.strip()]
    for label in ("profile", "operators", "tiers", "power", "fetched"):
        assert label in labels, proc.stdout
    assert f"fetched {tmp_path / 'p' / 'profile.json'}" in proc.stdout
    as_json = cli("profile", "--device", "bench", *params, "--out", tmp_path / "q", "--json",
                  timeout=300)
    assert as_json.returncode == 0, as_json.stderr
    answer = json.loads(as_json.stdout)
    assert answer["status"] == "finished" and answer["result"]["source"] == "measured", answer


def test_a_finished_profile_is_listed_done_not_at_0_percent(tmp_path, bench):
    """QA: `profile` without --graph ended "finished 0% compute: ...", and job-status listed
    it so: its phases had reported 0 of the whole, the last of them after the end."""
    params = [a for p in QUICK for a in ("--param", p)]
    proc = cli("profile", "--device", "bench", *params, "--out", tmp_path / "p", timeout=300)
    assert proc.returncode == 0, proc.stderr
    listed = cli("job-status", "--device", "bench")
    assert listed.returncode == 0, listed.stderr
    ours = [line for line in listed.stdout.splitlines() if "profile-" in line]
    assert ours and "finished 100% profile measured" in ours[-1], listed.stdout
