"""The `edge-remat` command's entry point. The CLI's imports (typer, click, rich; numpy and
the rest as a command first needs them) take a second or more on a board, and a Ctrl-C among
them escaped every handler as a traceback, or was lost: a KeyboardInterrupt raised in
importlib's own weakref callback is printed and swallowed (the deploy then trained anyway),
and one inside numpy's import left it half-initialised ("ImportError: cannot load module
more than once per process"). Here a Ctrl-C that lands inside an import is taken once the
import is done (ctrl_c_after_imports), and one that escapes the CLI ends as any interrupt
does: one line, exit status 130. One before main runs, in the console script's own imports
(`from edge_remat.entry import main`), is held by the package's first import
(edge_remat/__init__.py) and ends the command here the same way. One before that, while
Python reads its `site` (the .pth files), is the interpreter's own."""

from __future__ import annotations

import signal
import sys
# threading here, not in the handler: a Ctrl-C that came inside threading's own import
# found it there partly initialised ("no attribute 'Timer'", a traceback)
import threading
import time

EXIT_INTERRUPTED = 130  # errors.EXIT_INTERRUPTED, whose module is not imported yet
INTERRUPTED_LINE = "error: interrupted (Ctrl-C)\n"
AGAIN_S = 0.01  # how soon a Ctrl-C put off by an import is looked at again
GIVE_UP_S = 10.0  # an import that lasts longer than this after Ctrl-C is interrupted anyway


def in_an_import(frame) -> bool:
    """Whether `frame`, or a frame that called it, is the import machinery's: a module is
    being imported (its body runs below importlib's frames), or importlib is tidying up."""
    while frame is not None:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


class CtrlCAfterImports:
    """The SIGINT handler: Python's own (KeyboardInterrupt), except inside an import, where
    the interrupt is put off (SIGINT sent to the main thread again AGAIN_S later, as often as
    needed) until the import is done, for at most GIVE_UP_S. A handler that calls this one as
    the one it replaced (board.echoes_ignored) gets the KeyboardInterrupt at once."""

    def __init__(self) -> None:
        self.put_off_since: "float | None" = None
        self.again_pending = False

    def __call__(self, signum, frame):
        self.again_pending = False
        frame = frame if frame is not None else sys._getframe(1)
        if signal.getsignal(signal.SIGINT) is self and in_an_import(frame):
            now = time.monotonic()
            if self.put_off_since is None:
                self.put_off_since = now
            if now - self.put_off_since < GIVE_UP_S:
                self._again()
                return
        self.put_off_since = None
        raise KeyboardInterrupt

    def _again(self) -> None:
        if self.again_pending:  # a second Ctrl-C meanwhile: the one interrupt to come
            return
        self.again_pending = True
        timer = threading.Timer(AGAIN_S, signal.pthread_kill,
                                (threading.main_thread().ident, signal.SIGINT))
        timer.daemon = True  # nothing of it outlives the command
        timer.start()


def ctrl_c_after_imports() -> None:
    """Install CtrlCAfterImports where Ctrl-C is Python's own, or held by the package's first
    import (edge_remat._ctrl_c_held) (not where the command was started with SIGINT ignored,
    nor twice)."""
    from . import _ctrl_c_held
    if signal.getsignal(signal.SIGINT) in (signal.default_int_handler, _ctrl_c_held):
        signal.signal(signal.SIGINT, CtrlCAfterImports())


def ctrl_c_held_before() -> bool:
    """Whether a Ctrl-C came while the package's first import held it (the console script's
    imports, before main): the command then ends at once, as interrupted."""
    from . import _ctrl_c_held
    return _ctrl_c_held.pressed


def status_with_ctrl_c_put_off(code: int) -> int:
    """The exit status of a command that ended with `code`: a Ctrl-C put off by an import
    and not yet taken when the command had done its work (a plan of a tiny graph ends
    within milliseconds of its last import) is said, and the status is 130: it was not
    lost. What the command wrote is whole."""
    handler = signal.getsignal(signal.SIGINT)
    if code == 0 and isinstance(handler, CtrlCAfterImports) and \
            handler.put_off_since is not None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        sys.stderr.write("error: interrupted (Ctrl-C) as the command ended; what it wrote "
                         "is complete\n")
        return EXIT_INTERRUPTED
    return code


def main() -> None:
    try:
        ctrl_c_after_imports()
        if ctrl_c_held_before():  # in the console script's imports: nothing has run
            raise KeyboardInterrupt
        from .cli import main as run_cli
    except KeyboardInterrupt:
        sys.stderr.write(INTERRUPTED_LINE)
        sys.exit(EXIT_INTERRUPTED)
    try:
        run_cli()  # ends with sys.exit
    except KeyboardInterrupt:  # one that came before or after every command's own handling
        sys.stderr.write(INTERRUPTED_LINE)
        sys.exit(EXIT_INTERRUPTED)
    finally:  # the command has ended: a Ctrl-C now would only be a traceback in this import
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from edge_remat_agent.process_exit import skip_exit_collections
        skip_exit_collections()
