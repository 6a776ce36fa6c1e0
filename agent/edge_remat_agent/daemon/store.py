"""Job records, persisted one JSON file per job so a restarted daemon (or a host that comes
back days later) finds every job where it left it.

The daemon owns jobs/<id>/job.json and writes it on every state change. The job process owns
progress.json and outcome.json in the same folder, so the two never write the same file.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Dict, List, Optional

from ..wire.protocol import STATES, TERMINAL_STATES
from .inputs import prune_inputs
from .layout import JOB_ID, JOB_ID_RULE, Layout

_log = logging.getLogger(__name__)
KEEP_FINISHED = 200


def write_json_atomic(path: Path, obj: object) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        json.dump(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())  # a board losing power must not leave half a record
    os.replace(tmp, path)


def read_json(path: Path) -> Optional[dict]:
    try:
        with open(path) as handle:
            value = json.load(handle)
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _well_formed(record: Optional[dict], job_id: str) -> bool:
    """Whether a job.json read back holds what the daemon reads of every record: a damaged
    one (edited by hand, a disk's fault) stopped the daemon from starting at all ("order":
    "x" was a ValueError), and the board answered nobody until it was removed."""
    from ..formats import FormatError
    from ..formats.fields import Reader
    if record is None or record.get("id") != job_id:
        return False
    try:
        reader = Reader(record, job_id)
        reader.str("kind"), reader.object("params"), reader.str("state", choices=STATES)
        reader.integer("order"), reader.integer("rev"), reader.integer("restarts", 0)
    except FormatError:
        return False
    return True


class JobStore:
    def __init__(self, layout: Layout):
        self.layout = layout
        self.records: Dict[str, dict] = {}
        self._order = 0

    def load(self) -> None:
        for job_json in sorted(self.layout.jobs_dir.glob("*/job.json")):
            record = read_json(job_json)
            if not _well_formed(record, job_json.parent.name):
                _log.warning("ignoring unreadable job record %s", job_json)
                continue
            record["progress"] = read_json(job_json.parent / "progress.json")
            self.records[record["id"]] = record
            self._order = max(self._order, int(record.get("order", 0)))
        self._prune()
        prune_inputs(self.layout, self.records.values())  # those the pruned jobs alone named

    def new_id(self) -> str:
        return time.strftime("%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]

    def create(self, kind: str, params: dict, job_id: Optional[str] = None) -> dict:
        job_id = job_id or self.new_id()
        if not JOB_ID.match(job_id):
            raise ValueError(f"bad job id {job_id!r}: {JOB_ID_RULE}")
        self._order += 1
        record = {"id": job_id, "kind": kind, "params": params, "state": "queued",
                  "order": self._order, "created_s": time.time(), "started_s": None,
                  "finished_s": None, "result": None, "error": None, "restarts": 0,
                  "note": None, "pid": None, "rev": 1, "progress": None}
        job_dir = self.layout.job_dir(job_id)
        (job_dir / "files").mkdir(parents=True, exist_ok=True)
        (job_dir / "state").mkdir(exist_ok=True)
        self.records[job_id] = record
        self.save(record)
        return record

    def save(self, record: dict) -> None:
        on_disk = {k: v for k, v in record.items()
                   if k != "progress" and not k.startswith("_")}
        job_dir = self.layout.job_dir(record["id"])
        # made again where it was removed while the job ran: the record, which says so,
        # must outlive the daemon like any other (and its writing must not fail the worker)
        job_dir.mkdir(parents=True, exist_ok=True)
        write_json_atomic(job_dir / "job.json", on_disk)

    def update(self, record: dict, **changes: object) -> None:
        record.update(changes)
        record["rev"] = int(record.get("rev", 0)) + 1
        self.save(record)

    def next_queued(self) -> Optional[dict]:
        queued = [r for r in self.records.values() if r["state"] == "queued"]
        return min(queued, key=lambda r: r["order"]) if queued else None

    def in_state(self, state: str) -> List[dict]:
        return sorted((r for r in self.records.values() if r["state"] == state),
                      key=lambda r: r["order"])

    def public(self, record: dict) -> dict:
        view = {k: v for k, v in record.items() if k != "order" and not k.startswith("_")}
        if record["state"] == "queued":
            view["position"] = sum(1 for r in self.records.values()
                                   if r["state"] == "queued" and r["order"] < record["order"])
        return view

    def _prune(self) -> None:
        done = sorted((r for r in self.records.values() if r["state"] in TERMINAL_STATES),
                      key=lambda r: r["order"])
        for record in done[:max(0, len(done) - KEEP_FINISHED)]:
            shutil.rmtree(self.layout.job_dir(record["id"]), ignore_errors=True)
            del self.records[record["id"]]
