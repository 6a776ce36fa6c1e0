"""Hand the two workers the heaviest test files first, so no long file starts last.

With `--dist loadfile` each file runs whole on one worker, in the order the controller queues
them. pytest-xdist's own order (most tests first) queues the end-to-end files, a few tests of
minutes each, last; one of them starting as the other worker runs dry leaves that worker idle
for minutes. Longest first (the classic list-scheduling rule) bounds that tail by the shortest
files. The weights are each file's seconds in a whole run, kept in `tests/file_seconds.json`;
`--record-file-seconds PATH` writes them anew from a run (`-m ""`, on a quiet machine).
`pyproject.toml` passes `--no-loadscope-reorder` so xdist keeps the order given here.
"""

import json
import statistics
from collections import defaultdict
from pathlib import Path

WEIGHTS = Path(__file__).resolve().parent.parent / "file_seconds.json"


def pytest_addoption(parser):
    parser.addoption(
        "--record-file-seconds", metavar="PATH", default=None,
        help="write each test file's seconds in this run (setup, call and teardown) to PATH, "
             "as tests/file_seconds.json holds them")


def file_of(nodeid):
    return nodeid.split("::", 1)[0]


def load_weights(path=WEIGHTS):
    try:
        return {str(name): float(seconds) for name, seconds in json.loads(path.read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}  # no table: xdist's order stands, only less balanced


def heaviest_first(items, weights):
    """`items` reordered by their file's weight, heaviest first; a file's own tests keep their
    order. A file the table lacks (a new one) weighs the median file."""
    if not weights:
        return list(items)
    default = statistics.median(weights.values())
    rank = {}
    for item in items:
        name = file_of(item.nodeid)
        rank.setdefault(name, (-weights.get(name, default), len(rank)))
    return sorted(items, key=lambda item: rank[file_of(item.nodeid)])


def pytest_collection_modifyitems(session, config, items):
    items[:] = heaviest_first(items, load_weights())


class FileSeconds:
    """Sums each file's report durations as the controller (or the lone process) receives them."""

    def __init__(self, path):
        self.path = Path(path)
        self.seconds = defaultdict(float)

    def pytest_runtest_logreport(self, report):
        self.seconds[file_of(report.nodeid)] += report.duration

    def pytest_sessionfinish(self, session):
        table = {name: round(seconds, 1) for name, seconds in sorted(self.seconds.items())}
        self.path.write_text(json.dumps(table, indent=1) + "\n")


def pytest_configure(config):
    path = config.getoption("--record-file-seconds")
    # Under xdist only the controller records: the workers' reports reach it too.
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(FileSeconds(path), "file-seconds")
