"""The page stores a plan needs, opened for a run and closed (pages removed) after it.

flash  FlashStore in the page directory: checksummed files, the page cache dropped after each
       write and read so that paging really frees RAM (inside a memory cgroup the cache is
       charged to the run). Opening it removes the page files of runs that were killed there;
       the report's tiers.flash.cleaned_stale says how many and how large.
host   the caller's store for the link (a LinkStore; the run job's `host_pages` param makes one
       over the host's page service, see host_link_store); without one, a MemoryStore in this
       process, and the report says so: it moves bytes but frees no RAM. A run on a CUDA
       device pages to pinned host memory instead (PinnedStore): that frees device memory.
"""

from __future__ import annotations

import contextlib
import os
from typing import Iterator

import torch

from ..formats import HOME, Graph, Plan
from ..formats.graph import homed_bytes
from ..pages import (FlashStore, LinkStore, MemoryStore, PageStore, PageStoreError,
                     PageStoreFull, PinnedStore)
from ..pages.errors import FLASH_CAPACITY_REMEDY, full_remedy, page_dir_not_made
from ..pages.folder import make_page_dir
from .errors import BadInput, ExecutorError
from .updates import ParameterHome, homed_parameters


def paged_bytes_by_tier(plan: Plan, graph: Graph) -> dict[str, int]:
    """The most each tier holds in a step: pages stay until the step ends."""
    nodes: dict[str, set] = {}
    for ins in plan.instructions():
        if ins.op == "page_out":
            nodes.setdefault(ins.tier, set()).add(ins.node)
    return {tier: sum(graph.node(n).out_bytes for n in ids) for tier, ids in nodes.items()}


@contextlib.contextmanager
def open_stores(plan: Plan, graph: Graph, page_dir: str | None,
                given: dict[str, PageStore] | None = None, fsync: bool = False,
                flash_capacity_bytes: int | None = None,
                device: torch.device | None = None) -> Iterator[dict[str, PageStore]]:
    given = dict(given or {})
    stores: dict[str, PageStore] = {}
    opened: list[PageStore] = []
    try:
        for tier in sorted(plan.tiers_used()):
            if tier in given:
                stores[tier] = given[tier]
            elif tier == "flash":
                if page_dir is None:
                    raise BadInput("the plan pages to flash: give a page directory on the "
                                        "board's flash (--page-dir)")
                try:
                    store = FlashStore(page_dir, flash_capacity_bytes, fsync=fsync,
                                       drop_cache=True)
                except PageStoreError as error:
                    raise ExecutorError(str(error)) from error
                opened.append(store)
                _check_room(store, paged_bytes_by_tier(plan, graph)["flash"],
                            "plan with less paging", "all pages of a step")
                stores[tier] = store
            else:
                on_cuda = device is not None and device.type == "cuda"
                store = PinnedStore(None) if on_cuda else MemoryStore(None)
                opened.append(store)
                stores[tier] = store
        yield stores
    finally:
        for store in opened:
            store.close()


@contextlib.contextmanager
def open_parameter_home(graph: Graph, module, page_dir: str | None, fsync: bool = True,
                        plan: Plan | None = None) -> Iterator[ParameterHome | None]:
    """The home of the parameters the graph's param nodes load (a flash store of its own, kept
    across steps), with the parameters moved out of RAM; None when every parameter lives in
    RAM. Closing it removes what it wrote. A model built on `meta` (weights/) gets its frozen
    homed parameters from the weight page store in the page directory (written there once),
    read ahead in the order `plan` loads them (not for a plan made for overlap, which places
    its reads itself and counts them, not the store's), and every other parameter made in
    RAM."""
    homes = homed_parameters(graph)
    frozen = _frozen_from_weight_store(graph, module, page_dir, homes, plan)
    if not homes:
        yield None
        return
    if set(homes.values()) != {"flash"}:
        raise BadInput(f"parameters homed on {sorted(set(homes.values()) - {'flash'})}: this "
                       "executor homes parameters on flash only; capture with "
                       "--params-home flash")
    if page_dir is None:
        raise BadInput("the graph keeps parameters on flash: give a page directory on the "
                       "board's flash (--page-dir)")
    try:
        store = FlashStore(page_dir, None, fsync=fsync, drop_cache=True)
    except PageStoreError as error:
        raise ExecutorError(str(error)) from error
    try:
        held, written = homed_bytes(graph)
        # the home and the plan's page-outs fill one folder: checked apart, each fitted and
        # together they filled the disk mid-step. The remedy names paging only for a plan
        # that pages (QA: "plan with less paging" for a plan with no page-outs).
        paged = paged_bytes_by_tier(plan, graph).get("flash", 0) if plan is not None else 0
        what = ("the parameters and optimizer state homed on flash, and the largest group's "
                "new version an update writes beside them")
        last_resort = "keep the parameters in RAM (--params-home ram)"
        if paged:
            what = (f"{what}: {held + written} bytes; and the plan's page-outs at their most: "
                    f"{paged} bytes")
            last_resort += f", or {FLASH_CAPACITY_REMEDY}"
        _check_room(store, held + written + paged, last_resort, what)
        groups = [node.attrs["params"] for node in graph.nodes if node.kind == "param"]
        home = ParameterHome(store, module, list(homes), frozen, groups)
        try:  # the move out is set-up: the steps' own store errors are the interpreter's
            home.move_out()
        except PageStoreError as error:
            raise ExecutorError(str(error)) from error
        yield home
    finally:
        store.close()
        if frozen is not None:
            frozen.close()


def _frozen_from_weight_store(graph: Graph, module, page_dir: str | None,
                              homes: dict[str, str], plan: Plan | None):
    """For a model built on `meta`: the PagedWeights serving its frozen homed parameters
    (None if it has none), after making every other parameter in RAM."""
    from ..weights import WeightStoreError, is_deferred, make_missing
    if not is_deferred(module):
        return None
    params = dict(module.named_parameters())
    served = sorted(name for name in homes if name in params and not params[name].requires_grad)
    make_missing(module, keep_on_meta=set(served) if page_dir is not None else set())
    if not served or page_dir is None:
        return None
    from ..weights import WEIGHTS_FOLDER, WeightFile, ensure_model_weights
    from ..weights.paged import PagedWeights
    source = graph.capture.get("source") or {}
    try:
        make_page_dir(page_dir)  # the weights' folder goes in it, not on a missing drive's path
    except OSError as error:
        raise ExecutorError(page_dir_not_made(page_dir, error)) from error
    try:
        path, written = ensure_model_weights(module, str(source.get("model", graph.name)),
                                             int(source.get("seed") or 0),
                                             os.path.join(page_dir, WEIGHTS_FOLDER))
        file = WeightFile(path)
    except WeightStoreError as error:
        raise ExecutorError(str(error)) from error
    # A plan made for overlap reads its groups ahead itself where that pays (page_in from
    # home), counted in its peak, and computes the rest in place, as its model has it: the
    # store reads nothing ahead beside it (tinyllama-2l-lora under 892 MiB: 301-311 MiB
    # charged for training against a 270 MiB plan; 451-454 MiB with the store reading each
    # next group ahead, 637 MiB with it reading ahead only the groups the plan computes,
    # each held from the group before it on).
    placed = plan is None or plan.problem.get("io") == "overlap"
    order = [] if placed else [list(graph.node(ins.node).attrs["params"])
                               for ins in plan.instructions()
                               if graph.node(ins.node).kind == "param"
                               and (ins.op == "compute" or ins.tier == HOME)]
    paged = PagedWeights(file, order)
    paged.written = written  # figures of the one-time write, None when the file was there
    return paged


def describe_stores(stores: dict[str, PageStore]) -> dict[str, dict]:
    out = {}
    for tier, store in stores.items():
        row = {"store": type(store).__name__, "capacity_bytes": store.capacity_bytes}
        if isinstance(store, FlashStore):
            row.update(page_dir=store.page_dir, fsync=store.fsync, drop_cache=store.drop_cache,
                       cleaned_stale=dict(store.cleaned_stale))  # what killed runs had left
        if isinstance(store, MemoryStore):
            row["note"] = "held in this process's memory (no link to a host given): frees no RAM"
        if isinstance(store, PinnedStore):
            row["note"] = ("pinned host memory: frees the device's memory (not the board's DRAM "
                           "where the GPU shares it, as on a Jetson)")
        if isinstance(store, LinkStore):
            row["where"] = store.where
            row["note"] = f"sent to the {store.where}: out of this process's memory"
            stats = getattr(getattr(store, "client", None), "stats", None)
            if stats is not None:
                try:
                    row["service"] = stats()  # what the host saw: peak_bytes, puts, gets
                except PageStoreError as error:
                    row["service"] = {"error": str(error)}
        out[tier] = row
    return out


def host_pages_refusal(plan: Plan, address: str | None, device: str | None = "cpu",
                       where: str = "the run job's param host_pages") -> str | None:
    """Why a run on a board is refused: its plan pages to `host` and no host page service was
    given (`where` names how one is given), so each page would stay in the training process's
    own memory and free none of the board's RAM: an out-of-memory kill the plan said it
    avoided (QA: `job run` of such a plan trained at 644 MiB RSS, the report's note the only
    word). None where the run may go on: no host pages, a service given, or a CUDA device,
    whose `host` tier is pinned host memory (it frees the device's). The one rule of every
    board-side entry (the run job, `edge-remat-agent run`); run_plan, the library, still
    defaults to a MemoryStore, which its report says frees no RAM."""
    if address or "host" not in plan.tiers_used() or str(device or "cpu").startswith("cuda"):
        return None
    outs = plan.page_outs_to("host")
    return (f"the plan pages to the host ({outs} page-out{'s' if outs != 1 else ''}) but no "
            f"host page service was given ({where}): its pages would stay in this board's "
            "own memory and free none of its RAM. Remedy: run the plan with `edge-remat "
            "deploy PLAN --device D --graph G` (or `edge-remat run`, or `edge-remat job run` "
            "without --detach), which start the host's page service for the job, or plan "
            "again with --paging flash (or none)")


def host_link_store(plan: Plan, address: str | None,
                    wait_s: float | None = None) -> PageStore | None:
    """The `host` store over the page service at `address` (HOST:PORT, as the host passes it
    in the run job's `host_pages` param), connected now; None when the plan does not page to
    host or no address is given (open_stores then keeps host pages in this process). A link
    that drops later is waited for up to `wait_s` (None: the client's default)."""
    if not address or "host" not in plan.tiers_used():
        return None
    from ..pages.link import connect_store
    from ..pages.service import WAIT_S
    try:
        return connect_store(str(address), wait_s=WAIT_S if wait_s is None else float(wait_s))
    except (PageStoreError, ValueError) as error:
        raise ExecutorError(f"{error}. Remedy: run the plan through `edge-remat deploy` or "
                            "`edge-remat run`, which start the host's page service") from error


def _check_room(store: FlashStore, needed: int, last_resort: str, what: str) -> None:
    """Refuse before the first step when `what` (`needed` bytes) cannot fit on that
    filesystem; the remedy ends with `last_resort`."""
    free = store.free_bytes()
    if free is not None and needed > free:
        raise ExecutorError(str(PageStoreFull(
            f"({what})", store.page_dir, needed, free_bytes=free,
            cause="checked before the first step", remedy=full_remedy(last_resort))))
