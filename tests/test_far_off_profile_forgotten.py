"""A profile a run found far off its steps is forgotten by the index of profiles `edge-remat
profile --graph` measured, not only by the run's profile cache: QA, forget_if_far_off took it
out of the cache and the next run planned with it again, offered by profiled-graphs.json
(remember_profiled), instead of measuring again. A real local board gives the board identity
the index keys on; the profiles are real files."""

from __future__ import annotations

import json

import pytest

from edge_remat_agent.formats import load_graph
from edge_remat_agent.formats.profile import OpCost, Profile
from helpers.bad_inputs import tiny_graph

pytestmark = pytest.mark.loopback


def _profile_of(graph_path, folder, idle_w: float = 1.0):
    """A measured profile of the graph at `graph_path`, as a profile job fetches it."""
    path = folder / "profile.json"
    path.parent.mkdir(parents=True)
    Profile("measured", {}, idle_w=idle_w, active_w=2.0, name="bench",
            ops={"mm": OpCost(time_s=1e-3)},
            measurements={"ops": {"graph_fingerprint": load_graph(graph_path).fingerprint()}}
            ).save(path)
    return path.resolve()


def test_a_far_off_profile_is_not_offered_again_by_the_profiled_graphs_index(
        tmp_path, bench, monkeypatch):
    from edge_remat.devices import find_device
    from edge_remat.run.profiles import (PROFILED_INDEX, cache_dir, choose_profile,
                                         forget_if_far_off, remember_profiled)
    from edge_remat.transport import Board
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))  # nothing cached before
    graph = tiny_graph(tmp_path)
    other_graph = tmp_path / "other.json"  # another graph: its first node's output larger
    changed = json.loads(graph.read_text())
    changed["nodes"][0]["out_bytes"] *= 2
    other_graph.write_text(json.dumps(changed))
    profiled = _profile_of(graph, tmp_path / "P")
    other = _profile_of(other_graph, tmp_path / "Q")
    with Board(find_device("bench")) as board:
        remember_profiled(board, [other, profiled])

        def choose():
            said = []
            chosen = choose_profile(board, board.device, {"model": "tiny"}, graph,
                                    tmp_path / "out", say=said.append)
            return chosen, said

        chosen, said = choose()
        assert chosen.path == profiled and chosen.cached_at.is_file(), said
        assert said and "which `edge-remat profile` measured" in said[0], said
        # QA's verdict: the steps took 0.06x what the profile predicted
        report = {"step_time_s": [0.9, 0.050, 0.052], "predicted_time_s": 0.773,
                  "misses": [], "profile": {"how": "cached"}}
        warned = []
        forget_if_far_off(report, chosen, warned.append)
        assert report["profile"]["forgotten"] is True and len(warned) == 1, warned
        assert not chosen.cached_at.exists()

        index = json.loads((cache_dir() / PROFILED_INDEX).read_text())
        assert [entry["path"] for entry in index] == [str(other)], index  # the other graph's
        assert profiled.is_file()  # `profile --out P` wrote it: it stays, only not offered
        # the next run of the graph is offered nothing: it measures again (its profile job
        # is not run here: the index and the cache are what it would find)
        from edge_remat.run.profiles import _profiled_earlier
        assert _profiled_earlier(board, graph) is None
        assert _profiled_earlier(board, other_graph)[1] == other
