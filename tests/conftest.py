import os
import sys
from pathlib import Path

# Under pytest-xdist (`-n 2`) each worker gets a HOME of its own, set before anything imports
# edge_remat: the built-in local boards (device_configs/local.toml, emulated-board.toml) work in
# ~/.cache/edge-remat/..., and two tests on two workers would otherwise share that workdir, its
# daemon, its page folder and its memory cgroup (named after the workdir), and the agent
# archive and profile caches. One worker, or none, keeps HOME as it is.
_WORKER = os.environ.get("PYTEST_XDIST_WORKER")
if _WORKER and int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    _home = Path.home() / ".cache" / "edge-remat" / "test-workers" / _WORKER
    _home.mkdir(parents=True, exist_ok=True)
    os.environ["HOME"] = str(_home)

# Each worker's torch (and every board, daemon and CLI process a test starts, which inherit
# the environment) takes its share of the cores, not all of them: two workers of two threads
# each on two cores ran the executor, dtype and accumulate tests in 119-134 s, one thread each
# in 74 s. Set before anything imports torch; a value the caller gave is kept.
if _WORKER:
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    _share = max(1, (_cores or 1) // int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")))
    for _name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, str(_share))

# Let the tests import their shared helpers as `helpers.NAME` (tests/helpers/).
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402 - after the path, like the helpers it imports

from helpers.board_fixtures import local_bench_device, stop_agent  # noqa: E402
from helpers.executor_plans import user_capturer, zoo_capturer  # noqa: E402


@pytest.fixture
def bench(tmp_path, monkeypatch):
    """A local board named "bench" (EDGE_REMAT_DEVICE_CONFIGS) with its workdir under
    tmp_path: the workdir; its agent is stopped afterwards."""
    folder, workdir = local_bench_device(tmp_path, monkeypatch)
    yield workdir
    stop_agent(workdir)


# The executor tests' captures, made once per test module that asks for them.
@pytest.fixture(scope="module")
def zoo_captures():
    return zoo_capturer()


@pytest.fixture(scope="module")
def user_capture():
    return user_capturer()
