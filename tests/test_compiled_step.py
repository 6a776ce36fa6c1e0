"""Steps after the ledger's figures are known run as one compiled function
(executor/compiled_step.py, ledger_replay.py): they train to the same bits as eager PyTorch,
recomputation, dropout masks and batch-norm statistics included, and the run report says
about memory what it says when every step is measured."""

from __future__ import annotations

import pytest
import torch

from helpers.executor_plans import (EXAMPLE, assert_same_model, eager_run,
                                    every_forward_recomputed, example_model, fresh, keep_all,
                                    with_paging)
from edge_remat_agent.executor import ledger_replay, run_plan
from edge_remat_agent.executor.interpreter import PARTLY_REPLAYED
from edge_remat_agent.executor.step import PlannedStep
from edge_remat_agent.profiler import LiveTensorLedger

STEPS = 6  # the gradient check's step, two measured steps that agree, three replayed

MEMORY = ("ledger_peak_bytes", "ledger_peak_by_class", "computes", "recomputed")


def counting_compiled_steps(monkeypatch) -> list:
    ran = []
    run = PlannedStep._run_compiled

    def counted(self, compiled, batch, replay):
        ran.append(batch)
        return run(self, compiled, batch, replay)
    monkeypatch.setattr(PlannedStep, "_run_compiled", counted)
    return ran


def measured_every_step(monkeypatch) -> None:
    monkeypatch.setattr(ledger_replay, "AGREE", 10**9)


@pytest.fixture(scope="module")
def captures(user_capture):
    """update -> () -> a fresh capture of the example model: "fused" (update nodes among the
    instructions) or "step" (one optimizer step after them)."""
    from edge_remat_agent.capture import capture_module
    module, args = example_model()
    stepped = capture_module(module, args, "my_model", update="step")
    return {"fused": user_capture, "step": lambda: fresh(stepped, example_model)}


@pytest.mark.parametrize("update", ["fused", "step"])
@pytest.mark.parametrize("make_plan", [keep_all, every_forward_recomputed])
def test_compiled_steps_train_like_eager_and_report_the_same_memory(make_plan, update,
                                                                     captures, monkeypatch,
                                                                     tmp_path):
    user_capture = captures[update]
    captured = user_capture()
    assert captured.graph.capture["update"] == update
    plan = make_plan(captured.graph)
    ran = counting_compiled_steps(monkeypatch)
    report = run_plan(captured.graph, plan, STEPS, str(tmp_path), captured=captured, seed=7)
    assert len(ran) == STEPS - 3  # step 1 is checked, steps 2 and 3 measured
    # Each step says whether its ledger figures were counted or are the measured steps'.
    assert [r["ledger"] for r in report["steps"]] == ["measured"] * 3 + ["replayed"] * (STEPS - 3)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]

    reference, losses = eager_run(example_model, STEPS, seed=7)
    assert [r["loss"] for r in report["steps"]] == losses
    assert_same_model(captured.module, reference)  # parameters and running statistics
    assert int(captured.module.stem[1].num_batches_tracked) == STEPS

    ran.clear()
    measured_every_step(monkeypatch)
    again = user_capture()
    measured = run_plan(again.graph, plan, STEPS, str(tmp_path), captured=again, seed=7)
    assert not ran
    for mine, theirs in zip(report["steps"], measured["steps"]):
        assert {k: mine[k] for k in MEMORY} == {k: theirs[k] for k in MEMORY}
    assert report["memory_by_class"] == measured["memory_by_class"]
    assert report["summary"]["ledger_peak_bytes"] == measured["summary"]["ledger_peak_bytes"]


@pytest.mark.parametrize("update", ["fused", "step"])
@pytest.mark.parametrize("make_plan", [keep_all, every_forward_recomputed])
@pytest.mark.parametrize("clip", [None, 0.05])
def test_accumulating_runs_replay_their_later_micro_passes_to_the_same_bits_and_memory(
        clip, make_plan, update, monkeypatch, tmp_path):
    """--accumulate 3: a middle micro-pass and the last one (which steps the optimizer) each
    replay once two of their kind agreed; the first, which makes the gradient sums, is always
    measured. The run trains to the bits, and reports the memory, of one measured throughout;
    with clipping too (the norm of the sums, taken in the last pass)."""
    from edge_remat_agent.capture import capture_model

    def captured_model():
        return capture_model(EXAMPLE, batch=4, image=16, accumulate=3, update=update,
                             clip_grad_norm=clip)
    captured = captured_model()
    plan = make_plan(captured.graph)
    ran = counting_compiled_steps(monkeypatch)
    report = run_plan(captured.graph, plan, STEPS, str(tmp_path), captured=captured, seed=7)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    # middle passes from step 3 on (steps 1 and 2 agree), last passes from step 4 on (step 1's
    # is the checked one)
    assert len(ran) == (STEPS - 2) + (STEPS - 3)
    assert [r["ledger"] for r in report["steps"]] == \
        ["measured"] * 2 + [PARTLY_REPLAYED] * (STEPS - 2)

    ran.clear()
    measured_every_step(monkeypatch)
    again = fresh(captured_model(), example_model)
    measured = run_plan(again.graph, plan, STEPS, str(tmp_path), captured=again, seed=7)
    assert not ran
    assert [r["loss"] for r in report["steps"]] == [r["loss"] for r in measured["steps"]]
    assert_same_model(captured.module, again.module)
    for mine, theirs in zip(report["steps"], measured["steps"]):
        assert {k: mine[k] for k in MEMORY} == {k: theirs[k] for k in MEMORY}
    assert report["memory_by_class"] == measured["memory_by_class"]


def test_without_the_gradient_check_the_third_step_is_compiled(user_capture, monkeypatch,
                                                               tmp_path):
    captured = user_capture()
    ran = counting_compiled_steps(monkeypatch)
    run_plan(captured.graph, keep_all(captured.graph), 5, str(tmp_path), captured=captured,
             check_gradients=False)
    assert len(ran) == 3  # steps 1 and 2 measured


def test_a_plan_that_pages_is_interpreted_every_step(user_capture, monkeypatch, tmp_path):
    captured = user_capture()
    plan = with_paging(every_forward_recomputed(captured.graph), captured.graph, every=3)
    ran = counting_compiled_steps(monkeypatch)
    report = run_plan(captured.graph, plan, 5, str(tmp_path), captured=captured, seed=7,
                      check_gradients=False)
    assert not ran and report["steps"][-1]["page_ins"] > 0
    reference, losses = eager_run(example_model, 5, seed=7)
    assert [r["loss"] for r in report["steps"]] == losses


def test_a_batch_of_another_layout_is_measured_again():
    ledger = LiveTensorLedger()
    replay = ledger_replay.LedgerReplay(ledger)
    batch = (torch.zeros(4, 3), torch.zeros(4, dtype=torch.long))
    for _ in range(2):
        mark = replay.open()
        ledger.register("x", 100)
        ledger.unregister("x")
        replay.close(mark, batch)
    assert replay.ready(batch)
    assert not replay.ready((torch.zeros(4, 3).t(), batch[1]))  # other strides
    assert not replay.ready((torch.zeros(2, 3), batch[1]))
    assert not replay.ready((torch.zeros(4, 3, dtype=torch.float64), batch[1]))


def test_a_replayed_rise_gives_the_measured_peak_and_its_split():
    ledger = LiveTensorLedger(classify=lambda key: key[0])
    ledger.register(("fixed", 0), 1000)

    def step():
        ledger.register(("inputs", 1), 10)
        ledger.register(("activations", 2), 300)
        ledger.register(("activations", 3), 200)
        ledger.unregister(("activations", 2))
        ledger.unregister(("activations", 3))
        ledger.unregister(("inputs", 1))
    ledger.reset_peak()
    mark = ledger.open_window()
    step()
    rise = ledger.rise_since(mark)
    measured = (ledger.peak_bytes, dict(ledger.peak_by_class), ledger.peak_key)
    assert measured == (1510, {"fixed": 1000, "inputs": 10, "activations": 500},
                        ("activations", 3))

    ledger.register(("fixed", 4), 50)  # between steps: the rise sits on what is live then
    ledger.reset_peak()
    ledger.raise_peak(rise)
    assert (ledger.peak_bytes, ledger.peak_by_class, ledger.peak_key) == \
        (1560, {"fixed": 1050, "inputs": 10, "activations": 500}, ("activations", 3))

    mark = ledger.open_window()  # a step that leaves something registered is not replayed
    ledger.register(("activations", 5), 1)
    assert ledger.rise_since(mark) is None
