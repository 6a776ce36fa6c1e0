"""Checkpoints (--checkpoint-every) and resuming (--resume): a run of 6 steps and a run of 3
steps resumed for 3 more end bit for bit the same (parameters, optimizer state, losses), with
AdamW, a cosine schedule with warmup, real data and dropout; with parameters and optimizer
state homed on flash; with gradient accumulation. Then the same through `edge-remat run` on a
local board, a run killed by its memory limit resumed from its last checkpoint, and the
refusals of options and files a resume cannot go on from. Jobs the board's daemon restarts,
and jobs SIGKILLed on the board: test_resume_restarts.py."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers.resume_runs import GPT, QUICK, assert_same_checkpoint, assert_same_outputs, planned

from edge_remat_agent.executor.checkpoint import Checkpointing, read_checkpoint
from edge_remat_agent.executor.errors import BadInput
from edge_remat_agent.executor.run import run_plan

TRAINING = dict(lr_schedule="cosine", warmup=2, seed=0)
IDENTITY = {"--model": "gpt-tiny", "--optimizer": "adamw"}


def _run(tmp_path: Path, name: str, home: str, steps: int, accumulate: int = 1,
         stop_after: int | None = None, resume: Path | None = None, every: int = 2):
    captured, plan = planned(home, accumulate)
    checkpoint = tmp_path / f"{name}.pt"
    if resume is not None:
        checkpoint.write_bytes(resume.read_bytes())  # the next part replaces it
    checkpointing = Checkpointing(path=checkpoint, every=every, identity=IDENTITY,
                                  stop_after=stop_after,
                                  resume=read_checkpoint(checkpoint) if resume else None)
    report = run_plan(captured.graph, plan, steps, str(tmp_path / f"pages-{name}"),
                      captured=captured, data="text", keep_parameters=True,
                      checkpointing=checkpointing, **TRAINING)
    return report, captured.module.state_dict(), checkpoint


@pytest.mark.slow
@pytest.mark.parametrize("home,accumulate", [("ram", 1), ("flash", 1), ("flash", 2)],
                         ids=["ram", "flash", "flash-accumulate"])
def test_six_steps_equal_three_then_three_resumed(tmp_path, home, accumulate):
    whole, whole_params, whole_checkpoint = _run(tmp_path, "whole", home, 6, accumulate)
    first, _, first_checkpoint = _run(tmp_path, "first", home, 6, accumulate, stop_after=3)
    second, second_params, second_checkpoint = _run(tmp_path, "second", home, 6, accumulate,
                                                    resume=first_checkpoint)
    assert [s["step"] for s in first["steps"]] == [1, 2, 3]
    assert [s["step"] for s in second["steps"]] == [4, 5, 6]
    losses = [s["loss"] for s in first["steps"] + second["steps"]]
    assert losses == [s["loss"] for s in whole["steps"]]
    assert whole_params.keys() == second_params.keys()
    for name in whole_params:
        assert torch.equal(whole_params[name], second_params[name]), name
    assert_same_checkpoint(whole_checkpoint, second_checkpoint)
    assert second["checkpoint"]["resumed_from_step"] == 3
    assert whole["checkpoint"]["written"] == 3  # after steps 2, 4 and the last, 6
    assert second["grad_check"]["bitwise_equal"] is True  # checked on its first step, 4
    # not merely the same file: resuming without the optimizer state goes elsewhere
    state = torch.load(first_checkpoint)
    assert any(k.startswith("optimizer/") for k in state)


@pytest.mark.slow
def test_the_resumed_run_refuses_a_checkpoint_of_other_options(tmp_path):
    _, _, checkpoint = _run(tmp_path, "first", "ram", 4, stop_after=2)
    captured, plan = planned("ram")
    resume = read_checkpoint(checkpoint)
    with pytest.raises(BadInput, match="--optimizer adamw, this run has sgd"):
        run_plan(captured.graph, plan, 4, str(tmp_path / "p"), captured=captured,
                 checkpointing=Checkpointing(identity={**IDENTITY, "--optimizer": "sgd"},
                                             resume=resume))
    with pytest.raises(BadInput, match="after step 2, and this run would stop at step 2"):
        run_plan(captured.graph, plan, 2, str(tmp_path / "p"), captured=captured,
                 checkpointing=Checkpointing(identity=IDENTITY, resume=resume))


def test_a_damaged_or_foreign_checkpoint_is_one_line(tmp_path):
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(BadInput, match="is not a checkpoint torch.load reads"):
        read_checkpoint(damaged)
    weights = tmp_path / "weights.pt"
    torch.save({"w": torch.zeros(2)}, weights)
    with pytest.raises(BadInput, match="is no edge-remat checkpoint"):
        read_checkpoint(weights)
    with pytest.raises(BadInput, match="no checkpoint at"):
        read_checkpoint(tmp_path / "missing.pt")


# -- through `edge-remat run` on a local board -------------------------------------------------

def _losses(report: dict) -> list:
    return report["loss"]


@pytest.fixture(scope="module")
def stopped_after_3(tmp_path_factory):
    """`run --steps 6 --stop-after 3` on a local board "bench" (root/board), run once for the
    two tests below: (root, its report). Each test resumes a copy of root/part (its
    checkpoint.json names the job, whose checkpoint stays on the board)."""
    from helpers.board_fixtures import local_board
    from edge_remat.run import RunOptions, run
    root = tmp_path_factory.mktemp("stopped-after-3")
    with local_board(root, "bench"):
        first = run(RunOptions(steps=6, stop_after=3, out=str(root / "part"), **GPT))
    return root, first


def _copy_of_part(stopped_after_3, tmp_path: Path) -> Path:
    import shutil
    root, _ = stopped_after_3
    return Path(shutil.copytree(root / "part", tmp_path / "part"))


@pytest.mark.slow
@pytest.mark.loopback
def test_run_resumed_from_the_board_equals_the_uninterrupted_run(tmp_path, stopped_after_3):
    """`run --steps 6` against `run --steps 6 --stop-after 3` then `run --resume OUT`, with
    the host's copy of the checkpoint gone (a host that never got it): the board's is found,
    fetched, checked and read where it lies."""
    from helpers.board_fixtures import local_board
    from edge_remat.run import RunOptions, run
    root, first = stopped_after_3
    whole, part = tmp_path / "whole", _copy_of_part(stopped_after_3, tmp_path)
    with local_board(root, "bench"):
        uninterrupted = run(RunOptions(steps=6, out=str(whole), **GPT))
        assert first["checkpoint"]["step"] == 3 and (part / "checkpoint.pt").is_file()
        assert first["message"].startswith("finished 3 steps; stopped there by --stop-after 3 "
                                           "of --steps 6: the same command with --resume ")
        # the same command's --stop-after 3 would stop at once (QA): the line says so
        assert first["message"].endswith(", without --stop-after or with a later step, goes on")
        (part / "checkpoint.pt").unlink()
        said = []
        second = run(RunOptions(steps=6, resume=str(part), **GPT), say=said.append)
        # refused at once (bad input: nothing left to train), it removes none of the finished
        # run's outputs, though they were written in the two seconds before it, which it took
        # for its own (report.txt went)
        from edge_remat.run.options import RunProblem
        with pytest.raises(RunProblem, match="the run there is complete"):
            run(RunOptions(steps=6, resume=str(part), **GPT))
    assert any("fetching the checkpoint of job" in line for line in said), said
    assert second["message"] == "finished steps 4..6 (3 steps, resumed after step 3)"
    table = (part / "report.txt").read_text()
    assert "\n   4  " in table and "\n   6  " in table and "\n   1  " not in table, table
    assert _losses(first) + _losses(second) == _losses(uninterrupted)
    assert_same_outputs(whole, part)
    # complete: a cosine schedule spans --steps, so more steps are another run (QA: "give
    # --steps more than 6", which the resume then refused as "give --steps as it was")
    with local_board(root, "bench"), pytest.raises(
            RunProblem, match=r"the run there is complete .*its --lr-schedule cosine ends at "
                              r"step 6, so to train on start another run from its weights: "
                              r"--init .*weights"):
        run(RunOptions(steps=6, resume=str(whole), **GPT))


@pytest.mark.slow
@pytest.mark.loopback
def test_a_resume_with_other_options_or_a_bad_checkpoint_is_refused_in_one_line(
        tmp_path, stopped_after_3):
    from typer.testing import CliRunner
    from helpers.board_fixtures import local_board
    from edge_remat.cli import app
    root, _ = stopped_after_3
    part = _copy_of_part(stopped_after_3, tmp_path)
    with local_board(root, "bench"):
        common = ["run", "--device", "bench", "--model", "gpt-tiny", "--seq", "16",
                  "--optimizer", "adamw", "--data", "text", "--lr-schedule", "cosine",
                  "--warmup", "2", "--budget", "70%", "--params-home", "flash", "--paging",
                  "flash", "--profile", QUICK["profile"], "--no-plots", "--resume", str(part)]
        cases = [(["--batch", "4", "--steps", "6"], "had --batch 2, this run has 4"),
                 (["--batch", "2", "--steps", "5"], "had --steps 6, this run has 5"),
                 (["--batch", "2", "--steps", "6", "--out", str(tmp_path / "other")],
                  "leave out --out"),
                 (["--batch", "2", "--steps", "6", "--stop-after", "3"],
                  f"--resume {part}: the run there is complete (its checkpoint is after step "
                  "3, the last of this run): to train on, give --stop-after more than 3")]
        runner = CliRunner()
        for extra, words in cases:
            result = runner.invoke(app, common + extra)
            assert result.exit_code == 2, result.output
            assert words in result.output and "Traceback" not in result.output
        (part / "checkpoint.pt").write_bytes(b"not a checkpoint")
        (part / "checkpoint.json").unlink()  # the board's copy is not looked for
        result = runner.invoke(app, common + ["--batch", "2", "--steps", "6"])
        assert result.exit_code == 2 and "is not a checkpoint torch.load reads" in \
            result.output, result.output
        result = runner.invoke(app, common[:-1] + [str(tmp_path / "none"), "--batch", "2"])
        assert result.exit_code == 2 and "no such folder" in result.output, result.output
        # deploy --checkpoint-every: the last checkpoint comes back beside the report
        result = runner.invoke(app, ["deploy", str(part / "plan.json"), "--graph",
                                     str(part / "graph.json"), "--device", "bench", "--steps",
                                     "3", "--checkpoint-every", "2", "--data", "text",
                                     "--out", str(tmp_path / "deployed")])
    assert result.exit_code == 0, result.output
    assert read_checkpoint(tmp_path / "deployed" / "checkpoint.pt").steps_done == 3


KILL_ONCE = '''"""The bundled text, but drawing batch KILL_AT takes more memory than the board's
limit (and the kernel kills the run), once: the marker file beside it says it did."""
from pathlib import Path

from edge_remat_agent.data.text import text_batches

KILL_AT = 5  # step 6's batch
MARKER = Path(__file__).with_suffix(".killed")


def batches(batch, seed):
    for index, args in enumerate(text_batches(batch, 16, seed)):
        if index == KILL_AT and not MARKER.exists():
            MARKER.write_text("killed")
            hog = b"\\x01" * (4 << 30)  # every page written: charged to the memory cgroup
        yield args
'''


@pytest.mark.slow
@pytest.mark.loopback
@pytest.mark.cgroup
def test_a_run_killed_by_its_memory_limit_at_step_6_resumes_from_step_4_and_ends_as_the_uninterrupted(
        tmp_path):
    from helpers.board_fixtures import local_board
    from edge_remat.cgroup import unavailable_reason
    from edge_remat.run import RunOptions, run
    if unavailable_reason() is not None:
        pytest.skip(f"no memory cgroup: {unavailable_reason()}")
    data = tmp_path / "kill_once.py"
    data.write_text(KILL_ONCE)
    options = {**GPT, "data": f"{data}:batches", "steps": 8}
    whole, part = tmp_path / "whole", tmp_path / "part"
    with local_board(tmp_path, "bench", memory_limit_bytes=1024 * 2**20):
        data.with_suffix(".killed").write_text("the uninterrupted run is not killed")
        uninterrupted = run(RunOptions(out=str(whole), **options))
        data.with_suffix(".killed").unlink()
        said = []
        killed = run(RunOptions(out=str(part), **options), say=said.append)
        # batch 6 may be drawn ahead while step 5 runs (the suite's run once said step 5):
        # either way the last checkpoint is step 4's and the resumed run starts from it
        assert killed["status"] == "killed" and killed["killed_at_step"] in (5, 6), \
            killed["message"]
        assert killed["message"].startswith("killed by the memory limit at step ")
        assert killed["checkpoint"]["step"] == 4  # fetched from the killed job's files
        assert any(f"--resume {part} goes on" in line for line in said), said
        resumed = run(RunOptions(resume=str(part), **options))
    assert resumed["status"] == "finished"
    assert resumed["loss"] == uninterrupted["loss"][4:]  # steps 5 to 8
    assert_same_checkpoint(whole / "checkpoint.pt", part / "checkpoint.pt")


def test_the_training_identity_holds_the_trainable_dtype():
    """Mixed precision (`--trainable-dtype fp32`) trains other adapter weights and optimizer
    state than `--dtype bf16` alone: a resume across the two is named, not tried."""
    from edge_remat.run import RunOptions
    from edge_remat.run.resume import training_identity
    from edge_remat_agent.executor.save_choice import identity_mismatch
    lora = dict(device="bench", model="gpt-tiny-lora", dtype="bf16", **QUICK)
    mixed = training_identity(RunOptions(trainable_dtype="fp32", **lora))
    said = identity_mismatch(mixed, training_identity(RunOptions(**lora)))
    assert said is not None and said.startswith(
        "the checkpoint's run had --trainable-dtype fp32, this run has bf16")  # --dtype's


@pytest.mark.parametrize("record,field", [
    ('{"jobs": [5], "checkpoint_every": 1}', "'jobs[0]': expected a JSON object"),
    ('{"jobs": [{"job": "run-1"}]}', "'jobs[0].device': expected a value"),
    ('{"jobs": [], "checkpoint_every": "x"}', "'checkpoint_every': expected an integer"),
    ('[1]', "'<root>': expected a JSON object"),
    # QA: a file cut short was read as none, and the run went on and wrote over it
    ('{"jobs": 5', "checkpoint.json is not JSON"),
], ids=["job-a-number", "job-without-device", "every-a-word", "a-list", "cut-short"])
def test_a_damaged_checkpoint_record_is_refused_naming_its_field(tmp_path, record, field):
    # OUT/checkpoint.json's jobs say where --resume looks for a newer checkpoint than OUT's; a
    # damaged one was read as it was: `run --resume OUT` ended in an internal error
    # (AttributeError: 'int' object has no attribute 'get').
    from edge_remat.run.options import RunProblem
    from edge_remat.run.resume import read_record
    (tmp_path / "checkpoint.json").write_text(record)
    with pytest.raises(RunProblem) as refused:
        read_record(tmp_path)
    assert field in str(refused.value) and "remove" in str(refused.value)


def test_a_checkpoint_record_reads_as_written(tmp_path):
    from edge_remat.run.resume import note_job, read_record
    note_job(tmp_path, "run-1", "bench", 2, resumed=False)
    note_job(tmp_path, "run-2", "bench", 2, resumed=True)
    assert read_record(tmp_path) == {"jobs": [{"job": "run-2", "device": "bench"},
                                              {"job": "run-1", "device": "bench"}],
                                     "checkpoint_every": 2}
    assert read_record(tmp_path / "none") == {}


def test_a_checkpoint_the_come_back_fetched_into_out_board_is_resumed_from(tmp_path):
    """QA: a run whose link was lost said to come back with `job-status ... --out OUT/board`;
    that fetched OUT/board/checkpoint.pt, and `run --resume OUT` on another board said "no
    checkpoint there". It is taken (the newer of the two where OUT has one too)."""
    from edge_remat.run.resume import find_checkpoint
    from edge_remat_agent.executor.checkpoint_step import FORMAT, META, checkpoint_step
    (tmp_path / "board").mkdir()

    def written(path, steps):
        torch.save({META: {"format": FORMAT, "steps_done": steps}}, path)

    class OtherBoard:  # no job of the run's record ran on it
        name = "elsewhere"
    said = []
    written(tmp_path / "board" / "checkpoint.pt", 4)
    assert find_checkpoint(OtherBoard(), tmp_path, said.append) is None
    assert checkpoint_step(tmp_path / "checkpoint.pt") == 4 and "taking the checkpoint" in said[0]
    written(tmp_path / "checkpoint.pt", 6)  # a later part's, kept in OUT
    find_checkpoint(OtherBoard(), tmp_path, said.append)
    assert checkpoint_step(tmp_path / "checkpoint.pt") == 6 and len(said) == 1


def test_a_resume_beside_its_run_still_running_on_the_board_is_refused(tmp_path):
    """QA: `run --resume OUT` while OUT's job still trained (left with --keep-running) said
    "resuming after step 140", queued behind it, then failed on the board: the checkpoint it
    read by then was after the last step. Refused on the host, with the ways to wait or stop;
    once the job ended the resume goes on (here: to its next check, no checkpoint)."""
    import time

    from helpers.board_fixtures import local_board

    from edge_remat.devices import find_device
    from edge_remat.run.options import RunProblem
    from edge_remat.run.resume import find_checkpoint, note_job
    from edge_remat.transport import Board
    from edge_remat_agent.wire.protocol import TERMINAL_STATES
    out = tmp_path / "out"
    out.mkdir()
    with local_board(tmp_path, "bench"), Board(find_device("bench")) as board:
        job = board.submit("sleep", {"seconds": 60, "steps": 60}, None)["id"]
        note_job(out, job, board.name, 2, resumed=False)
        with pytest.raises(RunProblem) as refused:
            find_checkpoint(board, out, print)
        assert f"its job {job} is still " in str(refused.value)
        assert f"`edge-remat job-status {job} --device bench --wait --out {out / 'board'}`" \
            in str(refused.value) and f"`edge-remat job-cancel {job} --device bench`" \
            in str(refused.value)
        board.cancel(job)
        deadline = time.monotonic() + 120  # a busy host takes seconds
        while board.job(job)["state"] not in TERMINAL_STATES and time.monotonic() < deadline:
            time.sleep(0.2)
        with pytest.raises(RunProblem, match="no checkpoint there"):
            find_checkpoint(board, out, print)


def test_a_checkpoint_past_stop_after_names_stop_after(tmp_path):
    """QA: a checkpoint after step 2, resumed with --steps 3 --stop-after 1, said "give --steps
    more than 2": --steps was 3 already; --stop-after stopped it."""
    from edge_remat.run.options import RunOptions, RunProblem
    from edge_remat.run.resume import check_checkpoint, training_identity
    from edge_remat_agent.executor.checkpoint import RNG, VERSION
    from edge_remat_agent.executor.checkpoint_step import FORMAT, META
    opts = RunOptions(device="local", model="mlp", steps=3, stop_after=1, resume=str(tmp_path))
    torch.save({META: {"format": FORMAT, "version": VERSION, "steps_done": 2,
                       "identity": training_identity(opts)},
                RNG + "cpu": torch.get_rng_state()}, tmp_path / "checkpoint.pt")
    with pytest.raises(RunProblem, match="would stop at step 1: give --stop-after more than 2"):
        check_checkpoint(opts, tmp_path)


def test_a_complete_run_whose_outputs_never_came_says_how_to_fetch_them(tmp_path):
    # QA: deploy --resume of a job that finished while the link was down said only that the
    # run was complete; its folder had no weights.pt nor report, and nothing said where
    from edge_remat.run.resume import _outputs_left_behind, note_job
    note_job(tmp_path, "run-7", "bench", 2, resumed=False)
    hint = _outputs_left_behind(tmp_path, deployed=True)
    assert hint == (f"; its outputs are not in {tmp_path} (the link was lost before they "
                    f"came): `edge-remat job-status run-7 --device bench --out {tmp_path}` "
                    "fetches them")
    assert f"--out {tmp_path / 'board'}`" in _outputs_left_behind(tmp_path, deployed=False)
    (tmp_path / "run_report.json").write_text("{}")
    assert _outputs_left_behind(tmp_path, deployed=True) == ""
    assert _outputs_left_behind(tmp_path / "none", deployed=True) == ""


def test_a_resumed_runs_step_medians_name_its_absolute_steps():
    """QA: a run resumed after step 2 listed its one step as 3 in the table, and its miss
    line said 'step time: step 1'."""
    from edge_remat.reports.run_report import steady_median
    assert steady_median([0.5], after=2) == (0.5, "step 3")
    assert steady_median([0.5, 0.2], after=2) == (0.2, "step 4")
    assert steady_median([0.5, 0.2, 0.6], after=4) == (0.4, "median of steps 6-7")
    assert steady_median([0.5, 0.2, 0.6]) == (0.4, "median of steps 2-3")
