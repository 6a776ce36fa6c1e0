"""The planning problem: a graph, its costs and the limits, in index form for the solvers."""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass, field

from edge_remat_agent.costs import CostModel
from edge_remat_agent.floor import describe_floor, floor_node, node_label
from edge_remat_agent.formats import Graph
from edge_remat_agent.pebbling import PebblingFloor, pebbling_floor, proves_too_small
from edge_remat_agent.units import counted

OBJECTIVES = ("time", "energy")
PAGING_TIME_MODES = ("counted", "free")
IO_MODES = ("sync", "overlap")  # paging stops compute, or runs on its own timeline


class ProblemError(ValueError):
    """Inputs that do not make a planning problem (e.g. paging to a tier with no costs)."""


class InfeasibleBudget(ProblemError):
    """No schedule fits the budget; carries the floor: the proven least bytes a schedule needs
    (the smallest budget that has a chance, not one known to plan)."""

    def __init__(self, message: str, smallest_bytes: int | None):
        super().__init__(message)
        self.smallest_bytes = smallest_bytes


def training_state_remedy(graph: Graph, smallest: int | None) -> str:
    """`plan`'s words where parameters, gradients and optimizer state held in RAM are most of
    the floor: what lowers it (QA: hf:gpt2 at 50% named a floor of 1.46 GB, 995 MB of it fixed,
    and nothing to do; with the state homed on flash the floor was 463 MB). `run` homes them
    itself, and says its own remedy."""
    fixed = graph.capture.get("fixed") or {}
    held = sum(int(fixed.get(name) or 0) for name in ("parameters", "gradients",
                                                      "optimizer_state"))
    if not smallest or 2 * held < smallest:
        return ""
    return (f"; {held} bytes of it are the parameters, their gradients and the optimizer "
            "state, held in RAM for the whole step: capture with `edge-remat graph "
            "--params-home flash` to plan them too (`edge-remat run` does so by itself)")


class InfeasibleDeadline(ProblemError):
    """Schedules fit the budget, but none meets the deadline; carries the smallest deadline (a
    multiple of the plain time) that the fastest schedule found meets: `smallest_deadline` as
    the message prints it, rounded up (passed back, it is met), and `achieved`, exact."""

    def __init__(self, message: str, smallest_deadline: float, achieved: float | None = None):
        super().__init__(message)
        self.smallest_deadline = smallest_deadline
        self.achieved = smallest_deadline if achieved is None else achieved


@dataclass
class Problem:
    graph: Graph
    costs: CostModel
    budget_bytes: int
    objective: str = "time"
    deadline: float | None = None  # a multiple of the plain schedule's time
    tiers: tuple[str, ...] = ()  # paging tiers the plan may use
    paging_time: str = "counted"  # "free": paging does not count against the deadline (POET's)
    profile_name: str | None = None
    # "overlap": page-ins are prefetched and page-outs written behind on an IO timeline
    # (timeline.py); plans are scored by the makespan after the overlap post-pass (overlap.py).
    io: str = "sync"
    # The graph as given, where `graph` is it in another order (planner/ordering.py): the
    # plan names its fingerprint, and replays on it.
    given_graph: Graph | None = None
    # Seconds spent choosing that order: solve() counts them in its time limit and timings.
    order_s: float = 0.0
    n: int = field(init=False)

    def __post_init__(self) -> None:
        if self.objective not in OBJECTIVES:
            raise ProblemError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.paging_time not in PAGING_TIME_MODES:
            raise ProblemError(f"paging time must be one of {PAGING_TIME_MODES}")
        if self.io not in IO_MODES:
            raise ProblemError(f"paging IO must be one of {IO_MODES}, got {self.io!r}")
        missing = [t for t in self.tiers if t not in self.costs.tiers]
        if missing:
            many = len(missing) > 1
            tiers = f"the {' and '.join(missing)} tier{'s' if many else ''}"
            # only the flash tier can come from the command line; the host's is measured
            raise ProblemError(
                f"paging to {tiers} needs {'their' if many else 'its'} bandwidths: give a "
                f"profile with {tiers} (`edge-remat profile --device D` measures "
                f"{'them' if many else 'it'})"
                + (", or --flash-read-bw/--flash-write-bw for flash" if "flash" in missing
                   else ""))
        g = self.graph
        self.n = len(g)
        self.ids = [node.id for node in g.nodes]
        self.sizes = [node.out_bytes for node in g.nodes]
        # The cost model's workspace (a profile's where it measured one), as the simulator
        # takes it: every solver reads self.workspace.
        self.workspace = self.costs.workspace(g)
        self.deps = [[g.index[d] for d in node.inputs] for node in g.nodes]
        self.users: list[list[int]] = [[] for _ in range(self.n)]
        for k, ds in enumerate(self.deps):
            for i in ds:
                self.users[i].append(k)
        self.fixed = g.fixed_bytes + self.costs.runtime_warm_bytes
        # node -> the update that steps the parameters it reads (no recompute after it)
        self.stepped = g.stepped_by()
        self.plain_time = sum(self.costs.time_s)
        # param nodes an overlapped plan reads from their home on the IO timeline (overlap.py)
        self.home_reads = [node.read_from_home for node in g.nodes]

    def used_after(self, i: int, t: int) -> bool:
        """Whether node i has a user after stage t (next_use's question in O(1))."""
        users = self.users[i]
        return bool(users) and users[-1] > t

    def next_use(self, i: int, t: int) -> int | None:
        """The first user of node i that comes after stage t, or None."""
        users = self.users[i]
        pos = bisect.bisect_right(users, t)
        return users[pos] if pos < len(users) else None

    def objective_value(self, time_s: float, energy_j: float) -> float:
        return time_s if self.objective == "time" else energy_j

    def deadline_s(self) -> float | None:
        return None if self.deadline is None else self.deadline * self.plain_time

    def deadline_time(self, compute_s: float, paging_s: float) -> float:
        """The time that counts against the deadline under this problem's paging-time mode."""
        return compute_s + (paging_s if self.paging_time == "counted" else 0.0)

    def deadline_time_of(self, sim) -> float:
        """As deadline_time, for a simulated schedule: overlapped, paging counts only where
        it is not hidden behind compute (the makespan)."""
        if self.overlapped and self.paging_time == "counted":
            return sim.time_s
        return self.deadline_time(sim.compute_time_s, sim.paging_time_s)

    @property
    def source_graph(self) -> Graph:
        """The graph in the order it was given: the one the plan is for."""
        return self.given_graph if self.given_graph is not None else self.graph

    @property
    def overlapped(self) -> bool:
        """Scored on the IO timeline: paging, or parameters read from their home, beside
        compute."""
        return self.io == "overlap" and (bool(self.tiers) or any(self.home_reads))

    def hidden_home_reads(self) -> list[bool]:
        """The nodes whose computes an overlapped plan may hide behind compute: param nodes
        read from their home (none where the plan is not overlapped)."""
        return self.home_reads if self.overlapped else [False] * self.n

    def smallest_budget(self, seconds: float = 2.0) -> tuple[int, int]:
        """(bytes, node index): no schedule fits below a node's inputs + output + workspace;
        without paging, nor below the pebbling floor (pebbling.py) where that is higher (its
        search stops after `seconds`, the floor proven by then standing)."""
        need, k = floor_node(self.graph, self.workspace)
        game = None if self.tiers else pebbling_floor(self.sizes, self.deps, self.workspace,
                                                      need, seconds)
        return (self.fixed + game.bytes, game.node) if game else (self.fixed + need, k)

    def check_budget(self) -> None:
        """Raise InfeasibleBudget, naming the highest floor known, for a budget below a
        node's inputs + output + workspace or, without paging, below the pebbling floor."""
        need, k = floor_node(self.graph, self.workspace)
        capacity = self.budget_bytes - self.fixed
        proof = None if self.tiers or capacity < need else proves_too_small(
            self.sizes, self.deps, self.workspace, capacity)
        if capacity >= need and proof is None:
            return
        game = None if self.tiers else pebbling_floor(self.sizes, self.deps, self.workspace,
                                                      max(need, capacity))
        if game is None and proof is not None:  # the floor's search ran out of time first
            game = PebblingFloor(capacity + 1, proof)
        warm = self.costs.runtime_warm_bytes  # not the graph's: the profile's (QA)
        fixed = f", plus {self.fixed} bytes of fixed memory" if self.fixed else ""
        if warm:
            fixed = (f", plus {self.fixed} bytes of fixed memory ({self.graph.fixed_bytes} the "
                     f"graph's, {warm} what the runtime's first calls keep, from the profile)")
        if game is None:
            smallest, why = self.fixed + need, describe_floor(self.graph, k, self.workspace)
        else:
            node = self.graph.nodes[game.node]
            smallest = self.fixed + game.bytes
            why = (f"node {node.id!r} ({node_label(node)}) needs its {len(node.inputs)} inputs "
                   "in RAM at once, and whichever of them is computed last needs its own "
                   "inputs beside the others held, and so on back through the graph: no order "
                   f"of recomputation fits {game.bytes - 1} bytes")
        # `smallest` is a proven floor, not a budget known to plan: a schedule may need more
        raise InfeasibleBudget(
            f"budget {counted(self.budget_bytes, 'byte')} is too small: every schedule needs "
            f"at least {smallest} bytes (a lower bound; a budget there may still not plan): "
            f"{why}{fixed}" + ("" if game is None else " (without paging: --paging flash or "
                               "host lets a tensor come back without its inputs)"), smallest)

    def fingerprint(self) -> str:
        content = {"graph": self.source_graph.fingerprint(), "budget": self.budget_bytes,
                   "objective": self.objective, "deadline": self.deadline, "tiers": self.tiers,
                   "paging_time": self.paging_time, "profile": self.profile_name,
                   **({"io": self.io} if self.io != "sync" else {}),
                   **({"order": "memory"} if self.given_graph is not None else {}),
                   "static_w": self.costs.static_w}
        return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()[:16]
