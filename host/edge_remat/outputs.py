"""Where the commands write: checked before any work is done (a folder where a file is wanted,
an existing file without --force, a folder that cannot be written), so that a long solve or
capture never ends in "cannot write". The writes themselves are atomic (formats.fields.dump_json:
a temporary file beside the target, renamed over it, removed on failure)."""

from __future__ import annotations

import errno
import fnmatch
import json
import math
import os
import tempfile
from pathlib import Path

from edge_remat_agent.output_names import empty_name

from .errors import UserError


def output_file(path: "str | os.PathLike[str]", force: bool, option: str = "-o",
                inputs: "dict[str, str | None] | None" = None) -> Path:
    """A file the command will write: not a folder, not one of the command's `inputs`
    ({option: path}) even with `force`, not someone's existing file unless `force`, in a
    folder that exists (made here) and can be written."""
    path = Path(_named(path, option, "a file name"))
    if str(path) == "-":  # QA: it wrote a file named "-", where tools read "-" as stdout
        raise UserError(f"{option} - would write a file named '-', not to stdout: give a file "
                        "name (--json prints the summary on stdout)")
    if path.is_dir():
        raise UserError(f"{option} {path} is a folder: give a file name, e.g. "
                        f"{path / 'out.json'}")
    if path.exists() and not path.is_file():
        # the write replaces its file whole (a temporary file renamed over it): a FIFO or a
        # device node (/dev/full, as root) became a regular file, said "written"
        raise UserError(f"{option} {path} is not a regular file (a pipe, socket or device): "
                        "give a file name")
    for input_option, given in (inputs or {}).items():
        # `plan --graph G -o G --force` replaced the graph with its plan: --force is for
        # someone's old output, not for the file this command is reading
        if given and path.exists() and os.path.exists(given) and os.path.samefile(path, given):
            raise UserError(f"{option} {path} is the {input_option} file this command reads: "
                            "writing there would replace it (even with --force); give "
                            "another file name")
    if path.exists() and not force:
        raise UserError(f"{option} {path} already exists: add --force to overwrite it, or "
                        "choose another name")
    writable_folder(path.parent if str(path.parent) else Path("."), option)
    return path


def output_folder(path: "str | os.PathLike[str]", option: str = "--out",
                  inputs: "dict[str, str | None] | None" = None,
                  writes: tuple[str, ...] = (), force: bool | None = None) -> Path:
    """A folder the command will write its files into (made here when missing), where none
    of the command's `inputs` ({option: path}) lies at a path it `writes` (patterns relative
    to the folder, fnmatch's: 'plan-*.json'). With `force` False, a folder that already holds
    such files is refused (None: not checked, for commands whose files are theirs to renew)."""
    path = Path(_named(path, option, "a folder name"))
    if path.exists() and not path.is_dir():
        raise UserError(f"{option} {path} is a file, not a folder: give a folder name")
    folder = os.path.realpath(path)
    for input_option, given in (inputs or {}).items():
        if not given:
            continue
        inside = os.path.relpath(os.path.realpath(given), folder)
        if not inside.startswith(os.pardir) and any(fnmatch.fnmatch(inside, pattern)
                                                    for pattern in writes):
            # `plan --sweep -o D --graph D/plan-0.50.json` replaced the graph with a plan
            raise UserError(f"{option} {path} is where this command writes {inside}, the "
                            f"{input_option} file it reads: writing there would replace it; "
                            "give another folder")
    if force is False and path.is_dir():
        # `plan --sweep -o D` replaced an earlier sweep's plans in silence, or left them
        # mixed with its own, where `plan -o FILE` refuses without --force
        held = sorted(p.name for p in path.iterdir()
                      if any(fnmatch.fnmatch(p.name, pattern) for pattern in writes))
        if held:
            more = f" and {len(held) - 1} more" if len(held) > 1 else ""
            raise UserError(f"{option} {path} already holds {held[0]}{more}: add --force to "
                            "overwrite, or choose another folder")
    writable_folder(path, option)
    return path


def _named(path: "str | os.PathLike[str]", option: str, what: str):
    """`path`, unless it is empty (output_names.empty_name)."""
    if (empty := empty_name(path, option, what)) is not None:
        raise UserError(empty)
    return path


# Folders this command made, deepest first: a command that fails removes those it left empty
# (errors.cli_errors), so that bad input writes nothing, not even a folder.
_MADE: list[Path] = []


def count_folders_made_from_now() -> None:
    """A command starts: folders an earlier command of this process made are not its own."""
    _MADE.clear()


def remove_folders_left_empty() -> None:
    """The folders this command made and left empty go again; any with a file in it stays."""
    for folder in _MADE:
        try:
            folder.rmdir()
        except OSError:  # not empty, or gone already
            pass
    _MADE.clear()


def writable_folder(folder: Path, option: str) -> None:
    """Make `folder` (and its parents) and prove it can be written by writing into it:
    permission bits say nothing to root, and nothing about a read-only filesystem."""
    missing = [path for path in (folder, *folder.parents) if not path.exists()]
    try:
        folder.mkdir(parents=True, exist_ok=True)
        _MADE.extend(path for path in missing if path not in _MADE)
    except FileExistsError:
        raise UserError(f"{option}: {_first_file(folder)} is a file, not a folder") from None
    except OSError as exc:
        raise UserError(f"{option}: cannot make the folder {folder}: "
                        f"{exc.strerror or exc}") from None
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".edge-remat-probe-"):
            pass
    except OSError as exc:
        reason = exc.strerror or str(exc)
        if exc.errno == errno.ENOENT and folder.is_dir():  # procfs answers ENOENT to a new file
            reason = ("its filesystem does not let files be made in it (a virtual one, such as "
                      "/proc)")
        raise UserError(f"{option}: cannot write in {folder}: {reason} (choose a folder you "
                        "can write)") from None


def _first_file(folder: Path) -> Path:
    for parent in [folder, *folder.parents]:
        if parent.exists() and not parent.is_dir():
            return parent
    return folder


def file_stamp(path: Path):
    """(mtime_ns, inode, size) of a file, or None where there is none: what tells a command's
    own write of an output from an earlier command's (times alone cannot: a filesystem may
    keep them to the second, or two)."""
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_mtime_ns, st.st_ino, st.st_size


def written_since(path: Path, at_start: dict) -> bool:
    """Whether `path` was written since `at_start` ({path: file_stamp} as the command began):
    it is there, and not as it was then."""
    stamp = file_stamp(path)
    return stamp is not None and stamp != at_start.get(path)


def kept_note(kept: list[str], out: Path, command: str) -> str:
    """The line for an earlier `command`'s outputs in `out` that this one did not write again
    (its trained weights, its checkpoint): kept, and not this command's."""
    verb, them = ("is", "it") if len(kept) == 1 else ("are", "them")
    return (f"note: {', '.join(kept)} in {out} {verb} an earlier {command}'s, kept: this "
            f"{command} did not write {them} again (remove {them}, or give another --out)")


def print_json(obj: object, indent: "int | None" = None) -> None:
    """Print `obj` on stdout as strict JSON (RFC 8259, what jq and JSON.parse read), as every
    command's --json does: a number that is not finite (a diverged run's loss) is null, as
    JavaScript's JSON.stringify writes it, not Python's NaN or Infinity, which strict readers
    refuse (QA: plan --json printed Infinity); what JSON has no type for is its str()."""
    print(json.dumps(_finite_or_null(obj), indent=indent, default=str, allow_nan=False))


def _finite_or_null(value: object) -> object:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite_or_null(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(item) for item in value]
    return value
