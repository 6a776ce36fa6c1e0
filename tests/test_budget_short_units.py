"""`--budget 4M`: the short decimal units (k, M, G, T) are read as kB, MB, GB, TB, which a
warning says (4M is 4,000,000 bytes; 4MiB is 4,194,304), as a bare `--budget 50` read as 50
bytes is warned of; and the unknown-unit message lists them. QA: `--budget 4M` was read as
4,000,000 bytes without a word, though M was not in the message's list of known units."""

from __future__ import annotations

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph


@pytest.mark.parametrize("budget,line", [
    ("4M", "warning: --budget 4M is read as 4,000,000 bytes (4 MB, decimal units): for 4 MiB "
           "(4,194,304 bytes), write 4MiB"),
    ("512k", "warning: --budget 512k is read as 512,000 bytes (512 kB, decimal units): for "
             "512 KiB (524,288 bytes), write 512KiB"),
    ("4MiB", None), ("4MB", None), ("0.9", None)])
def test_a_short_decimal_unit_is_warned_of(tmp_path, budget, line):
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", budget, "--time-limit", "3",
              "-o", tmp_path / "plan.json")
    assert "Traceback" not in run.stderr, run.stderr
    warnings = [w for w in run.stderr.splitlines() if w.startswith("warning: ")]
    if line is None:
        assert not [w for w in warnings if "read as" in w], run.stderr
    else:
        assert warnings == [line], run.stderr


def test_the_unknown_unit_message_names_the_short_decimal_units(tmp_path):
    refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "4Q", "-o",
                tmp_path / "plan.json"), BAD_INPUT, "unknown size unit 'q'",
            "k, M, G and T are kB, MB, GB and TB")
