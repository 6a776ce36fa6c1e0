"""The executor against eager PyTorch: plans with recomputation and paging to flash train to the
same bits, batch-norm statistics and dropout masks included; what can go wrong on a board
(a plan for another graph, a damaged page, a full disk, out of memory) is one clear error.

Models are tiny (batch 2, 32x32 images, sequences of 16) so the file stays fast on a small CPU.
"""

from __future__ import annotations

import dataclasses
import json
import re

import pytest
import torch
from typer.testing import CliRunner

from helpers.board_fixtures import local_bench_device, stop_agent
from helpers.executor_plans import (SMALL, activation_budget, assert_same_model, dtr_plan,
                                    eager_run, every_forward_recomputed, example_model,
                                    trainable_count, with_paging, zoo_model)
from edge_remat_agent import cli as agent_cli
from edge_remat_agent.capture import capture_model
from edge_remat_agent.capture.models import load_model
from edge_remat_agent.executor import (BadBatch, BadInput, InstructionFailed, OutOfMemory,
                                       PlanMismatch, plain_step, run_plain, run_plan,
                                       torch_optimizer)
from edge_remat_agent.pages import FlashStore

pytestmark = pytest.mark.slow

STEPS = 3


# -- the plan trains exactly like eager PyTorch ---------------------------------------------------

@pytest.mark.parametrize("name", sorted(SMALL))
def test_recompute_and_paging_to_flash_train_bitwise_like_eager(name, zoo_captures, tmp_path):
    captured = zoo_captures(name)
    plan = with_paging(dtr_plan(captured.graph), captured.graph)
    report = run_plan(captured.graph, plan, STEPS, str(tmp_path / "pages"), captured=captured,
                      seed=11)
    assert report["recomputed"] > 0 and report["page_outs"] > 0 and report["page_ins"] > 0

    check = report["grad_check"]
    assert check["bitwise_equal"], check
    assert check["max_abs_diff"] == 0.0
    assert check["compared"] == trainable_count(captured.module)

    reference, losses = eager_run(zoo_model(name), STEPS, seed=11)
    assert [r["loss"] for r in report["steps"]] == losses  # the same optimizer trajectory
    assert_same_model(captured.module, reference)  # parameters and batch-norm buffers

    summary = report["summary"]
    assert summary["ledger_within_prediction"], summary
    assert summary["ledger_over_predicted_bytes"] <= 0
    for record in report["steps"]:
        assert record["rss_peak_bytes"] > record["ledger_peak_bytes"] > report["fixed_bytes"] // 2
        assert record["energy_j"] is None and record["step_time_s"] > 0
    assert json.loads(json.dumps(report)) == report
    assert not list((tmp_path / "pages").iterdir())  # every page file removed


def test_dropout_masks_and_batch_norm_statistics_survive_recomputation(user_capture, tmp_path):
    captured = user_capture()
    graph = captured.graph
    random_nodes = [n.id for n in graph.nodes if n.attrs.get("random")]
    assert random_nodes and any(n.attrs.get("buffer_updates") for n in graph.nodes)
    plan = with_paging(every_forward_recomputed(graph), graph, every=3)
    report = run_plan(graph, plan, STEPS, str(tmp_path), captured=captured, seed=5)

    forward = sum(1 for n in graph.nodes if n.kind == "forward")
    assert report["recomputed"] + report["page_ins"] == forward
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    reference, losses = eager_run(example_model, STEPS, seed=5)
    assert [r["loss"] for r in report["steps"]] == losses
    assert_same_model(captured.module, reference)  # running statistics updated once per step
    assert int(captured.module.stem[1].num_batches_tracked) == STEPS


def test_each_step_takes_its_batch_from_data(user_capture, tmp_path):
    captured = user_capture()
    images, labels = captured.example_args
    batches = [(images * (i + 1), labels) for i in range(2)]
    report = run_plan(captured.graph, every_forward_recomputed(captured.graph), 2, None,
                      data=batches, captured=captured, seed=1)
    module, _ = example_model()
    optimizer = torch_optimizer("sgd", module)
    torch.manual_seed(1)
    assert [r["loss"] for r in report["steps"]] == [plain_step(module, optimizer, b)
                                                     for b in batches]
    with pytest.raises(BadBatch, match="ran out of batches at step 3"):
        run_plan(captured.graph, every_forward_recomputed(captured.graph), 3, None,
                 data=iter(batches), captured=user_capture(), check_gradients=False)
    with pytest.raises(BadBatch, match=r"captured for a float32 tensor of shape \[4, 3, 16, 16\]"):
        run_plan(captured.graph, every_forward_recomputed(captured.graph), 1, None,
                 data=lambda step: (torch.randn(2, 3, 16, 16), labels), captured=user_capture())


def test_the_run_job_trains_on_the_data_and_lr_the_host_sends(tmp_path):
    """What `edge-remat run --data digits --lr 0.05` sends the board's run job: each step takes
    the next digits batch (the very batches plain training draws with that seed), the optimizer
    steps with that lr, and the report names the data, so the host's report can state it."""
    from edge_remat.reports.run_report import build_report
    from edge_remat_agent.daemon.registry import JobContext
    from edge_remat_agent.data import batches
    from edge_remat_agent.executor.jobs import run_job
    captured = capture_model("digits-cnn", batch=8, image=8, seed=2)
    (tmp_path / "inputs").mkdir()
    captured.graph.save(tmp_path / "inputs" / "graph.json")
    every_forward_recomputed(captured.graph).save(tmp_path / "inputs" / "plan.json")
    ctx = JobContext("run-test", tmp_path / "job", tmp_path)
    steps, lr = 3, 0.05
    answer = run_job(ctx, {"plan": "inputs/plan.json", "graph": "inputs/graph.json",
                           "steps": steps, "data": "digits", "seed": 2, "lr": lr,
                           "optimizer": "sgd"})
    report = json.loads((tmp_path / "job" / "files" / "run_report.json").read_text())
    assert answer["data"] == report["data"] == "digits"
    assert report["optimizer"]["lr"] == answer["optimizer"]["lr"] == lr
    assert report["grad_check"]["bitwise_equal"]  # on the first digits batch

    def eager(data):
        module, example_args = load_model("digits-cnn", 8, 8, None, 2)
        optimizer = torch_optimizer("sgd", module, lr)
        feed = batches(data, example_args, 2)
        torch.manual_seed(2)
        return [plain_step(module, optimizer, next(feed)) for _ in range(steps)]
    losses = [r["loss"] for r in report["steps"]]
    assert losses == eager("digits")
    assert losses != eager("example")  # not the capture's example batch every step
    host = build_report(mode="planned", status="finished", device="bench", model="digits-cnn",
                        steps=steps, result=report, data="digits")
    assert host["data"] == "digits"

    with pytest.raises(ValueError, match="captured for the sgd optimizer, not adamw"):
        run_job(ctx, {"plan": "inputs/plan.json", "graph": "inputs/graph.json", "steps": 1,
                      "optimizer": "adamw"})
    with pytest.raises(BadBatch, match="unknown data 'nope'"):
        run_plan(captured.graph, every_forward_recomputed(captured.graph), 1, None,
                 data="nope", captured=captured, check_gradients=False)


def test_plain_run_reports_the_same_losses_as_eager(user_capture):
    captured = user_capture()
    report = run_plain(captured.graph, 2, model=example_model(), seed=3)
    _, losses = eager_run(example_model, 2, seed=3)
    assert report["mode"] == "plain" and [r["loss"] for r in report["steps"]] == losses
    assert all(r["ledger_peak_bytes"] is None and r["rss_peak_bytes"] > 0
               for r in report["steps"])


# -- refusing, detecting, explaining -------------------------------------------------------------

def test_a_plan_for_another_graph_is_refused(user_capture, tmp_path):
    captured = user_capture()
    plan = every_forward_recomputed(captured.graph)
    wrong = dataclasses.replace(plan, graph_fingerprint="0123456789abcdef")
    with pytest.raises(PlanMismatch, match="made for graph 0123456789abcdef.*refusing"):
        run_plan(captured.graph, wrong, 1, str(tmp_path), captured=captured)

    # The graph file says something else than what this machine captures.
    other = dataclasses.replace(captured.graph, fixed_bytes=captured.graph.fixed_bytes + 1)
    with pytest.raises(PlanMismatch, match="the graph captured on this machine"):
        run_plan(other, dataclasses.replace(plan, graph_fingerprint=other.fingerprint()), 1,
                 str(tmp_path), captured=captured)


def test_a_plan_that_pages_without_its_tier_figures_is_refused(user_capture, tmp_path):
    captured = user_capture()
    plan = with_paging(every_forward_recomputed(captured.graph), captured.graph, every=1)
    with pytest.raises(BadInput, match="pages to flash but carries no figures for it"):
        run_plan(captured.graph, dataclasses.replace(plan, tiers={}), 1, str(tmp_path),
                 captured=captured)


@pytest.mark.parametrize("paging_io", ["sync", "overlap"])
def test_a_nodes_outputs_are_paged_as_one_file(user_capture, tmp_path, paging_io):
    """A page_out writes the node's outputs at once (flash: one file, one fsync) and its
    page_in reads them at once: module-level BERT-mini's layer nodes keep 19 tensors each."""
    class Recording(FlashStore):
        def put_many(self, items):
            writes.append(len(items))
            return super().put_many(items)

    writes: list[int] = []
    captured = user_capture()
    plan = with_paging(every_forward_recomputed(captured.graph), captured.graph, every=1)
    with Recording(tmp_path) as store:
        report = run_plan(captured.graph, plan, 1, None, captured=captured,
                          stores={"flash": store}, paging_io=paging_io)
    assert report["grad_check"]["bitwise_equal"]
    outputs = [len(captured.graph.node(ins.node).attrs["outputs"]) for stage in plan.stages
               for ins in stage if ins.op == "page_out"]
    assert sorted(w for w in writes if w) == sorted(n for n in outputs if n)
    assert max(writes) > 1


def test_a_corrupted_page_is_detected(user_capture, tmp_path):
    class Damaging(FlashStore):  # the file's last byte: its last page's payload
        def put_many(self, items):
            size = super().put_many(items)
            with open(self.path_of(items[-1][0]), "r+b") as page:
                page.seek(-1, 2)
                last = page.read(1)
                page.seek(-1, 2)
                page.write(bytes([last[0] ^ 0xFF]))
            return size

    captured = user_capture()
    plan = with_paging(every_forward_recomputed(captured.graph), captured.graph, every=1)
    with Damaging(tmp_path) as store, pytest.raises(InstructionFailed) as failed:
        run_plan(captured.graph, plan, 1, None, captured=captured, stores={"flash": store})
    message = str(failed.value)
    assert "page_in" in message and "corrupted" in message and "CRC32" in message


def test_a_full_page_store_is_a_clear_error(user_capture, tmp_path):
    captured = user_capture()
    plan = with_paging(every_forward_recomputed(captured.graph), captured.graph, every=1)
    with pytest.raises(InstructionFailed) as failed:
        run_plan(captured.graph, plan, 1, str(tmp_path), captured=captured,
                 flash_capacity_bytes=4096)
    message = str(failed.value)
    assert "page_out" in message and "needs" in message and "4096-byte capacity" in message
    assert "Remedy" in message and not list(tmp_path.iterdir())


def test_too_little_disk_is_refused_before_the_first_step(user_capture, tmp_path, monkeypatch):
    from edge_remat_agent.executor import ExecutorError
    monkeypatch.setattr(FlashStore, "free_bytes", lambda self: 100)
    captured = user_capture()
    plan = with_paging(every_forward_recomputed(captured.graph), captured.graph, every=1)
    with pytest.raises(ExecutorError, match="100 bytes are free.*checked before the first step"):
        run_plan(captured.graph, plan, 1, str(tmp_path), captured=captured)


def test_too_little_disk_for_flash_homed_parameters_names_their_remedy(tmp_path, monkeypatch):
    """QA: parameters homed on flash that the page folder cannot hold were refused as
    '(all pages of a step)' with the remedy 'plan with less paging', for a plan that pages
    nothing. The refusal names them and --params-home ram."""
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.solve import solve
    from edge_remat_agent.executor import ExecutorError
    monkeypatch.setattr(FlashStore, "free_bytes", lambda self: 100)  # a full disk's answer
    captured = capture_model("mlp", params_home="flash")
    plan = solve(build_problem(captured.graph, 1.0, paging="none"), "heuristic:keep-all").plan
    with pytest.raises(ExecutorError) as refused:
        run_plan(captured.graph, plan, 1, str(tmp_path / "pages"), captured=captured)
    message = str(refused.value)
    assert "parameters and optimizer state homed on flash" in message, message
    assert "--params-home ram" in message and "less paging" not in message


def test_running_out_of_memory_names_the_instruction(user_capture, monkeypatch):
    from edge_remat_agent.capture.replay import StepRunner
    captured = user_capture()
    graph = captured.graph
    victim = next(n for n in graph.nodes if n.kind == "backward")
    compute = StepRunner.compute

    def failing(self, node_id):
        if node_id == victim.id:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:121] DefaultCPUAllocator: can't "
                               "allocate memory: you tried to allocate 1048576 bytes.")
        return compute(self, node_id)

    monkeypatch.setattr(StepRunner, "compute", failing)
    with pytest.raises(OutOfMemory) as failed:
        run_plan(graph, every_forward_recomputed(graph), 1, None, captured=captured,
                 check_gradients=False)
    message = str(failed.value)
    assert f"compute {victim.id}" in message and victim.name in message
    assert "out of memory" in message and "Remedy: plan with a smaller budget" in message


# -- the command line and the daemon -------------------------------------------------------------

def test_agent_run_command_captures_again_and_checks_the_plan(tmp_path, capsys):
    captured = capture_model("resnet18", batch=2, image=32)
    graph_file, plan_file = tmp_path / "graph.json", tmp_path / "plan.json"
    captured.graph.save(graph_file)
    from edge_remat.cli import app
    budget = activation_budget(captured.graph, 0.6)
    result = CliRunner().invoke(app, [
        "plan", "--graph", str(graph_file), "--budget", str(budget), "--paging", "flash",
        "--flash-read-bw", "2GB", "--flash-write-bw", "2GB", "--time-limit", "3",
        "--workers", "1", "-o", str(plan_file)])
    assert result.exit_code == 0, result.output

    code = agent_cli.main(["run", str(plan_file), "--graph", str(graph_file), "--steps", "2",
                           "--page-dir", str(tmp_path / "pages"), "--sensor", "none", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0 and report["grad_check"]["bitwise_equal"]
    assert len(report["steps"]) == 2  # the plan pages to flash, overlapped by default:
    assert report["summary"]["ledger_within_prediction"], report["summary"]

    plan = json.loads(plan_file.read_text())
    plan["graph_fingerprint"] = "ffffffffffffffff"
    plan_file.write_text(json.dumps(plan))
    code = agent_cli.main(["run", str(plan_file), "--graph", str(graph_file), "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("error: the plan was made for graph ffffffffffffffff")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.fixture
def local_board(tmp_path, monkeypatch):
    folder, workdir = local_bench_device(tmp_path, monkeypatch)
    yield "bench"
    stop_agent(workdir)


def test_deploy_runs_the_plan_on_the_board_through_the_daemon(user_capture, local_board,
                                                               tmp_path):
    from edge_remat.cli import app
    captured = user_capture()
    graph_file, plan_file = tmp_path / "graph.json", tmp_path / "plan.json"
    captured.graph.save(graph_file)
    with_paging(every_forward_recomputed(captured.graph), captured.graph).save(plan_file)
    result = CliRunner().invoke(app, ["deploy", str(plan_file), "--device", local_board,
                                      "--graph", str(graph_file), "--steps", "2",
                                      "--out", str(tmp_path / "out"), "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["status"] == "finished" and answer["result"]["steps"] == 2
    assert answer["result"]["grad_check"]["bitwise_equal"]
    report = json.loads((tmp_path / "out" / "run_report.json").read_text())
    assert [r["step"] for r in report["steps"]] == [1, 2]
    assert report["page_outs"] > 0 and report["tiers"]["flash"]["page_dir"].startswith(
        str(tmp_path / "board"))


def test_a_page_dir_under_the_home_pages_there_not_in_a_folder_named_tilde(user_capture,
                                                                          tmp_path, monkeypatch):
    """Every shipped device config sets `page_dir = "~/..."`. Before, the board's job took it
    as a relative path: it paged (and kept a 1.1B model's 4.4 GB of weights) in WORKDIR/~/...,
    while `devices check` tested the real folder under the home."""
    from edge_remat.cli import app
    from edge_remat.devices import write_local_device
    (tmp_path / "home").mkdir()  # a home exists: a page_dir's missing parent is refused
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("EDGE_REMAT_DEVICE_CONFIGS", str(tmp_path / "configs"))
    workdir = tmp_path / "board"
    write_local_device(tmp_path / "configs", "tilde", workdir, page_dir="~/board-pages")
    captured = user_capture()
    graph_file, plan_file = tmp_path / "graph.json", tmp_path / "plan.json"
    captured.graph.save(graph_file)
    with_paging(every_forward_recomputed(captured.graph), captured.graph).save(plan_file)
    try:
        result = CliRunner().invoke(app, ["deploy", str(plan_file), "--device", "tilde",
                                          "--graph", str(graph_file), "--steps", "1",
                                          "--out", str(tmp_path / "out"), "--json"])
    finally:
        stop_agent(workdir)
    assert result.exit_code == 0, result.output
    report = json.loads((tmp_path / "out" / "run_report.json").read_text())
    assert report["page_outs"] > 0
    assert report["tiers"]["flash"]["page_dir"].startswith(str(tmp_path / "home" / "board-pages"))
    assert not (workdir / "~").exists()


def test_a_graph_this_machine_does_not_capture_is_refused(user_capture, tmp_path):
    graph = user_capture().graph
    nodes = [dataclasses.replace(n) for n in graph.nodes]
    nodes[0].time_s *= 2  # as if captured with another torch: another graph
    graph = dataclasses.replace(graph, nodes=nodes)
    plan = every_forward_recomputed(graph)
    with pytest.raises(PlanMismatch, match="re-capturing gave a different graph.*Remedy"):
        run_plan(graph, plan, 1, str(tmp_path))


def test_deploy_says_in_words_what_the_run_measured_and_what_a_plan_records_wrongly(
        user_capture, local_board, tmp_path):
    """(1) Before, deploy without --json printed the job's result as a JSON dump. (2) A plan
    whose `predicted` was edited by hand ran without a word, and the report said "4.43 MiB
    measured, 100 B predicted (OVER the prediction)": the board compares against the recorded
    figures, so deploy says, as `simulate` does, that they are not the replay's. The unedited
    plan's deploy serves both (each deploy is a board job of its own: seconds)."""
    from edge_remat.cli import app
    captured = user_capture()
    graph_file, plan_file = tmp_path / "graph.json", tmp_path / "plan.json"
    captured.graph.save(graph_file)
    every_forward_recomputed(captured.graph).save(plan_file)
    args = ["deploy", str(plan_file), "--device", local_board, "--graph", str(graph_file),
            "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(app, [*args, "--steps", "2"])
    assert result.exit_code == 0 and "warning" not in result.stderr, result.output
    assert "2 steps on" in result.stdout and "ledger peak" in result.stdout
    assert "gradients    bitwise equal to eager PyTorch" in result.stdout
    assert "{" not in result.stdout and "fetched " in result.stdout
    # Coming back for the finished job without --out: its result, the report left on the board
    # (QA: 'error: internal error (KeyError: 'model')', exit 70, the summary needing the report)
    job = re.search(r"job (run-\S+) finished", result.output).group(1)
    status = CliRunner().invoke(app, ["job-status", job, "--device", local_board])
    assert status.exit_code == 0, status.output
    assert f"job {job} finished" in status.stdout and '"summary"' in status.stdout

    plan = json.loads(plan_file.read_text())
    replayed_peak, plan["predicted"]["peak_bytes"] = plan["predicted"]["peak_bytes"], 100
    plan_file.write_text(json.dumps(plan))
    result = CliRunner().invoke(app, [*args, "--steps", "1"])
    assert result.exit_code == 0, result.output
    assert f"warning: {plan_file} records figures its replay does not give: peak_bytes 100 " \
        f"(the replay: {replayed_peak})" in result.stderr
