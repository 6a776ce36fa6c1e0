"""The runner's compiled nodes (capture/straight_line.py) and folded getitems (replay.py):
what the ledger counts is what the runner holds, and a failing op leaves nothing behind."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from edge_remat_agent.capture import capture_model
from edge_remat_agent.capture.replay import StepRunner
from edge_remat_agent.profiler import LiveTensorLedger


@pytest.fixture(scope="module")
def resnet():
    """Batch norm and convolution backward: ops with several results, all taken by getitems."""
    return capture_model("resnet18", update="step", batch=2, image=16)


def _runner(captured) -> tuple[StepRunner, LiveTensorLedger]:
    ledger = LiveTensorLedger()
    return StepRunner(captured.trace, captured.graph, captured.module, captured.example_args,
                      None, ledger), ledger


def _held_bytes(runner: StepRunner) -> int:
    """Bytes of the distinct storages of everything the runner holds (not gradient storages,
    which the caller counts as fixed memory)."""
    storages = {}
    for name, value in runner.env.items():
        if name in runner.fixed_values():
            continue
        for t in value if isinstance(value, (tuple, list)) else [value]:
            if isinstance(t, torch.Tensor):
                storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    extra = [runner.loss] + list(runner.buffer_updates.values())
    for t in extra:
        if t is not None:
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    return sum(storages.values())


def test_the_ledger_follows_what_the_runner_holds_node_by_node(resnet):
    runner, ledger = _runner(resnet)
    with torch.no_grad():
        for node in resnet.graph.nodes:
            if node.kind == "update":
                continue
            runner.compute(node.id)
            runner.free_inputs_read_last(node.id)
            assert ledger.live_bytes == _held_bytes(runner), node.name
    assert runner.loss is not None and len(runner.grads) > 0
    runner.release_all()
    assert (ledger.live_bytes, len(ledger)) == (0, 0)


def test_multi_result_ops_run_without_their_getitems(resnet):
    runner, _ = _runner(resnet)
    steps = [step for node in resnet.graph.nodes if node.kind not in ("param", "update")
             for step in runner._ops_of(node.id).steps]
    folded = [step for step in steps if step.items]
    assert folded, "batch norm's and convolution backward's getitems are folded"
    assert not any(step.op.target.__name__ == "getitem" for step in steps
                   if any(step.op.args[0].name == f.name for f in folded))


def test_an_op_that_fails_inside_a_node_leaves_nothing_held(resnet):
    runner, ledger = _runner(resnet)
    # The first node with temporaries registered before its last op: make that op fail.
    with torch.no_grad():
        for node in resnet.graph.nodes:
            if node.kind in ("param", "update"):
                continue
            prep = runner._ops_of(node.id)
            if len(prep.steps) >= 3 and node.kind == "forward":
                break
            runner.compute(node.id)
        before = (ledger.live_bytes, len(ledger), dict(runner._holds))

        def fail(*args, **kwargs):
            raise RuntimeError("injected")
        prep.steps[-1] = dataclasses.replace(prep.steps[-1], call=fail)
        prep.run = None  # compiled again with the failing call
        with pytest.raises(RuntimeError, match="injected"):
            runner.compute(node.id)
    assert (ledger.live_bytes, len(ledger), dict(runner._holds)) == before
