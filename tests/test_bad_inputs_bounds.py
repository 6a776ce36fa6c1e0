"""Bad-input catalogue, numbers past what a file may hold, and graph fields with values nothing
knows. Each was an internal error (exit 70), or a plan of Infinity and NaN, or was planned and
trained without a word; now the real CLI refuses it with exit 2 and one line naming the file and
the field (helpers/bad_inputs.py):

- a JSON integer longer than Python converts (4300 digits), in a graph, a plan, a profile, a
  sweep, for every command that reads them (was "internal error (ValueError: Exceeds the limit
  (4300 digits) for integer string conversion ...)"); an integer too large for a float where a
  number is read (10**400 seconds), named with its file;
- a graph whose sizes add up past 2**53 bytes (MAX_GRAPH_BYTES; at 2**60 a size its plain
  peak passed the planner's 2**62 "no budget" and keep_all found nothing, "TypeError: object
  of type 'NoneType' has no len()"), whatever the solver;
- a node time or energy past 1e18 (MAX_FIGURE: 1e308 s a node planned a step of inf s,
  TDI NaN, and wrote a plan of Infinity and NaN that simulate refused); the plan writer
  refuses NaN and infinities (NotFiniteJSON) instead of writing them;
- a graph's `dtype` or a node's `attrs.home` (`attrs.io.tier`) that is no dtype or tier.
"""

from __future__ import annotations

import json
import math

import pytest

from helpers.bad_inputs import (BAD_INPUT, cli, env, no_new_files, refused, tiny_graph,
                                tiny_plan, tree)
from edge_remat_agent.formats import Plan
from edge_remat_agent.formats.fields import dump_json

# the dtypes a capture (torch's names) or an ONNX import writes (formats.graph.DTYPES)
DTYPES = ("float32", "float16", "bfloat16", "float64")

DIGITS = "9" * 5000  # past sys.get_int_max_str_digits() (4300)
TOO_LONG = ["a number of at most 4300 digits", "an integer of 5000 digits"]
CAPTURED = {"source": {"model": "mlp"}}  # names its model, as deploy needs


def _with_digits(path, field: str) -> None:
    """Replace the first `"field": <number>` in the file with a 5000-digit integer."""
    text = path.read_text()
    start = text.index(f'"{field}": ') + len(f'"{field}": ')
    end = start
    while text[end] in "0123456789.-e":
        end += 1
    path.write_text(text[:start] + DIGITS + text[end:])


def _graph(tmp_path, change, name="bad.json", **overrides):
    """The tiny graph, its JSON object changed by `change`, written to `name`."""
    obj = json.loads(tiny_graph(tmp_path, "good-graph.json", **overrides).read_text())
    change(obj)
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


# --- 3: integers longer than 4300 digits ------------------------------------------------------

def test_long_integer_in_a_graph_is_refused_by_plan(tmp_path):
    graph = tiny_graph(tmp_path, fixed_bytes=1)
    _with_digits(graph, "fixed_bytes")
    before = tree(tmp_path)
    refused(cli("plan", "--graph", graph, "--budget", "90%", "-o", tmp_path / "x.json"),
            BAD_INPUT, "tiny.json: field 'fixed_bytes'", *TOO_LONG)
    no_new_files(before, tmp_path)


def test_long_integer_in_a_node_names_the_node(tmp_path):
    graph = tiny_graph(tmp_path)
    _with_digits(graph, "out_bytes")
    refused(cli("plan", "--graph", graph, "--budget", "90%"), BAD_INPUT,
            "field 'nodes[0].out_bytes'", *TOO_LONG)


def test_long_integer_in_a_plan_is_refused_by_simulate_deploy_and_plot(tmp_path, bench):
    graph = tiny_graph(tmp_path, capture=CAPTURED)
    plan = tiny_plan(tmp_path, graph)
    _with_digits(plan, "budget_bytes")
    words = ["plan.json: field 'budget_bytes'", *TOO_LONG]
    refused(cli("simulate", plan, "--graph", graph), BAD_INPUT, *words)
    before = tree(tmp_path)
    refused(cli("plot", "--plan", plan, "--graph", graph, "--out", tmp_path / "plots"),
            BAD_INPUT, *words)
    refused(cli("deploy", plan, "--device", "bench", "--graph", graph, "--out",
                tmp_path / "out", environ=env()), BAD_INPUT, *words)
    assert not bench.exists(), "something was sent to the board"
    no_new_files(before, tmp_path)


def test_long_integer_in_a_graph_is_refused_by_deploy(tmp_path, bench):
    graph = tiny_graph(tmp_path, capture=CAPTURED, fixed_bytes=1)
    plan = tiny_plan(tmp_path, graph)
    _with_digits(graph, "fixed_bytes")
    refused(cli("deploy", plan, "--device", "bench", "--graph", graph, "--out",
                tmp_path / "out", environ=env()), BAD_INPUT, "tiny.json: field 'fixed_bytes'",
            *TOO_LONG)
    assert not bench.exists(), "something was sent to the board"


def test_long_integer_in_a_profile_is_refused_by_plan(tmp_path):
    graph = tiny_graph(tmp_path)
    profile = tmp_path / "profile.json"
    profile.write_text(json.dumps(
        {"format": "edge-remat/profile", "version": 1, "name": "p", "source": "measured",
         "device": {}, "power": {"idle_w": 1.0, "active_w": 3.0}, "ops": {},
         "tiers": {"flash": {"read_bytes_per_s": 1e8, "write_bytes_per_s": 1e8,
                             "capacity_bytes": 1}}}))
    _with_digits(profile, "capacity_bytes")
    refused(cli("plan", "--graph", graph, "--budget", "90%", "--profile", profile), BAD_INPUT,
            "profile.json: field 'tiers.flash.capacity_bytes'", *TOO_LONG)


def test_long_integer_in_a_sweep_is_refused_by_plot(tmp_path):
    sweep = tmp_path / "sweep.json"
    sweep.write_text(json.dumps({"objective": "time", "sweep": [{"budget_bytes": 1}]}))
    _with_digits(sweep, "budget_bytes")
    refused(cli("plot", "--sweep", sweep, "--out", tmp_path / "plots"), BAD_INPUT,
            "sweep.json: field 'sweep[0].budget_bytes'", *TOO_LONG)


def test_integer_too_large_for_a_float_names_its_file_and_field(tmp_path):
    # 10**400 where a number (a float) is read: OverflowError, said without the file
    graph = tiny_graph(tmp_path)
    graph.write_text(graph.read_text().replace('"time_s": 1.0', '"time_s": 1' + "0" * 400, 1))
    refused(cli("plan", "--graph", graph, "--budget", "90%"), BAD_INPUT,
            "tiny.json: field 'nodes[0].time_s'", "a finite number")


# --- 4: sizes past 2**53 bytes together -------------------------------------------------------

def _every_size(value: int):
    def change(graph):
        graph["fixed_bytes"] = value
        for node in graph["nodes"]:
            node["out_bytes"] = node["workspace_bytes"] = value
    return change


@pytest.mark.parametrize("solver", [None, "milp", "heuristic:descent"])
def test_sizes_of_2_60_are_refused(tmp_path, solver):
    # QA's graph: each size 2**60, which the host's own check (checks.check_sizes) allowed
    graph = _graph(tmp_path, _every_size(2**60))
    before = tree(tmp_path)
    line = refused(cli("plan", "--graph", graph, "--budget", "50%", "-o", tmp_path / "ph.json",
                       "--force", *(["--solver", solver] if solver else [])), BAD_INPUT,
                   "bad.json: field 'fixed_bytes'", "add up to at most 2**53 bytes (8 PiB",
                   f"got {2**60}")
    assert "up to this one" not in line  # it alone passes the bound
    no_new_files(before, tmp_path)


def test_sizes_past_2_53_together_are_refused(tmp_path):
    graph = _graph(tmp_path, _every_size(2**51))  # the fifth size passes it
    refused(cli("plan", "--graph", graph, "--budget", "50%"), BAD_INPUT,
            "bad.json: field 'nodes[1].workspace_bytes'", "2**53 bytes",
            f"got {2**51}: the sizes up to this one add up to {5 * 2**51} bytes")


def test_sizes_past_2_53_in_a_node_link_graph_are_refused(tmp_path):
    graph = tmp_path / "links.json"
    graph.write_text(json.dumps({"directed": True, "graph": {},
                                 "nodes": [{"id": 0, "cost_cpu": 1, "cost_ram": 2**52},
                                           {"id": 1, "cost_cpu": 1, "cost_ram": 2**52},
                                           {"id": 2, "cost_cpu": 1, "cost_ram": 2**52}],
                                 "links": [{"source": 0, "target": 1},
                                           {"source": 1, "target": 2}]}))
    refused(cli("plan", "--graph", graph, "--budget", "50%"), BAD_INPUT,
            "links.json: field 'nodes[2].out_bytes'", "2**53 bytes")


def test_sizes_just_under_2_53_plan_and_replay(tmp_path):
    """Below the bound the figures are exact: the plain peak, the budget, the replay."""
    nodes = 5
    share = 2**53 // (2 * nodes + 1)
    graph = _graph(tmp_path, _every_size(share), "edge.json")
    plan = tmp_path / "p.json"
    proc = cli("plan", "--graph", graph, "--budget", "100%", "-o", plan, "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(plan.read_text())["predicted"]["peak_bytes"] <= 2**53
    proc = cli("simulate", plan, "--graph", graph)
    assert proc.returncode == 0 and "valid plan" in proc.stdout, proc.stdout + proc.stderr


# --- 5: node times and energies past 1e18 ------------------------------------------------------

def _every_node(**fields):
    def change(graph):
        for node in graph["nodes"]:
            node.update(fields)
    return change


@pytest.mark.parametrize("field,unit", [("time_s", "s"), ("energy_j", "J")])
def test_node_figures_past_1e18_are_refused(tmp_path, field, unit):
    graph = _graph(tmp_path, _every_node(**{field: 1e308}))
    before = tree(tmp_path)
    refused(cli("plan", "--graph", graph, "--budget", "120%", "-o", tmp_path / "p.json",
                "--force"), BAD_INPUT, f"bad.json: field 'nodes[0].{field}'",
            f"at most 1e18 {unit} a node", "1e+308")
    no_new_files(before, tmp_path)


def test_page_costs_past_1e18_are_refused(tmp_path):
    def costs(out_time_s):
        return {"page_costs": {"flash": {"out_time_s": out_time_s, "out_energy_j": 0.0,
                                         "in_time_s": 0.1, "in_energy_j": 0.0}}}

    def change(graph):
        for i, node in enumerate(graph["nodes"]):
            node["attrs"] = costs(1e300 if i == 1 else 0.1)
    graph = _graph(tmp_path, change)
    refused(cli("plan", "--graph", graph, "--budget", "80%"), BAD_INPUT,
            "field 'nodes[1].attrs.page_costs.flash.out_time_s'", "at most 1e18 s")


def test_node_times_of_1e18_plan_to_finite_figures(tmp_path):
    graph = _graph(tmp_path, _every_node(time_s=1e18, energy_j=1e18), "slow.json")
    plan = tmp_path / "p.json"
    proc = cli("plan", "--graph", graph, "--budget", "80%", "-o", plan, "--json")
    assert proc.returncode == 0, proc.stderr
    for text in (plan.read_text(), proc.stdout):
        assert "Infinity" not in text and "NaN" not in text
    assert math.isfinite(json.loads(plan.read_text())["predicted"]["time_s"])
    assert cli("simulate", plan, "--graph", graph).returncode == 0


def test_a_plan_with_a_figure_that_is_not_finite_is_not_written(tmp_path):
    from edge_remat_agent.formats.fields import NotFiniteJSON
    plan = Plan(stages=[], graph_fingerprint="g", budget_bytes=1, objective="time",
                solver={"name": "x", "lower_bound": math.inf}, predicted={"time_s": math.nan})
    path = tmp_path / "p.json"
    with pytest.raises(NotFiniteJSON, match=r"cannot write .*p\.json: field "
                                            r"'solver\.lower_bound' is inf, not a finite"):
        plan.save(path)
    assert list(tmp_path.iterdir()) == []  # nor its temporary file


def test_reports_keep_a_diverged_loss(tmp_path):
    """A run's report holds a loss that went inf as a measurement (run --resume reads it)."""
    dump_json({"steps": [{"loss": math.inf}]}, tmp_path / "report.json")
    assert json.loads((tmp_path / "report.json").read_text())["steps"][0]["loss"] == math.inf


# --- 12: dtype and home -----------------------------------------------------------------------

FIELD_CASES = [
    ("dtype fp64", lambda g: g.update(dtype="fp64"), "field 'dtype'",
     "one of 'float32', 'float16', 'bfloat16', 'float64', got 'fp64'"),
    ("dtype float8", lambda g: g.update(dtype="float8_e4m3fn"), "field 'dtype'", "'float32'"),
    ("update homed on disk",
     lambda g: g["nodes"][5]["attrs"].update(home="disk"), "field 'nodes[5].attrs.home'",
     "one of 'flash', 'host', got 'disk'"),
    ("io on disk",
     lambda g: g["nodes"][5]["attrs"].update(home="flash", io={"tier": "disk", "read_bytes": 0,
                                                                "write_bytes": 0}),
     "field 'nodes[5].attrs.io.tier'", "one of 'flash', 'host', got 'disk'"),
]


def _with_update(graph: dict) -> None:
    graph["nodes"].append({"id": "u", "kind": "update", "op": "sgd_update", "inputs": ["ga"],
                           "out_bytes": 0, "time_s": 0.1, "attrs": {}})


@pytest.mark.parametrize("case,change,where,words", FIELD_CASES,
                         ids=[c[0] for c in FIELD_CASES])
def test_unknown_dtype_or_home_is_refused(tmp_path, case, change, where, words):
    graph = _graph(tmp_path, lambda g: (_with_update(g), change(g)))
    before = tree(tmp_path)
    refused(cli("plan", "--graph", graph, "--budget", "90%", "-o", tmp_path / "q.json"),
            BAD_INPUT, f"bad.json: {where}", words)
    no_new_files(before, tmp_path)


@pytest.mark.parametrize("case,change,where,words", FIELD_CASES[::2],
                         ids=[c[0] for c in FIELD_CASES[::2]])
def test_deploy_refuses_an_unknown_dtype_or_home_before_sending(tmp_path, bench, case, change,
                                                                 where, words):
    # QA: deploy trained such a graph, exit 0, without a word
    good = _graph(tmp_path, _with_update, "good.json", capture=CAPTURED)
    plan = tiny_plan(tmp_path, good)
    graph = _graph(tmp_path, lambda g: (_with_update(g), change(g)), capture=CAPTURED)
    refused(cli("deploy", plan, "--device", "bench", "--graph", graph, "--out",
                tmp_path / "out", environ=env()), BAD_INPUT, f"bad.json: {where}", words)
    assert not bench.exists(), "something was sent to the board"


@pytest.mark.parametrize("dtype", [*DTYPES, None])
def test_every_dtype_a_capture_or_import_writes_is_accepted(tmp_path, dtype):
    from edge_remat_agent.formats.graph import DTYPES as accepted
    assert set(DTYPES) == set(accepted)
    graph = _graph(tmp_path, lambda g: g.update(dtype=dtype))
    assert cli("plan", "--graph", graph, "--budget", "90%").returncode == 0


@pytest.mark.parametrize("tier", ["flash", "host"])
def test_updates_homed_on_a_page_tier_are_accepted(tmp_path, tier):
    io = {"tier": tier, "read_bytes": 1000, "write_bytes": 2000}
    graph = _graph(tmp_path, lambda g: (_with_update(g),
                                        g["nodes"][5]["attrs"].update(home=tier, io=io)))
    proc = cli("plan", "--graph", graph, "--budget", "100%")
    assert proc.returncode == 0, proc.stderr
