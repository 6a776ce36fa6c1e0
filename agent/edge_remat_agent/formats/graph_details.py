"""What a capture writes beside the graph's structure, checked when a graph is loaded: the
nodes' attributes (`Node.attrs`) and the graph's capture record (`Graph.capture`), which
planning, simulation and the reports read.

Nothing checked them before: a graph file edited by hand or damaged failed where a value was
first used, as an internal error (`plan` on a captured GPT graph whose `attrs.io` lost its
`tier`: KeyError; `members` set to a number, or the capture's `estimate.flops_per_s` to a list:
TypeError). Now such a file is refused on load, naming the field. Fields not named here
(an importer's notes, a synthetic graph's generator parameters) are kept as they are.
"""

from __future__ import annotations

from typing import Callable

from .fields import Reader
from .profile import TIER_NAMES

# a param node's `attrs.io.source` where its group comes from the model's frozen weight file
# (weights/store.py), which costs its own reads (the flash tier's weights_read_curve)
WEIGHT_FILE = "weight file"
# a capture's update nodes and its parameters' homes (here, not in capture/: the host checks
# the options before it imports torch)
UPDATE_MODES = ("fused", "step")
PARAM_HOMES = ("ram", "flash")  # the executor homes parameters on flash (not yet the host)


def _count(r: Reader, key: str) -> None:  # bytes or nodes: an integer >= 0
    r.integer(key)


def _amount(r: Reader, key: str) -> None:  # an estimate's input or a norm: a finite number >= 0
    r.number(key)


def _optional_amount(r: Reader, key: str) -> None:
    r.number(key, None)


def _positive(r: Reader, key: str) -> None:  # a rate that divides
    if r.number(key) <= 0:
        raise r.error(key, "a number > 0", r.raw(key))


def _micro_batches(r: Reader, key: str) -> None:
    r.integer(key, minimum=1)


def _text(r: Reader, key: str) -> None:
    r.str(key)


def _optional_text(r: Reader, key: str) -> None:
    r.str(key, None)


def _flag(r: Reader, key: str) -> None:
    r.boolean(key)


def _object(r: Reader, key: str) -> None:
    r.object(key)


def _sequence(r: Reader, key: str) -> list | tuple:
    """A list (or, in a graph built in this process and not yet written, a tuple)."""
    value = r.raw(key)
    if not isinstance(value, (list, tuple)):
        raise r.error(key, "a list", value)
    return value


def _names(r: Reader, key: str) -> None:
    for i, name in enumerate(_sequence(r, key)):
        if not isinstance(name, str):
            raise r.error(f"{key}[{i}]", "a string (a name)", name)


def _node_ids(r: Reader, key: str) -> None:
    for i, node_id in enumerate(_sequence(r, key)):
        if isinstance(node_id, bool) or not isinstance(node_id, (int, str)):
            raise r.error(f"{key}[{i}]", "a node id (integer or string)", node_id)


def _name_pairs(r: Reader, key: str) -> None:  # [gradient value, parameter] pairs
    for i, pair in enumerate(_sequence(r, key)):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2
                and all(isinstance(x, str) for x in pair)):
            raise r.error(f"{key}[{i}]", "a pair of names [value, parameter]", pair)


def _name_map(r: Reader, key: str) -> None:
    for name, value in r.object(key).items():
        if not isinstance(value, str):
            raise r.error(f"{key}.{name}", "a string (a name)", value)


def _producers(r: Reader, key: str) -> None:  # a value's name -> the node that makes it
    for name, node_id in r.object(key).items():
        if isinstance(node_id, bool) or not isinstance(node_id, (int, str)):
            raise r.error(f"{key}.{name}", "a node id (integer or string)", node_id)


def _home(r: Reader, key: str) -> None:  # the page tier a group's parameters live on
    # (capture/state.py; the executor homes them on flash, the planner plans either; QA: an
    # update node homed on "disk" was planned and trained without a word)
    r.str(key, choices=TIER_NAMES)


def _home_io(r: Reader, key: str) -> None:  # what a node reads and writes of its home tier
    io = r.child(key)
    io.str("tier", choices=TIER_NAMES)
    io.integer("read_bytes")
    io.integer("write_bytes")
    io.str("source", None, choices=(WEIGHT_FILE,))


PAGE_COST_FIGURES = ("out_time_s", "out_energy_j", "in_time_s", "in_energy_j")


def _page_costs(r: Reader, key: str) -> None:  # a tier's costs given node by node (POET's)
    tiers = r.child(key)
    for tier in tiers.obj:
        costs = tiers.child(tier)
        for figure in PAGE_COST_FIGURES:
            costs.number(figure)


def _counts(r: Reader, key: str) -> None:  # a breakdown of bytes by class
    counts = r.child(key)
    for name in counts.obj:
        counts.integer(name)


def _estimate_rates(r: Reader, key: str) -> None:  # the rates the capture estimated times at
    rates = r.child(key)
    _positive(rates, "flops_per_s")
    _positive(rates, "bytes_per_s")
    rates.number("op_overhead_s")
    rates.number("view_overhead_s", None)


def _model_source(r: Reader, key: str) -> None:  # how to capture the model again
    source = r.child(key)
    source.str("model", None)
    for size in ("batch", "image", "seq"):
        source.integer(size, None, minimum=1)
    source.integer("seed", None, minimum=None)


def _state_dict(r: Reader, key: str) -> None:  # the model's tensors: name -> shape, dtype
    tensors = r.child(key)
    for name in tensors.obj:
        tensor = tensors.child(name)
        for i, extent in enumerate(_sequence(tensor, "shape")):
            if isinstance(extent, bool) or not isinstance(extent, int) or extent < 0:
                raise tensor.error(f"shape[{i}]", "an integer >= 0", extent)
        tensor.str("dtype")
        tensor.boolean("trainable", None)


NODE_CHECKS: dict[str, Callable[[Reader, str], None]] = {
    "bytes_moved": _amount, "flops": _amount, "clip_grad_norm": _amount, "max_norm": _amount,
    "grad_bytes": _count, "state_bytes": _count, "sum_bytes": _count, "temp_bytes": _count,
    "home": _home, "loss": _text, "optimizer": _text, "scope": _text,
    "random": _flag,
    "members": _names, "ops": _names, "outputs": _names, "replays": _names, "params": _names,
    "norm_order": _names, "clip_copies": _names,
    "param_readers": _node_ids,
    "buffer_updates": _name_map, "grads": _name_map, "update_grads": _name_map,
    "reads": _producers,
    "io": _home_io,
    "norm_grads": _name_pairs, "sum_grads": _name_pairs, "summed_apart": _flag,
    "page_costs": _page_costs,
}

CAPTURE_CHECKS: dict[str, Callable[[Reader, str], None]] = {
    "estimate": _estimate_rates, "fixed": _counts, "planned_state": _counts,
    "source": _model_source, "state_dict": _state_dict,
    "accumulate": _micro_batches, "clip_grad_norm": _optional_amount,
    "optimizer": _text, "update": _text, "params_home": _text,
    "dtype": _optional_text, "trainable_dtype": _optional_text,
    "reference_peak_bytes": _count, "saved_bytes": _count, "level": _count,
    "max_nodes": _count, "captured_nodes": _count, "planner_nodes": _count,
    "operator_level": _flag, "refined": _flag,
    "model": _text, "tool": _text, "torch": _text, "signature": _object,
    "capture_s": _amount, "trace_s": _amount,
}


def _check(fields: Reader, checks: dict[str, Callable[[Reader, str], None]]) -> None:
    for key, check in checks.items():
        if key in fields.obj:
            check(fields, key)


def check_node_attrs(attrs: Reader) -> None:
    """Each attribute named in NODE_CHECKS has its type (a FormatError naming the field if not)."""
    _check(attrs, NODE_CHECKS)


def check_capture(capture: Reader) -> None:
    """Each field of the capture record named in CAPTURE_CHECKS has its type."""
    _check(capture, CAPTURE_CHECKS)
