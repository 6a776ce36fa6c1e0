#!/usr/bin/env python3
"""A parameter group on flash as one file against a file per tensor, on this machine's flash.

Each model is captured with its parameters homed on flash (`params_home="flash"`); its param
nodes give the groups. One step of the parameter home's traffic, group by group, as the
executor makes it: the param node reads the group's parameters, the update reads their
optimizer state and writes the new parameters and state as a new version, and the old version
goes. Two ways, in interleaved rounds, through one FlashStore (fsync, page cache dropped):

  per tensor  every tensor its own page file (PageStore's put_many / get_many: put and get one
              by one), as the home did before 2026-12-05
  grouped     FlashStore.put_many / get_many: a group's pages back to back in one file

Printed per model: groups, tensors and bytes a step moves, the median step of each way, and
the plan's charge for the same traffic (the fitted flash tier: one read or write a node).

    python benchmarks/group_pages.py --quick
    python benchmarks/group_pages.py --page-dir /mnt/sd/pages
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time

import torch

from edge_remat_agent.capture import capture_model
from edge_remat_agent.pages import FlashStore
from edge_remat_agent.pages.base import PageStore
from edge_remat_agent.profiler import measure_flash

from arguments import existing_folder, int_at_least, positive_int  # this script's neighbour

MODELS = [("bert-mini", {"batch": 2, "seq": 16, "optimizer": "sgd"}),
          ("resnet18", {"batch": 2, "image": 32, "optimizer": "sgd"}),
          ("tinyllama-2l-lora", {"seq": 16, "optimizer": "adamw"})]
QUICK = MODELS[:1]
FLASH_SIZES = [4096, 65536, 1 << 20, 16 << 20]
STATE_KEYS = {"sgd": ("momentum_buffer",), "adamw": ("step", "exp_avg", "exp_avg_sq")}
WAYS = ("per tensor", "grouped")


def groups_of(name: str, options: dict) -> tuple[list[dict[str, torch.Tensor]], tuple]:
    """Each param node's parameters (name -> value), and the optimizer's state keys."""
    optimizer = options["optimizer"]
    captured = capture_model(name, params_home="flash", **options)
    from edge_remat_agent.weights.deferred import make_missing
    make_missing(captured.module)  # a model built on meta: real values to write
    params = dict(captured.module.named_parameters(remove_duplicate=False))
    groups = [{p: params[p].detach() for p in node.attrs["params"]}
              for node in captured.graph.nodes if node.kind == "param"
              and all(params[p].requires_grad for p in node.attrs["params"])]
    return groups, STATE_KEYS[optimizer]


def state_of(value: torch.Tensor, key: str) -> torch.Tensor:
    return torch.tensor(1.0) if key == "step" else torch.zeros_like(value)


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def store_calls(store: FlashStore, grouped: bool):
    """(put_many, get_many): the store's own, or PageStore's, which go page by page."""
    if grouped:
        return store.put_many, store.get_many
    return (lambda items: PageStore.put_many(store, items),
            lambda keys: PageStore.get_many(store, keys))


def one_step(store: FlashStore, groups, states, state_keys, version: int,
             grouped: bool) -> float:
    """Seconds for one step of the home's traffic (see the module's docstring); `states`:
    each group's optimizer state, the first step's (it has none to read)."""
    put_many, get_many = store_calls(store, grouped)
    start = time.perf_counter()
    for index, (group, first_state) in enumerate(zip(groups, states)):
        names = list(group)
        state_names = [(name, key) for name in names for key in state_keys]
        values = get_many([("param", index, name, version) for name in names])
        state = get_many([("state", index, name, key, version) for name, key in state_names]) \
            if version else first_state
        items = [(("param", index, name, version + 1), value)
                 for name, value in zip(names, values)]
        items += [(("state", index, name, key, version + 1), value)
                  for (name, key), value in zip(state_names, state)]
        put_many(items)
        for key, _ in items:
            store.discard((*key[:-1], version))
    return time.perf_counter() - start


def bench(name: str, options: dict, args, flash) -> dict:
    groups, state_keys = groups_of(name, options)
    states = [[state_of(value, key) for value in group.values() for key in state_keys]
              for group in groups]
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for r in range(args.rounds):
        for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
            with FlashStore(args.page_dir, fsync=True, drop_cache=True) as store:
                grouped = way == "grouped"
                put_many, _ = store_calls(store, grouped)
                for i, group in enumerate(groups):  # moved out before the first step
                    put_many([(("param", i, n, 0), v) for n, v in group.items()])
                steps = [one_step(store, groups, states, state_keys, v, grouped)
                         for v in range(args.steps)]
                times[way].append(statistics.median(steps[1:]))  # the first makes the state
    median = {way: statistics.median(t) for way, t in times.items()}
    # the plan's charge: one read of the parameters, one of the state, one write of both
    charged = sum(flash.read_cost(nbytes(g.values()))[0] + flash.read_cost(nbytes(state))[0]
                  + flash.write_cost(nbytes(g.values()) + nbytes(state))[0]
                  for g, state in zip(groups, states))
    moved = sum(2 * (nbytes(g.values()) + nbytes(state)) for g, state in zip(groups, states))
    return {"model": name, "optimizer": options["optimizer"], "groups": len(groups),
            "tensors": sum(len(g) for g in groups), "moved_bytes": moved,
            "seconds": median, "charged_s": charged}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="bert-mini only, fewer rounds")
    parser.add_argument("--page-dir", type=existing_folder, default=tempfile.gettempdir())
    parser.add_argument("--rounds", type=positive_int,
                        help="rounds of both ways (default 5; quick 3)")
    parser.add_argument("--steps", type=int_at_least(2), default=4,  # one timed at least
                        help="steps a round (the first untimed)")
    args = parser.parse_args()
    args.rounds = args.rounds or (3 if args.quick else 5)
    flash = measure_flash(args.page_dir, FLASH_SIZES, fsync=True).fit()
    print(f"# flash in {args.page_dir} (fsync, page cache dropped): read "
          f"{flash.read_bytes_per_s / 1e6:.0f} MB/s, write {flash.write_bytes_per_s / 1e6:.0f} "
          f"MB/s, latency {flash.read_latency_s * 1e3:.2f} / {flash.write_latency_s * 1e3:.2f} ms")
    print(f"{'model':<18} {'optimizer':<9} {'groups':>6} {'tensors':>7} {'MB moved':>9} "
          f"{'per tensor s':>13} {'grouped s':>10} {'ratio':>6} {'plan charges s':>15}")
    for name, options in (QUICK if args.quick else MODELS):
        row = bench(name, options, args, flash)
        per, grouped = row["seconds"]["per tensor"], row["seconds"]["grouped"]
        print(f"{row['model']:<18} {row['optimizer']:<9} {row['groups']:6d} {row['tensors']:7d} "
              f"{row['moved_bytes'] / 1e6:9.1f} {per:13.4f} {grouped:10.4f} "
              f"{grouped / per:6.2f} {row['charged_s']:15.4f}")
        sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
