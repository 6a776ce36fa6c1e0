"""A busy power below the idle one: never a negative compute energy.

QA: a profile edited to idle_w 10, active_w 1 planned "energy 0.8907 J (compute -8.017, ...)",
and `run --profile` with it wrote energy_compute_j -18.0 into plan.json; noise alone can bring
a measured pair close (idle 9.84 W against busy 10.0 W was measured). Beyond noise such a
profile is refused; within it, compute costs 0 W above idle; the profiler never writes it.
"""

from __future__ import annotations

import json

import pytest
from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph

from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import load_graph
from edge_remat_agent.formats.profile import load_profile, profile_from_dict
from edge_remat_agent.profiler import measured_profile


def _profile(idle_w: float, active_w: float) -> dict:
    return {"format": "edge-remat/profile", "version": 1, "name": "p", "source": "measured",
            "device": {}, "power": {"idle_w": idle_w, "active_w": active_w}, "tiers": {},
            "ops": {}}


def test_a_profile_whose_busy_power_is_below_idle_is_refused(tmp_path):
    graph = tiny_graph(tmp_path)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(_profile(10.0, 1.0)))
    line = refused(cli("plan", "--graph", graph, "--budget", "0.8", "--profile", profile,
                       "--objective", "energy"), BAD_INPUT, "active_w", "idle_w", "measure")
    assert "-8.017" not in line


def test_within_noise_compute_costs_no_energy_and_never_less(tmp_path):
    """Busy 9.9 W against idle 10 W (1% below: noise): taken, compute at 0 W above idle."""
    profile = profile_from_dict(_profile(10.0, 9.9))
    costs = build_costs(load_graph(tiny_graph(tmp_path)), profile)
    assert costs.energy_j == [0.0] * 5 and costs.static_w == 10.0
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(_profile(10.0, 9.9)))
    proc = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.8", "--profile", path,
               "--objective", "energy", "--output", tmp_path / "plan.json")
    assert proc.returncode == 0, proc.stderr
    predicted = json.loads((tmp_path / "plan.json").read_text())["predicted"]
    assert predicted["energy_compute_j"] == 0.0
    assert predicted["energy_j"] == pytest.approx(predicted["energy_static_j"])


def test_the_profiler_never_writes_a_busy_power_below_idle(tmp_path):
    """Its busy window read below its idle one: active_w is idle_w, and the profile says so."""
    from edge_remat_agent.profiler.power import power_read
    power = power_read(9.84, 9.70, "rapl", False, [], 2.0, 2.0, 2, {})
    assert power.active_w == power.idle_w == 9.84 and power.busy_read_w == 9.70
    path = tmp_path / "profile.json"
    measured_profile({"board": "b"}, power).save(path)
    profile = load_profile(path)
    assert profile.active_w == profile.idle_w == 9.84
    said = profile.measurements["power"]
    assert said["busy_read_w"] == 9.70 and "below the idle" in said["note"]
    usual = power_read(2.0, 10.0, "rapl", False, [], 2.0, 2.0, 2, {})
    assert usual.active_w == 10.0 and usual.busy_read_w is None and usual.note is None
