"""What the host checks before anything goes to the board (the board checks again, as a second
line): a plan against its graph (fingerprint, every instruction, peak against its own budget),
a graph the executor can run, a profile against the graph it costs (the bounds of what a graph
may hold are checked on load: formats/graph.py check_bounds)."""

from __future__ import annotations

import math
import os
from typing import Callable, Optional

from edge_remat_agent.costs import profile_key_for
from edge_remat_agent.formats import Graph, Plan, Profile

from .errors import UserError
from .units import fmt_bytes


def replay_costs(plan: Plan, graph: Graph, profile: Optional[Profile] = None):
    """The costs a replay uses: the profile's where one is given, else the plan's own. Its
    tiers: the plan's (the figures it was planned with, --flash-read-bw's too), but another
    board's profile pages at that board's (QA: a Jetson's flash, 30x the Pi's, replayed the
    Pi's paging time, said to be the Jetson's)."""
    from edge_remat_agent.costs import build_costs, plan_costs
    if not profile:
        return plan_costs(graph, plan)
    return build_costs(graph, profile, {**plan.tiers, **profile.tiers}
                       if another_boards_profile(plan, profile) else plan.tiers)


def another_boards_profile(plan: Plan, profile: Profile) -> bool:
    """Whether `profile` is of another board than the one the plan was made with."""
    planned_with = plan.problem.get("profile")
    return bool(planned_with and profile.name and profile.name != planned_with)


def replayed_profile_note(plan: Plan, profile: Optional[Profile],
                          figures: str = "times and energy") -> Optional[str]:
    """The note where a replay (simulate's figures, plot's memory traces) uses other costs
    than the plan was made with, or None: the graph's own where the plan had a profile and none
    is given, another board's where the profile is of another. `figures`: what of the replay
    the profile changes."""
    planned_with = plan.problem.get("profile")
    if planned_with and profile is None:
        return (f"note: the plan was made with the profile '{planned_with}' and is replayed "
                f"here with the graph's own costs; give --profile for its {figures}")
    if profile is not None and another_boards_profile(plan, profile):
        # QA: another board's profile gave another time and said nothing of it
        return (f"note: the plan was made with the profile '{planned_with}' and is replayed "
                f"here with '{profile.name}': its {figures} are that board's, not the plan's "
                "recorded ones")
    return None


def tiers_not_replayed(plan: Plan, profile: Profile) -> list[str]:
    """The tiers whose figures in the profile of the plan's own board differ from the plan's,
    which the replay keeps (QA: a profile edited to a flash 1000x slower, and too small for
    one page, replayed the same paging time without a word)."""
    if another_boards_profile(plan, profile):
        return []
    return [name for name, tier in plan.tiers.items()
            if name in profile.tiers and profile.tiers[name] != tier]


def replay(plan: Plan, graph: Graph, plan_name: str, graph_name: str,
           profile: Optional[Profile] = None):
    """The simulator's replay of `plan` on `graph` (PlanError names a bad instruction); a plan
    made for another graph is refused first, by fingerprint."""
    from edge_remat_agent.simulate import PlanError, simulate

    if plan.graph_fingerprint and plan.graph_fingerprint != graph.fingerprint():
        raise UserError(f"{plan_name} was made for another graph (its graph_fingerprint is "
                        f"{plan.graph_fingerprint}), not for {graph_name} "
                        f"({graph.fingerprint()}): give the graph it was planned for, or plan "
                        f"again with `edge-remat plan --graph {graph_name}`")
    costs = replay_costs(plan, graph, profile)
    # as it was scored: a plan with nothing to page is scored synchronously whatever its
    # problem's io (QA: simulate said overlap with a step time where the plan said sync)
    scored = plan.predicted.get("io") or plan.problem.get("io")
    io = "overlap" if scored == "overlap" else "sync"
    try:
        return simulate(graph, costs, plan.stages, plan.budget_bytes, io=io)
    except PlanError as error:  # QA: the line named neither the file nor what to do
        raise UserError(f"{plan_name}: {error}; a plan the planner writes replays, so this one "
                        f"was edited or damaged: plan again with `edge-remat plan --graph "
                        f"{graph_name}`") from None


# The plan's `predicted` figures set against its replay's (the simulator's own figures, so a
# plan made by the planner agrees to rounding): an edited or stale plan claims otherwise.
RECORDED_FIGURES = ("peak_bytes", "tdi_percent", "time_s", "energy_j")


def replay_summary(plan: Plan, graph: Graph, result, profile: Optional[Profile] = None) -> dict:
    """The replay's figures as the plan records its own: with --accumulate K, what a step of
    K passes costs too (`accumulated_step`)."""
    from edge_remat_agent.accumulated_step import accumulated_step
    from edge_remat_agent.accumulation import micro_batches_of
    summary = result.summary()
    step = accumulated_step(graph, replay_costs(plan, graph, profile), plan.stages, result,
                            micro_batches_of(graph))
    if step is not None:
        summary["accumulated_step"] = step
    return summary


def recorded_figures_differ(plan: Plan, summary: dict) -> list[str]:
    """The plan's recorded figures its replay (`summary`) does not give, e.g. 'peak_bytes 5
    (the replay: 3280840)'; compare only where the replay used the costs the plan had. A
    step of K passes' figures too (QA: an edited accumulated_step replayed without a word)."""
    differ = []
    recorded = plan.predicted.get("accumulated_step") or {}
    replayed = summary.get("accumulated_step") or {}
    pairs = [(key, plan.predicted.get(key), summary.get(key)) for key in RECORDED_FIGURES]
    pairs += [(f"accumulated_step.{key}", recorded.get(key), replayed.get(key))
              for key in ("micro_batches", "time_s", "energy_j") if recorded or replayed]
    for key, said, got in pairs:
        if isinstance(said, (int, float)) and got is not None and \
                not math.isclose(said, got, rel_tol=1e-6, abs_tol=1e-9):
            differ.append(f"{key} {_figure(said)} (the replay: {_figure(got)})")
    return differ


def recorded_figures_warning(plan: Plan, plan_name: str, summary: dict,
                             profile: Optional[Profile] = None,
                             then: str = "the figures shown are the replay's") -> Optional[str]:
    """The warning for a plan whose recorded figures its replay (`summary`) does not give, or
    None; compared only where the replay used the costs the plan was made with (with other
    costs, differences are expected). `then` says what follows from it."""
    if plan.problem.get("profile") != (profile and profile.name):
        return None
    differ = recorded_figures_differ(plan, summary)
    return (f"warning: {plan_name} records figures its replay does not give: "
            f"{'; '.join(differ)}; {then}") if differ else None


def _figure(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.6g}"


def check_plan(plan: Plan, graph: Graph, plan_name: str, graph_name: str):
    """Refuse, on the host, a plan the board would refuse or that would break its promise:
    made for another graph, an invalid instruction, a peak over its own budget. Returns the
    replay."""
    if not plan.graph_fingerprint:
        raise UserError(f"{plan_name} does not say which graph it was made for (no "
                        f"graph_fingerprint): make it with `edge-remat plan --graph "
                        f"{graph_name}`")
    result = replay(plan, graph, plan_name, graph_name)
    if result.fits_budget is False:
        raise UserError(f"{plan_name} peaks at {fmt_bytes(result.peak_bytes)} "
                        f"({result.peak_bytes} bytes), over its own budget of "
                        f"{fmt_bytes(plan.budget_bytes)}: the board would run out of the "
                        f"memory it was promised; plan again with `edge-remat plan --graph "
                        f"{graph_name} --budget ...`")
    return result


def check_runnable(graph: Graph, graph_name: str) -> None:
    """The executor runs graphs captured from a PyTorch model it can build again (the board
    captures the model once more and compares)."""
    if graph.planning_only:
        raise UserError(f"{graph_name} is for planning only (imported from ONNX: it has no "
                        "PyTorch ops to run): capture the model with `edge-remat graph --model "
                        "MODULE:FACTORY` to run it on a board")
    model = (graph.capture.get("source") or {}).get("model")
    if model is None:
        raise UserError(f"{graph_name} does not say which model it was captured from (a "
                        "benchmark or hand-written graph plans, but cannot run): capture the "
                        "model with `edge-remat graph --model NAME|MODULE:FACTORY`")
    from edge_remat_agent.user_code import spec_file
    file = None if model.startswith("hf:") else spec_file(model)
    if file is not None and not os.path.isabs(file):  # captured before `graph` made it absolute
        raise UserError(f"{graph_name} names its model's file by a relative path, {file}: the "
                        "board builds the model in another folder, where it means nothing; "
                        f"capture it again (`edge-remat graph --model {model}` stores the "
                        "absolute path) or give the absolute path in --model")


def profile_coverage(profile: Profile, graph: Graph) -> "tuple[int, int]":
    """(nodes whose op the profile measured, nodes)."""
    covered = sum(1 for node in graph.nodes if profile_key_for(profile, node) is not None)
    return covered, len(graph.nodes)


def note_profile_fit(profile: Optional[Profile], graph: Graph, profile_name: str,
                     say: Callable[[str], None]) -> None:
    """A profile whose operators are none of the graph's was measured for another model: its
    hardware figures (power, tiers, runtime memory) still serve, the node times are
    estimates. Said once, so that it is never silent."""
    if profile is None:
        return
    if not profile.ops:
        from edge_remat_agent.costs import board_roofline
        figures = "measured" if profile.source == "measured" else "published"
        times = f"the capture's estimates rescaled to the board's {figures} compute rates" \
            if board_roofline(graph, profile) is not None else \
            "the capture's estimates (the profile gives no compute rates)" \
            if not profile.compute else \
            "the graph's own (it holds no capture's estimate to rescale)"  # QA: it said
        # "rescaled" of a hand-written graph, whose times it left as they were
        say(f"note: {profile_name} is {profile.source}: it times no operator, so node times "
            f"are {times}, not measured; measure them with "
            "`edge-remat profile --device NAME --graph GRAPH` (on a board that holds a plain "
            "step of the graph)")
        return
    covered, total = profile_coverage(profile, graph)
    if covered * 2 < total:
        say(f"warning: {profile_name} measured {covered} of the {total} nodes of "
            f"{graph.name!r} (it was measured for another model or shapes): their times are "
            "estimates, its power, tiers and runtime memory are used; for measured times, "
            "profile this graph (`edge-remat profile --device NAME --graph GRAPH`)")


def note_budget_above_ram(profile: Optional[Profile], budget_bytes: int, profile_name: str,
                          say: Callable[[str], None], peak_bytes: Optional[int] = None) -> None:
    """A plan the profile's board cannot hold: its predicted peak (`peak_bytes`; the budget
    where not given) past the board's RAM. A budget past it is no such plan where the plan
    peaks below (QA: `run --budget 2GiB` on a board of 600 MiB was told "this plan will not
    fit there", and its plan of 318 MiB finished)."""
    amount, what = (budget_bytes, "the budget") if peak_bytes is None else \
        (peak_bytes, "the plan's predicted peak")
    note_above_ram(profile.ram_total_bytes if profile is not None else None, what,
                   amount, f"{profile_name} gives its board",
                   "give a budget in bytes below it", say)


def note_share_fallback(profile: Optional[Profile], plan_dict: dict, profile_name: str,
                        say: Callable[[str], None]) -> None:
    """A tier the plan could page to whose compute_share is the profiler's fallback (the IO
    thread's CPU per IO second, or 1, where the pairs measured beside compute were too noisy
    or too few), said: that figure decides paging against recomputing, and a user reading the
    plan should know it was not measured beside compute (profiler/contention.py)."""
    from edge_remat_agent.formats.profile import share_notes
    if profile is None:
        return
    planned = set(plan_dict.get("tiers") or ())
    for note in share_notes(profile.measurements):
        if note.split(" ", 1)[0] in planned:
            say(f"note: {profile_name}: {note}")


def note_plan_above_ram(config, peak_bytes: int, say: Callable[[str], None]) -> None:
    """deploy: a plan whose predicted peak the device config's board cannot hold (its memory
    limit where it has one) is said before it is shipped, as `run` says its budget."""
    hardware = config.hardware
    ram = hardware.memory_limit_bytes or hardware.ram_bytes
    whose = f"the device config {config.name!r}" + (
        " (its memory limit)" if hardware.memory_limit_bytes else "")
    note_above_ram(ram, "the plan's predicted peak", peak_bytes, f"{whose} gives its board",
                   "plan again with a budget in bytes below it", say)


def note_plan_above_board_ram(config, read_sysinfo: Callable[[], dict], peak_bytes: int,
                              say: Callable[[str], None]) -> None:
    """deploy, connected: where the device config names no RAM, what the board's agent says
    it has (its memory-limited cgroup's limit, else the machine's RAM) (QA: an 842 MiB plan
    went to a board of 450 MiB, its config silent, and was killed without a word before).
    `read_sysinfo` asks the board, only then: a round trip over a slow link."""
    if config.hardware.memory_limit_bytes or config.hardware.ram_bytes:
        return  # said before connecting (note_plan_above_ram)
    sysinfo = read_sysinfo()
    limit = sysinfo.get("ram_limit_bytes")
    note_above_ram(limit or sysinfo.get("ram_total_bytes"), "the plan's predicted peak",
                   peak_bytes, f"{config.name} has" + (" (its memory limit)" if limit else ""),
                   "plan again with a budget in bytes below it", say)


def note_above_ram(ram_bytes: Optional[int], what: str, amount: int, whose: str, fix: str,
                   say: Callable[[str], None]) -> None:
    if ram_bytes and amount > ram_bytes:
        say(f"warning: {what}, {fmt_bytes(amount)}, is more than the {fmt_bytes(ram_bytes)} "
            f"of RAM {whose}: this plan will not fit there; {fix}")


def check_solver_options(solver: str, time_limit: float, workers: Optional[int],
                         backend: str = "cbc") -> None:
    """The solver's options, before any graph is read or solver loaded: the first mistake."""
    mistakes = solver_option_mistakes(solver, time_limit, workers, backend)
    if mistakes:
        raise UserError(mistakes[0])


def solver_option_mistakes(solver: str, time_limit: float, workers: Optional[int],
                           backend: str = "cbc") -> list[str]:
    """Every mistake in the solver's options (a fleet manifest reports them all at once)."""
    import math

    from .planner.baselines import BASELINES
    known = ["auto", "cpsat", "milp"] + [f"heuristic:{name}" for name in BASELINES]
    mistakes = []
    if solver not in known:
        mistakes.append(f"unknown --solver {solver!r}: use one of {', '.join(known)}")
    if not math.isfinite(time_limit) or time_limit <= 0:
        mistakes.append(f"--time-limit must be a positive number of seconds, not "
                        f"{time_limit:g}")
    if workers is not None and workers < 1:
        mistakes.append(f"--workers must be at least 1, not {workers}")
    if backend not in ("cbc", "highs"):
        mistakes.append(f"unknown --backend {backend!r}: use cbc or highs")
    return mistakes
