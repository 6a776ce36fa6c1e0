"""Ctrl-C in the `edge-remat` console script's own imports (`from edge_remat.entry import
main`, before main installs the CLI's handler) ends as any Ctrl-C does: exit 130, one
`error: interrupted (Ctrl-C)` line, no traceback, nothing run. QA: SIGINT a few ms into
`edge-remat devices` printed "Traceback ... KeyboardInterrupt" from the script's import,
exit 1. The script here is pip's console script for `edge_remat.entry:main`, as a file named
edge-remat (tests/helpers' env puts this checkout first on the path). A Ctrl-C before that,
while Python reads its `site` (the .pth files: the first ~0.1 s), is the interpreter's own
and out of our reach (docs/errors.md)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from helpers.bad_inputs import INTERRUPTED, REPO, SIGINT_INSIDE_IMPORT, env, refused

# what pip writes for [project.scripts] edge-remat = "edge_remat.entry:main"
CONSOLE_SCRIPT = """# -*- coding: utf-8 -*-
import re
import sys
{before}from edge_remat.entry import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""



def console_script(folder, before: str = ""):
    path = folder / "edge-remat"
    path.write_text(CONSOLE_SCRIPT.format(before=before))
    return path


@pytest.mark.parametrize("module", ["edge_remat_agent", "edge_remat.entry"])
def test_ctrl_c_in_the_console_script_s_imports_is_one_line(tmp_path, module):
    script = console_script(tmp_path, SIGINT_INSIDE_IMPORT)
    proc = subprocess.run([sys.executable, str(script), module, "devices"],
                          capture_output=True, text=True, timeout=60, env=env())
    line = refused(proc, INTERRUPTED, "interrupted")
    assert proc.stderr.strip() == line == "error: interrupted (Ctrl-C)", proc.stderr
    assert proc.stdout == "", proc.stdout  # devices listed nothing: it never ran


# Python's start as far as the console script, in this test: what its `site` would have
# imported (re, enum) imported, with SIGINT still the system's default (a Ctrl-C there
# kills, silently: the interpreter's part, which no code of ours can reach), then Python's
# own handler, as when a script starts, and the console script run as __main__.
STARTED = """import _signal, sys
_signal.signal(_signal.SIGINT, _signal.SIG_DFL)
import re
sys.argv.pop(0)
__file__ = sys.argv[0]
code = compile(open(__file__).read(), __file__, "exec")
_signal.signal(_signal.SIGINT, _signal.default_int_handler)
exec(code)
"""


def before_our_code(err: str) -> bool:
    """Whether `err` is a Ctrl-C that came before any code of ours ran: in the interpreter's
    start ("Fatal Python error: init_sys_streams"), or in importlib finding and loading the
    edge_remat package itself (a traceback through no file of this checkout): no code of a
    package runs before its first line."""
    return "Fatal Python error: init_" in err or \
        ("Traceback" in err and not any(f'File "{REPO / part}' in err
                                        for part in ("host", "agent")))


def test_sigint_a_few_ms_into_the_command_is_one_line_or_the_signal(tmp_path):
    """The console script, SIGINT after a few ms: either no code of ours ran yet (killed by
    SIGINT, silent: the shell's 130; or the interpreter's own start, before_our_code), or
    exit 130 and the one line, never a traceback through our code. Python's site is skipped
    (-S, site-packages on PYTHONPATH instead; STARTED stands in for it), so that the delays
    land in our imports, not in a .pth file's."""
    import site
    script = console_script(tmp_path)
    environ = env()
    environ["PYTHONPATH"] += os.pathsep + os.pathsep.join(site.getsitepackages())
    seen = []
    # the first 80 ms: Python's start, the console script's imports, main and the CLI's own
    # (the whole command takes 0.5 s on 2 loaded cores)
    for delay in (0.002, 0.005, 0.01, 0.015, 0.02, 0.03, 0.04, 0.06, 0.08):
        proc = subprocess.Popen([sys.executable, "-S", "-c", STARTED, str(script), "devices"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=environ)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        seen.append((delay, proc.returncode))
        if before_our_code(err):
            continue
        assert "Traceback" not in err, (delay, err)
        if proc.returncode == -signal.SIGINT:
            assert err == "", (delay, err)
        elif proc.returncode == 0 and err == "":  # a fast machine: devices was done first
            continue
        else:  # devices may have done its work as an import put the Ctrl-C off: it says so
            assert proc.returncode == INTERRUPTED, (delay, proc.returncode, err)
            # A Ctrl-C put off by the CLI's own imports (typer, pydantic) now and then ends at
            # 130 with no line at all, before this change too (seen in 3 of 60 runs of the
            # installed edge-remat at 0.2-0.6 s): not this test's matter, and no traceback
            assert err == "" or (len(err.splitlines()) == 1 and
                                 err.startswith("error: interrupted (Ctrl-C)")), (delay, err)
    assert any(code == INTERRUPTED for _, code in seen), seen
