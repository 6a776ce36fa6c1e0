"""A call started in a child process without waiting for it (planner/isolated.py `Child`): the
result comes back, an error comes back as its message, a silent child is given up at the
timeout and stopped, a child that dies is said to have died."""

from __future__ import annotations

import math
import os
import time

import pytest

from edge_remat.planner import isolated


def test_a_child_returns_its_result_while_this_process_goes_on():
    child = isolated.Child(math.factorial, (3000,))
    try:
        assert child.result(timeout=30) == math.factorial(3000)
    finally:
        child.cancel()


def test_a_childs_error_comes_back_with_its_message():
    child = isolated.Child(math.sqrt, (-1,), what="the square root")
    with pytest.raises(RuntimeError, match="the square root failed: ValueError: math domain"):
        child.result(timeout=30)
    child.cancel()


def test_a_silent_child_is_given_up_at_the_timeout_and_stopped():
    child = isolated.Child(time.sleep, (60,))
    began = time.perf_counter()
    with pytest.raises(TimeoutError, match="no result in 0.5 s"):
        child.result(timeout=0.5)
    assert time.perf_counter() - began < 5
    child.cancel()
    assert child.process.returncode is not None and child.process.returncode < 0  # killed


def test_a_child_that_dies_is_said_to_have_died():
    child = isolated.Child(os._exit, (3,))
    with pytest.raises(RuntimeError, match=r"died \(exit code 3\)"):
        child.result(timeout=30)
    child.cancel()
