"""The IO timeline's charge for the IO's CPU: a tier's compute_share (timeline.py), the same in
the simulator, the planner's post-pass and what a plan predicts; figures computed by hand."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.bad_inputs import cli, refused
from helpers.overlap_schedules import placed_for_overlap
from helpers.small_graphs import training_chain
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.problem import Problem
from edge_remat.planner.solve import solve
from edge_remat_agent.costs import build_costs
from edge_remat_agent.formats import FormatError, Graph, Instruction, Node, Profile, Tier
from edge_remat_agent.formats.plan import load_plan, plan_from_dict
from edge_remat_agent.formats.profile import profile_from_dict
from edge_remat_agent.simulate import simulate
from edge_remat_agent.timeline import COMPUTE, PAGE_IN, PAGE_OUT, run_timeline


def chain() -> Graph:
    """Four 4-byte nodes in a line, 1 s each, then one that reads the first and the last."""
    nodes = [Node(id=i, name=f"n{i}", kind="forward", op="op", inputs=[i - 1] if i else [],
                  out_bytes=8 if i == 3 else 4, time_s=1.0) for i in range(4)]
    nodes.append(Node(id=4, name="last", kind="forward", op="op", inputs=[0, 3], out_bytes=1,
                      time_s=1.0))
    return Graph(nodes, name="chain")


def flash(share: float) -> Tier:
    # 4 bytes: a write takes 0.104 s, a read 1.1 s
    return Tier(read_bytes_per_s=4.0, write_bytes_per_s=1000.0, latency_s=0.1,
                compute_share=share)


def stages_of(*rows):
    return [[Instruction(*ins) for ins in row] for row in rows]


# The write of node 0 is issued at 2 s, the read right behind it: IO busy from 2 to 3.204 s.
PREFETCHED = stages_of([("compute", 0)], [("compute", 1), ("page_out", 0, "flash")],
                       [("page_in", 0, "flash"), ("compute", 2), ("free", 1)],
                       [("compute", 3), ("free", 2)], [("compute", 4), ("free", 0), ("free", 3)])
# The read is issued only before its use: compute 4 waits for it.
LATE = stages_of([("compute", 0)], [("compute", 1), ("page_out", 0, "flash")],
                 [("compute", 2), ("free", 1)], [("compute", 3), ("free", 2)],
                 [("page_in", 0, "flash"), ("compute", 4), ("free", 0), ("free", 3)])


def test_io_beside_compute_costs_its_share_of_its_time():
    graph = chain()
    free = simulate(graph, build_costs(graph, None, {"flash": flash(0.0)}), PREFETCHED,
                    io="overlap")
    assert free.time_s == pytest.approx(5.0) and free.io_slowed_s == pytest.approx(0.0)
    # Share 0.5: compute 2 starts at 2 s beside 1.204 s of IO at half speed (0.602 s of its
    # work done by 3.204 s), the remaining 0.398 s at full speed: it ends at 3.602 s.
    half = simulate(graph, build_costs(graph, None, {"flash": flash(0.5)}), PREFETCHED,
                    io="overlap")
    assert half.time_s == pytest.approx(5.602)
    assert half.io_slowed_s == pytest.approx(0.602) and half.io_wait_s == pytest.approx(0.0)
    assert half.io_busy_s == pytest.approx(1.204)
    assert half.paging_hidden_share == pytest.approx(0.5)  # 1 - 0.602 / 1.204


def test_io_that_stops_compute_costs_what_synchronous_paging_does():
    graph = chain()
    costs = build_costs(graph, None, {"flash": flash(1.0)})
    stopped = simulate(graph, costs, PREFETCHED, io="overlap")
    assert stopped.time_s == pytest.approx(5 + 1.204)
    assert stopped.time_s == pytest.approx(simulate(graph, costs, PREFETCHED, io="sync").time_s)
    assert stopped.paging_hidden_share == pytest.approx(0.0)


def test_io_compute_waits_for_costs_only_the_wait():
    graph = chain()
    over = simulate(graph, build_costs(graph, None, {"flash": flash(0.5)}), LATE, io="overlap")
    # The write (2 to 2.104 s) slows compute 2 by 0.052 s: it ends at 3.052 s, compute 3 at
    # 4.052 s; the read is issued then and compute 4 waits for all of it (to 5.152 s).
    assert over.io_slowed_s == pytest.approx(0.052)
    assert over.io_wait_s == pytest.approx(1.1)
    assert over.time_s == pytest.approx(5 + 0.052 + 1.1)


def test_each_tier_charges_its_own_share():
    # compute 0 (2 s) runs beside a host write of 1 s (share 0.25) and then a flash read of
    # 0.5 s (share 1): 0.75 s of its work by 1 s, none by 1.5 s, the rest to 2.75 s.
    ops = [(PAGE_OUT, 1, "host"), (PAGE_IN, 2, "flash"), (COMPUTE, 0, None)]
    timeline = run_timeline(ops, [[], [], []], [1, 1, 1], [2.0, 0.0, 0.0],
                            {"flash": [0.0, 0.0, 0.5], "host": [0.0, 0.0, 0.0]},
                            {"flash": [0.0, 0.0, 0.0], "host": [0.0, 1.0, 0.0]}, [3, 3, 3], 100,
                            compute_share={"host": 0.25, "flash": 1.0})
    assert timeline.step_time_s == pytest.approx(2.75)
    assert timeline.slowed_s == pytest.approx(0.75) and timeline.waited_s == 0.0
    assert timeline.io_busy_s == pytest.approx(1.5)


@pytest.mark.parametrize("seed,share", [(0, 0.3), (1, 0.7), (2, 1.0), (3, 0.5)])
def test_stop_the_world_paging_stays_an_upper_bound(seed, share):
    graph = training_chain(10, seed)
    tier = Tier(read_bytes_per_s=4.0, write_bytes_per_s=4.0, latency_s=0.1, compute_share=share)
    s = placed_for_overlap(graph, build_costs(graph, None, {"flash": tier}), seed)
    unshared = simulate(graph, build_costs(graph, None, {"flash": flash_like(tier, 0.0)}),
                        s.placed, s.budget, io="overlap")
    assert s.after.fits_budget
    assert unshared.time_s <= s.after.time_s * (1 + 1e-9)  # the share only ever adds
    assert s.after.time_s <= s.before.time_s * (1 + 1e-9)  # the post-pass scores with the share
    assert s.before.time_s <= s.sync.evaluation.sim.time_s * (1 + 1e-9)
    assert evaluate(s.over_p, s.sync.decisions).sim.time_s == pytest.approx(s.after.time_s)


def flash_like(tier: Tier, share: float) -> Tier:
    return Tier(tier.read_bytes_per_s, tier.write_bytes_per_s, tier.latency_s,
                compute_share=share)


# -- the field in profiles and plans -----------------------------------------------------------

def profile_with(tier: dict) -> dict:
    return {"format": "edge-remat/profile", "version": 1, "source": "measured", "device": {},
            "power": {"idle_w": 1.0, "active_w": 2.0}, "tiers": {"flash": tier}}


def test_a_measured_share_round_trips_and_old_profiles_read_as_free_io():
    tier = Tier(read_bytes_per_s=1e8, write_bytes_per_s=5e7, compute_share=0.35)
    loaded = profile_from_dict(Profile("measured", {}, 1.0, 2.0, tiers={"flash": tier}).to_dict())
    assert loaded.tiers["flash"].compute_share == 0.35
    old = profile_from_dict(profile_with({"read_bytes_per_s": 1e8, "write_bytes_per_s": 5e7}))
    assert old.tiers["flash"].compute_share == 0.0
    assert "compute_share" not in old.tiers["flash"].to_dict()  # 0 is written as before


@pytest.mark.parametrize("share", [1.5, -0.1, "half", True])
def test_a_share_out_of_range_is_refused_by_name(share):
    with pytest.raises(FormatError) as error:
        profile_from_dict(profile_with({"read_bytes_per_s": 1e8, "write_bytes_per_s": 5e7,
                                        "compute_share": share}), "p.json")
    assert "tiers.flash.compute_share" in str(error.value)


def test_a_plan_carries_the_share_it_was_planned_with():
    graph = chain()
    costs = build_costs(graph, None, {"flash": flash(0.5)})
    p = Problem(graph, costs, 10**6, "time", None, ("flash",), "counted", None, "overlap")
    plan = solve(p, "heuristic:keep-all", time_limit=5).plan
    again = plan_from_dict(plan.to_dict())
    assert again.tiers["flash"].compute_share == 0.5


# -- `plan --profile` --------------------------------------------------------------------------

def save_json(obj, path) -> None:
    path.write_text(json.dumps(obj))


def planned_with_share(tmp_path, share) -> subprocess.CompletedProcess:
    graph_file, profile_file = tmp_path / "g.json", tmp_path / f"p{share}.json"
    training_chain(10, 1).save(graph_file)
    tier = {"read_bytes_per_s": 4.0, "write_bytes_per_s": 4.0, "latency_s": 0.1,
            "compute_share": share}
    save_json(profile_with(tier), profile_file)
    return cli("plan", "--graph", graph_file, "--budget", "60%", "--profile", profile_file,
               "--paging", "flash", "--solver", "heuristic:paging", "--time-limit", "5",
               "-o", tmp_path / f"plan{share}.json", "--json")


def test_plan_takes_the_share_from_the_profile(tmp_path):
    free, costly = (planned_with_share(tmp_path, share) for share in (0.0, 1.0))
    assert free.returncode == 0 and costly.returncode == 0, free.stderr + costly.stderr
    plans = [load_plan(tmp_path / f"plan{share}.json") for share in (0.0, 1.0)]
    assert plans[1].tiers["flash"].compute_share == 1.0
    assert "compute_share" not in plans[0].to_dict()["tiers"]["flash"]
    free_p, costly_p = (plan.predicted for plan in plans)
    assert free_p["page_outs"] > 0 and free_p["io_slowed_s"] == 0.0
    assert free_p["paging_hidden_share"] == 1.0  # all of it hidden behind compute
    # Share 1: every IO stops compute, so the step is compute + all the IO, synchronously.
    assert costly_p["page_outs"] > 0 and costly_p["paging_hidden_share"] == pytest.approx(0.0)
    assert costly_p["time_s"] == pytest.approx(free_p["time_s"] + costly_p["io_busy_s"])


def test_plan_refuses_a_profile_with_a_share_out_of_range(tmp_path):
    refused(planned_with_share(tmp_path, 2.0), 2, "compute_share", "0")


def test_bandwidths_on_the_command_line_keep_the_profiles_measured_share(tmp_path):
    planned_with_share(tmp_path, 0.75)  # writes g.json and p0.75.json
    run = cli("plan", "--graph", tmp_path / "g.json", "--budget", "60%", "--profile",
              tmp_path / "p0.75.json", "--paging", "flash", "--flash-read-bw", "8B",
              "--flash-write-bw", "8B", "--solver", "heuristic:paging", "--time-limit", "5",
              "-o", tmp_path / "overridden.json", "--json")
    assert run.returncode == 0, run.stderr
    tier = load_plan(tmp_path / "overridden.json").tiers["flash"]
    assert (tier.read_bytes_per_s, tier.write_bytes_per_s) == (8.0, 8.0)  # the command line's
    assert tier.compute_share == 0.75  # the board's, which the command line cannot give


def _costs(time_s, in_s, out_s, share=0.0):
    return dict(deps=[[], [], []], sizes=[1, 1, 2], time_s=time_s,
                in_time_s={"flash": in_s}, out_time_s={"flash": out_s}, limit_bytes=100,
                compute_share={"flash": share})


def test_a_step_run_in_pieces_from_copies_is_the_step_run_whole():
    from edge_remat_agent.timeline import TimelineRun, first_writes
    ops = [(COMPUTE, 0, None), (PAGE_OUT, 0, "flash"), (PAGE_IN, 2, "flash"),
           (COMPUTE, 1, None), (PAGE_OUT, 0, "flash"), (COMPUTE, 2, None)]
    trace = [1, 1, 3, 4, 3, 5]
    costs = _costs([2.0, 1.0, 0.5], [0.0, 0.0, 1.5], [0.7, 0.0, 0.0], share=0.4)
    whole = run_timeline(ops, costs["deps"], costs["sizes"], costs["time_s"],
                         costs["in_time_s"], costs["out_time_s"], trace, 100,
                         costs["compute_share"])
    run = TimelineRun(**costs)
    writes = first_writes(ops)
    assert writes == [False, True, False, False, False, False]  # node 0 is on flash already
    for k in range(len(ops)):
        run = run.copy()  # a copy goes on where its original stood
        run.run(ops, trace, writes, k, k + 1)
    assert run.finish() == whole


def test_a_run_lags_another_by_d_where_its_rest_is_the_others_d_later():
    from edge_remat_agent.timeline import TimelineRun
    costs = _costs([2.0, 3.0, 1.0], [0.0, 0.0, 4.0], [0.0, 0.0, 0.0], share=0.5)
    rest = [(COMPUTE, 2, None), (COMPUTE, 2, None)]

    def after(*ops):
        run = TimelineRun(**costs)
        run.run(list(ops), [4] * len(ops), [False] * len(ops))
        return run
    early = after((COMPUTE, 0, None), (PAGE_IN, 2, "flash"))
    late = after((COMPUTE, 1, None), (PAGE_IN, 2, "flash"))  # the same read, 1 s later
    assert late.lag_behind(early) == pytest.approx(1.0)
    # the read issued before compute 0 slows it, and is done when it ends: not a shift
    ahead = after((PAGE_IN, 2, "flash"), (COMPUTE, 0, None))
    assert ahead.lag_behind(early) is None and early.lag_behind(ahead) is None
    ends = []
    for run in (early, late):
        run.run(rest, [6, 6], [False, False])
        ends.append(run.finish().step_time_s)
    assert ends[1] - ends[0] == pytest.approx(1.0)
