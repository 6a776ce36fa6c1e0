"""The `edge-remat` command's entry point. The CLI's imports (typer, click, rich) take a second
or more on a board, and a Ctrl-C among them escaped every handler as a traceback; here it ends
as any interrupt does: one line, exit status 130."""

from __future__ import annotations

import sys

EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED, whose module is not imported yet


def main() -> None:
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
