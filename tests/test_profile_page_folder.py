"""A run's profile measures the flash in the page folder the run pages to, and is cached (and
found in the index of profiled graphs) for that folder only. QA, with a device config whose
page_dir was a 20 MiB tmpfs: `edge-remat run` measured the flash in the workdir's pages on the
root disk (capacity 71.9 GB), planned 236520960 bytes of page-outs and was refused before the
first step ("20971520 bytes are free"), while `edge-remat profile` of the same config measured
the tmpfs; and a run of another model on that config planned with the profile cached for
`local` ("profile: ... cached"). page_folder.py is the one answer both use."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from edge_remat.devices import load_device, write_local_device
from edge_remat.run import profiles as run_profiles
from edge_remat_agent.formats import load_graph

REPO = Path(__file__).resolve().parents[1]
MEASURED = REPO / "profiles" / "this-machine.json"


class FakeBoard:
    """What choose_profile asks of a board (identity, job kinds, the profile job, which it
    records with its params), the one machine whatever device config reaches it."""

    def __init__(self, profile_path: Path):
        self.name, self.profile_path, self.jobs = "fake", profile_path, []
        self.device = load_device(REPO / "device_configs" / "local.toml")

    def sysinfo(self):
        return {"hostname": "fake", "machine": "x86_64", "ram_total_bytes": 64 << 30}

    def hello(self):
        return {"job_kinds": {"profile": {}, "run": {}}}

    def run_job(self, kind, params, inputs, out_dir):
        """The profile, fetched into out_dir/profile as a job's is (a file of each job's)."""
        self.jobs.append((kind, params))
        fetched = Path(out_dir) / f"job-{len(self.jobs)}" / "profile.json"
        fetched.parent.mkdir(parents=True)
        fetched.write_bytes(self.profile_path.read_bytes())
        return {"fetched": [str(fetched)]}

    # the twin that measures an emulated board
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def stop_agent(self):
        pass


def _configs(tmp_path):
    """Two configs of this machine: one paging to its own folder ("small"), one to the
    agent's WORKDIR/pages ("plain")."""
    folder = tmp_path / "configs"
    small = load_device(write_local_device(folder, "small", tmp_path / "board",
                                           page_dir=str(tmp_path / "small" / "pages")))
    plain = load_device(write_local_device(folder, "plain", tmp_path / "board"))
    return small, plain


def _graph_and_profile(tmp_path):
    """A graph file and a measured profile of it (its fingerprint), as a profile job fetches."""
    from edge_remat_agent.capture import capture_model
    graph = tmp_path / "g.json"
    capture_model("mlp", batch=2, image=8).graph.save(graph)
    profile = json.loads(MEASURED.read_text())
    profile["measurements"].setdefault("ops", {})["graph_fingerprint"] = \
        load_graph(graph).fingerprint()
    path = tmp_path / "job" / "profile.json"
    path.parent.mkdir()
    path.write_text(json.dumps(profile))
    return graph, path


def test_the_profile_job_measures_the_configs_page_folder_and_is_cached_for_it(
        tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    small, plain = _configs(tmp_path)
    board = FakeBoard(MEASURED)
    model = {"model": "mlp", "batch": None}

    def choose(device, model=model):
        return run_profiles.choose_profile(board, device, model, tmp_path / "g.json",
                                           tmp_path / "out").how

    assert choose(small) == "measured"
    [(kind, params)] = board.jobs
    assert kind == "profile" and params["page_dir"] == str(tmp_path / "small" / "pages")
    assert choose(small) == "cached"
    # the same machine and model through a config paging elsewhere: its own flash, measured
    assert choose(plain) == "measured" and len(board.jobs) == 2
    assert "page_dir" not in board.jobs[1][1]  # the agent's own WORKDIR/pages
    assert (choose(small), choose(plain)) == ("cached", "cached") and len(board.jobs) == 2


def test_a_profiled_graph_is_offered_to_runs_paging_to_the_folder_it_measured(
        tmp_path, monkeypatch):
    """The index of profiled graphs (profiled-graphs.json) keys on the page folder too: a
    profile a run measured for one config was offered to the next run of that graph through
    another (the run's cache key differs here: another model entry, the same graph)."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    small, plain = _configs(tmp_path)
    graph, profiled = _graph_and_profile(tmp_path)
    board = FakeBoard(profiled)

    def choose(device, model):
        said = []
        how = run_profiles.choose_profile(board, device, model, graph, tmp_path / "out",
                                          say=said.append).how
        return how, said

    assert choose(small, {"model": "mlp", "batch": 2})[0] == "measured"
    how, said = choose(plain, {"model": "mlp", "batch": 2, "seq": None})
    assert how == "measured" and len(board.jobs) == 2, said
    how, said = choose(small, {"model": "mlp", "batch": 2, "seq": 0})
    assert how == "cached" and len(board.jobs) == 2, said
    assert any("which `edge-remat profile` measured" in line for line in said), said


def test_an_emulated_boards_twin_measures_the_emulated_boards_page_folder(
        tmp_path, monkeypatch):
    """Its twin works in a workdir of its own: it measures the folder the emulated board's
    runs page to, named in full (this machine's)."""
    from edge_remat.transport.emulated import emulated_device
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    _, plain = _configs(tmp_path)
    limited = emulated_device(plain, 512 * 2**20)
    twin = FakeBoard(MEASURED)
    run_profiles.choose_profile(FakeBoard(MEASURED), limited, {"model": "mlp"},
                                tmp_path / "g.json", tmp_path / "out",
                                measuring_board=lambda: twin)
    [(_, params)] = twin.jobs
    assert params["page_dir"] == os.path.join(limited.connection.workdir, "pages")
    assert limited.connection.workdir.endswith("-limited")


@pytest.mark.slow  # two runs on a real local board, each profiling mlp; mounts a tmpfs (root)
def test_a_run_measures_its_configs_small_page_folder_and_another_config_measures_its_own(
        tmp_path):
    from helpers.bad_inputs import cli
    from helpers.board_fixtures import local_board
    from helpers.small_disk import small_disk
    with small_disk(tmp_path / "small", "20M") as disk, \
            local_board(tmp_path, "smallflash", page_dir=disk / "pages"):
        write_local_device(tmp_path / "configs", "plain", tmp_path / "board")

        def run(device, out):
            proc = cli("run", "--device", device, "--model", "mlp", "--budget", "98%",
                       "--params-home", "ram", "--paging", "flash", "--steps", 1,
                       "--no-grad-check", "--time-limit", 10, "--no-plots", "--out",
                       tmp_path / out, "--json", timeout=600)
            assert proc.returncode == 0, proc.stderr
            return json.loads(proc.stdout), proc.stderr

        small, said = run("smallflash", "small-run")
        plain, said_plain = run("plain", "plain-run")
    assert small["profile"]["how"] == "measured", said
    flash = json.loads((tmp_path / "small-run" / "profile" / "profile.json").read_text())
    assert flash["tiers"]["flash"]["capacity_bytes"] <= 20 * 2**20, flash["tiers"]["flash"]
    assert str(disk / "pages") in flash["measurements"]["tiers"]["flash"]["method"]
    assert plain["profile"]["how"] == "measured", said_plain
    measured = json.loads((tmp_path / "plain-run" / "profile" / "profile.json").read_text())
    assert str(tmp_path / "board" / "pages") in measured["measurements"]["tiers"]["flash"][
        "method"]
