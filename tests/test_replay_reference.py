"""The gradient check's reference on a CUDA device: the captured step's ops replayed plainly.

On a device, eager PyTorch takes other kernels than the CPU-traced ops the plan replays (docs/
boards.md), so the check compares the planned step with the trace replayed once per node in the
graph's order instead (executor/gradcheck.replay_reference). No GPU here: these tests check on
the CPU that the replay is eager's step bit for bit (so it is a faithful plain step), that it
leaves the model, its buffers and the generators as they were, and that a run checked against
it still trains like eager PyTorch. tests/test_cuda.py runs the check on the device itself.
"""

from __future__ import annotations

import pytest
import torch

from helpers.executor_plans import (assert_same_model, dtr_plan, eager_run, with_paging,
                                    zoo_model)
from edge_remat_agent.capture import capture_module
from edge_remat_agent.executor import run as run_module, run_plan
from edge_remat_agent.executor.gradcheck import (compare, deterministic, eager_reference,
                                                 replay_reference)
from edge_remat_agent.run_command import gradient_mismatch, reference_words


def _captured(name: str, **options):
    module, args = zoo_model(name)()
    return capture_module(module, args, name, **options)


@pytest.mark.parametrize("name, options", [("mobilenet_v2", {}),
                                           ("bert-mini", {"operator_level": True}),
                                           ("bert-mini", {"accumulate": 2})])
def test_the_replayed_step_is_eagers_bit_for_bit_and_changes_nothing(name, options):
    """Batch norm's statistics and dropout's generator included (mobilenet_v2, bert-mini)."""
    captured = _captured(name, **options)
    module, batch = captured.module, captured.example_args
    cpu = torch.device("cpu")
    buffers = {n: b.clone() for n, b in module.named_buffers()}
    more = (batch,) if options.get("accumulate") else ()
    with deterministic(cpu):
        torch.manual_seed(7)
        replayed = replay_reference(captured, module, batch, cpu, more)
        after_replay = torch.rand(3)
        torch.manual_seed(7)
        eager = eager_reference(module, batch, cpu, more)
        after_eager = torch.rand(3)
    check = compare(eager, replayed.loss, replayed.grads, module)
    assert check["bitwise_equal"] and check["compared"] == len(list(module.parameters())), check
    assert torch.equal(after_replay, after_eager)  # the generator left where it was
    assert all(torch.equal(b, buffers[n]) for n, b in module.named_buffers())
    assert replayed.kind == "replay" and reference_words({"reference": "replay"}) != \
        reference_words({})


def test_a_run_checked_against_the_replay_trains_like_eager(monkeypatch, tmp_path):
    """What a CUDA run does, on the CPU: parameters homed on flash are loaded for the replay
    as the planned step's param nodes load them, and the run still trains like eager."""
    monkeypatch.setattr(run_module, "plain_reference",
                        lambda captured, home, module, batch, device, more=():
                        replay_reference(captured, module, batch, device, more,
                                         home.load if home else None))
    captured = _captured("bert-mini", params_home="flash")
    plan = with_paging(dtr_plan(captured.graph), captured.graph)
    report = run_plan(captured.graph, plan, 2, str(tmp_path), captured=captured, seed=3,
                      keep_parameters=True)
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    assert report["grad_check"]["reference"] == "replay"
    reference, losses = eager_run(zoo_model("bert-mini"), 2, seed=3)
    assert [r["loss"] for r in report["steps"]] == losses
    assert_same_model(captured.module, reference)


def test_a_replay_that_differs_is_reported_as_the_replays():
    """A planned step unlike its replay (here: a gradient off by one ulp) fails the check,
    and the words name the replay, not eager PyTorch."""
    captured = _captured("bert-mini")
    cpu = torch.device("cpu")
    with deterministic(cpu):
        replayed = replay_reference(captured, captured.module, captured.example_args, cpu)
    grads = dict(replayed.grads)
    name = next(iter(grads))
    grads[name] = torch.nextafter(grads[name], torch.full_like(grads[name], float("inf")))
    check = compare(replayed, replayed.loss, grads, captured.module)
    assert not check["bitwise_equal"] and check["differing"] == [name]
    assert reference_words(check) == "the captured step replayed plainly"
    assert "the captured step replayed plainly" in gradient_mismatch(check)


def test_a_replay_that_runs_out_of_memory_says_to_run_without_the_check():
    """A board without room for the reference's plain step (here: the home's load fails as
    CUDA's allocator does) gets one line, and the generator is left as it was."""
    from edge_remat_agent.executor.errors import ExecutorError
    captured = _captured("bert-mini", params_home="flash")

    def no_room(name):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 MiB")
    before = torch.get_rng_state()
    with pytest.raises(ExecutorError, match="plain step ran out of memory .* without the "
                                            "gradient check"):
        replay_reference(captured, captured.module, captured.example_args,
                         torch.device("cpu"), load_parameter=no_room)
    assert torch.equal(torch.get_rng_state(), before)
