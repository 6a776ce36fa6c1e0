"""A run whose link was lost while it profiled the board (found while fixing the profile's lost
host link, tests/test_profile_host_link_lost.py):
- it gave up and left OUT/report.json naming the profile job; the way back (`job-status ID
  --wait --out OUT/profile`) rewrote it "finished", though the run never planned or trained.
  The report now keeps its status and says how the profile job ended;
- the profile, its host tier lost, was cached, and every later run with --paging host was
  refused until --reprofile. It is not cached now."""

from __future__ import annotations

import json

from pathlib import Path

from edge_remat.run.come_back import settle_lost_report, settled_line
from edge_remat.run.profiles import _cache
from edge_remat_agent.formats.profile import load_profile

SHIPPED_PROFILE = Path(__file__).resolve().parents[1] / "profiles" / "this-machine.json"


def _lost_report(out, job: str) -> None:
    out.mkdir(parents=True)
    (out / "report.json").write_text(json.dumps(
        {"status": "link_lost", "message": "cannot reach bench (gave up reconnecting)",
         "model": "mlp", "device": "bench", "written": [], "job": job}))


def test_a_runs_lost_profile_job_that_finished_leaves_the_run_unfinished(tmp_path):
    out = tmp_path / "run"
    _lost_report(out, "profile-1")
    record = {"id": "profile-1", "kind": "profile", "state": "finished", "result": {}}
    path, was = settle_lost_report(out / "profile", "profile-1", record)
    report = json.loads(path.read_text())
    assert path == out / "report.json" and was == "link_lost"
    assert report["status"] == "link_lost" and report["profile_job_state"] == "finished"
    assert report["message"].endswith("its profile job then ended on the board: finished: the "
                                      "run planned and trained nothing; the same command "
                                      "again starts it")
    assert settled_line(path, was, "profile-1", record) == (
        f"{path} now says that the run's profile job profile-1 ended: finished; the run itself "
        "planned and trained nothing (it said link_lost)")


def test_a_runs_training_job_is_still_settled_with_its_end(tmp_path):
    out = tmp_path / "run"
    _lost_report(out, "run-1")
    record = {"id": "run-1", "kind": "run", "state": "finished", "result": {}}
    path, was = settle_lost_report(out / "board", "run-1", record)
    assert json.loads(path.read_text())["status"] == "finished"
    assert settled_line(path, was, "run-1", record).endswith("ended: finished (it said "
                                                             "link_lost)")


def test_the_way_back_reports_the_limit_the_board_ran_the_job_under(tmp_path):
    """An SSH board in a memory cgroup of its own: its config names no limit, the job's record
    does (the board's daemon read its group's, 60fceab); the settled report says it, as `run`
    would have. QA: it stayed null."""
    out = tmp_path / "run"
    _lost_report(out, "run-1")
    limit = 450 * 2**20
    record = {"id": "run-1", "kind": "run", "state": "finished", "result": {},
              "memory_limit_bytes": limit}
    path, _ = settle_lost_report(out / "board", "run-1", record)
    assert json.loads(path.read_text())["memory_limit_bytes"] == limit
    # an emulated board's limit (its config's, in the report already) stays
    report = json.loads((out / "report.json").read_text())
    (out / "report.json").write_text(json.dumps({**report, "status": "link_lost",
                                                  "memory_limit_bytes": 300 * 2**20}))
    path, _ = settle_lost_report(out / "board", "run-1", record)
    assert json.loads(path.read_text())["memory_limit_bytes"] == 300 * 2**20


def test_a_profile_that_lost_a_tier_is_not_cached(tmp_path):
    lost = json.loads(SHIPPED_PROFILE.read_text())
    lost.setdefault("measurements", {})["tiers_not_measured"] = {
        "host": "lost the link to the host page service"}
    fetched = tmp_path / "fetched.json"
    fetched.write_text(json.dumps(lost))
    said: list = []
    cached = tmp_path / "cache" / "key.json"
    assert _cache(load_profile(fetched), fetched, cached, "bench", said.append) is None
    assert not cached.exists()
    assert said == ["bench: the profile is not cached: its host tier was not measured"]
    assert _cache(load_profile(SHIPPED_PROFILE), SHIPPED_PROFILE, cached, "bench",
                  said.append) == cached and cached.is_file()
