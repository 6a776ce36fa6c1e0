"""The host side of edge-remat: CLI, graph import, planner, transports, deploy, reports."""

# First of all, the `edge-remat` command's Ctrl-C is held (_ctrl_c_held). _signal, not
# signal: the interpreter has it loaded already, so no import comes before the handler.
import _signal


def _ctrl_c_held(signum, frame) -> None:
    """The `edge-remat` command's SIGINT handler from its first import of ours until its
    entry (entry.main) runs: a Ctrl-C is noted, and entry.main ends the command with its one
    line, exit 130 (QA: one in these milliseconds printed a KeyboardInterrupt traceback from
    the console script's `from edge_remat.entry import main`, exit 1)."""
    _ctrl_c_held.pressed = True


_ctrl_c_held.pressed = False
if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
    _signal.signal(_signal.SIGINT, _ctrl_c_held)
    import sys as _sys
    # Only for the `edge-remat` console script (its __main__ is that file): code that
    # imports edge_remat as a library keeps Python's Ctrl-C, and one that came meanwhile.
    if (getattr(_sys.modules.get("__main__"), "__file__", None) or "").replace("\\", "/") \
            .rsplit("/", 1)[-1] != "edge-remat":
        _signal.signal(_signal.SIGINT, _signal.default_int_handler)
        if _ctrl_c_held.pressed:
            raise KeyboardInterrupt

from edge_remat_agent import __version__  # noqa: E402 - after the handler

__all__ = ["__version__"]
