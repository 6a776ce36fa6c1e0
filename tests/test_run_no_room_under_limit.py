"""A memory limit that leaves nothing for training beside the runtime and its headroom, with
parameters anywhere: the line before the flash graph's capture says so, not that the budget
is below what parameters in RAM allow. QA: `run --device local --memory-limit 300MiB --model
digits-cnn --steps 2` profiled, said "the budget is below what parameters in RAM allow:
capturing again with parameters ... homed on flash", captured again, and only then "error: the
memory limit (300 MiB) leaves nothing for training ...: give --memory-limit 421MiB or more".
The flash graph is still captured: its floor, the lowest, names the limit to give. This
machine's profile (runtime 231 MiB), so nothing is profiled."""

from __future__ import annotations

import pytest
from helpers.board_fixtures import local_board
from helpers.local_runs import PROFILE

from edge_remat.cgroup import unavailable_reason

CGROUP = unavailable_reason()


@pytest.mark.slow  # two captures of digits-cnn through the CLI (~10 s)
@pytest.mark.cgroup
@pytest.mark.skipif(CGROUP is not None, reason=f"no memory cgroup: {CGROUP}")
def test_a_limit_that_leaves_nothing_says_so_before_capturing_again(tmp_path):
    from typer.testing import CliRunner
    from edge_remat.cli import app
    with local_board(tmp_path, "bench"):
        result = CliRunner().invoke(app, [
            "run", "--device", "bench", "--memory-limit", "300MiB", "--model", "digits-cnn",
            "--steps", "2", "--profile", str(PROFILE), "--no-plots", "--out",
            str(tmp_path / "out")])
    err = result.stderr
    assert result.exit_code == 2 and "Traceback" not in err, (result.stdout, err)
    assert "below what parameters in RAM allow" not in err, err
    nothing = "the memory limit (300 MiB) leaves nothing for training after the runtime's own " \
        "231 MiB and 160 MiB headroom"
    assert f"{nothing}: capturing again with parameters and optimizer state homed on flash " \
        "(their lowest floor) to name the memory limit to give" in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"error: {nothing}: give --memory-limit ") and \
        last.endswith("MiB or more"), last
