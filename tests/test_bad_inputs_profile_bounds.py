"""Bad-input catalogue, profiles bounded as graphs are (formats/fields.py: MAX_FIGURE, MIN_RATE,
MAX_RATE, check_figure, the one rule for both), and JSON written or printed strictly:

- a profile's op time or energy, latency, watts or joules a byte past 1e18, or a bandwidth or
  compute rate outside 1 to 2**60 a second, is refused on load with exit 2 naming the file and
  the field (QA: an op of 1e300 s planned a step of 2e300 s, a flash of 1e-300 B/s was "a
  number is too large (cannot convert float infinity to integer)", naming no file);
- Profile.save writes strict JSON, as Plan.save and Graph.save do (NotFiniteJSON);
- a size at the command line is bounded as a graph's sizes are (2**53 bytes, not 2**60).
"""

from __future__ import annotations

import json
import math
import re

import pytest

from helpers.bad_inputs import BAD_INPUT, REPO, cli, refused, tiny_graph

PROFILE = {"format": "edge-remat/profile", "version": 1, "name": "p", "source": "measured",
           "device": {}, "power": {"idle_w": 1.0, "active_w": 3.0},
           "ops": {"forward": {"time_s": 0.5, "energy_j": 1.0}},
           "compute": {"flops_per_s": 1e10, "bytes_per_s": 1e9},
           "tiers": {"flash": {"read_bytes_per_s": 1e8, "write_bytes_per_s": 1e8,
                               "latency_s": 0.001, "read_j_per_byte": 1e-9,
                               "write_j_per_byte": 1e-9,
                               "read_curve": [[65536, 0.001], [1048576, 0.01]]}}}


def _set(path: str, value):
    def change(profile):
        *parents, last = path.split(".")
        for key in parents:
            profile = profile[key]
        profile[last] = value
    return change


CASES = [
    ("op time 1e300", "ops.forward.time_s", 1e300, "at most 1e18 s"),
    ("op energy 1e300", "ops.forward.energy_j", 1e300, "at most 1e18 J"),
    ("latency 1e300", "tiers.flash.latency_s", 1e300, "at most 1e18 s"),
    ("write latency 1e300", "tiers.flash.write_latency_s", 1e300, "at most 1e18 s"),
    ("joules a byte 1e300", "tiers.flash.write_j_per_byte", 1e300, "at most 1e18 J"),
    ("idle watts 1e300", "power.idle_w", 1e300, "at most 1e18 W"),
    ("overhead 1e300", "compute.op_overhead_s", 1e300, "at most 1e18 s"),
    ("bandwidth 1e308", "tiers.flash.read_bytes_per_s", 1e308,
     "a bandwidth from 1 to 2**60 bytes/s"),
    ("bandwidth 1e-300", "tiers.flash.write_bytes_per_s", 1e-300,
     "a bandwidth from 1 to 2**60 bytes/s"),
    ("compute flops 1e-300", "compute.flops_per_s", 1e-300, "a rate from 1 to 2**60 FLOP/s"),
    ("compute bytes 1e308", "compute.bytes_per_s", 1e308, "a bandwidth from 1 to 2**60"),
    ("curve seconds 1e300", "tiers.flash.read_curve", [[65536, 0.001], [1048576, 1e300]],
     "at most 1e18 s"),
]


@pytest.mark.parametrize("case,field,value,words", CASES, ids=[c[0] for c in CASES])
def test_a_profile_figure_out_of_bounds_is_refused(tmp_path, case, field, value, words):
    profile = dict(json.loads(json.dumps(PROFILE)))
    _set(field, value)(profile)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(profile))
    shown = field + ("[1][1]" if field.endswith("_curve") else "")
    refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "90%", "--profile", path),
            BAD_INPUT, f"profile.json: field '{shown}'", words)


@pytest.mark.parametrize("field,value,words", [
    ("ops.forward.time_s", -1.0, "a number >= 0"),
    ("tiers.flash.read_bytes_per_s", 0, "a bandwidth from 1 to 2**60 bytes/s"),
], ids=["negative time", "bandwidth 0"])
def test_a_negative_figure_or_a_bandwidth_of_0_stays_refused(tmp_path, field, value, words):
    # guards: refused before too (the bandwidth's words were "a bandwidth > 0 bytes/s")
    from edge_remat_agent.formats import FormatError
    from edge_remat_agent.formats.profile import profile_from_dict
    profile = json.loads(json.dumps(PROFILE))
    _set(field, value)(profile)
    with pytest.raises(FormatError, match=re.escape(f"p.json: field '{field}'")) as error:
        profile_from_dict(profile, "p.json")
    assert words in str(error.value)


def test_a_flash_latency_option_out_of_bounds_names_the_option(tmp_path):
    refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "90%",
                "--flash-read-bw", "90MB", "--flash-write-bw", "90MB",
                "--flash-latency", "1e300"), BAD_INPUT, "--flash-latency", "at most 1e18 s")


def test_the_shipped_profiles_are_within_the_bounds():
    from edge_remat_agent.formats import load_profile
    shipped = sorted((REPO / "profiles").glob("*.json"))
    assert shipped
    for path in shipped:
        load_profile(path)


def test_a_profile_with_a_figure_that_is_not_finite_is_not_written(tmp_path):
    from edge_remat_agent.formats.fields import NotFiniteJSON
    from edge_remat_agent.formats.profile import profile_from_dict
    profile = profile_from_dict(json.loads(json.dumps(PROFILE)), "p.json")
    profile.idle_w = math.inf
    path = tmp_path / "p.json"
    with pytest.raises(NotFiniteJSON, match=r"cannot write .*p\.json: field 'power\.idle_w' "
                                            r"is inf, not a finite"):
        profile.save(path)
    assert list(tmp_path.iterdir()) == []  # nor its temporary file


def test_a_budget_past_what_a_graph_may_hold_is_refused(tmp_path):
    """The command line's sizes were bounded at 2**60 bytes (units.MAX_BYTES), a graph's at
    2**53 (MAX_GRAPH_BYTES): one rule now."""
    refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "16384TiB"), BAD_INPUT,
            "budget '16384TiB' is larger than any board's memory",
            f"at most {2**53} bytes, 8192 TiB")
    assert cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "8192TiB", "--solver",
               "heuristic:keep-all").returncode == 0
