"""A killed run leaves no page files behind: the next store opened on the same page directory
removes what a dead run left, never a live run's directory, never the user's files.

The runs are really killed (SIGKILL, so nothing of theirs gets to clean up): an executor in a
fresh interpreter, in the middle of a step with pages on flash (it only wraps FlashStore.put_many to
say when they are there), and bare page stores in forked processes. Nothing is mocked.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import torch

from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor import run_plan
from edge_remat_agent.pages import FlashStore
from edge_remat_agent.pages.flash import STORE_DIRECTORY
from helpers.executor_plans import (EXAMPLE, every_forward_recomputed, example_model, fresh,
                                    with_paging)

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="flock and SIGKILL are POSIX")

CHILD_TIMEOUT_S = 120  # a child that never says it is ready is killed, and the test fails

# An executor that stops in the middle of its first step, with two page files on flash, says where
# they are, and waits to be killed.
EXECUTOR = r"""
import os, sys, time
from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor import run_plan
from edge_remat_agent.formats import load_plan
from edge_remat_agent.pages import flash

example, plan_file, page_dir = sys.argv[1:]
captured = capture_model(example, batch=4, image=16)
sys.stdin.readline()  # the plan is written (the parent captured and planned meanwhile)
put_many = flash.FlashStore.put_many

def put_then_wait(self, items):
    size = put_many(self, items)
    if sum(name.endswith(".page") for name in os.listdir(self.directory)) == 2:
        print(self.directory, flush=True)
        time.sleep(600)
    return size

flash.FlashStore.put_many = put_then_wait
run_plan(captured.graph, load_plan(plan_file), 1000, page_dir, captured=captured,
         check_gradients=False)
"""


@contextlib.contextmanager
def child(script: str, *args: str):
    process = subprocess.Popen([sys.executable, "-c", script, *args], stdin=subprocess.PIPE,
                               stdout=subprocess.PIPE, text=True)
    watchdog = threading.Timer(CHILD_TIMEOUT_S, process.kill)
    watchdog.start()
    try:
        yield process
    finally:
        watchdog.cancel()
        if process.poll() is None:
            process.kill()
        process.wait()
        for stream in (process.stdin, process.stdout):
            with contextlib.suppress(OSError):
                stream.close()


def ready(process: subprocess.Popen) -> Path:
    """The store directory the child reports once its pages are on flash."""
    line = process.stdout.readline().strip()
    assert line, f"the child exited before it paged (exit code {process.wait()})"
    return Path(line)


def kill(process: subprocess.Popen) -> None:
    process.send_signal(signal.SIGKILL)
    assert process.wait() == -signal.SIGKILL


def sizes(directory: Path) -> dict[str, int]:
    return {p.name: p.stat().st_size for p in directory.iterdir()}


def user_files(page_dir: Path) -> dict[str, bytes]:
    """Things of the user's in the page directory, some named almost like a store's."""
    (page_dir / "edge-remat-pages-mine").mkdir()
    (page_dir / "edge-remat-pages-mine" / "notes.txt").write_bytes(b"mine")
    (page_dir / "edge-remat-pages-1-deadbeef.old").mkdir()  # not exactly a store's name
    (page_dir / "edge-remat-pages-1-deadbeef.old" / "x.page").write_bytes(b"old")
    (page_dir / "data.bin").write_bytes(b"\x00" * 100)
    elsewhere = page_dir.parent / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious").write_bytes(b"precious")
    (page_dir / "edge-remat-pages-2-cafef00d").symlink_to(elsewhere)  # named like a store's
    return snapshot(page_dir)


def snapshot(page_dir: Path) -> dict[str, bytes]:
    """Every file of the user's: in the page dir (store directories aside) and behind the link."""
    files = {}
    for root in (page_dir, page_dir.parent / "elsewhere"):
        for folder, folders, names in os.walk(root):  # links are not followed
            if folder == str(page_dir):
                folders[:] = [f for f in folders if not STORE_DIRECTORY.fullmatch(f)]
            for name in names:
                path = Path(folder) / name
                files[str(path.relative_to(page_dir.parent))] = path.read_bytes()
    return files


def test_a_killed_executor_leaves_no_pages_for_the_next_run(tmp_path):
    """SIGKILL an executor mid-step with pages on flash; the next run_plan on that page dir
    removes them and says so, and leaves a live store and the user's files alone."""
    plan_file, pages = tmp_path / "plan.json", tmp_path / "pages"
    pages.mkdir()
    mine = user_files(pages)

    with FlashStore(pages) as live:  # another run's store, alive all along
        live.put("kept", torch.arange(10.0))
        with child(EXECUTOR, EXAMPLE, str(plan_file), str(pages)) as executor:
            captured = fresh(capture_model(EXAMPLE, batch=4, image=16), example_model)
            graph = captured.graph
            plan = with_paging(every_forward_recomputed(graph), graph, every=1)
            plan.save(plan_file)
            executor.stdin.write("go\n")
            executor.stdin.flush()
            dead = ready(executor)
            kill(executor)
        left = sizes(dead)  # what SIGKILL left behind: the directory and its two page files
        assert dead.parent == pages and STORE_DIRECTORY.fullmatch(dead.name)
        assert len(left) == 2 and all(name.endswith(".page") for name in left)

        report = run_plan(graph, plan, 1, str(pages), captured=captured, seed=2)
        assert report["grad_check"]["bitwise_equal"] and report["page_outs"] > 0
        assert report["tiers"]["flash"]["cleaned_stale"] == {
            "directories": 1, "files": 2, "bytes": sum(left.values())}
        assert not dead.exists()
        assert live.cleaned_stale == {"directories": 0, "files": 0, "bytes": 0}
        assert torch.equal(live.get("kept"), torch.arange(10.0))  # the live store untouched
        stores = [p for p in pages.iterdir() if STORE_DIRECTORY.fullmatch(p.name)
                  and not p.is_symlink()]
        assert stores == [Path(live.directory)]  # the run removed its own directory too
    assert snapshot(pages) == mine  # the user's files, all of them, as they were
    assert sorted(p.name for p in pages.iterdir()) == sorted(
        ["edge-remat-pages-mine", "edge-remat-pages-1-deadbeef.old", "data.bin",
         "edge-remat-pages-2-cafef00d"])


class ForkedStore:
    """A child process with a page store of two pages in `page_dir`, forked (no second torch
    import: fast). `check()` has it read its pages back; `finish()` has it close its store and
    exit 0; `kill()` SIGKILLs it."""

    def __init__(self, page_dir: Path):
        commands, self._commands = os.pipe()
        self._answers, answers = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns into pytest
            code = 1
            try:
                os.close(self._commands)
                os.close(self._answers)
                with FlashStore(page_dir) as store, open(commands) as inbox, \
                        open(answers, "w") as outbox:
                    store.put("a", torch.arange(1000.0))
                    store.put("b", torch.ones(500))
                    print(store.directory, file=outbox, flush=True)
                    for _ in inbox:
                        same = (torch.equal(store.get("a"), torch.arange(1000.0))
                                and torch.equal(store.get("b"), torch.ones(500)))
                        print("ok" if same else "bad", file=outbox, flush=True)
                code = 0
            finally:
                os._exit(code)
        os.close(commands)
        os.close(answers)
        self.inbox = open(self._commands, "w")
        self.outbox = open(self._answers)
        watchdog = threading.Timer(CHILD_TIMEOUT_S, self.kill)
        watchdog.daemon = True
        watchdog.start()
        self.directory = Path(self.outbox.readline().strip())
        watchdog.cancel()

    def check(self) -> str:
        self.inbox.write("check\n")
        self.inbox.flush()
        return self.outbox.readline().strip()

    def finish(self) -> int:
        self.inbox.close()
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])

    def kill(self) -> int:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)
        return os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])


def test_a_store_removes_a_dead_process_pages_but_not_a_live_process(tmp_path):
    """Two processes with page stores on one page dir: one is SIGKILLed, the other lives on.
    A new store removes the dead one's directory only; the live one still reads its pages."""
    pages = tmp_path / "pages"
    doomed, alive = ForkedStore(pages), ForkedStore(pages)
    try:
        dead, living = doomed.directory, alive.directory
        assert dead.parent == living.parent == pages and dead != living
        assert doomed.kill() == -signal.SIGKILL
        left = sizes(dead)
        assert len(left) == 2 and set(sizes(living)) == set(left)

        with FlashStore(pages) as store:
            assert store.cleaned_stale == {"directories": 1, "files": 2,
                                           "bytes": sum(left.values())}
            assert not dead.exists() and living.is_dir()
            with FlashStore(pages) as another:  # nothing left to clean, and `store` is alive
                assert another.cleaned_stale == {"directories": 0, "files": 0, "bytes": 0}
                assert Path(store.directory).is_dir()
        assert alive.check() == "ok"  # its pages, whole
        assert alive.finish() == 0
    finally:
        for process in (doomed, alive):
            with contextlib.suppress(ChildProcessError):
                process.kill()
    assert list(pages.iterdir()) == []  # the live one cleaned up after itself when it closed
