"""`devices --check` of a local board whose workdir's disk is full names the board once in its
line: the error already begins with it. QA, the workdir a full 1 MiB tmpfs: "fullboard:
fullboard (this machine) is out of disk in W: the agent needs ... bytes plus 1 MiB: ..."."""

from __future__ import annotations

import errno

from helpers.bad_inputs import UNREACHABLE, cli
from helpers.small_disk import small_disk


def fill(folder) -> None:
    """Write into `folder` until its disk has no room left."""
    with open(folder / "filler", "wb") as out:
        try:
            while True:
                out.write(b"\0" * 65536)
                out.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC, exc


def test_a_full_workdir_is_said_naming_the_board_once(tmp_path):
    with small_disk(tmp_path / "wd", "1M") as workdir:
        fill(workdir)
        config = tmp_path / "board.toml"
        config.write_text(f'name = "fullboard"\n[connection]\nkind = "local"\n'
                          f'workdir = "{workdir}"\n[hardware]\npage_dir = "{tmp_path}/pages"\n'
                          'sensor = "none"\n')
        check = cli("devices", config, "--check")
    assert check.returncode == UNREACHABLE, (check.stdout, check.stderr)
    assert "Traceback" not in check.stdout + check.stderr
    (line,) = [line for line in check.stdout.splitlines() if "out of disk" in line]
    assert line.startswith(f"fullboard (this machine) is out of disk in {workdir}"), line
    assert line.count("fullboard") == 1 and "set workdir in [connection] of" in line, line
    assert "error: 1 of 1 board failed the check: fullboard" in check.stderr, check.stderr


def test_a_line_that_does_not_begin_with_the_board_keeps_its_name():
    from edge_remat.remote import failed_check_line
    assert failed_check_line("s", "cannot reach u@h:1: refused") == "s: cannot reach u@h:1: " \
                                                                      "refused"
    assert failed_check_line("x", "x has no torch") == "x has no torch"
    assert failed_check_line("x", "x's page_dir cannot hold pages") == \
        "x's page_dir cannot hold pages"
    assert failed_check_line("x", "xy (this machine) is out of disk") == \
        "x: xy (this machine) is out of disk"
