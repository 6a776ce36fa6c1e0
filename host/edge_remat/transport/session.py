"""The host's side of one connection to an agent: typed requests, chunked file transfer, and
errors turned into the transport's one-line errors (a dead link is always LinkLost)."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable, Optional

from edge_remat_agent.daemon.identity import file_sha256
from edge_remat_agent.wire.framing import ConnectionClosed, FrameStream, ProtocolError
from edge_remat_agent.wire.protocol import (MISSING_TORCH, OFFSET, OUT_OF_DISK,
                                            PROTOCOL_VERSION, Client, RemoteError)

from .. import __version__
from .errors import AgentError, BoardMissingTorch, BoardOutOfDisk, LinkLost
from .hints import torch_hint

REQUEST_TIMEOUT_S = 30.0
PUT_CHUNK = 256 << 10
GET_CHUNK = 1 << 20


class AgentSession:
    def __init__(self, stream: FrameStream, *, board: str, family: str = "generic",
                 on_close: Optional[Callable[[], None]] = None):
        self.stream = stream
        self.client = Client(stream)
        self.board = board
        self.family = family
        self.info: dict = {}
        self._on_close = on_close
        # a slow link's transport sets smaller ones (serial.py)
        self.get_chunk, self.put_chunk = GET_CHUNK, PUT_CHUNK
        self.last_get: dict = {}  # the latest fetch: where it resumed, what it moved

    # -- plumbing --------------------------------------------------------------------------
    def call(self, request_type: str, body: bytes = b"", /, timeout: float = REQUEST_TIMEOUT_S,
             **fields: Any) -> "tuple[dict, bytes]":
        try:
            self.stream.settimeout(timeout)
            return self.client.call(request_type, body, **fields)
        except RemoteError as exc:
            raise self._agent_error(exc) from None
        except (ConnectionClosed, ProtocolError) as exc:
            raise LinkLost(f"lost the link to {self.board}: {exc}") from None
        except (socket.timeout, TimeoutError):
            raise LinkLost(f"{self.board} did not answer a {request_type!r} request within "
                           f"{timeout:g} s") from None
        except (OSError, EOFError) as exc:  # paramiko raises plain OSError/SSHException family
            raise LinkLost(f"lost the link to {self.board}: {exc or type(exc).__name__}") from None
        except Exception as exc:  # noqa: BLE001 - paramiko.SSHException and pyserial errors
            if type(exc).__module__.split(".")[0] in ("paramiko", "serial"):
                raise LinkLost(f"lost the link to {self.board}: {exc}") from None
            raise

    def _agent_error(self, exc: RemoteError) -> Exception:
        if exc.code == MISSING_TORCH:
            return BoardMissingTorch(f"{self.board}: {exc.message}; "
                                     f"{torch_hint(self.family)}")
        if exc.code == OUT_OF_DISK:
            return BoardOutOfDisk(f"{self.board} is out of disk: {exc.message}; free some space "
                                  "or point workdir at a larger partition")
        return AgentError(f"{self.board}: {exc.message}", exc.code, exc.details)

    def close(self) -> None:
        self.stream.close()
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    # -- requests --------------------------------------------------------------------------
    def hello(self, timeout: float = REQUEST_TIMEOUT_S) -> dict:
        header, _ = self.call("hello", timeout=timeout, protocol=PROTOCOL_VERSION,
                              client=f"edge-remat/{__version__}")
        self.info = header
        return header

    def ping(self) -> dict:
        return self.call("ping", timeout=10.0)[0]

    def sysinfo(self, page_dir: Optional[str] = None) -> dict:
        """The board's figures; with page_dir, whether that folder is usable for pages."""
        return self.call("sysinfo", **({"page_dir": page_dir} if page_dir else {}))[0]

    def submit(self, kind: str, params: dict, job_id: Optional[str] = None) -> dict:
        fields = {"kind": kind, "params": params}
        if job_id:
            fields["job"] = job_id
        return self.call("submit", **fields)[0]["job"]

    def job(self, job_id: str) -> dict:
        return self.call("job", job=job_id)[0]["job"]

    def wait(self, job_id: str, after_rev: Optional[int], timeout: float = 10.0) -> dict:
        return self.call("wait", timeout=timeout + REQUEST_TIMEOUT_S, job=job_id,
                         after_rev=after_rev, timeout_s=timeout)[0]["job"]

    def jobs(self) -> list:
        return self.call("jobs")[0]["jobs"]

    def cancel(self, job_id: str) -> dict:
        return self.call("cancel", job=job_id)[0]["job"]

    def stop(self, if_idle: bool = False, wait_s: float = 15.0) -> None:
        """Stop the agent; returns once it has gone (it closes the link as its last act)."""
        self.call("stop", if_idle=if_idle)
        try:
            self.stream.settimeout(wait_s)
            self.stream.recv()
        except Exception:  # noqa: BLE001 - end of stream, timeout or a dead link: all "gone"
            pass

    def stat_file(self, remote: str, sha256: Optional[str] = None, with_hash: bool = True) -> dict:
        fields: dict = {"path": remote, "hash": with_hash}
        if sha256:
            fields["sha256"] = sha256
        return self.call("stat_file", **fields)[0]

    def put_file(self, local: "str | os.PathLike[str]", remote: str,
                 on_progress: Optional[Callable[[int, int], None]] = None,
                 chunk: Optional[int] = None) -> bool:
        """Send a file unless the board has it with the same sha256; resumes a partial upload.
        Returns whether bytes were sent."""
        local = Path(local)
        chunk = chunk or self.put_chunk
        size = local.stat().st_size
        sha = file_sha256(local)
        state = self.stat_file(remote, sha)
        if state["exists"] and state["sha256"] == sha:
            return False
        offset = int(state.get("partial") or 0)
        with open(local, "rb") as handle:
            while True:
                handle.seek(offset)
                data = handle.read(chunk)
                try:
                    header, _ = self.call("put_file", data, path=remote, offset=offset,
                                          size=size, sha256=sha)
                except AgentError as exc:
                    if exc.code == OFFSET:  # the board has a different amount: go from there
                        offset = int(exc.details.get("have", 0))
                        continue
                    raise
                offset = int(header["have"])
                if on_progress is not None:
                    on_progress(offset, size)
                if header.get("done"):
                    return True

    def get_file(self, remote: str, local: "str | os.PathLike[str]",
                 chunk: Optional[int] = None) -> Path:
        """Fetch into LOCAL.part, then rename. A .part that a dropped link left is resumed
        from its end; the checksum of the whole decides, and a damaged or foreign one is
        fetched again from the start (a damaged fresh fetch: LinkLost, which the caller
        retries)."""
        chunk = chunk or self.get_chunk
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + ".part")
        offset = resumed = tmp.stat().st_size if tmp.is_file() else 0
        with open(tmp, "ab") as handle:
            while True:
                header, data = self.call("get_file", path=remote, offset=offset, length=chunk)
                handle.write(data)
                handle.flush()  # what arrived stays, for a resume after a dropped link
                offset += len(data)
                if offset >= int(header["size"]) or not data:
                    break
        self.last_get = {"path": remote, "resumed_from": resumed, "bytes": offset - resumed}
        expected = self.stat_file(remote)["sha256"]
        if offset > int(header["size"]) or expected and file_sha256(tmp) != expected:
            tmp.unlink()
            if resumed:  # the .part was another file's (an earlier fetch's): from the start
                return self.get_file(remote, local, chunk)
            raise LinkLost(f"{remote} from {self.board} arrived damaged (sha256 mismatch); "
                           "fetch it again")
        os.replace(tmp, local)
        return local
