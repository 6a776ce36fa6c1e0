"""What every command's --json prints is strict JSON (RFC 8259, what jq and JSON.parse read),
through one helper, outputs.print_json: a number that is not finite (a diverged run's loss) is
null, not Python's NaN or Infinity (QA: plan --json printed Infinity where a profile's op took
1e308 s; the bounds on files read now keep such figures out, and this is the second line)."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from helpers.bad_inputs import REPO


def test_printed_json_is_strict(capsys):
    from edge_remat.outputs import print_json
    print_json({"loss": math.nan, "losses": [1.0, math.inf, -math.inf], "at": Path("x")})

    def refuse(constant):
        raise AssertionError(f"{constant} is not strict JSON")
    assert json.loads(capsys.readouterr().out, parse_constant=refuse) == \
        {"loss": None, "losses": [1.0, None, None], "at": "x"}


def test_commands_print_json_only_through_print_json():
    """Where a command prints JSON by json.dumps itself, NaN and Infinity reach stdout
    (QA: plan --json printed Infinity)."""
    printed = re.compile(r"(print|echo)\(json\.dumps\(")
    found = [f"{path.relative_to(REPO)}:{n}" for path in (REPO / "host").rglob("*.py")
             for n, line in enumerate(path.read_text().splitlines(), 1)
             if printed.search(line) and path.name != "outputs.py"]
    assert not found, found
