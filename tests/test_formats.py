"""The file formats: bad input is a FormatError (or, for a plan that cannot run, a PlanError) that
names the file, the field and what was expected; good input round-trips; the published benchmark
graphs import with the sizes and orders their README gives."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from edge_remat.importers.graph_import import load_graph_file
from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import (FormatError, Graph, Instruction, Node, OpCost, Plan, Profile,
                                      Tier, graph_from_dict, load_graph, load_plan, load_profile,
                                      plan_from_dict)
from edge_remat_agent.simulate import PlanError, simulate

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
GRAPHS = SHARED / "benchmarks" / "graphs"
needs_shared = pytest.mark.skipif(not GRAPHS.is_dir(),
                                  reason=f"benchmark graphs not found at {GRAPHS} (shared/ sits "
                                         "beside the repository root)")


# --- helpers -----------------------------------------------------------------------------------

def tiny_graph_dict() -> dict:
    """Five nodes in our own format: a -> b -> loss -> grad_b -> grad_a."""
    return {"format": "edge-remat/graph", "version": 1, "name": "tiny", "nodes": [
        {"id": "a", "kind": "forward", "op": "conv", "inputs": [], "out_bytes": 1000,
         "time_s": 1.0},
        {"id": "b", "kind": "forward", "op": "conv", "inputs": ["a"], "out_bytes": 1000,
         "time_s": 2.0},
        {"id": "l", "kind": "loss", "op": "loss", "inputs": ["b"], "out_bytes": 100,
         "time_s": 0.5},
        {"id": "gb", "kind": "backward", "op": "conv_bw", "inputs": ["l", "b"], "out_bytes": 1000,
         "time_s": 2.0},
        {"id": "ga", "kind": "backward", "op": "conv_bw", "inputs": ["gb", "a"], "out_bytes": 100,
         "time_s": 1.0},
    ]}


def node_link_dict() -> dict:
    """Three nodes in Checkmate's node-link dialect: 0 -> 1 -> 2."""
    return {"directed": True, "multigraph": False, "graph": {"name": "nl"},
            "nodes": [{"id": i, "name": f"n{i}", "cost_cpu": 1 + i, "cost_ram": 10,
                       "backward": i == 2} for i in range(3)],
            "links": [{"source": 0, "target": 1}, {"source": 1, "target": 2}]}


def plain_stages(graph: Graph) -> list[list[Instruction]]:
    """Every node once, in order, freeing each output after its last user (valid for any graph)."""
    last_use = {n.id: k for k, n in enumerate(graph.nodes)}
    for k, n in enumerate(graph.nodes):
        for dep in n.inputs:
            last_use[dep] = k
    stages = []
    for k, n in enumerate(graph.nodes):
        stage = [Instruction("compute", n.id)]
        stage += [Instruction("free", i) for i, last in last_use.items() if last == k]
        stages.append(stage)
    return stages


def plan_dict(graph: Graph, stages=None) -> dict:
    stages = plain_stages(graph) if stages is None else stages
    return Plan(stages=stages, graph_fingerprint=graph.fingerprint(), budget_bytes=10**9,
                solver={"name": "test"}, problem={"paging": []}).to_dict()


def write(tmp_path: Path, name: str, obj=None, text: str | None = None) -> Path:
    path = tmp_path / name
    path.write_text(text if text is not None else json.dumps(obj))
    return path


def expect_format_error(load, path: Path, field: str, *expected_words: str) -> FormatError:
    """`load(path)` raises a FormatError that names the file, the field and what was expected."""
    with pytest.raises(FormatError) as info:
        load(path)
    err = info.value
    message = str(err)
    assert str(path) in message, message
    assert err.source == str(path)
    assert field in err.field, (field, err.field)
    assert f"'{err.field}'" in message, message
    assert "expected" in message, message
    for word in expected_words:
        assert word.lower() in message.lower(), (word, message)
    return err


# --- malformed graphs --------------------------------------------------------------------------

@pytest.mark.parametrize("load", [load_graph, load_graph_file], ids=["load_graph", "import"])
def test_truncated_json(tmp_path, load):
    text = json.dumps(tiny_graph_dict())
    path = write(tmp_path, "cut.json", text=text[: len(text) // 2])
    expect_format_error(load, path, "<json line", "valid JSON")


def test_truncated_json_mid_utf8_character(tmp_path):
    raw = json.dumps(tiny_graph_dict() | {"name": "réseau"}, ensure_ascii=False).encode()
    cut = raw[: raw.index("é".encode()) + 1]  # half of the two-byte 'é'
    path = tmp_path / "cut_utf8.json"
    path.write_bytes(cut)
    expect_format_error(load_graph_file, path, "<", "JSON")


def test_missing_file(tmp_path):
    expect_format_error(load_graph_file, tmp_path / "absent.json", "<file>", "readable file")


@pytest.mark.parametrize("load", [load_graph, load_graph_file], ids=["load_graph", "import"])
@pytest.mark.parametrize("root", [[1, 2, 3], "graph", 42, None])
def test_root_not_an_object(tmp_path, load, root):
    path = write(tmp_path, "root.json", root)
    expect_format_error(load, path, "<root>", "a JSON object")


def test_unknown_node_in_inputs(tmp_path):
    g = tiny_graph_dict()
    g["nodes"][2]["inputs"] = ["b", "ghost"]
    err = expect_format_error(load_graph, write(tmp_path, "g.json", g), "nodes[2].inputs",
                              "ids of nodes in this graph")
    assert "ghost" in str(err)


def test_unknown_node_in_node_link_link(tmp_path):
    g = node_link_dict()
    g["links"].append({"source": 1, "target": 99})
    err = expect_format_error(load_graph_file, write(tmp_path, "nl.json", g), "links[2].target",
                              "node in this graph")
    assert "99" in str(err)


def test_unhashable_node_link_endpoint(tmp_path):
    g = node_link_dict()
    g["links"][0]["source"] = [0]
    expect_format_error(load_graph_file, write(tmp_path, "nl.json", g), "links[0].source",
                        "node")


def test_node_link_cycle(tmp_path):
    g = node_link_dict()
    g["links"].append({"source": 2, "target": 0})
    err = expect_format_error(load_graph_file, write(tmp_path, "cycle.json", g), "links", "cycle")
    # the cycle itself, in the links' direction (from whichever node it starts)
    assert any(f"the cycle {a} -> {b} -> {c} -> {a}" in str(err)
               for a, b, c in ((0, 1, 2), (1, 2, 0), (2, 0, 1)))


def test_node_link_cycle_with_order(tmp_path):
    # Before, this named 'nodes[0].inputs', a field of our format that the file does not have.
    g = node_link_dict()
    g["links"].append({"source": 2, "target": 0})
    g["graph"]["order"] = [0, 1, 2]
    expect_format_error(load_graph_file, write(tmp_path, "cycle.json", g), "links", "cycle")


def test_node_link_order_that_runs_a_node_before_its_input(tmp_path):
    g = node_link_dict()
    g["graph"]["order"] = [0, 2, 1]
    err = expect_format_error(load_graph_file, write(tmp_path, "order.json", g), "graph.order",
                              "after its inputs")
    assert "node 2 comes before its input 1" in str(err)


def test_node_link_self_loop(tmp_path):
    g = node_link_dict()
    g["links"].append({"source": 1, "target": 1})
    expect_format_error(load_graph_file, write(tmp_path, "loop.json", g), "links[2]", "self-loop")


def test_node_link_order_not_a_list(tmp_path):
    g = node_link_dict()
    g["graph"]["order"] = 5
    expect_format_error(load_graph_file, write(tmp_path, "order.json", g), "graph.order")


def test_node_link_order_missing_a_node(tmp_path):
    g = node_link_dict()
    g["graph"]["order"] = [0, 1]
    expect_format_error(load_graph_file, write(tmp_path, "order.json", g), "graph.order",
                        "every node id exactly once")


@pytest.mark.parametrize("load", [load_graph, load_graph_file], ids=["load_graph", "import"])
def test_input_that_comes_later_is_an_order_error(tmp_path, load):
    g = tiny_graph_dict()
    g["nodes"][1]["inputs"] = ["a", "l"]  # l comes after b: a cycle b -> l -> b
    err = expect_format_error(load, write(tmp_path, "g.json", g), "nodes[1].inputs")
    assert "order" in str(err) and "cycle" in str(err)


def test_negative_out_bytes(tmp_path):
    g = tiny_graph_dict()
    g["nodes"][3]["out_bytes"] = -5
    expect_format_error(load_graph_file, write(tmp_path, "g.json", g), "nodes[3].out_bytes",
                        "integer >= 0", "-5")


def test_negative_node_link_size(tmp_path):
    g = node_link_dict()
    g["nodes"][1]["cost_ram"] = -1
    expect_format_error(load_graph_file, write(tmp_path, "nl.json", g), "nodes[1].cost_ram",
                        ">= 0")


@pytest.mark.parametrize("value", ["big", 1.5, None, True])
def test_out_bytes_not_an_integer(tmp_path, value):
    g = tiny_graph_dict()
    g["nodes"][0]["out_bytes"] = value
    expect_format_error(load_graph, write(tmp_path, "g.json", g), "nodes[0].out_bytes", "integer")


def test_duplicate_ids(tmp_path):
    g = tiny_graph_dict()
    g["nodes"][3]["id"] = "b"
    g["nodes"][4]["inputs"] = ["b", "a"]
    err = expect_format_error(load_graph, write(tmp_path, "g.json", g), "nodes[3].id", "unique")
    assert "'b'" in str(err)


def test_duplicate_node_link_ids(tmp_path):
    g = node_link_dict()
    g["nodes"][2]["id"] = 1
    expect_format_error(load_graph_file, write(tmp_path, "nl.json", g), "nodes[2].id", "unique")


def test_unknown_field_in_node(tmp_path):
    g = tiny_graph_dict()
    g["nodes"][2]["colour"] = "red"
    expect_format_error(load_graph, write(tmp_path, "g.json", g), "nodes[2].colour",
                        "no such field", "out_bytes")


def test_unknown_top_level_field(tmp_path):
    g = tiny_graph_dict()
    g["extra"] = 1
    expect_format_error(load_graph, write(tmp_path, "g.json", g), "extra", "no such field")


def test_bad_kind(tmp_path):
    g = tiny_graph_dict()
    g["nodes"][0]["kind"] = "sideways"
    expect_format_error(load_graph, write(tmp_path, "g.json", g), "nodes[0].kind", "'forward'",
                        "'backward'")


def test_no_nodes(tmp_path):
    g = tiny_graph_dict()
    g["nodes"] = []
    expect_format_error(load_graph, write(tmp_path, "g.json", g), "nodes", "at least one node")


@pytest.mark.parametrize("header, field, expected", [
    ({"format": "edge-remat/plan"}, "format", "'edge-remat/graph'"),
    ({"format": 3}, "format", "a string"),
    ({"version": 2}, "version", "one of 1"),
    ({"version": "1"}, "version", "an integer"),
])
def test_wrong_header(tmp_path, header, field, expected):
    g = tiny_graph_dict() | header
    expect_format_error(load_graph, write(tmp_path, "g.json", g), field, expected)


def test_missing_version(tmp_path):
    g = tiny_graph_dict()
    del g["version"]
    expect_format_error(load_graph, write(tmp_path, "g.json", g), "version", "missing")


def test_unknown_format_for_import(tmp_path):
    g = tiny_graph_dict() | {"format": "onnx"}
    expect_format_error(load_graph_file, write(tmp_path, "g.json", g), "format",
                        "edge-remat/graph", "node-link")


# --- malformed plans ---------------------------------------------------------------------------

@pytest.fixture
def tiny() -> Graph:
    return graph_from_dict(tiny_graph_dict(), "tiny.json")


def test_plain_plan_is_valid(tiny):
    """The helper's plan runs, so the failures below come from the one thing each test breaks."""
    result = simulate(tiny, build_costs(tiny), plain_stages(tiny), 10**9)
    assert result.recomputed == 0 and result.fits_budget
    assert result.peak_bytes == 3100  # at gb: a, b, l and gb's output


def test_plan_unknown_op(tmp_path, tiny):
    p = plan_dict(tiny)
    p["stages"][1][0]["op"] = "launch"
    expect_format_error(load_plan, write(tmp_path, "p.json", p), "stages[1][0].op",
                        "'compute'", "'page_in'", "launch")


def test_plan_tier_on_compute(tmp_path, tiny):
    p = plan_dict(tiny)
    p["stages"][0][0]["tier"] = "flash"
    expect_format_error(load_plan, write(tmp_path, "p.json", p), "stages[0][0].tier",
                        "no tier on a 'compute'")


def test_plan_paging_without_tier(tmp_path, tiny):
    p = plan_dict(tiny)
    p["stages"][1].insert(1, {"op": "page_out", "node": "a"})
    expect_format_error(load_plan, write(tmp_path, "p.json", p), "stages[1][1].tier", "missing")


def test_plan_unknown_tier(tmp_path, tiny):
    p = plan_dict(tiny)
    p["stages"][1].insert(1, {"op": "page_out", "node": "a", "tier": "cloud"})
    expect_format_error(load_plan, write(tmp_path, "p.json", p), "stages[1][1].tier", "'flash'")


@pytest.mark.parametrize("header, field", [({"format": "edge-remat/graph"}, "format"),
                                           ({"version": 9}, "version")])
def test_plan_wrong_header(tmp_path, tiny, header, field):
    expect_format_error(load_plan, write(tmp_path, "p.json", plan_dict(tiny) | header), field)


def test_plan_unknown_field_in_instruction(tmp_path, tiny):
    p = plan_dict(tiny)
    p["stages"][0][0]["when"] = "now"
    expect_format_error(load_plan, write(tmp_path, "p.json", p), "stages[0][0].when",
                        "no such field")


def test_plan_stage_not_a_list(tmp_path, tiny):
    p = plan_dict(tiny)
    p["stages"][2] = {"op": "compute", "node": "l"}
    expect_format_error(load_plan, write(tmp_path, "p.json", p), "stages[2]", "a list")


def test_plan_truncated(tmp_path, tiny):
    text = json.dumps(plan_dict(tiny))
    expect_format_error(load_plan, write(tmp_path, "p.json", text=text[:-10]), "<json",
                        "valid JSON")


def run_plan(graph: Graph, p: dict) -> None:
    plan = plan_from_dict(p, "p.json")
    simulate(graph, build_costs(graph), plan.stages, plan.budget_bytes)


def expect_plan_error(graph: Graph, p: dict, *words: str) -> PlanError:
    with pytest.raises(PlanError) as info:
        run_plan(graph, p)
    message = str(info.value)
    assert message.startswith("invalid plan "), message
    for word in words:
        assert word in message, (word, message)
    return info.value


def test_plan_unknown_node(tiny):
    p = plan_dict(tiny)
    p["stages"][2].append({"op": "free", "node": "phantom"})
    err = expect_plan_error(tiny, p, "'phantom'", "not in graph 'tiny'", "stage 2")
    assert err.stage == 2 and err.instruction.node == "phantom"


def test_plan_frees_twice(tiny):
    p = plan_dict(tiny)
    p["stages"][4].append({"op": "free", "node": "ga"})  # the plain plan already freed ga
    err = expect_plan_error(tiny, p, "free ga", "freed twice")
    assert err.stage == 4


def test_plan_computes_with_input_missing(tiny):
    p = plan_dict(tiny)
    p["stages"][0].append({"op": "free", "node": "a"})  # b still needs a
    err = expect_plan_error(tiny, p, "compute b", "inputs ['a'] are not in RAM")
    assert (err.stage, err.position) == (1, 0)


def test_plan_pages_in_what_was_never_paged_out(tiny):
    p = plan_dict(tiny)
    p["stages"][0].append({"op": "page_in", "node": "a", "tier": "flash"})
    plan = plan_from_dict(p, "p.json")
    costs = build_costs(tiny, tiers={"flash": Tier(90e6, 40e6)})
    with pytest.raises(PlanError, match=r"page_in a flash.*never paged out to 'flash'"):
        simulate(tiny, costs, plan.stages)


def test_plan_pages_to_a_tier_without_costs(tiny):
    p = plan_dict(tiny)
    p["stages"][1].insert(1, {"op": "page_out", "node": "a", "tier": "host"})
    expect_plan_error(tiny, p, "tier 'host' is not available")


def test_plan_leaves_a_node_uncomputed(tiny):
    p = plan_dict(tiny)
    p["stages"] = p["stages"][:4] + [[{"op": "free", "node": "gb"}, {"op": "free", "node": "a"}]]
    err = expect_plan_error(tiny, p, "nodes never computed: ['ga']", "after its last stage")
    assert err.instruction is None


def test_plan_computes_twice_without_free(tiny):
    p = plan_dict(tiny)
    p["stages"][1].insert(0, {"op": "compute", "node": "a"})
    expect_plan_error(tiny, p, "already in RAM")


# --- round trips -------------------------------------------------------------------------------

def test_graph_round_trip(tmp_path, tiny):
    again = graph_from_dict(tiny.to_dict(), "again")
    assert again.fingerprint() == tiny.fingerprint()
    assert again.to_dict() == tiny.to_dict()
    tiny.save(tmp_path / "g.json")
    loaded = load_graph(tmp_path / "g.json")
    assert loaded.fingerprint() == tiny.fingerprint()
    assert [n.kind for n in loaded.nodes] == ["forward", "forward", "loss", "backward", "backward"]


def test_graph_round_trip_keeps_every_field():
    g = Graph(nodes=[Node(0, "x", "forward", "matmul", [], 64, workspace_bytes=8, time_s=0.25,
                          energy_j=0.5, signature="matmul[4x4]f32", attrs={"shape": [4, 4]}),
                     Node("y", "y", "update", "sgd", [0], 0)],
              name="full", fixed_bytes=1024, batch=4, dtype="float32",
              capture={"tool": "test"}, cost_source="estimate", planning_only=True)
    again = graph_from_dict(json.loads(json.dumps(g.to_dict())))
    assert again.to_dict() == g.to_dict()
    assert again.fingerprint() == g.fingerprint()


def test_fingerprint_changes_with_content(tiny):
    changed = tiny_graph_dict()
    changed["nodes"][0]["out_bytes"] += 1
    assert graph_from_dict(changed).fingerprint() != tiny.fingerprint()


def test_plan_round_trip(tmp_path, tiny):
    stages = plain_stages(tiny)
    stages[1].append(Instruction("page_out", "a", "flash"))
    stages[4].insert(0, Instruction("page_in", "a", "host"))
    plan = Plan(stages=stages, graph_fingerprint=tiny.fingerprint(), budget_bytes=12345,
                objective="energy", solver={"name": "milp:cbc", "gap": 0.0},
                predicted={"peak_bytes": 2100}, problem={"paging": ["flash", "host"]},
                fingerprint="abc123", tiers={"flash": Tier(90e6, 40e6, 1e-4, 1e-9, 2e-9),
                                             "host": Tier(35e6, 35e6, 1e-3)})
    plan.save(tmp_path / "plan.json")
    loaded = load_plan(tmp_path / "plan.json")
    assert loaded == plan
    assert loaded.stages[1][-1] == Instruction("page_out", "a", "flash")
    assert list(loaded.instructions()) == list(plan.instructions())


def test_plan_tiers_from_before_they_had_a_field(tmp_path, tiny):
    """Plans written before `tiers` kept the figures in `problem.tier_params`."""
    plan = Plan(stages=plain_stages(tiny), graph_fingerprint=tiny.fingerprint(),
                budget_bytes=12345, problem={"paging": ["flash"]}, tiers={"flash": Tier(9.0, 4.0)})
    old = plan.to_dict()
    old["problem"]["tier_params"] = old.pop("tiers")
    loaded = load_plan(write(tmp_path, "old.json", old))
    assert loaded.tiers == plan.tiers and loaded.problem == {"paging": ["flash"]}

    bad = plan.to_dict()
    bad["tiers"]["tape"] = bad["tiers"]["flash"]
    expect_format_error(load_plan, write(tmp_path, "p1.json", bad), "tiers.tape", "flash or host")
    bad = plan.to_dict()
    bad["tiers"]["flash"]["write_bytes_per_s"] = 0
    expect_format_error(load_plan, write(tmp_path, "p2.json", bad),
                        "tiers.flash.write_bytes_per_s", "a bandwidth from 1 to 2**60 bytes/s")


@pytest.mark.parametrize("field, value, expected", [
    ("peak_bytes", "2MB", "an integer"), ("time_s", [1.0], "a finite number"),
    ("tdi_percent", float("nan"), "a finite number"), ("step_time_s", "1 s", "a finite number"),
    ("peak_at", "stage 3", "[stage, position]"), ("accumulated_step", 4, "a JSON object")])
def test_plan_predicted_figures_that_are_not_numbers(tmp_path, tiny, field, value, expected):
    """The board's summary and the run report print these: a damaged one was a TypeError in
    the middle of a run ("run stopped: TypeError ...", exit 1), now the plan is refused."""
    p = plan_dict(tiny)
    p["predicted"] = {"peak_bytes": 3100, "time_s": 7.5, "step_time_s": None, "peak_at": [3, 0],
                      field: value}
    expect_format_error(load_plan, write(tmp_path, "p.json", p), f"predicted.{field}", expected)
    p["predicted"] = {"accumulated_step": {"micro_batches": 0, "time_s": 1.0, "energy_j": 2.0}}
    expect_format_error(load_plan, write(tmp_path, "p.json", p),
                        "predicted.accumulated_step.micro_batches", "an integer >= 1")


@pytest.mark.parametrize("field, value, expected", [
    ("status", 3, "a string"), ("gap", "3%", "a finite number"), ("workers", 0, ">= 1")])
def test_plan_solver_figures_of_the_wrong_type(tmp_path, tiny, field, value, expected):
    """`plan`'s table, the run report and a fleet's rows print these; a plan may leave any of
    them out (one written by hand or by another tool)."""
    p = plan_dict(tiny)
    load_plan(write(tmp_path, "p.json", p))  # solver {"name": "test"} alone
    p["solver"][field] = value
    expect_format_error(load_plan, write(tmp_path, "p.json", p), f"solver.{field}", expected)


def test_a_null_optional_object_reads_as_left_out(tmp_path):
    """`"ops": null` in a profile was an AttributeError (exit 70); it is a profile without ops."""
    profile = Profile(source="measured", device={}, idle_w=1.0, active_w=2.0).to_dict()
    profile["ops"], profile["tiers"] = None, None
    loaded = load_profile(write(tmp_path, "p.json", profile))
    assert loaded.ops == {} and loaded.tiers == {}


def test_profile_round_trip(tmp_path):
    profile = Profile(source="measured", device={"board": "rpi5", "ram": "8GB"}, idle_w=2.5,
                      active_w=7.0,
                      tiers={"flash": Tier(90e6, 40e6, 1e-4, 1e-9, 2e-9, 10**9),
                             "host": Tier(1e8, 1e8)},
                      ops={"conv[1x3x32x32]f32": OpCost(0.01, 0.05, 4096, 128),
                           "relu": OpCost(0.001)},
                      ram_total_bytes=8 * 2**30, runtime_baseline_bytes=300 * 2**20,
                      published_sources=["datasheet"], name="rpi5-test")
    profile.save(tmp_path / "profile.json")
    loaded = load_profile(tmp_path / "profile.json")
    assert loaded == profile
    assert loaded.to_dict() == profile.to_dict()


def test_profile_errors(tmp_path):
    profile = Profile(source="measured", device={}, idle_w=1.0, active_w=2.0,
                      tiers={"flash": Tier(1.0, 1.0)}).to_dict()
    bad = copy.deepcopy(profile)
    bad["tiers"]["flash"]["read_bytes_per_s"] = 0
    expect_format_error(load_profile, write(tmp_path, "p1.json", bad),
                        "tiers.flash.read_bytes_per_s", "a bandwidth from 1 to 2**60 bytes/s")
    bad = copy.deepcopy(profile)
    bad["tiers"]["tape"] = bad["tiers"]["flash"]
    expect_format_error(load_profile, write(tmp_path, "p2.json", bad), "tiers.tape", "flash or host")
    bad = copy.deepcopy(profile)
    bad["source"] = "guessed"
    expect_format_error(load_profile, write(tmp_path, "p3.json", bad), "source", "'measured'")


# --- the published benchmark graphs ------------------------------------------------------------

BENCHMARKS = {"rl100.json": (100, 236), "rl250.json": (250, 944),
              "fcn8_vgg_train.json": (73, 149), "vgg16_train.json": (45, 87)}


@needs_shared
@pytest.mark.parametrize("name", sorted(BENCHMARKS))
def test_benchmark_graph_imports(name):
    g = load_graph_file(GRAPHS / name)
    nodes, edges = BENCHMARKS[name]
    assert len(g) == nodes
    assert sum(len(n.inputs) for n in g.nodes) == edges
    assert g.cost_source == "published"
    assert all(n.time_s is not None and n.time_s >= 0 and n.out_bytes >= 0 for n in g.nodes)
    # A valid execution order: every input comes before its user.
    seen = set()
    for n in g.nodes:
        assert set(n.inputs) <= seen, n.id
        seen.add(n.id)
    # And it round-trips through our own format unchanged.
    assert graph_from_dict(g.to_dict(), name).fingerprint() == g.fingerprint()


@needs_shared
def test_rl100_keeps_the_published_order():
    g = load_graph_file(GRAPHS / "rl100.json")
    order = json.loads((GRAPHS / "rl100.json").read_text())["graph"]["order"]
    assert [n.id for n in g.nodes[:4]] == [0, 3, 2, 9]
    assert [n.id for n in g.nodes] == order


@needs_shared
@pytest.mark.parametrize("name", ["fcn8_vgg_train.json", "vgg16_train.json"])
def test_checkmate_graphs_kind_from_backward_flag(name):
    raw = json.loads((GRAPHS / name).read_text())
    flags = {n["id"]: bool(n["backward"]) for n in raw["nodes"]}
    g = load_graph_file(GRAPHS / name)
    kinds = {n.id: n.kind for n in g.nodes}
    assert kinds == {i: "backward" if b else "forward" for i, b in flags.items()}
    assert {"forward", "backward"} == set(kinds.values())
    sizes = {n["id"]: n["cost_ram"] for n in raw["nodes"]}
    assert all(n.out_bytes == sizes[n.id] for n in g.nodes)
