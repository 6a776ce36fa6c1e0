"""The `edge-remat` command's entry point. The CLI's imports (typer, click, rich) take a second
or more on a board, and a Ctrl-C among them escaped every handler as a traceback; here it ends
as any interrupt does: one line, exit status 130."""

from __future__ import annotations

import signal
import sys

EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED, whose module is not imported yet


def ctrl_c_reaches_us() -> None:
    """SIGINT is Ctrl-C (KeyboardInterrupt) from the start, even where the parent left it
    ignored: a shell without job control starts `cmd &` so, and Python then keeps it ignored.
    Only the job wait set a handler of its own (transport.board.echoes_ignored), so a SIGINT
    before it, while connecting to a board (an SSH port that never speaks, a serial line with
    no agent), was dropped and the command waited out connect_timeout_s (QA: exit 3 after
    30 s, SIGINT sent at 2 s and 3 s), where SIGTERM stopped it at once."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def main() -> None:
    ctrl_c_reaches_us()
    try:
        from .cli import main as run_cli
    except KeyboardInterrupt:
        sys.stderr.write("error: interrupted (Ctrl-C)\n")
        sys.exit(EXIT_INTERRUPTED)
    try:
        run_cli()  # ends with sys.exit
    finally:
        from edge_remat_agent.process_exit import skip_exit_collections
        skip_exit_collections()
