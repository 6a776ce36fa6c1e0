"""A solver model's build that keeps to the time limit: the MILP's and CP-SAT's models are built
in Python, in time that grows with the graph, and a build that outlasts the limit leaves the
solver nothing to run in."""

from __future__ import annotations

import time as clock
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


class OutOfTime(Exception):
    """The model was not built before its deadline."""


def until(deadline: float, items: Iterable[T]) -> Iterator[T]:
    """`items`, the deadline (a time.perf_counter() time) checked before each: OutOfTime once
    it has passed."""
    for item in items:
        if clock.perf_counter() > deadline:
            raise OutOfTime
        yield item
