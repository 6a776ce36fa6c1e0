"""File transfer requests: the host pushes inputs (and new agent archives) in chunks, and
fetches job outputs. Uploads go to a part file named after the expected sha256, so an upload
cut by a dropped link resumes from the bytes already on the board, and only a complete file
with the right hash is renamed into place."""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
from pathlib import Path

from ..wire.protocol import BAD_REQUEST, OFFSET, OUT_OF_DISK
from .identity import file_sha256
from .inputs import note_asked_after
from .layout import Layout

MAX_CHUNK = 4 << 20
DISK_MARGIN = 1 << 20


class RequestError(Exception):
    """A request the agent refuses: becomes an error reply with this code."""

    def __init__(self, code: str, message: str, **details: object):
        self.code = code
        self.message = message
        self.details = details
        super().__init__(message)


def _path(layout: Layout, request: dict, for_writing: bool = False) -> Path:
    try:
        return layout.resolve(request.get("path"), for_writing=for_writing)
    except ValueError as exc:
        raise RequestError(BAD_REQUEST, str(exc)) from None


def _sha(request: dict) -> str:
    sha = request.get("sha256")
    if not isinstance(sha, str) or len(sha) != 64:
        raise RequestError(BAD_REQUEST, "put_file needs the file's sha256 (64 hex digits)")
    return sha.lower()


def _count(value: object) -> bool:
    """Whether a request's field is a byte count or offset: an integer >= 0 (JSON's true and
    false are not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _part_path(final: Path, sha: str) -> Path:
    return final.with_name(f".{final.name}.{sha[:16]}.part")


def stat_file(layout: Layout, request: dict) -> dict:
    path = _path(layout, request)
    info = {"exists": path.is_file(), "size": None, "sha256": None, "partial": 0}
    if info["exists"]:
        info["size"] = path.stat().st_size
        if request.get("hash", True):
            info["sha256"] = file_sha256(path)
    sha = request.get("sha256")
    if isinstance(sha, str) and len(sha) == 64:  # a push asks: it may find the file there
        if info["exists"]:
            note_asked_after(layout, path)
        part = _part_path(path, sha.lower())
        info["partial"] = part.stat().st_size if part.exists() else 0
    return info


def put_file(layout: Layout, request: dict, body: bytes, allow_code: bool = True) -> dict:
    final = _path(layout, request, for_writing=True)
    if not allow_code and Path(request["path"]).parts[0] != "inputs":
        raise RequestError(BAD_REQUEST, "over TCP the host may write only under inputs/ "
                                        "(a new agent comes over SSH or serial)")
    sha = _sha(request)
    size, offset = request.get("size"), request.get("offset")
    if not _count(size) or not _count(offset):
        raise RequestError(BAD_REQUEST, "put_file needs integer size and offset")
    if offset + len(body) > size:
        raise RequestError(BAD_REQUEST, f"chunk ends at {offset + len(body)}, past the "
                                        f"file's size {size}")
    final.parent.mkdir(parents=True, exist_ok=True)
    part = _part_path(final, sha)
    have = part.stat().st_size if part.exists() else 0
    if offset != have:
        raise RequestError(OFFSET, f"the board has {have} bytes of this file, not {offset}",
                           have=have)
    free = shutil.disk_usage(final.parent).free
    if offset == 0 and free < size + DISK_MARGIN:
        raise RequestError(OUT_OF_DISK, f"the board has {free} bytes free in {final.parent}; "
                                        f"the file needs {size} bytes and {DISK_MARGIN} more "
                                        "(1 MiB) are kept free for the board's own use",
                           free_bytes=free)
    try:
        with open(part, "ab") as handle:
            handle.write(body)
            handle.flush()
            os.fsync(handle.fileno())
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            part.unlink()
            raise RequestError(OUT_OF_DISK, f"the board ran out of disk writing {final}",
                               free_bytes=shutil.disk_usage(final.parent).free) from None
        raise
    have = offset + len(body)
    if have < size:
        return {"have": have, "done": False}
    got = file_sha256(part)
    if got != sha:
        part.unlink()
        raise RequestError(BAD_REQUEST, f"{request.get('path')}: the received bytes hash to "
                                        f"{got[:16]}..., not {sha[:16]}...; send it again")
    os.replace(part, final)
    return {"have": have, "done": True}


def get_file(layout: Layout, request: dict) -> "tuple[dict, bytes]":
    path = _path(layout, request)
    offset, length = request.get("offset", 0), request.get("length", MAX_CHUNK)
    if not _count(offset):
        raise RequestError(BAD_REQUEST, "get_file needs a non-negative integer offset")
    if not _count(length):  # a negative length would read the whole file into one reply
        raise RequestError(BAD_REQUEST, "get_file needs a non-negative integer length")
    length = min(length, MAX_CHUNK)
    try:
        with open(path, "rb") as handle:
            size = os.fstat(handle.fileno()).st_size
            handle.seek(offset)
            data = handle.read(length)
    except FileNotFoundError:
        raise RequestError(BAD_REQUEST, f"no file {request.get('path')!r} on the board") from None
    except IsADirectoryError:
        raise RequestError(BAD_REQUEST, f"{request.get('path')!r} is a folder") from None
    return {"size": size, "offset": offset}, data


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
