"""benchmarks/executor.py's verdicts: a target was "met" from one median whose difference from
the target lay within the run's own noise (1.02x eager against a 1.03x target, with rounds
0.97x-1.08x). Now each round is held against eager's of the same round, and a target is met
or missed only where every round agrees; otherwise the verdict is "within noise"."""

from __future__ import annotations

import importlib.util
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.bad_inputs import env

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "executor.py"


def _benchmark():
    spec = importlib.util.spec_from_file_location("benchmark_executor", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_target_is_met_or_missed_only_where_every_round_says_so():
    bench = _benchmark()
    under = lambda ratio: ratio <= bench.EAGER_RATIO_TARGET  # noqa: E731
    assert bench.judged([0.98, 1.01, 1.02], under) == "met"
    assert bench.judged([1.05, 1.08, 1.04], under) == "MISSED"
    assert bench.judged([0.97, 1.08, 1.02], under) == "within noise"  # median 1.02: was "met"
    assert bench.judged([1.02], under).startswith("not judged")
    assert bench.spread([0.97, 1.08, 1.02], "{:.2f}x") == "3 rounds 0.97x to 1.08x"


@pytest.mark.slow  # ResNet-18 profiled, planned and trained in rounds: minutes
def test_the_quick_benchmark_judges_each_target_by_its_rounds(tmp_path):
    done = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--rounds", "2", "--steps",
                           "3", "--budgets", "1.0", "--time-limit", "2", "--page-dir",
                           str(tmp_path)], capture_output=True, text=True, env=env(),
                          timeout=900)
    assert done.returncode == 0, done.stderr
    verdicts = [line for line in done.stdout.splitlines() if re.match(r"# budget 1", line)]
    assert len(verdicts) == 2, done.stdout
    for line in verdicts:  # the verdict agrees with the rounds it prints
        printed = re.search(r"2 rounds ([-+\d.]+)[%x] to ([-+\d.]+)[%x]", line).groups()
        limit = 15.0 if "prediction" in line else 1.03
        # each round as printed, rounded: one printed at the limit may lie on either side of
        # it (CI: "1.03x" judged a miss, its figure above 1.03 before rounding)
        sides = [_sides(text, limit, "prediction" in line) for text in printed]
        expected = {"met" if all(both) else "MISSED" if not any(both) else "within noise"
                    for both in itertools.product(*sides)}
        assert any(re.search(rf"[ (]{verdict}[ ,]", line) for verdict in expected), \
            (expected, line)


def _sides(text: str, limit: float, absolute: bool) -> set[bool]:
    """Whether a round printed as `text` meets `limit`: both, where its rounding spans it."""
    half = 0.5 * 10 ** -len(text.partition(".")[2])
    value = float(text)
    return {(abs(v) if absolute else v) <= limit for v in (value - half, value + half)}
