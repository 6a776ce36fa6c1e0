"""A capture the host traced of the graph it sends, handed to a board whose own trace would be
the same, so that the board's job need not trace it again.

    host:  params[TRACED] = the pushed answer (what isolated.trace_in_child returns, pickled),
           params[TRACED_KEY] = kept.capture_key(graph text, False, the board's agent build)
    board: keep_handed(read, graph_path) keeps it among the board's captures (kept.py), where
           that key is the board's own key for the graph; its capture then reads it back.

A job on a board of the host's torch, Python, machine and agent build (a local board, or an SSH
board on this machine) traced the graph the host had just traced: a child process, torch
imported again, the model built, the trace (3-8 s a job for mlp here). The key is the one the
board would keep its own trace under, so a handed answer is read back exactly where the
board's own would be; one traced for another board keys otherwise and is left unused.
"""

from __future__ import annotations

from pathlib import Path

TRACED, TRACED_KEY = "traced", "traced_key"
PARAMS = (TRACED, TRACED_KEY)


def keep_handed(read, graph_path: "Path | None") -> bool:
    """Keep the answer a job's params hand over (`read`: the job's JobParams) where its key is
    this board's for the graph at `graph_path`; whether it was kept."""
    import sys
    from .kept import answer_under, capture_key, keep_under, kept_folder
    answer_path = read.input_path(TRACED)
    key = read.params.get(TRACED_KEY)
    folder = kept_folder()
    if answer_path is None or graph_path is None or folder is None or not isinstance(key, str):
        return False
    # traced under another torch, Python or agent build: another key
    if capture_key(Path(graph_path).read_text(), False) != key:
        return False
    if answer_under(folder, key) is None:  # one kept already is the same answer
        keep_under(folder, key, answer_path.read_bytes())
    print(HANDED_LINE, file=sys.stderr)  # the job's log
    return True


HANDED_LINE = ("capture: the host's trace of this graph, handed with the job, is this board's "
               "own (the same torch, Python, machine and agent build): kept, and read back "
               "where the board would trace it")
