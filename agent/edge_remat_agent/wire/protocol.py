"""The request/reply protocol spoken over frames, and a small blocking client for it.

Every request is a frame whose header holds `type` and a client-chosen `id`; the agent answers
each with exactly one frame carrying the same `id`: `{"type": "reply", "ok": true, ...}` or
`{"type": "error", "code": ..., "error": "one line"}`. A client has one request in flight at a
time, so there is no multiplexing to get wrong; long waits are long polls (`wait` with a
timeout), which survive a dropped link because nothing is pushed unasked.

Requests (fields besides type/id):
    hello      protocol, client                 -> protocol, agent_version, build, python, ...
    ping                                        -> time_s
    sysinfo                                     -> python/torch versions, RAM, disk, board
    submit     kind, params, job (optional id)  -> job (the record; same id = same job)
    job        job                              -> job
    wait       job, after_rev, timeout_s        -> job, once its rev differs from after_rev
                                                  or it is done (a long poll)
    jobs                                        -> jobs (every record, oldest first)
    cancel     job                              -> job
    stat_file  path, sha256 (optional)          -> exists, size, sha256, partial
    put_file   path, offset, size, sha256; body -> have (bytes of the file now on the board)
    get_file   path, offset, length             -> size; body = the bytes
    stop       if_idle                          -> stopping (then the agent shuts down)
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Optional

from .framing import Frame, FrameStream, ProtocolError

PROTOCOL_VERSION = 1

# Error codes: the host turns these into its own one-line errors.
BAD_REQUEST = "bad_request"
UNKNOWN_JOB = "unknown_job"
UNKNOWN_KIND = "unknown_kind"
MISSING_TORCH = "missing_torch"
OUT_OF_DISK = "out_of_disk"
BUSY = "busy"
CONFLICT = "conflict"
PROTOCOL_MISMATCH = "protocol"
OFFSET = "offset"
INTERNAL = "internal"

TERMINAL_STATES = ("finished", "failed")
STATES = ("queued", "running") + TERMINAL_STATES


class RemoteError(Exception):
    """The agent answered a request with an error."""

    def __init__(self, code: str, message: str, details: Optional[dict] = None):
        self.code = code
        self.message = message
        self.details = details or {}
        super().__init__(message)


def reply(request: dict, **fields: Any) -> dict:
    return {"type": "reply", "id": request.get("id"), "ok": True, **fields}


def error_reply(request: dict, code: str, message: str, **fields: Any) -> dict:
    return {"type": "error", "id": request.get("id"), "ok": False, "code": code,
            "error": message, **fields}


class Client:
    """One request at a time over a FrameStream; replies to older, abandoned requests are
    skipped by id."""

    def __init__(self, stream: FrameStream):
        self.stream = stream
        self._ids = itertools.count(1)
        self._lock = threading.Lock()

    def call(self, request_type: str, body: bytes = b"", /, **fields: Any) -> Frame:
        with self._lock:
            request_id = next(self._ids)
            self.stream.send({**fields, "type": request_type, "id": request_id}, body)
            while True:
                header, data = self.stream.recv()
                if header.get("id") != request_id:
                    continue  # a late answer to a request whose wait we gave up on
                if header.get("type") == "error":
                    details = {k: v for k, v in header.items()
                               if k not in ("type", "id", "ok", "code", "error")}
                    raise RemoteError(str(header.get("code", INTERNAL)),
                                      str(header.get("error", "unknown error")), details)
                if header.get("type") != "reply":
                    raise ProtocolError(f"unexpected frame type {header.get('type')!r}")
                return header, data

    def hello(self, client_name: str) -> dict:
        header, _ = self.call("hello", protocol=PROTOCOL_VERSION, client=client_name)
        return header

    def close(self) -> None:
        self.stream.close()
