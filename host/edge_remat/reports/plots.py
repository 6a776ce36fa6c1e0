"""Pictures of a plan and a run (PNG, matplotlib's Agg backend, imported only when drawing).

    schedule.png  stage x node: computed / kept in RAM / paged to flash or host
                  (binned above MAX_CELLS stages or nodes, in at most MAX_INCHES a side)
    memory.png    RAM over one step's instructions, planned and plain, against the budget, with
                  what the board measured (tensor peak, process peak, the kernel's peak, limit)
    sweep.png     a budget sweep (`edge-remat plan --sweep ... --json`): energy and time
                  against the memory budget (a fleet: one line per board)
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional, Sequence

from edge_remat_agent.formats import HOME, Graph, Plan, Profile

MIB = 2**20
# Cell codes of the schedule matrix, drawn in this order of colours.
EMPTY, IN_RAM, ON_FLASH, ON_HOST, COMPUTED = range(5)
CELL_LABELS = ("not held", "kept in RAM", "on flash", "on host", "computed")
CELL_COLOURS = ("#ffffff", "#9ecae1", "#fd8d3c", "#9e9ac8", "#08306b")


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # files only: no display on a board or in CI
    import matplotlib.pyplot as plt
    return plt


def schedule_matrix(graph: Graph, plan: Plan, stages_per_row: int = 1,
                    nodes_per_column: int = 1):
    """One row per stage, one column per node: what the stage did with the node's output (a
    numpy uint8 array). Binned (more than one stage or node a cell), a cell holds the largest
    code of those it covers, the most notable: computed, on host, on flash, kept in RAM.
    Built row by row into the binned array, so a large plan never holds stages x nodes."""
    import numpy as np
    n, ram = len(graph), set()
    tiers: dict[str, set[int]] = {"flash": set(), "host": set()}
    held = np.full(n, EMPTY, np.uint8)  # each node's code before this stage's computations
    rows = np.zeros((-(-len(plan.stages) // stages_per_row), -(-n // nodes_per_column)), np.uint8)
    starts = np.arange(0, n, nodes_per_column)
    for k, stage in enumerate(plan.stages):
        computed = []
        for ins in stage:
            i = graph.index[ins.node]
            if ins.op == "compute" or ins.tier == HOME:  # a read from home computes it
                ram.add(i)
                computed.append(i)
            elif ins.op == "free":
                ram.discard(i)
            elif ins.op == "page_out":
                ram.discard(i)
                tiers[ins.tier].add(i)
            elif ins.op == "page_in":
                ram.add(i)
            held[i] = (IN_RAM if i in ram else ON_FLASH if i in tiers["flash"] else
                       ON_HOST if i in tiers["host"] else EMPTY)
        row = held.copy()
        row[computed] = COMPUTED
        binned = np.maximum.reduceat(row, starts) if n else row
        np.maximum(rows[k // stages_per_row], binned, out=rows[k // stages_per_row])
    return rows


# The schedule's size caps: a plan of thousands of stages and nodes drew one figure inch per
# 8 nodes (11244 x 9155 px for 1050 nodes, 23 GB and the OOM killer for 5000; QA). At most
# MAX_CELLS cells a side (binned above it; a cell still a few pixels) in at most MAX_INCHES a
# side, about 2600 px at _save's 110 dpi, with the text scaled up with the figure to be read.
MAX_CELLS = 1000
MAX_INCHES = 24.0


def plot_schedule(graph: Graph, plan: Plan, path: "str | Path", title: str = "") -> Path:
    import numpy as np
    plt = _pyplot()
    from matplotlib.colors import ListedColormap
    from matplotlib.patches import Patch
    stages, nodes = len(plan.stages), len(graph)
    per_row, per_column = (max(1, -(-count // MAX_CELLS)) for count in (stages, nodes))
    matrix = schedule_matrix(graph, plan, per_row, per_column)
    size = (min(MAX_INCHES, max(6, nodes * 0.12 + 2)), min(MAX_INCHES, max(4, stages * 0.1 + 2)))
    with plt.rc_context({"font.size": 10 * min(2.4, max(1.0, max(size) / 10))}):
        fig, ax = plt.subplots(figsize=size)
        # extent in stages and nodes, not cells: the axes read the same binned or not; codes
        # resampled before colouring ("data"), not as RGBA floats: a third of the memory
        ax.imshow(matrix, cmap=ListedColormap(CELL_COLOURS), vmin=0, vmax=len(CELL_COLOURS) - 1,
                  aspect="auto", interpolation="nearest", interpolation_stage="data",
                  extent=(-0.5, matrix.shape[1] * per_column - 0.5,
                          matrix.shape[0] * per_row - 0.5, -0.5))
        ax.set_xlim(-0.5, nodes - 0.5)
        ax.set_ylim(stages - 0.5, -0.5)
        ax.set_xlabel("node (graph order)")
        ax.set_ylabel("stage")
        binned = (f"\nbinned: a cell is {per_row} x {per_column} (stages x nodes), "
                  "the most notable shown" if per_row > 1 or per_column > 1 else "")
        ax.set_title((title or f"schedule: {stages} stages x {nodes} nodes") + binned)
        used = set(np.unique(matrix).tolist()) | {COMPUTED, IN_RAM}
        ax.legend(handles=[Patch(facecolor=CELL_COLOURS[c], edgecolor="grey",
                                 label=CELL_LABELS[c]) for c in sorted(used) if c != EMPTY],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        return _save(fig, path)


def memory_traces(graph: Graph, plan: Plan,
                  profile: Optional[Profile] = None) -> tuple[list[int], list[int]]:
    """RAM at each instruction (tensors + fixed memory) of the plan and of plain PyTorch's
    schedule (`plain_reference`, what a fractional budget is a fraction of), with the
    profile's workspaces where the plan was made with it: the peaks the reports name."""
    from edge_remat_agent.costs import plan_costs
    from edge_remat_agent.simulate import simulate
    planned = simulate(graph, plan_costs(graph, plan, profile), plan.stages).memory_trace
    return planned, plain_trace(graph, profile)


def plain_trace(graph: Graph, profile: Optional[Profile] = None) -> list[int]:
    """RAM at each instruction of plain PyTorch's schedule (`plain_reference`), with the
    profile's workspaces: memory_traces' second, for a caller that replayed the plan itself
    (plot: the replay its over-budget warning reads)."""
    from edge_remat_agent.costs import build_costs

    from ..planner.baselines import keep_all
    from ..planner.build import plain_reference
    from ..planner.evaluate import evaluate
    from ..planner.problem import Problem
    reference = plain_reference(graph)
    unlimited = Problem(reference, build_costs(reference, profile), budget_bytes=2**62)
    return evaluate(unlimited, keep_all(unlimited)).sim.memory_trace


def _mib(nbytes: float) -> str:
    """MiB as the reports print them (two decimals): a label and the text agree."""
    return f"{nbytes / MIB:.2f}"


def plot_memory(planned: Sequence[int], budget_bytes: int, path: "str | Path",
                plain: Optional[Sequence[int]] = None,
                measured_trace: Optional[Sequence[int]] = None,
                measured: Optional[dict] = None, title: str = "") -> Path:
    """`measured` may hold tensor_peak_bytes, process_peak_bytes, kernel_peak_bytes and
    limit_bytes: each becomes a labelled horizontal line."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.8))
    if plain:
        ax.plot(_fraction_axis(plain), [b / MIB for b in plain], color="#bdbdbd",
                label=f"plain schedule (peak {_mib(max(plain))} MiB)")
    ax.plot(_fraction_axis(planned), [b / MIB for b in planned], color="#08519c",
            label=f"planned (peak {_mib(max(planned))} MiB)")
    if measured_trace:
        ax.plot(_fraction_axis(measured_trace), [b / MIB for b in measured_trace],
                color="#d94801", linestyle=":", label="measured tensors")
    ax.axhline(budget_bytes / MIB, color="#cb181d", linestyle="--",
               label=f"budget {_mib(budget_bytes)} MiB")
    styles = {"tensor_peak_bytes": ("measured tensor peak", "#d94801", "-."),
              "process_peak_bytes": ("measured process peak (RSS)", "#6a51a3", "-."),
              "kernel_peak_bytes": ("kernel's peak (cgroup)", "#000000", ":"),
              "limit_bytes": ("memory limit", "#67000d", "-")}
    for key, (label, colour, style) in styles.items():
        value = (measured or {}).get(key)
        if value:
            ax.axhline(value / MIB, color=colour, linestyle=style,
                       label=f"{label} {_mib(value)} MiB")
    ax.set_xlabel("progress through one training step (instructions)")
    ax.set_ylabel("MiB")
    ax.set_ylim(bottom=0)
    ax.set_title(title or "memory over one step")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return _save(fig, path)


def plot_sweep(rows: Sequence[dict], path: "str | Path", title: str = "",
               units: tuple[str, str] = ("s", "J")) -> Path:
    """Rows as `edge-remat plan --sweep --json` prints them (budget_bytes, energy_j, time_s);
    `units`: its (time, energy) units, a graph file's cost units where its costs are not
    seconds (they were labelled s and J)."""
    return plot_sweeps({"": rows}, path, title, units)


SERIES_COLOURS = ("#08519c", "#e6550d", "#31a354", "#756bb1", "#636363", "#d6616b")


def plot_sweeps(series: "dict[str, Sequence[dict]]", path: "str | Path",
                title: str = "", units: tuple[str, str] = ("s", "J")) -> Path:
    """One line per series (e.g. per board in a fleet), each a sweep's rows; a budget with no
    plan is a dotted vertical line in the series' colour."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    any_infeasible = False
    highest = {"energy_j": 0.0, "time_s": 0.0}
    for k, (label, rows) in enumerate(series.items()):
        colour = SERIES_COLOURS[k % len(SERIES_COLOURS)]
        solved = sorted((r for r in rows if r.get("energy_j") is not None
                         and r.get("budget_bytes")), key=lambda r: r["budget_bytes"])
        infeasible = [r for r in rows if r.get("energy_j") is None and r.get("budget_bytes")]
        any_infeasible = any_infeasible or bool(infeasible)
        for ax, key in ((top, "energy_j"), (bottom, "time_s")):
            ax.plot([r["budget_bytes"] / MIB for r in solved], [r[key] for r in solved],
                    marker="o", color=colour, label=label or None)
            highest[key] = max([highest[key], *(r[key] for r in solved)])
            for r in infeasible:
                ax.axvline(r["budget_bytes"] / MIB, color=colour if label else "#cb181d",
                           linestyle=":", alpha=0.6)
    for ax, label, key in ((top, f"energy per step ({units[1]})", "energy_j"),
                           (bottom, f"time per step ({units[0]})", "time_s")):
        ax.set_ylabel(label)
        ax.grid(alpha=0.3)
        # costs are never negative (QA: with no plan, -0.04 to 0.04); the axis from 0 keeps
        # the autoscaled top, a margin of the values' narrow range: room above the highest
        # marker (QA: the top markers and line were cut in half)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1.08 * highest[key]) if highest[key] else None)
    if any_infeasible:
        top.plot([], [], color="#cb181d" if "" in series else "#636363", linestyle=":",
                 label="no plan (below the floor, or none found)")
    if any_infeasible or any(series):  # beside the axes: inside, it hid a board's points (QA)
        top.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    bottom.set_xlabel("memory budget (MiB)")
    top.set_title(title or "cost of training against the memory budget")
    return _save(fig, path)


def _fraction_axis(values: Sequence) -> list[float]:
    n = max(1, len(values) - 1)
    return [k / n for k in range(len(values))]


def _save(fig, path: "str | Path") -> Path:
    """Draw into memory, then write the file as every JSON file is (dump_bytes: a temporary
    file beside it, renamed over it): QA, a full disk left a 0-byte schedule.png, which the
    retry then refused as an existing file, and an error that named no file."""
    import io

    import matplotlib.pyplot as plt
    from edge_remat_agent.formats.fields import dump_bytes
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    image = io.BytesIO()
    try:
        fig.savefig(image, format=path.suffix.lstrip(".").lower() or "png", dpi=110,
                    bbox_inches="tight")
    finally:
        plt.close(fig)
    dump_bytes(image.getvalue(), path)
    return path
