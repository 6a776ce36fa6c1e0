"""Finding a job's fetched outputs (remote.py): the one place that reads a job record's
`fetched` list, for the profile a profile job brought and the report a run job brought."""

from __future__ import annotations

import json

from edge_remat.remote import fetched_file, fetched_json, full_result


def test_the_profile_and_the_run_report_are_found_among_the_fetched_files(tmp_path):
    report = tmp_path / "run_report.json"
    report.write_text(json.dumps({"model": "mlp", "steps": [{"loss": 1.0}]}))
    weights = tmp_path / "weights.pt"
    weights.write_bytes(b"")
    record = {"fetched": [str(weights), str(report)], "result": {"summary": {}}}
    assert fetched_json(record) == [report]
    assert fetched_file(record, "run_report.json") == report
    assert fetched_file(record, "profile.json") is None
    assert full_result(record)["model"] == "mlp"  # the whole report, not the job's summary
    assert full_result({"result": {"summary": {}}}) == {"summary": {}}
    assert full_result({}) == {} and fetched_json({}) == []
