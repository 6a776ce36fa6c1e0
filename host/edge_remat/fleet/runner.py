"""Run a fleet: capture each model once, plan every (model, board, budget, deadline), write
the plans into the output tree, and collect the results.

    OUT/MODEL/graph.json                   the captured graph (capture.json: how)
    OUT/MODEL/BOARD/plan-80pct.json        the plan, as `edge-remat plan` writes it
    OUT/MODEL/sweep.png                    energy and time against memory, one line per board
    OUT/results.json, OUT/results.csv      one row per task

Resumable: a graph captured with the same settings, and a plan for the same problem (the plan's
fingerprint: graph, budget, objective, deadline, tiers, profile) that the simulator replays
with the figures it promises under the board's profile, are kept, not planned again. Failed
tasks are recorded with their one-line error and tried again on the next run; so are tasks
whose budget or deadline is infeasible, which are answers (the floor, or the smallest deadline), not
failures.

Solver threads: the cores (Ray: the cluster's CPUs) shared out among the tasks in flight, so
that tasks do not oversubscribe them; each Ray task asks for as many CPUs as it has threads.
"""

from __future__ import annotations

import json
import math
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from edge_remat_agent.formats import Graph, load_plan
from edge_remat_agent.formats.fields import dump_json
from edge_remat_agent.units import counted

from ..errors import Interrupted
from ..planner.interrupt import stopped_by
from .manifest import Manifest, ModelEntry
from .progress import Progress
from .results import (INFEASIBLE, failed_row, infeasible_text, is_failure, plan_row,
                      write_results, write_tables)
from .tasks import PlanTask


@dataclass
class FleetResult:
    rows: list[dict]
    files: list[Path]
    workers: int
    in_flight: int
    seconds: float
    slowest: list[tuple[float, str]]

    @property
    def failed(self) -> list[dict]:
        return [row for row in self.rows if is_failure(row)]

    @property
    def infeasible(self) -> list[dict]:
        return [row for row in self.rows if row["status"] in INFEASIBLE]


def solver_threads(cpus: int, tasks: int, parallel: bool, threads: Optional[int]) -> int:
    """Threads per solve: cores / tasks in flight (all of them when one task runs at a time)."""
    if threads is not None:
        return threads
    if not parallel:
        return cpus
    return max(1, cpus // max(1, min(cpus, tasks)))


def run_fleet(manifest: Manifest, out: Path, backend, threads: Optional[int] = None,
              say: Callable[[str], None] = lambda line: None,
              live: Optional[bool] = None) -> FleetResult:
    started = time.perf_counter()
    out = Path(out)
    boards = {b.name: b for b in manifest.boards}
    tasks = [PlanTask(m.name, b.name, budget, deadline) for m in manifest.models
             for b in manifest.boards for budget in manifest.budgets
             for deadline in manifest.deadlines]
    rows: dict[PlanTask, dict] = {}
    graphs: dict[str, Graph] = {}
    to_capture: list[ModelEntry] = []
    # every graph file a manifest names was read with it (load_manifest): a bad one is refused
    # with nothing written (QA: the graphs read before it were left in OUT)
    known = {model.name: _known_graph(model, out) for model in manifest.models}
    for model in manifest.models:
        graph = known[model.name]
        if graph is None:
            to_capture.append(model)
            continue
        if model.graph_file is not None:
            (out / model.name).mkdir(parents=True, exist_ok=True)
            graph.save(out / model.name / "graph.json")
        graphs[model.name] = graph
        _say_profile_fit(graph, manifest.boards, say)
    for task in tasks:
        if task.model in graphs:
            kept = _kept_row(task, graphs[task.model], boards[task.board].profile, manifest, out)
            if kept is not None:
                rows[task] = kept
    to_plan = [t for t in tasks if t not in rows]
    workers = solver_threads(backend.cpus, len(to_plan), backend.parallel,
                             threads or manifest.threads)
    in_flight_max = max(1, backend.cpus // workers) if backend.parallel else 1
    shared_graphs = {name: backend.share(graph) for name, graph in graphs.items()}
    shared_profiles = {name: backend.share(b.profile) for name, b in boards.items()}

    progress = Progress(len(tasks), len(rows), say, live)
    queue = deque([("capture", m) for m in to_capture]
                  + [("plan", t) for t in to_plan if t.model in graphs])
    in_flight: dict = {}  # handle -> (kind, item, when it was submitted)

    def submit(kind, item) -> None:
        if kind == "capture":
            handle = backend.submit_capture(item.spec, item.capture)
            label = f"capturing {item.name}"
        else:
            handle = backend.submit_plan(shared_graphs[item.model],
                                         shared_profiles[item.board], item.budget,
                                         item.deadline, manifest.plan, workers)
            label = item.label
        in_flight[handle] = (kind, item, time.perf_counter())
        progress.started(label)

    def record() -> None:
        """results.csv and results.json of the tasks recorded so far, rewritten as each task
        ends (the plots at the end): what a run that dies leaves (--no-ray, whose process a
        task's SIGKILL ends, left none, QA), as an interrupted one does."""
        write_tables([rows[t] for t in tasks if t in rows], out, str(manifest.path))

    def captured(model: ModelEntry, outcome: dict) -> None:
        progress.stopped(f"capturing {model.name}")
        mine = [t for t in tasks if t.model == model.name]
        if not outcome["ok"]:
            for task in mine:
                rows[task] = failed_row(task, {**outcome, "status": "capture failed",
                                               "seconds": None})
                progress.finished_task(task.label, 0.0, f"capture failed: {outcome['error']}")
            return
        graph = outcome["graph"]
        folder = out / model.name
        folder.mkdir(parents=True, exist_ok=True)
        graph.save(folder / "graph.json")
        dump_json(model.capture_args(), folder / "capture.json")
        say(f"captured {model.name}: {len(graph.nodes)} nodes in {outcome['seconds']:.1f} s")
        _say_profile_fit(graph, manifest.boards, say)
        graphs[model.name] = graph
        shared_graphs[model.name] = backend.share(graph)
        more = []
        for task in mine:
            kept = _kept_row(task, graph, boards[task.board].profile, manifest, out)
            if kept is not None:
                rows[task] = kept
                progress.resumed += 1
            else:
                more.append(("plan", task))
        if backend.parallel:
            queue.extend(more)
        else:  # one at a time: the model's plans before the next capture, so that a model
            queue.extendleft(reversed(more))  # that kills the process leaves them recorded
        progress.redraw()

    def planned(task: PlanTask, outcome: dict) -> None:
        if outcome["ok"]:
            path = out / task.relpath
            path.parent.mkdir(parents=True, exist_ok=True)
            dump_json(outcome["plan"], path)
            rows[task] = plan_row(task, outcome["plan"], outcome["seconds"], resumed=False,
                                  board_ram_bytes=_ram(boards[task.board].profile))
            progress.finished_task(task.label, outcome["seconds"])
        elif outcome["status"] in INFEASIBLE:
            rows[task] = failed_row(task, outcome)
            progress.finished_task(task.label, outcome.get("seconds") or 0.0,
                                   infeasible=infeasible_text(rows[task]))
        else:
            rows[task] = failed_row(task, outcome)
            progress.finished_task(task.label, outcome.get("seconds") or 0.0, outcome["error"])

    try:
        while queue or in_flight:
            while queue and len(in_flight) < in_flight_max:
                submit(*queue.popleft())
            for handle in backend.wait(list(in_flight), timeout_s=1.0):
                kind, item, submitted = in_flight.pop(handle)
                outcome = backend.result(handle)
                if outcome.get("seconds") is None:  # a dead worker's: as long as it ran
                    outcome["seconds"] = time.perf_counter() - submitted
                (captured if kind == "capture" else planned)(item, outcome)
                record()
            progress.redraw()
    except KeyboardInterrupt:
        progress.close()
        ordered = [rows[t] for t in tasks if t in rows]
        write_results(ordered, out, str(manifest.path))  # first: on disk whatever comes next
        backend.cancel(list(in_flight))
        raise Interrupted(f"interrupted ({stopped_by()}) with {len(ordered)} of "
                          f"{counted(len(tasks), 'task')} "
                          f"recorded in {out}/results.csv; run the same command again to "
                          "resume") from None
    finally:
        progress.close()
    ordered = [rows[t] for t in tasks]
    files = write_results(ordered, out, str(manifest.path))
    return FleetResult(ordered, files, workers, in_flight_max, time.perf_counter() - started,
                       progress.slowest())


def _ram(profile) -> Optional[int]:
    return profile.ram_total_bytes if profile is not None else None


def _say_profile_fit(graph: Graph, boards: list, say: Callable[[str], None]) -> None:
    """`plan`'s warning for a measured profile made for another model or shapes (its node
    times are estimates), once per model and board: the tasks plan in workers that print
    nothing, and QA's fleet planned with such a profile without a word. (A modelled profile,
    which times no operator, is what a manifest's `device` asks for: no note.)"""
    from ..checks import note_profile_fit
    for board in boards:
        if board.profile.ops:
            note_profile_fit(board.profile, graph, f"{board.name}'s profile "
                             f"({board.profile_path})", say)


def _known_graph(model: ModelEntry, out: Path) -> Optional[Graph]:
    """A graph file the manifest names (read with it; the caller copies it into the tree),
    or one captured before with the same settings; None: capture it."""
    from ..importers.graph_import import load_graph_file
    folder = out / model.name
    if model.graph_file is not None:
        return model.graph
    try:
        same = json.loads((folder / "capture.json").read_text()) == \
            json.loads(json.dumps(model.capture_args()))
        return load_graph_file(folder / "graph.json") if same else None
    except (OSError, ValueError):
        return None


def _kept_row(task: PlanTask, graph: Graph, profile, manifest: Manifest,
              out: Path) -> Optional[dict]:
    """The results row of the plan already written for this task, if it is for the same
    problem, valid, and holds what the row reports (its solver's status, bound, times): a plan
    missing one, damaged or written by hand, is planned again, as an invalid one is."""
    from ..checks import replay
    from ..planner.build import build_problem
    path = out / task.relpath
    if not path.is_file():
        return None
    try:
        plan = load_plan(path)
        settings = manifest.plan
        problem = build_problem(graph, task.budget, profile, settings.objective, task.deadline,
                                settings.paging, None, settings.paging_time)
        if plan.fingerprint != problem.fingerprint():
            return None
        summary = json.loads(json.dumps(replay(plan, graph, str(path), "graph",
                                               profile).summary()))  # as the file holds it
    except Exception:  # noqa: BLE001 - unreadable, another problem's or invalid: plan again
        return None
    promised = plan.predicted
    for key, value in summary.items():  # the same profile's costs give the same figures
        if key not in promised:
            return None
        if isinstance(value, float) and not math.isclose(value, promised[key], rel_tol=1e-9,
                                                         abs_tol=1e-12):
            return None
        if not isinstance(value, float) and value != promised[key]:
            return None
    try:
        return plan_row(task, plan.to_dict(), None, resumed=True,
                        board_ram_bytes=_ram(profile))
    except KeyError:
        return None
