"""A graph file's capture details (the nodes' `attrs`, the `capture` record) are checked on load.

Planning, simulation and the reports read them, and nothing checked them: a damaged or
hand-edited file failed where a value was first used, as an internal error (exit 70). Each case
below damages one field of a real capture (a user model with dropout and batch norm, AdamW,
clipping, two micro-batches and its parameters on flash, so that every attribute a capture
writes is there) and expects a FormatError naming that field."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, no_new_files, refused, tree
from helpers.user_models import HERE as USER_MODELS
from edge_remat_agent.capture import capture_model
from edge_remat_agent.formats import FormatError, graph_from_dict
from edge_remat_agent.formats.graph_details import CAPTURE_CHECKS, NODE_CHECKS

USER_MODEL = f"{Path(__file__).resolve().parents[1] / 'examples' / 'my_model.py'}:make_model"


@pytest.fixture(scope="module")
def captured() -> dict:
    """Both graphs' dicts: every attribute, and a capture record with every field."""
    every = capture_model(USER_MODEL, optimizer="adamw", params_home="flash", batch=4, image=16,
                          clip_grad_norm=1.0, accumulate=2).graph
    plain = capture_model(USER_MODEL, batch=4, image=16).graph
    # accumulating without clipping (sums nodes), and clipping gradients that share a storage
    summed = capture_model(USER_MODEL, batch=4, image=16, accumulate=2).graph
    aliased = capture_model(f"{USER_MODELS}:make_aliased_gradients", clip_grad_norm=1.0).graph
    return {"every": every.to_dict(), "plain": plain.to_dict(), "summed": summed.to_dict(),
            "aliased": aliased.to_dict()}


def test_every_detail_a_capture_writes_is_checked_and_a_capture_loads_as_it_was(captured):
    for graph in captured.values():
        written = {key for node in graph["nodes"] for key in node.get("attrs", {})}
        assert written <= set(NODE_CHECKS), f"add a check for {sorted(written - set(NODE_CHECKS))}"
        assert set(graph["capture"]) <= set(CAPTURE_CHECKS), sorted(
            set(graph["capture"]) - set(CAPTURE_CHECKS))
        assert graph_from_dict(copy.deepcopy(graph)).to_dict() == graph
    assert {key for graph in captured.values() for node in graph["nodes"]
            for key in node.get("attrs", {})} \
        == set(NODE_CHECKS) - {"page_costs"}  # POET's problems alone give that one


def _first(graph: dict, key: str) -> tuple[int, dict]:
    """The position and attributes of the first node that has attribute `key`."""
    return next((i, node["attrs"]) for i, node in enumerate(graph["nodes"])
                if key in node.get("attrs", {}))


def _set_attr(key: str, value, inner: str | None = None, within: str = ""):
    """Set one node's attribute (or a field `inner` of it); the field the error names, with
    `within` where it names an item inside the value."""
    def damage(graph: dict) -> str:
        i, attrs = _first(graph, key)
        if inner is None:
            attrs[key] = value
        elif value is _DELETE:
            del attrs[key][inner]
        else:
            attrs[key][inner] = value
        return f"nodes[{i}].attrs.{key}" + (f".{inner}" if inner else "") + within
    return damage


def _set_capture(*path, value, within: str = ""):
    def damage(graph: dict) -> str:
        where = graph["capture"]
        keys = [next(iter(where[path[0]])) if key is _ANY else key for key in path[:-1]]
        for key in keys:
            where = where[key]
        where[path[-1]] = value
        return "capture." + ".".join(map(str, keys + [path[-1]])) + within
    return damage


def _unknown_param_reader(graph: dict) -> str:
    i, attrs = _first(graph, "param_readers")
    attrs["param_readers"] = attrs["param_readers"] + [10 ** 6]
    return f"nodes[{i}].attrs.param_readers[{len(attrs['param_readers']) - 1}]"


_DELETE, _ANY = object(), object()
DAMAGE = {
    "the home io's tier missing": _set_attr("io", _DELETE, inner="tier"),
    "the home io's read bytes negative": _set_attr("io", -1, inner="read_bytes"),
    "members a number": _set_attr("members", 3),
    "flops a string": _set_attr("flops", "many"),
    "sum bytes a fraction": _set_attr("sum_bytes", 0.5),
    "a clipping pair of one name": _set_attr("norm_grads", [["g"]], within="[0]"),
    "a read's producer a list": _set_attr("reads", {"x": [1]}, within=".x"),
    "random a string": _set_attr("random", "yes"),
    "an update's parameter reader not in the graph": _unknown_param_reader,
    "the estimate's flop rate zero": _set_capture("estimate", "flops_per_s", value=0),
    "the estimate's byte rate a list": _set_capture("estimate", "bytes_per_s", value=[1]),
    "fixed memory a string": _set_capture("fixed", "parameters", value="4MB"),
    "micro-batches zero": _set_capture("accumulate", value=0),
    "a tensor's shape negative": _set_capture("state_dict", _ANY, "shape", value=[-1, 3],
                                               within="[0]"),
    "the source's batch a string": _set_capture("source", "batch", value="8"),
}


@pytest.mark.parametrize("damage", DAMAGE.values(), ids=DAMAGE.keys())
def test_a_damaged_detail_is_refused_naming_its_field(captured, damage):
    graph = copy.deepcopy(captured["every"])
    field = damage(graph)
    with pytest.raises(FormatError) as error:
        graph_from_dict(graph, "damaged.json")
    assert error.value.field == field, (error.value.field, field)
    assert str(error.value).startswith(f"damaged.json: field '{field}': expected ")


def test_details_nothing_plans_with_are_kept_as_they_are(captured):
    graph = copy.deepcopy(captured["plain"])
    graph["nodes"][0].setdefault("attrs", {})["imported_from"] = [1, "conv0"]
    graph["capture"]["generator"] = {"w": 0.31}
    loaded = graph_from_dict(graph)
    assert loaded.nodes[0].attrs["imported_from"] == [1, "conv0"]
    assert loaded.capture["generator"] == {"w": 0.31}


def test_poet_style_page_costs_need_their_four_figures(captured):
    graph = copy.deepcopy(captured["plain"])
    costs = {"out_time_s": 0.1, "out_energy_j": 0.2, "in_time_s": 0.1, "in_energy_j": 0.2}
    graph["nodes"][0]["attrs"]["page_costs"] = {"flash": dict(costs)}
    graph_from_dict(copy.deepcopy(graph))
    del graph["nodes"][0]["attrs"]["page_costs"]["flash"]["in_energy_j"]
    with pytest.raises(FormatError, match=re.escape("nodes[0].attrs.page_costs.flash.in_energy_j")):
        graph_from_dict(graph)


def test_plan_refuses_a_damaged_capture_in_one_line_and_writes_nothing(captured, tmp_path):
    """Before: `error: internal error (KeyError: 'tier')`, exit 70."""
    graph = copy.deepcopy(captured["every"])
    field = DAMAGE["the home io's tier missing"](graph)
    path = tmp_path / "damaged.json"
    path.write_text(json.dumps(graph))
    before = tree(tmp_path)
    proc = cli("plan", "--graph", path, "--budget", "50%", "-o", tmp_path / "plan.json")
    refused(proc, BAD_INPUT, field, "expected a value (the field is missing)")
    no_new_files(before, tmp_path)
