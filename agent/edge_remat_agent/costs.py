"""What each step of a schedule costs: per-node compute time and energy, per-tier paging costs,
and the workspace each node needs while it computes.

One cost model serves the simulator, the solvers and the reports, so that they agree to the joule
and to the byte: build_costs is the one place where a profile's measurements override the
graph's figures (time, energy, workspace), and the simulator (simulate.py) and the planner's
Problem (host planner/problem.py, which every solver reads) take each node's workspace from
`CostModel.workspace_bytes`, never from the graph's nodes; fixed memory likewise adds the
first calls' memory a profile measured (`CostModel.runtime_warm_bytes`) to the graph's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from .formats import HOME, ComputeRates, FormatError, Graph, Node, Plan, Profile, Tier
from .formats.graph import homed_bytes, ram_homed_signature
from .formats.graph_details import WEIGHT_FILE
from .timeline import Timeline, TimelineRun, run_timeline

# Modelled page tiers for a parameter home when no profile or command line gives figures:
# a board's eMMC / SD card (reads ~100 MB/s, writes ~40 MB/s) and a USB 2 link to a host
# (~35 MB/s each way). Only for costing param and update nodes; a profile replaces them.
ESTIMATED_TIERS = {
    "flash": Tier(read_bytes_per_s=100e6, write_bytes_per_s=40e6, latency_s=1e-4),
    "host": Tier(read_bytes_per_s=35e6, write_bytes_per_s=35e6, latency_s=1e-3),
}

# Without a power model, energy is reported as if the board drew 1 W above idle and 0 W idle,
# so that it equals compute time; reports say so.
DEFAULT_ACTIVE_W = 1.0


@dataclass
class TierCosts:
    """Per-node paging costs for one tier (arrays indexed like the graph's nodes)."""

    out_time_s: list[float]
    out_energy_j: list[float]
    in_time_s: list[float]
    in_energy_j: list[float]
    capacity_bytes: int | None = None  # what page-outs may hold: the tier's, less its home
    compute_share: float = 0.0  # compute lost per second of this tier's IO beside it (Tier's)
    # What the parameters homed on this tier need of its capacity (formats.graph.homed_bytes):
    # taken off capacity_bytes, as the home and the page-outs fill one folder.
    home_bytes: int = 0


@dataclass
class CostModel:
    time_s: list[float]
    energy_j: list[float]  # dynamic compute energy per node (above idle)
    static_w: float = 0.0  # idle power, charged for the whole step
    tiers: dict[str, TierCosts] = field(default_factory=dict)
    power_source: str = "default"  # "profile:<name>" | "graph" | "default"
    time_source: str = "graph"
    # Where node costs come from, in the graph format's words: "profile" when a profile
    # measured every node, "profile+<graph's source>" when some, else the graph's own.
    cost_source: str = "unknown"
    # Bytes each node needs while it computes beyond its output (indexed like the graph's
    # nodes): a profile's measured workspace (the allocator's peak: scratch inside kernels
    # included) where its op has one, else the graph's. None: the graph's, node by node.
    workspace_bytes: list[int] | None = None
    workspace_source: str = "graph"  # "graph" | "profile:<name> for k/n nodes"
    # The figures each tier's costs came from (a profile's or the command line's; a tier the
    # graph costs node by node has none): what a plan carries so that it replays on its own.
    tier_figures: dict[str, Tier] = field(default_factory=dict)
    # What the graph's ops' first calls leave to the process (a profile's `persistent_bytes`
    # over the graph's distinct ops): fixed memory from the first step on, which the runtime
    # baseline, taken before it, does not hold. Every schedule pays it, plain PyTorch's too.
    runtime_warm_bytes: int = 0
    # Of each node's time and energy, what reading and writing its parameters' home takes
    # (param and update nodes under --params-home flash|host): IO that reports name apart
    # from compute. None: no node has any.
    home_io_s: list[float] | None = None
    home_io_j: list[float] | None = None
    # Compute lost per second of a read from the parameters' home beside it (the home tier's
    # compute_share; the largest where groups live on two tiers).
    home_compute_share: float = 0.0

    def timeline(self, ops, deps: list[list[int]], sizes: list[int],
                 sync_trace: list[int]) -> Timeline:
        """The IO timeline (timeline.py) of resolved instructions under these costs: node
        times, each tier's read and write times and its compute share."""
        return run_timeline(ops, deps, sizes, self.time_s, *self._tier_times(), sync_trace,
                            compute_share=self._tier_shares())

    def timeline_run(self, deps: list[list[int]], sizes: list[int],
                     limit_bytes: int) -> TimelineRun:
        """A step's timelines under these costs, not yet started, to run instruction by
        instruction (timeline.py's TimelineRun)."""
        return TimelineRun(deps, sizes, self.time_s, *self._tier_times(), limit_bytes,
                           self._tier_shares())

    def _tier_times(self) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
        # a read from home takes what computing its param node takes (simulate.py)
        return ({**{name: tier.in_time_s for name, tier in self.tiers.items()},
                 HOME: self.time_s},
                {name: tier.out_time_s for name, tier in self.tiers.items()})

    def _tier_shares(self) -> dict[str, float]:
        return {**{name: tier.compute_share for name, tier in self.tiers.items()},
                HOME: self.home_compute_share}

    def in_order(self, positions: list[int]) -> "CostModel":
        """The same costs for the graph's nodes in another order: node i of the new order is
        node positions[i] of this one (planner/ordering.py reorders graphs whose order is
        free)."""
        def pick(values):
            return None if values is None else [values[k] for k in positions]
        tiers = {name: replace(tier, out_time_s=pick(tier.out_time_s),
                               out_energy_j=pick(tier.out_energy_j),
                               in_time_s=pick(tier.in_time_s), in_energy_j=pick(tier.in_energy_j))
                 for name, tier in self.tiers.items()}
        return replace(self, time_s=pick(self.time_s), energy_j=pick(self.energy_j), tiers=tiers,
                       workspace_bytes=pick(self.workspace_bytes), home_io_s=pick(self.home_io_s),
                       home_io_j=pick(self.home_io_j))

    def workspace(self, graph: Graph) -> list[int]:
        """Each node's workspace bytes (the graph's where this model has none)."""
        if self.workspace_bytes is None:
            return [node.workspace_bytes for node in graph.nodes]
        if len(self.workspace_bytes) != len(graph):
            raise ValueError(f"the cost model has workspace for {len(self.workspace_bytes)} "
                             f"nodes, graph '{graph.name}' has {len(graph)}")
        return list(self.workspace_bytes)

    def describe(self) -> dict[str, Any]:
        return {"static_w": self.static_w, "power_source": self.power_source,
                "time_source": self.time_source, "cost_source": self.cost_source,
                "workspace_source": self.workspace_source, "tiers": sorted(self.tiers),
                "runtime_warm_bytes": self.runtime_warm_bytes}


def build_costs(graph: Graph, profile: Profile | None = None,
                tiers: dict[str, Tier] | None = None) -> CostModel:
    """Costs from the graph, overridden by a profile's measurements (matched by op signature:
    `node.signature or node.op`): time, energy, and workspace where the profile's op has one."""
    times, energies, from_profile = [], [], 0
    workspaces, workspace_from_profile = [], 0
    io_times, io_energies = [], []
    idle_w = profile.idle_w if profile else 0.0
    # marginal compute power: never below 0 (a profile's busy power within noise of idle),
    # else compute would earn energy and --objective energy favour recomputation
    dynamic_w = max(0.0, profile.active_w - profile.idle_w) if profile else DEFAULT_ACTIVE_W
    have_time = [n.time_s is not None for n in graph.nodes]
    unit_costs = not any(have_time)
    roofline = board_roofline(graph, profile)
    from_roofline = 0
    all_tiers = dict(profile.tiers) if profile else {}
    all_tiers.update(tiers or {})
    for node, has in zip(graph.nodes, have_time):
        key = profile_key_for(profile, node) if profile else None
        measured = profile.ops[key] if key is not None else None
        own = key == (node.signature or node.op)
        # an update homed off RAM stages its state in RAM: the RAM twin's workspace is not its
        if measured is not None and own and measured.workspace_bytes is not None:
            workspace_from_profile += 1
            workspaces.append(int(measured.workspace_bytes))
        else:
            workspaces.append(int(node.workspace_bytes))
        if measured is not None:
            from_profile += 1
            time = measured.time_s
            energy = measured.energy_j if measured.energy_j is not None else time * dynamic_w
        else:
            if not has and not unit_costs:
                raise FormatError(graph.name, f"node {node.id!r}.time_s",
                                  "a cost on every node (other nodes have one)")
            time = 1.0 if unit_costs else node.time_s
            energy = node.energy_j
            if roofline is not None:  # the board's time; its energy follows from its power
                time, energy, from_roofline = roofline(node), None, from_roofline + 1
            if energy is None:
                energy = time * dynamic_w
        io_time, io_energy = home_io_cost(node, all_tiers)
        times.append(float(time) + io_time)
        energies.append(float(energy) + io_energy)
        io_times.append(io_time)
        io_energies.append(io_energy)
    sizes = [n.out_bytes for n in graph.nodes]
    tier_costs = {name: tier_costs_from(tier, sizes, sum(homed_bytes(graph, name)))
                  for name, tier in all_tiers.items()}
    tier_costs.update(_per_node_tiers(graph, exclude=set(all_tiers)))
    if profile:
        said = f"({profile.source})" in profile.name  # "... (modelled)" names say it already
        power_source = f"profile:{profile.name}" + ("" if said else f" ({profile.source})")
    else:
        power_source = "graph" if any(n.energy_j is not None for n in graph.nodes) else "default"
    time_source = ("unit" if unit_costs else
                   f"profile:{profile.name} for {from_profile}/{len(graph)} nodes" if from_profile
                   else graph.cost_source)
    if from_roofline:
        time_source += (f"; the board's roofline ({profile.name}) for {from_roofline}/"
                        f"{len(graph)} nodes")
    cost_source = ("profile" if from_profile == len(graph) else
                   f"profile+{graph.cost_source}" if from_profile else
                   "unit" if unit_costs else graph.cost_source)
    workspace_source = (f"profile:{profile.name} for {workspace_from_profile}/{len(graph)} "
                        "nodes" if workspace_from_profile else "graph")
    has_io = any(io_times)
    homes = {n.attrs["io"]["tier"] for n in graph.nodes if n.read_from_home}
    home_share = max((all_tiers[name].compute_share for name in homes if name in all_tiers),
                     default=0.0)
    return CostModel(times, energies, idle_w, tier_costs, power_source, time_source, cost_source,
                     workspaces, workspace_source, all_tiers, runtime_warm_bytes(graph, profile),
                     io_times if has_io else None, io_energies if has_io else None,
                     home_share)


def plan_costs(graph: Graph, plan: Plan, profile: Profile | None = None) -> CostModel:
    """The costs a plan is replayed with: the graph's where its profile is not at hand (else
    the profile's), the figures of the tiers it pages to and the first calls' memory it
    counted, all its own."""
    return replace(build_costs(graph, profile, plan.tiers),
                   runtime_warm_bytes=plan.runtime_warm_bytes)


def runtime_warm_bytes(graph: Graph, profile: Profile | None) -> int:
    """The profile's `persistent_bytes` over the graph's distinct ops (0 without any)."""
    if profile is None:
        return 0
    keys = {profile_key_for(profile, node) for node in graph.nodes} - {None}
    return sum(profile.ops[key].persistent_bytes or 0 for key in keys)


def profile_key_for(profile: Profile, node: Node) -> str | None:
    """The profile's key that measured the node's op: its signature (else its op); for an
    update whose group lives on a page tier, failing that, the same update's with the group in
    RAM, the only one a board's profile job runs. Its time and what its first call leaves are
    the node's: the same step on the same tensors (reading and writing the home is costed
    apart, home_io_cost). Without it a run with parameters on flash matched none of its
    updates in the profile of the graph with them in RAM, which holds most of the warm-up
    (resnet18 b8: 4.33 of 4.78 MB), and the plan charged 0.12 MiB. None: not measured."""
    own = node.signature or node.op
    if own in profile.ops:
        return own
    twin = ram_homed_signature(node)
    return twin if twin in profile.ops else None


def board_roofline(graph: Graph, profile: Profile | None):
    """node -> its time on the profile's board, for the nodes the profile did not time: the
    capture's estimate rescaled by the node's roofline at the board's rates over its roofline
    at the capture's (the estimate sums each ATen op's own roofline, so the ratio keeps its
    mix of compute- and memory-bound ops). None where there is nothing to rescale: no
    `compute` rates in the profile, or a graph whose times are not the capture's estimate."""
    rates = profile.compute if profile is not None else None
    captured = graph.capture.get("estimate") if graph.cost_source == "estimate" else None
    if rates is None or not captured:
        return None
    board = ComputeRates(rates.flops_per_s, rates.bytes_per_s,
                         rates.op_overhead_s if rates.op_overhead_s is not None
                         else captured["op_overhead_s"])
    estimate = ComputeRates(captured["flops_per_s"], captured["bytes_per_s"],
                            captured["op_overhead_s"])

    def line(node, r: ComputeRates) -> float:
        ops = max(1, len(node.attrs.get("members", ())))
        return max(node.attrs.get("flops", 0) / r.flops_per_s,
                   node.attrs.get("bytes_moved", 0) / r.bytes_per_s) + ops * r.op_overhead_s

    def time_on_board(node) -> float:
        at_estimate = line(node, estimate)
        return node.time_s * line(node, board) / at_estimate if at_estimate > 0 else node.time_s
    return time_on_board


def home_io_cost(node, tiers: dict[str, Tier]) -> tuple[float, float]:
    """What a node's reads and writes of its parameters' home cost (param nodes read a group,
    update nodes read and write its optimizer state and write the new parameters): the tier's
    measured figures, else the modelled ones (capture/estimate.py)."""
    io = node.attrs.get("io")
    if not io:
        return 0.0, 0.0
    return home_transfer_cost(node, io["read_bytes"], io["write_bytes"], tiers)


def home_transfer_cost(node, read_bytes: int, write_bytes: int,
                       tiers: dict[str, Tier]) -> tuple[float, float]:
    """Seconds and joules of reading and writing these bytes of the node's home tier (its
    `attrs.io.tier`), in one read and one write as a node makes them; a group from the frozen
    weight file (`attrs.io.source`) at that file's read rate."""
    io = node.attrs["io"]
    tier = tiers.get(io["tier"]) or ESTIMATED_TIERS.get(io["tier"])
    if tier is None:
        raise FormatError(f"node {node.id!r}", "attrs.io.tier", "flash or host", io["tier"])
    read = tier.weights_read_cost if io.get("source") == WEIGHT_FILE else tier.read_cost
    read_s, read_j = read(read_bytes) if read_bytes else (0.0, 0.0)
    write_s, write_j = tier.write_cost(write_bytes) if write_bytes else (0.0, 0.0)
    return read_s + write_s, read_j + write_j


def _per_node_tiers(graph: Graph, exclude: set[str]) -> dict[str, TierCosts]:
    """Tiers whose costs the graph gives node by node (`attrs.page_costs`, e.g. POET's problems);
    a profile's or the command line's tier takes precedence."""
    names = {name for node in graph.nodes for name in node.attrs.get("page_costs", {})} - exclude
    out = {}
    for name in sorted(names):
        rows = [node.attrs.get("page_costs", {}).get(name) for node in graph.nodes]
        if any(row is None for row in rows):
            raise FormatError(graph.name, f"attrs.page_costs.{name}", "costs on every node")
        out[name] = TierCosts(*([float(row[key]) for row in rows] for key in
                                ("out_time_s", "out_energy_j", "in_time_s", "in_energy_j")))
    return out


def tier_costs_from(tier: Tier, sizes: list[int], home_bytes: int = 0) -> TierCosts:
    """`home_bytes`: what parameters homed on the tier need of its capacity; page-outs get
    the rest (none where they need it all). Before, page-outs had the whole capacity, and
    `--params-home flash --paging flash` filled the page folder mid-step."""
    writes = [tier.write_cost(s) for s in sizes]
    reads = [tier.read_cost(s) for s in sizes]
    capacity = tier.capacity_bytes
    if capacity is not None:
        capacity = max(0, capacity - home_bytes)
    return TierCosts([w[0] for w in writes], [w[1] for w in writes],
                     [r[0] for r in reads], [r[1] for r in reads], capacity,
                     tier.compute_share, home_bytes)
