"""A full disk under a command's output: the error names the file and says the disk is full (no
"check the path and its permissions", which sent users after a path that was right), and
nothing half-written stays. QA, on a 1 MiB tmpfs filled with dd: plan -o, graph -o, plot --out
and run --out each said only 'error: No space left on device (check the path and its
permissions)', exit 2; plot left a 0-byte schedule.png (and its folder), which the retry then
refused as an existing file ('add --force'). The disks are real tmpfs mounts (root; the tests
skip elsewhere, saying so)."""

from __future__ import annotations

import errno
import json
import os

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph, tiny_plan
from helpers.small_disk import small_disk

PAGE = 4096


def _fill(disk, leave_pages: int = 0) -> None:
    """Fill the 1 MiB disk, leaving `leave_pages` pages (tmpfs counts whole pages)."""
    (disk / "filler").write_bytes(b"\0" * (2**20 - leave_pages * PAGE))


def _said_full(line: str, path) -> None:
    assert f"{path}: No space left on device: the disk is full (" in line, line
    assert "to write" in line and "free there" in line, line
    assert "make room on it, or write elsewhere" in line, line
    assert "permission" not in line, line


@pytest.mark.parametrize("command", ["plan", "graph"])
@pytest.mark.parametrize("as_json", [False, True], ids=["line", "json"])
def test_a_full_disk_names_the_file_it_could_not_write(tmp_path, command, as_json):
    graph = tiny_graph(tmp_path)
    with small_disk(tmp_path / "disk", "1M") as disk:
        _fill(disk)
        out = disk / "out.json"
        args = (["plan", "--graph", graph, "--budget", "0.8", "-o", out] if command == "plan"
                else ["graph", "--model", "mlp", "-o", out])
        proc = cli(*args, *(["--json"] if as_json else []), cwd=tmp_path)
        left = sorted(p.name for p in disk.iterdir())
    line = refused(proc, BAD_INPUT, json_out=as_json)
    _said_full(line, out)
    assert "0 B free there" in line, line
    if as_json:
        said = json.loads(proc.stdout.strip().splitlines()[-1])
        assert "error: " + said["error"] == line, (said, line)
        assert said["free_bytes"] == 0 and said["needed_bytes"] > 0, said
    assert left == ["filler"], left


def test_a_run_on_a_full_disk_names_its_file_and_leaves_no_folder(tmp_path):
    with small_disk(tmp_path / "disk", "1M") as disk:
        _fill(disk)
        proc = cli("run", "--device", "local", "--model", "mlp", "--budget", "120%",
                   "--steps", "1", "--out", disk / "rr", cwd=tmp_path, timeout=300)
        left = sorted(p.name for p in disk.iterdir())
    line = refused(proc, BAD_INPUT)
    _said_full(line, disk / "rr" / "graph.json")
    assert left == ["filler"], left  # rr, which the run made, is gone with its files


def test_plot_on_a_full_disk_leaves_no_empty_png_and_no_folder(tmp_path):
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph)
    with small_disk(tmp_path / "disk", "1M") as disk:
        _fill(disk)
        out = disk / "pl"
        first = cli("plot", "--plan", plan, "--graph", graph, "--out", out)
        left = sorted(p.name for p in disk.iterdir())
        (disk / "filler").unlink()  # room made: the same command again just works
        again = cli("plot", "--plan", plan, "--graph", graph, "--out", out)
        made = sorted(p.name for p in out.iterdir())
    _said_full(refused(first, BAD_INPUT), out / "schedule.png")
    assert left == ["filler"], left
    assert again.returncode == 0, again.stderr
    assert made == ["memory.png", "schedule.png"], made


def test_plot_that_fills_the_disk_halfway_leaves_none_of_its_pngs(tmp_path):
    """schedule.png fits and memory.png does not: the plot fails, and leaves neither, so that
    the retry after making room is not refused for an existing schedule.png."""
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph)
    sizes = tmp_path / "sizes"
    assert cli("plot", "--plan", plan, "--graph", graph, "--out", sizes).returncode == 0
    schedule, memory = ((sizes / name).stat().st_size for name in ("schedule.png",
                                                                   "memory.png"))
    room = -(-schedule // PAGE) + 1  # pages: schedule.png fits, memory.png does not
    assert memory > PAGE * (room - -(-schedule // PAGE)), (schedule, memory)
    with small_disk(tmp_path / "disk", "1M") as disk:
        _fill(disk, leave_pages=room)
        out = disk / "pl"
        first = cli("plot", "--plan", plan, "--graph", graph, "--out", out)
        left = sorted(p.name for p in disk.iterdir())
        (disk / "filler").unlink()
        again = cli("plot", "--plan", plan, "--graph", graph, "--out", out)
    _said_full(refused(first, BAD_INPUT), out / "memory.png")
    assert left == ["filler"], left
    assert again.returncode == 0, again.stderr


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT], ids=["ENOSPC", "EDQUOT"])
def test_a_full_disk_is_said_as_such_whoever_wrote(tmp_path, code):
    """A writer other than dump_bytes (torch.save, a library): the file, that the disk (or the
    quota) is full and what is free there, no permissions hint; a writer's own remedy (a
    run's fetch: how to fetch the job's outputs again) is kept as it said it."""
    from edge_remat.errors import EXIT_BAD_INPUT, classify
    status, line, extra = classify(OSError(code, os.strerror(code), str(tmp_path / "w.pt")))
    assert status == EXIT_BAD_INPUT
    full = "the disk quota is used up" if code == errno.EDQUOT else "the disk is full"
    assert line.startswith(f"{tmp_path / 'w.pt'}: {os.strerror(code)}: {full} ("), line
    assert "free there): make room on it, or write elsewhere" in line, line
    assert "permission" not in line and extra["free_bytes"] > 0, (line, extra)
    own = OSError(code, "No space left on device; job J's outputs stay on the board: make "
                  "room, then fetch them with `edge-remat job-status J ...`", "out/weights.pt")
    assert classify(own)[1] == f"out/weights.pt: {own.strerror}"
