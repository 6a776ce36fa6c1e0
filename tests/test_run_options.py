"""`edge-remat run` options that the host must settle before any work: the data spec (checked
against the agent's own table, its files found from the user's folder) and --paging none with
the parameters' home (homing them on flash is paging)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from helpers.bad_inputs import BAD_INPUT, REPO, cli, no_new_files, refused, tree
from helpers.board_fixtures import local_board

PROFILE = REPO / "profiles" / "this-machine.json"  # given: no profiling on the board
DATA_FILE = """
import torch

def batches(batch, seed):
    while True:
        yield (torch.zeros(batch, 4),)
"""


def _run(*args, cwd, timeout=120):
    # "local", as users name it, but working in a folder of the test's whose agent is stopped
    # at the end (the shipped one's daemon outlived the tests)
    with tempfile.TemporaryDirectory() as bench, local_board(Path(bench), "local"):
        return cli("run", "--device", "local", "--model", "mlp", "--steps", 1, "--time-limit",
                   5, "--no-plots", *args, cwd=cwd, timeout=timeout)


def _ssh_device(folder):
    """A board with a disk of its own; nothing here connects to it."""
    path = folder / "far-board.toml"
    path.write_text('name = "far-board"\n[connection]\nkind = "ssh"\nhost = "192.0.2.1"\n')
    return path


# -- defect 12: --data ---------------------------------------------------------------------

def test_unknown_data_is_refused_before_any_work(tmp_path):
    before = tree(tmp_path)
    proc = _run("--budget", "98%", "--data", "bogus", cwd=tmp_path, timeout=60)
    refused(proc, BAD_INPUT, "bogus", "example", "digits", "text", "MODULE:FUNCTION")
    assert "capturing" not in proc.stderr
    no_new_files(before, tmp_path)


@pytest.mark.parametrize("data, words", [
    ("digits", ["argument 0 is (8, 1, 8, 8)", "(8, 3, 32, 32)"]),
    ("text", ["token ids"]),
])
def test_bundled_data_that_cannot_feed_the_model_is_refused_before_the_profile(tmp_path, data,
                                                                              words):
    """Before, the board found it after the capture, the profile and the plan (exit 1)."""
    before = tree(tmp_path)
    proc = _run("--budget", "100%", "--data", data, "--out", "out", cwd=tmp_path)
    refused(proc, BAD_INPUT, f"--data {data} cannot feed this model", *words)
    assert "profil" not in proc.stderr and "planning" not in proc.stderr
    no_new_files(before, tmp_path)


@pytest.mark.parametrize("body, spec, words", [
    (DATA_FILE, "mydata.py:batches", ["gives 1 arguments; the model takes 2"]),
    ("def batches(batch, seed):\n    raise OSError('no such dataset')\n", "mydata.py:batches",
     ["failed on its first batch: OSError: no such dataset"]),
    # QA: a module's name, not its file, was checked only on the board (exit 1, after it all)
    (DATA_FILE, "mydata:batches", ["gives 1 arguments; the model takes 2"]),
    (DATA_FILE, "operator:add", ["failed on its first batch: TypeError"]),
], ids=["file, short batch", "file raises", "module, short batch", "an installed module's"])
def test_a_data_function_that_cannot_feed_the_model_is_refused_before_the_profile(
        tmp_path, body, spec, words):
    """QA: where the board reads this host's files, a MODULE:FUNCTION whose batches cannot feed
    the model failed on the board after the profile and the plan (exit 1, no report)."""
    (tmp_path / "mydata.py").write_text(body)
    before = tree(tmp_path)
    proc = _run("--budget", "100%", "--data", spec, "--out", "out", cwd=tmp_path)
    refused(proc, BAD_INPUT, "cannot feed this model", *words)
    assert "profil" not in proc.stderr and "planning" not in proc.stderr
    no_new_files(before, tmp_path)


def test_an_infeasible_budget_leaves_no_files(tmp_path):
    """Exit 2 writes nothing: the run had left the graph.json it captured before the budget
    turned out infeasible (mlp's floor is 95% of its plain peak)."""
    before = tree(tmp_path)
    proc = _run("--budget", "50%", "--profile", PROFILE, "--out", "out", cwd=tmp_path)
    refused(proc, BAD_INPUT, "needs at least")
    no_new_files(before, tmp_path)


def test_a_batch_of_another_dtype_is_named_with_its_dtype():
    """Float values for integer token ids: the error showed the same shape twice, '(2, 8),
    the model's example is (2, 8) torch.int64', and not what differed."""
    import torch
    from edge_remat_agent.data import DataError, _checked
    example = (torch.zeros(2, 8, dtype=torch.long),)
    with pytest.raises(DataError) as error:
        next(_checked("data.py:ids_float", iter([(torch.rand(2, 8),)]), example, torch))
    assert "argument 0 is (2, 8) torch.float32, the model's example is (2, 8) torch.int64" \
        in str(error.value)


def test_data_named_by_the_agents_own_table():
    from edge_remat_agent.data import DataError, check_data_spec
    for spec in ("example", "digits", "text", "my_pkg.data:batches", "data/mine.py:batches"):
        check_data_spec(spec)
    for spec in ("bogus", ":batches", "mine.py:"):
        with pytest.raises(DataError):
            check_data_spec(spec)


@pytest.mark.parametrize("spec,words", [("mydata.py:nope", ["no function named 'nope'"]),
                                        ("missing.py:batches", ["no such file", "missing.py"]),
                                        ("mydata:nope", ["no function named 'nope'"]),
                                        ("nomod:batches", ["cannot import nomod"])])
def test_a_data_file_the_board_cannot_use_is_refused_on_the_host(tmp_path, spec, words):
    (tmp_path / "mydata.py").write_text(DATA_FILE)
    before = tree(tmp_path)
    proc = _run("--budget", "98%", "--data", spec, cwd=tmp_path, timeout=60)
    refused(proc, BAD_INPUT, spec, *words)
    assert "capturing" not in proc.stderr
    no_new_files(before, tmp_path)


def test_a_local_board_gets_a_module_of_this_folder_as_its_file(tmp_path, monkeypatch):
    """The board's agent imports in a folder of its own, where `mydata:batches` of the user's
    folder is no module; an installed module, a package or a file keeps its spec."""
    from edge_remat.devices import find_device
    from edge_remat.run.options import RunOptions, for_board
    (tmp_path / "mydata.py").write_text(DATA_FILE)
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text(DATA_FILE)
    monkeypatch.chdir(tmp_path)
    local = find_device("local")
    given = {"mydata:batches": f"{tmp_path / 'mydata.py'}:batches",
             "json:loads": "json:loads", "mypkg:batches": "mypkg:batches",
             "nomod:batches": "nomod:batches", "digits": "digits",
             "mydata.py:batches": f"{tmp_path / 'mydata.py'}:batches"}
    for spec, board_spec in given.items():
        opts = RunOptions(device="local", model="mlp", data=spec)
        assert for_board(opts, local).data == board_spec, spec
    # a board with a disk of its own gets the file with the job (pushed_files.py)
    assert for_board(RunOptions(device="local", model="mlp", data="mydata:b"),
                     find_device(str(_ssh_device(tmp_path)))).data == f"{tmp_path}/mydata.py:b"
    # a model's factory alike (QA: `--model mymod:make` of the user's folder was captured on
    # the host, then failed on the local board: "cannot import mymod")
    opts = RunOptions(device="local", model="mydata:batches", data="digits")
    assert for_board(opts, local).model == f"{tmp_path / 'mydata.py'}:batches"
    assert for_board(RunOptions(device="local", model="mlp"), local).model == "mlp"
    (tmp_path / "hf.py").write_text(DATA_FILE)  # an hf: spec is no module, whatever is here
    assert for_board(RunOptions(device="local", model="hf:gpt2"), local).model == "hf:gpt2"


def test_batches_come_from_a_data_file(tmp_path, monkeypatch):
    import torch

    from edge_remat_agent.data import batches
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "mydata.py").write_text(DATA_FILE)
    monkeypatch.chdir(tmp_path)
    args = next(batches("sub/mydata.py:batches", (torch.ones(3, 4),)))
    assert torch.equal(args[0], torch.zeros(3, 4))


def test_relative_files_are_made_absolute_for_a_local_board(tmp_path, monkeypatch):
    from edge_remat.devices import find_device
    from edge_remat.run.options import RunOptions, for_board
    monkeypatch.chdir(tmp_path)
    opts = for_board(RunOptions(device="local", model="my_model.py:make_model",
                                data="sub/mydata.py:batches"), find_device("local"))
    assert opts.model == f"{tmp_path}/my_model.py:make_model"
    assert opts.data == f"{tmp_path}/sub/mydata.py:batches"
    kept = for_board(RunOptions(device="local", model="digits-cnn", data=None),
                     find_device("local"))
    assert (kept.model, kept.data) == ("digits-cnn", "digits")


def test_relative_files_are_made_absolute_for_a_remote_board(tmp_path, monkeypatch):
    """An SSH board gets the user's files with the job and reads its copy of each: a relative
    path is this host's file, named absolute (it was refused: "give the absolute path the
    file has on the board"); a path only the board has stays as given."""
    from edge_remat.devices import find_device
    from edge_remat.run.options import RunOptions, for_board
    monkeypatch.chdir(tmp_path)
    far = find_device(str(_ssh_device(tmp_path)))
    opts = for_board(RunOptions(device="far-board", model="my_model.py:make_model",
                                data="sub/mydata.py:batches"), far)
    assert opts.model == f"{tmp_path}/my_model.py:make_model"
    assert opts.data == f"{tmp_path}/sub/mydata.py:batches"
    kept = for_board(RunOptions(device="far-board", model="/srv/m.py:make",
                                data="/srv/data.py:batches"), far)
    assert (kept.model, kept.data) == ("/srv/m.py:make", "/srv/data.py:batches")


@pytest.mark.parametrize("paging", ["host", "both"])
def test_host_paging_on_a_serial_board_is_refused_before_any_work(tmp_path, paging):
    """The device config says the link is serial, which cannot carry host pages: refused at
    once (exit 2), not after the capture and the plan; nothing connects to the port."""
    device = tmp_path / "uart-board.toml"
    device.write_text('name = "uart-board"\n[connection]\nkind = "serial"\n'
                      f'port = "{tmp_path / "no-such-tty"}"\n')
    before = tree(tmp_path)
    proc = cli("run", "--device", device, "--model", "mlp", "--budget", "50%", "--paging",
               paging, "--out", tmp_path / "out", cwd=tmp_path, timeout=60)
    refused(proc, BAD_INPUT, f"--paging {paging}", "serial", "--paging flash", "SSH")
    assert "capturing" not in proc.stderr
    no_new_files(before, tmp_path)


# -- defect 14: --paging none keeps the parameters in RAM ----------------------------------

def test_paging_none_with_parameters_on_flash_is_refused(tmp_path):
    before = tree(tmp_path)
    proc = _run("--budget", "90%", "--paging", "none", "--params-home", "flash", cwd=tmp_path,
                timeout=60)
    refused(proc, BAD_INPUT, "--paging none", "--params-home flash")
    assert "capturing" not in proc.stderr
    no_new_files(before, tmp_path)


def test_paging_none_does_not_move_parameters_to_flash(tmp_path):
    """mlp at 90%: below what RAM-homed parameters allow (about 95%), above the floor with them
    on flash (about 85%). With --paging none the budget is refused, naming the floor."""
    proc = _run("--budget", "90%", "--paging", "none", "--profile", PROFILE,
                "--no-grad-check", "--out", tmp_path / "run", cwd=tmp_path)
    refused(proc, BAD_INPUT, "needs at least")
    assert "--params-home flash" not in proc.stderr


@pytest.mark.parametrize("paging, budget, hint", [
    ("none", "90%", "--paging flash would home the parameters"),
    ("host", "90%", "--paging both would home the parameters"),
    ("host", "50%", None),  # below the floor with parameters on flash too: no hint
])
def test_a_budget_only_parameters_on_flash_meet_names_the_paging_that_homes_them(
        tmp_path, paging, budget, hint):
    """mlp at 90%: below the floor with parameters in RAM, above it with them on flash
    (about 85%), which --paging none or host rules out. The refusal did not say that
    --paging flash or both would move them (QA: a LoRA Llama refused at 50% with --paging
    host, planned at 60% with --paging both)."""
    profile = json.loads(PROFILE.read_text())  # with a host tier, as a measured one has
    profile["tiers"]["host"] = {**profile["tiers"]["flash"], "capacity_bytes": None}
    (tmp_path / "profile.json").write_text(json.dumps(profile))
    proc = _run("--budget", budget, "--paging", paging, "--profile", tmp_path / "profile.json",
                "--no-grad-check", "--out", tmp_path / "run", cwd=tmp_path)
    refused(proc, BAD_INPUT, "needs at least")
    error = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1, proc.stderr
    if hint is None:
        assert "would home" not in error[0], error[0]
    else:
        assert error[0].index("needs at least") < error[0].index(hint), error[0]


def test_only_paging_that_allows_flash_may_home_parameters_there():
    from edge_remat.run.options import flash_allowed
    assert [flash_allowed(p) for p in (None, "flash", "both", "host", "none")] == \
        [True, True, True, False, False]
    from edge_remat.run.options import paging_with_flash
    assert [paging_with_flash(p) for p in ("none", "host", "flash", "both")] == \
        ["flash", "both", "flash", "both"]


def test_outputs_an_earlier_run_left_and_this_one_did_not_write_are_removed(tmp_path):
    from edge_remat.run.orchestrate import _output_stamps, _remove_earlier_outputs
    for name in ("memory.png", "sweep.json", "plan.json", "notes.txt", "weights.pt",
                 "checkpoint.pt"):
        (tmp_path / name).write_text("earlier run")  # the same second as this run's start
    at_start = _output_stamps(tmp_path)
    (tmp_path / "plan.json").write_text("this run")  # written again: kept
    said = []
    _remove_earlier_outputs(tmp_path, at_start, True, said.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint.pt", "notes.txt",
                                                          "plan.json", "weights.pt"]
    assert "memory.png, sweep.json" in said[0]
    # what an earlier run trained stays, and is said (QA: it stayed without a word)
    assert said[1] == f"note: weights.pt, checkpoint.pt in {tmp_path} are an earlier run's, " \
        "kept: this run did not write them again (remove them, or give another --out)"


def test_a_profile_an_earlier_run_measured_goes_where_this_run_took_the_cached_one(tmp_path):
    """QA: OUT/profile/profile.json of an earlier run that measured it stayed beside the
    report of a later run that took the cached profile, said nowhere. One this run fetched
    stays."""
    from edge_remat.run.orchestrate import _output_stamps, _remove_earlier_outputs
    (tmp_path / "profile").mkdir()
    (tmp_path / "profile" / "profile.json").write_text("earlier run's")
    said = []
    _remove_earlier_outputs(tmp_path, _output_stamps(tmp_path), True, said.append)
    assert not (tmp_path / "profile").exists()
    assert said == [f"removed profile/profile.json from {tmp_path}: an earlier run's, which "
                    "this run did not write again"]
    (tmp_path / "profile").mkdir()
    at_start = _output_stamps(tmp_path)
    (tmp_path / "profile" / "profile.json").write_text("this run's")
    _remove_earlier_outputs(tmp_path, at_start, True, said.append)
    assert (tmp_path / "profile" / "profile.json").read_text() == "this run's" and len(said) == 1


def test_a_folder_that_held_no_runs_report_keeps_files_of_output_names(tmp_path):
    """QA: `run --out DIR` removed someone's own sweep.json and memory.png from a folder no
    run had used. Only a folder that held a run's report.json when the run started is one."""
    import time

    from edge_remat.run.orchestrate import (holds_a_run_report, _output_stamps,
                                            _remove_earlier_outputs)
    earlier = time.time() - 60
    for name in ("memory.png", "sweep.json"):
        (tmp_path / name).write_text("mine")
        os.utime(tmp_path / name, (earlier, earlier))
    assert not holds_a_run_report(tmp_path)
    (tmp_path / "report.json").write_text('{"my": "own notes"}')
    assert not holds_a_run_report(tmp_path)  # a file of that name, not a run's report
    said = []
    _remove_earlier_outputs(tmp_path, _output_stamps(tmp_path), holds_a_run_report(tmp_path),
                            said.append)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["memory.png", "report.json",
                                                          "sweep.json"] and not said
    (tmp_path / "report.json").write_text('{"status": "finished", "model": "mlp", '
                                          '"device": "local"}')
    assert holds_a_run_report(tmp_path)


def test_each_device_config_emulates_its_board_in_a_workdir_of_its_own(tmp_path):
    """`--memory-limit` moved every local device to one fixed workdir, so two emulated boards
    (a user's run and another's, or two test boards) could take each other's daemon: the
    suite once failed with 'an agent daemon already runs for ... outside the memory limit'."""
    from edge_remat.devices import load_device, write_local_device
    from edge_remat.transport.emulated import emulated_device
    one = load_device(write_local_device(tmp_path, "one", tmp_path / "one"))
    two = load_device(write_local_device(tmp_path, "two", tmp_path / "two"))
    limited = [emulated_device(d, 2**30).connection.workdir for d in (one, two)]
    assert limited == [str(tmp_path / "one") + "-limited", str(tmp_path / "two") + "-limited"]
    already = load_device(write_local_device(tmp_path, "three", tmp_path / "three",
                                             memory_limit_bytes=2**29))
    assert emulated_device(already, 2**30).connection.workdir == str(tmp_path / "three")


def test_an_emulated_boards_page_folder_moves_with_its_workdir(tmp_path, monkeypatch):
    """The shipped local board keeps its pages in its workdir; `--memory-limit` moved the
    workdir (WORKDIR-limited) but not the page folder, whose parent (the unlimited board's
    workdir) a fresh machine lacks: a run paging under a limit failed with 'its parent folder
    .../local-board does not exist'. The page folder moves along; one elsewhere stays."""
    from edge_remat.devices import find_device, load_device, write_local_device
    from edge_remat.transport.emulated import emulated_device, unlimited_twin
    from edge_remat_agent.pages.folder import make_page_dir
    shipped = find_device("local")
    assert shipped.hardware.page_dir.startswith(shipped.connection.workdir + "/")
    for board, suffix in ((emulated_device(shipped, 2**30), "-limited"),
                          (unlimited_twin(shipped), "-unlimited")):
        workdir = board.connection.workdir
        assert workdir == shipped.connection.workdir + suffix
        assert board.hardware.page_dir == workdir + "/pages"
        monkeypatch.setenv("HOME", str(tmp_path / f"fresh{suffix}"))  # a fresh machine's HOME
        os.makedirs(os.path.expanduser(workdir))  # what the board's daemon makes as it starts
        make_page_dir(os.path.expanduser(board.hardware.page_dir))
    elsewhere = load_device(write_local_device(tmp_path, "ssd", tmp_path / "ssd",
                                               page_dir="/mnt/ssd/pages"))
    assert emulated_device(elsewhere, 2**30).hardware.page_dir == "/mnt/ssd/pages"


@pytest.mark.slow  # a real run on the local board (~15 s)
def test_a_malloc_the_board_lacks_is_a_warning_on_the_terminal_and_in_report_txt(tmp_path):
    """--malloc tcmalloc without its library ran under glibc's malloc, said only in
    report.json; an option asked for and dropped deserves a `warning:` line."""
    from edge_remat_agent.allocator import malloc_library
    if malloc_library("tcmalloc") is not None:
        pytest.skip("tcmalloc is installed here: the run would use it")
    proc = _run("--budget", "98%", "--malloc", "tcmalloc", "--profile", PROFILE,
                "--no-grad-check", "--out", tmp_path / "out", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    said = "warning: --malloc tcmalloc: libtcmalloc_minimal.so.4 is not installed here"
    assert said in proc.stderr
    assert "--malloc tcmalloc: libtcmalloc_minimal.so.4" in (tmp_path / "out" / "report.txt"
                                                              ).read_text()


def test_the_plain_comparison_runs_under_the_malloc_asked_for(tmp_path):
    """Before, `run --plain --malloc jemalloc` ran plain PyTorch under glibc's malloc: the
    option reached only the planned run's job."""
    from edge_remat_agent.allocator import malloc_library
    if malloc_library("jemalloc") is None:
        pytest.skip("jemalloc is not installed here")
    proc = _run("--plain", "--malloc", "jemalloc", "--out", tmp_path / "out", cwd=tmp_path,
                timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    assert report["malloc"] == {"requested": "jemalloc", "running": "jemalloc"}


def test_a_plain_run_keeps_weights_equal_to_the_planned_runs_and_names_its_settings(tmp_path):
    """QA: --plain saved no weights.pt, so plain and planned training could not be compared
    file to file, and --save was refused with it; its report's `optimizer` (every setting it
    stepped with) left out the schedule and the clipping, which it applied."""
    import torch
    same = ("--optimizer", "adamw", "--lr-schedule", "cosine", "--clip-grad-norm", "0.5",
            "--steps", "2")
    plain = _run("--plain", *same, "--out", tmp_path / "plain", cwd=tmp_path, timeout=300)
    assert plain.returncode == 0, plain.stderr
    planned = _run("--budget", "100%", "--profile", PROFILE, *same, "--out",
                   tmp_path / "planned", cwd=tmp_path, timeout=300)
    assert planned.returncode == 0, planned.stderr
    report = json.loads((tmp_path / "plain" / "report.json").read_text())
    optimizer = report["optimizer"]
    assert optimizer["name"] == "adamw" and optimizer["lr_schedule"] == "cosine"
    assert optimizer["clip_grad_norm"] == 0.5 and optimizer["warmup"] == 0
    assert report["weights"]["file"] == str(tmp_path / "plain" / "weights.pt")
    mine, theirs = (torch.load(tmp_path / run / "weights.pt") for run in ("plain", "planned"))
    assert mine.keys() == theirs.keys() and mine
    assert all(torch.equal(mine[key], theirs[key]) for key in mine)
    # QA: options only a plan reads ran plain PyTorch without a word
    none = _run("--plain", "--save", "none", "--allocator", "arena", "--paging", "flash",
                "--out", tmp_path / "none", cwd=tmp_path)
    assert none.returncode == 0 and not (tmp_path / "none" / "weights.pt").exists(), none
    assert "warning: --paging, --time-limit, --allocator shape the plan, and --plain trains " \
        "without one: ignored" in none.stderr, none.stderr
    # (_run gives every run a --time-limit)
    assert "warning: --time-limit shapes the plan, and --plain trains without one: ignored" \
        in plain.stderr, plain.stderr


def test_a_budget_above_the_plain_peak_is_said_in_words_not_a_percentage_over_100():
    """Under --memory-limit a small model's planning line read 'budget 221.0 MiB (1079% of the
    plain peak)', and the report's plan line '(1041% of plain 21.23 MiB)'."""
    from edge_remat.reports.run_report import build_report, report_text
    from edge_remat.units import budget_against_plain
    assert budget_against_plain(221 * 2**20, int(20.5 * 2**20)) == (
        "budget 221.00 MiB, above the plain peak of 20.50 MiB: no recomputation needed")
    assert budget_against_plain(10 * 2**20, 20 * 2**20) == \
        "budget 10.00 MiB (50% of plain 20.00 MiB)"
    assert budget_against_plain(20 * 2**20, 20 * 2**20) == \
        "budget 20.00 MiB (100% of plain 20.00 MiB)"
    report = build_report(mode="planned", status="finished", device="b", model="m", steps=1,
                          result={"steps": []}, plan={"budget_bytes": 221 * 2**20},
                          plain_peak_bytes=int(20.5 * 2**20))
    line = next(x for x in report_text(report).splitlines() if x.startswith("plan "))
    assert "budget 221.00 MiB, above the plain peak of 20.50 MiB: no recomputation" in line


def test_a_kernel_peak_below_the_runtime_baseline_measures_no_physical_memory():
    """QA: under --memory-limit 1TiB (past this machine's RAM) the report read 'physical
    memory of training (kernel peak - runtime baseline of 300.94 MiB): -33.18 MiB ... (-1.65x)'.
    A peak below the baseline measured nothing, and no figure is given."""
    from edge_remat.reports.run_report import build_report, report_text
    report = build_report(mode="planned", status="finished", device="b", model="m", steps=1,
                          result={"steps": [], "runtime_baseline_bytes": 300 * 2**20},
                          plan={"budget_bytes": 30 * 2**20,
                                "predicted": {"peak_bytes": 20 * 2**20}},
                          kernel_peak_bytes=267 * 2**20, memory_limit_bytes=2**40)
    assert report["training_physical_bytes"] is None
    assert "physical memory of training" not in report_text(report)



def test_a_kernel_peak_the_board_could_not_restart_measures_no_physical_memory():
    """QA: on emulated-arm64 the kernel's peak ran since its group began, the profile job's
    included, and the report read 'physical memory of training ...: 517.49 MiB against
    2.19 MiB predicted (236.75x)'. Where the job says the peak was not restarted at the
    runtime baseline, no such figure; where it was, the figure as before."""
    from edge_remat.reports.run_report import build_report, report_text

    def report(restarted):
        return build_report(
            mode="planned", status="finished", device="b", model="m", steps=1,
            result={"steps": [], "runtime_baseline_bytes": 850 * 2**20,
                    "runtime_baseline": {"bytes": 850 * 2**20, "peak_restarted": restarted}},
            plan={"budget_bytes": 3 * 2**20, "predicted": {"peak_bytes": 2 * 2**20}},
            kernel_peak_bytes=1368 * 2**20, kernel_peak_source="since the group began")
    unrestarted = report(False)
    assert unrestarted["training_physical_bytes"] is None
    assert "physical memory of training" not in report_text(unrestarted)
    assert report(True)["training_physical_bytes"] == 518 * 2**20


def test_the_arena_executors_physical_memory_is_also_held_against_its_arena():
    """QA: digits-cnn at 30% with --allocator arena read 'physical memory of training ...:
    102.01 MiB against 92.38 MiB predicted (1.10x, arena executor)', where the plan's arena
    passed its tensor peak by 6.49 MiB (fragmentation) and the board allocates the arena. The
    line also holds the figure against the arena laid out with fixed memory; the glibc
    executor's has no such figure."""
    from edge_remat.reports.run_report import build_report, report_text
    mib = 2**20

    def line(allocator):
        report = build_report(
            mode="planned", status="finished", device="b", model="m", steps=1,
            result={"steps": [], "runtime_baseline_bytes": 250 * mib,
                    "runtime_baseline": {"bytes": 250 * mib, "peak_restarted": True},
                    "executor_allocator": allocator},
            plan={"budget_bytes": 96 * mib, "predicted": {"peak_bytes": 92 * mib},
                  "problem": {"fixed_bytes": 2 * mib},
                  "arena": {"size_bytes": 97 * mib, "details": {}}},
            kernel_peak_bytes=352 * mib)
        return report, next(x for x in report_text(report).splitlines()
                            if "physical memory of training" in x)
    report, arena = line("arena")
    assert report["arena_footprint_bytes"] == 99 * mib
    assert "102.00 MiB against 92.00 MiB predicted (1.11x, arena executor; the arena laid " \
        "out, with fixed memory, 99.00 MiB: 1.03x)" in arena, arena
    report, glibc = line("glibc")
    assert "arena_footprint_bytes" not in report and "laid out" not in glibc, glibc


@pytest.mark.slow  # a real run on the local board (~15 s, in a memory cgroup: root)
def test_a_memory_limit_past_this_machines_ram_is_a_warning(tmp_path):
    from edge_remat.cgroup import unavailable_reason
    if (reason := unavailable_reason()) is not None:
        pytest.skip(f"no memory cgroup: {reason}")
    proc = _run("--budget", "98%", "--profile", PROFILE, "--no-grad-check", "--memory-limit",
                "1TiB", "--out", tmp_path / "out", cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "warning: --memory-limit 1024.00 GiB is more than this machine's" in proc.stderr
    assert "the limit never binds" in proc.stderr


@pytest.mark.slow  # a real run on the local board (~15 s); mounts a tmpfs (root)
def test_a_full_disk_while_fetching_names_the_file_and_the_way_back_and_keeps_the_plan(
        tmp_path):
    """QA: with OUT on a full disk the run said only 'No space left on device (check the path
    and its permissions)', removed the graph and plan it had written, and left weights.pt.part.
    The disk is a real 2 MiB tmpfs, nearly filled."""
    from helpers.small_disk import small_disk
    with small_disk(tmp_path / "disk") as disk:
        (disk / "fill").write_bytes(b"\0" * (2 * 2**20 - 160 * 1024))
        out = disk / "out"
        proc = _run("--budget", "98%", "--profile", PROFILE, "--no-grad-check", "--out", out,
                    cwd=tmp_path, timeout=300)
        left = sorted(p.name for p in out.rglob("*"))
    assert proc.returncode == BAD_INPUT and "Traceback" not in proc.stderr, proc.stderr
    error = proc.stderr.strip().splitlines()[-1]
    assert "No space left on device" in error and "weights.pt" in error, error
    assert "edge-remat job-status run-" in error and f"--out {out}" in error, error
    assert "graph.json" in left and "plan.json" in left, left
    assert not [name for name in left if name.endswith(".part")], left


@pytest.mark.parametrize("budget_mib, words", [
    (232, "leave 155 MiB of the 600 MiB memory limit for the allocator's slack, less than the "
          "160 MiB a run keeps: the limit may kill the run"),
    (400, "and the runtime's own 213 MiB and 160 MiB headroom pass the 600 MiB memory limit: "
          "the limit will likely kill the run"),
    (200, None),
    ((500, 7), None),  # QA: a plan that peaks far below its budget was told it would be killed
    # QA: a limit that leaves nothing beside the runtime was told to leave out --budget, to plan
    # for "(0 MiB)", which was refused: the limit to give instead
    ((8, None, 300), "leave 79 MiB of the 300 MiB memory limit for the allocator's slack, less "
                     "than the 160 MiB a run keeps: the limit may kill the run; give "
                     "--memory-limit 381MiB or more"),
])
def test_a_budget_into_the_limits_headroom_may_kill_one_past_it_likely_will(budget_mib, words):
    """The README's resnet18 at 65% (232 MiB beside a 213 MiB runtime under 600 MiB) was told
    the limit 'will likely kill the run', and peaked at 480 MiB: only budget and runtime past
    the limit are that; into the headroom, the allocator's slack decides."""
    from types import SimpleNamespace
    from edge_remat.run.orchestrate import _note_budget_past_limit
    said = []
    budget_mib, peak_mib, limit_mib = (budget_mib + (600,))[:3] if isinstance(budget_mib, tuple) \
        else (budget_mib, None, 600)
    _note_budget_past_limit(
        budget_mib * 2**20, SimpleNamespace(budget=f"{budget_mib}MiB"),
        SimpleNamespace(hardware=SimpleNamespace(memory_limit_bytes=limit_mib * 2**20)),
        SimpleNamespace(profile=SimpleNamespace(runtime_baseline_bytes=213 * 2**20)),
        said.append, peak_mib and peak_mib * 2**20)
    if words is None:
        assert said == []
    elif limit_mib == 600:
        assert len(said) == 1 and words in said[0] and "(227 MiB)" in said[0], said
        assert f"give --memory-limit {budget_mib + 373}MiB or more, or leave out" in said[0]
    else:
        assert len(said) == 1 and words in said[0] and "leave out" not in said[0], said


def test_bad_input_after_profiling_removes_the_fetched_profile_too(tmp_path):
    """Exit 2 writes nothing: a budget refused after the board was profiled left
    OUT/profile/profile.json (the profile cache keeps the measurement). A profile folder
    older than the run, or a file of the user's in it, stays."""
    from edge_remat.run.orchestrate import _output_stamps, _remove_outputs_since
    out = tmp_path / "out"
    (out / "profile").mkdir(parents=True)
    mine = out / "profile" / "notes.txt"
    mine.write_text("the user's")
    (out / "report.txt").write_text("an earlier run's, written a moment before this one")
    at_start = _output_stamps(out)
    (out / "profile" / "profile.json").write_text("{}")
    (out / "graph.json").write_text("{}")
    _remove_outputs_since(out, at_start)
    assert sorted(p.name for p in out.rglob("*")) == ["notes.txt", "profile", "report.txt"]
    mine.unlink()
    (out / "report.txt").unlink()
    at_start = _output_stamps(tmp_path / "fresh")  # a run into a folder it made
    (out / "profile" / "profile.json").write_text("{}")
    _remove_outputs_since(out, at_start)
    assert list(out.iterdir()) == []


# -- run --arena: the layout --allocator arena runs in -------------------------------------

def test_an_unknown_run_arena_is_refused_before_any_work(tmp_path):
    before = tree(tmp_path)
    proc = _run("--budget", "90%", "--allocator", "arena", "--arena", "none", cwd=tmp_path,
                timeout=60)
    refused(proc, BAD_INPUT, "--arena", "'none'", "best-fit | cpsat")
    assert "capturing" not in proc.stderr
    no_new_files(before, tmp_path)


def test_run_lays_its_arena_out_with_cpsat_when_asked_and_says_where_it_is_unused(tmp_path):
    """`plan --arena cpsat` packs tighter than best fit, and `run` had no way to ask for it:
    its arena was always best fit, re-planned cheaper until the looser layout fit."""
    asked = _run("--budget", "90%", "--profile", PROFILE, "--allocator", "arena", "--arena",
                 "cpsat", "--arena-time-limit", 3, "--out", tmp_path / "cpsat", "--steps", 2,
                 cwd=tmp_path, timeout=300)
    assert asked.returncode == 0, asked.stderr
    assert "--arena" not in asked.stderr, asked.stderr
    arena = json.loads((tmp_path / "cpsat" / "plan.json").read_text())["arena"]
    assert arena["method"] == "cpsat" and arena["details"]["fit"]["fits"]
    report = json.loads((tmp_path / "cpsat" / "report.json").read_text())
    assert report["executor_allocator"] == "arena"
    assert report["grad_check"]["bitwise_equal"] is True
    # with the glibc allocator no arena is run in: the plan keeps the report's best fit
    glibc = _run("--budget", "90%", "--profile", PROFILE, "--arena", "cpsat", "--out",
                 tmp_path / "glibc", cwd=tmp_path, timeout=300)
    assert glibc.returncode == 0, glibc.stderr
    assert "warning: --arena and --arena-time-limit lay out the arena that --allocator arena " \
        "runs in, and this run allocates with glibc: ignored" in glibc.stderr, glibc.stderr
    assert json.loads((tmp_path / "glibc" / "plan.json").read_text())["arena"]["method"] == \
        "best-fit"
