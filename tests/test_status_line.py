"""The planner's status line (planner/status_line.py): on a terminal it shows the time and the
phase from the start, before any plan exists, and redraws itself between new bests; off a
terminal there is none."""

from __future__ import annotations

import io
import os
import re
import subprocess

from helpers.bad_inputs import COMMAND, env

from edge_remat.planner.plan_file import make_plan
from edge_remat.planner.status_line import StatusLine, status_line
from edge_remat.synthetic import random_layered


def drawn(text: str) -> list[str]:
    """The lines a terminal showed one after another (each redraw starts with a carriage
    return), padding stripped."""
    return [part.strip() for part in re.split(r"[\r\n]", text) if part.strip()]


def test_a_large_plan_shows_its_phases_and_a_ticking_clock_before_its_first_best():
    """500 nodes: before this status line existed the terminal stayed blank until the LNS's
    first new best (16 s at 2000 nodes). Now each phase is named as it starts and the clock
    is redrawn between, and the line is ended before the table."""
    stream = io.StringIO()
    line = StatusLine(stream, tick_s=0.05)
    line.start()
    try:
        plan, _ = make_plan(random_layered(500, seed=0), "0.8", time_limit=4, workers=1,
                            progress=line)
    finally:
        line.close()
    shown = drawn(stream.getvalue())
    first_best = next((i for i, text in enumerate(shown) if "best" in text), len(shown))
    before = shown[:first_best]
    phases = [re.sub(r"^plan +[\d.]+ s +", "", text) for text in shown]
    for phase in ("preparing the problem", "heuristics (feasibility phase)", "window LNS",
                  "lower bound (covering problem)", "laying out the arena"):
        assert any(p.startswith(phase) for p in phases), (phase, phases)
    seconds = [float(re.match(r"plan +([\d.]+) s", text).group(1)) for text in before]
    assert len(before) >= 3 and seconds == sorted(seconds) and seconds[-1] > 0, before
    assert stream.getvalue().endswith("\n")
    # the plan's final bound (the covering problem's where HiGHS gets it in its share of the
    # time and it is the stronger, else the stage model's) is on the line once it is known,
    # before the table: which of the two wins depends on the host's load (the full suite once
    # got the stage model's)
    bounds = [m.group(1) for m in (re.search(r" bound (\S+) +gap", t) for t in shown) if m]
    assert bounds[-1] == f"{plan['solver']['lower_bound']:.6g}", (bounds, plan["solver"])


def test_the_clock_ticks_without_news_and_stops_when_closed():
    stream = io.StringIO()
    with status_line(True, stream, tick_s=0.05) as line:
        line.phase("waiting")
        line.ticker.join(0.35)  # no phase, no new best: only the ticker draws
    assert len([t for t in drawn(stream.getvalue()) if t.endswith("waiting")]) >= 3
    ended = stream.getvalue()
    line.draw()  # closed: nothing more is drawn after the line's end
    assert stream.getvalue() == ended and not line.ticker.is_alive()


def _plan_with_stderr(tmp_path, stderr) -> subprocess.CompletedProcess:
    graph = tmp_path / "g.json"
    random_layered(60, seed=1).save(graph)
    return subprocess.run([*COMMAND, "plan", "--graph", str(graph), "--budget", "0.8",
                           "--time-limit", "2", "--solver", "heuristic:peak-search"],
                          stdout=subprocess.PIPE, stderr=stderr, env=env(), timeout=120)


def _on_a_terminal(run) -> tuple[subprocess.CompletedProcess, str]:
    """run(terminal) with its stderr on a pseudo-terminal: its result and what it showed."""
    main, terminal = os.openpty()
    try:
        done = run(terminal)
        os.close(terminal)
        shown = b""
        while True:
            try:
                chunk = os.read(main, 4096)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            shown += chunk
    finally:
        os.close(main)
    return done, shown.decode()


def test_on_a_terminal_the_plan_command_draws_the_line_and_ends_it(tmp_path):
    done, text = _on_a_terminal(lambda terminal: _plan_with_stderr(tmp_path, terminal))
    assert done.returncode == 0
    assert "\r  plan " in text and "preparing the problem" in text and text.endswith("\n")
    assert done.stdout.decode().startswith("status")


def test_off_a_terminal_there_is_no_status_line(tmp_path):
    done = _plan_with_stderr(tmp_path, subprocess.PIPE)
    assert done.returncode == 0 and done.stderr == b""


def screen(shown: str) -> list[str]:
    """What a terminal shows after `shown`: a carriage return moves to the line's start, and
    what follows overwrites it."""
    rows, row, column = [[]], 0, 0
    for char in shown:
        if char == "\r":
            column = 0
        elif char == "\n":
            rows.append([])
            row, column = row + 1, 0
        else:
            line = rows[row]
            line.extend(" " * (column + 1 - len(line)))
            line[column] = char
            column += 1
    return ["".join(r).rstrip() for r in rows]


WRITES_BETWEEN = """
import sys, time, warnings, typer
from edge_remat.planner.status_line import status_line
with status_line(True, tick_s=0.02) as line:
    line.phase("window LNS")
    time.sleep(0.1)
    warnings.warn("a library's warning")
    time.sleep(0.1)
    typer.echo("warning: an echoed line", err=True)
    print("error: a", "printed line", file=sys.stderr)
    time.sleep(0.1)
"""


def test_a_warning_written_meanwhile_clears_the_line_and_the_line_is_drawn_again():
    """A warning printed while the line was drawn ran on after it on the same terminal line
    ('  plan 0.2 s   window LNS<warning>'): each stderr write now clears it first and redraws it
    below once the text's line ends."""
    import sys
    done, shown = _on_a_terminal(lambda terminal: subprocess.run(
        [sys.executable, "-c", WRITES_BETWEEN], stderr=terminal, env=env(), timeout=60))
    assert done.returncode == 0
    rows = [row for row in screen(shown.replace("\r\n", "\n")) if row]
    warned = next(i for i, row in enumerate(rows) if "UserWarning" in row)
    assert rows[warned].startswith("<string>:") and "plan" not in rows[warned], rows
    assert rows[warned + 1:] == ["warning: an echoed line", "error: a printed line",
                                 rows[-1]], rows
    assert re.fullmatch(r"plan +[\d.]+ s +window LNS", rows[-1].strip()), rows
