"""Every byte of a training step planned: gradients, parameters and optimizer state.

Fused updates (each parameter group steps as soon as its gradients are complete) and parameters
homed on flash (param nodes load them; update nodes write them back) must give exactly what
plain `loss.backward(); optimizer.step()` gives, step after step; the solvers must reach the
exhaustive optimum on graphs with such nodes; and what goes wrong says so in one line.
"""

from __future__ import annotations

import copy
import os
import re
from pathlib import Path

import pytest
import torch
from helpers.small_graphs import state_chain
from helpers.exact_problems import assert_matches_brute_force, problem
from helpers.executor_plans import eager_parameters, keep_all, problem_near_floor
from helpers.user_models import spec as user_model

from edge_remat_agent.capture import capture_model
from edge_remat_agent.executor import ExecutorError
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.executor.updates import ParameterHome
from edge_remat_agent.formats import Tier
from edge_remat_agent.pages import FlashStore, PageStoreFull
from edge_remat.planner import isolated
from edge_remat.planner.build import build_problem, plain_peak_bytes
from edge_remat.planner.cpsat import solve_cpsat
from edge_remat.planner.evaluate import evaluate
from edge_remat.planner.problem import InfeasibleBudget
from edge_remat.planner.solve import solve

pytestmark = pytest.mark.slow

USER_MODEL = str(Path(__file__).resolve().parents[1] / "examples" / "my_model.py") + ":make_model"
FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}
STEPS = 3


# --- the solvers on graphs with parameter, gradient and update nodes --------------------------

@pytest.mark.parametrize("seed,fraction,paging", [(1, 0.6, False), (2, 0.5, False),
                                                  (3, 0.7, True), (4, 0.5, True)])
def test_solvers_reach_the_exhaustive_optimum_with_state_nodes(seed, fraction, paging):
    p = problem(state_chain(seed), fraction, paging=paging)
    expected = assert_matches_brute_force(p)  # the MILP
    outcome = isolated.call("ortools", solve_cpsat, p, 30, workers=2)
    if expected is None:
        assert outcome.status == "infeasible"
        return
    assert outcome.status == "optimal"
    assert evaluate(p, outcome.decisions).value == pytest.approx(expected[0], rel=1e-6)


# --- the executor: parameters after the steps equal plain PyTorch's, bit for bit ---------------

def _eager_parameters(spec: str, optimizer: str, train, example_args, steps=STEPS, **shape):
    """Plain eager training of the same model, weights, data and generator state."""
    module = capture_model(spec, optimizer=optimizer, train=train, **shape).module
    return eager_parameters(module, optimizer, example_args, steps)


def _planned(spec, optimizer, params_home, fraction, tmp_path, train=None, paging="none",
             steps=STEPS, **shape):
    # Module-level groups (refined=False): the split heuristic reaches their floor; refined
    # graphs' exactness is tests/test_granularity.py's.
    captured = capture_model(spec, optimizer=optimizer, params_home=params_home, train=train,
                             refined=False, **shape)
    graph = captured.graph
    p = problem_near_floor(graph, fraction, paging, FLASH)
    plan = solve(p, "heuristic:split" if paging == "none" else "heuristic:paging").plan
    report = run_plan(graph, plan, steps, str(tmp_path / "pages"), captured=captured, seed=0,
                      keep_parameters=True)
    return captured, plan, report


CASES = [
    # dropout and batch norm (examples/my_model.py), SGD with momentum, gradients planned
    ("sgd-fused", USER_MODEL, "sgd", "ram", 0.6, None, "none", STEPS),
    # AdamW, parameters and optimizer state on flash, activations recomputed
    ("adamw-flash", USER_MODEL, "adamw", "flash", 0.3, None, "none", STEPS),
    # AdamW on flash with activations paged to flash too
    ("adamw-flash-paging", USER_MODEL, "adamw", "flash", 0.5, None, "flash", STEPS),
    # partial fine-tuning: frozen parameters are read-only pages
    ("frozen-flash", USER_MODEL, "sgd", "flash", 0.4, ["head.*", "block2.*"], "none", STEPS),
    # an output head tied to the embedding: its reader loads the one tensor on flash
    ("tied-flash", user_model("make_tied_lm"), "sgd", "flash", 0.5, None, "none", STEPS),
    # a bias tied under a name that reads nothing (BERT's masked-LM head): it trained not at
    # all, its gradient kept under the name that reads it, which the updates did not use
    ("tied-bias", user_model("make_shared_bias_head"), "sgd", "ram", 0.9, None, "none", STEPS),
    ("tied-bias-flash", user_model("make_shared_bias_head"), "adamw", "flash", 0.9, None,
     "none", STEPS),
    # upsampling traced as eager's kernels (their Python decompositions round differently)
    ("unet-upsampling", user_model("make_unet"), "sgd", "ram", 0.6, None, "none", STEPS),
    # a batch as a dict and a list: the graph's inputs are its leaves
    ("dict-batch", user_model("make_dict_batch"), "sgd", "ram", 0.9, None, "none", STEPS),
    # AdamW in RAM: its per-parameter step counts are fixed memory too
    ("adamw-ram", user_model("make_dict_batch"), "adamw", "ram", 0.9, None, "none", STEPS),
    # the optimizers a fine-tuner expects beside those, 5 steps each with recomputation and
    # paging: Nesterov's temporary, Adam without weight decay, amsgrad's third state copy
    ("sgd-nesterov-paging", USER_MODEL, "sgd-nesterov", "ram", 0.5, None, "flash", 5),
    ("adam-flash-paging", USER_MODEL, "adam", "flash", 0.5, None, "flash", 5),
    ("adam-amsgrad-flash-paging", USER_MODEL, "adam-amsgrad", "flash", 0.5, None, "flash", 5),
]


@pytest.mark.parametrize("label,spec,optimizer,home,fraction,train,paging,steps", CASES,
                         ids=[c[0] for c in CASES])
def test_parameters_after_the_steps_equal_plain_pytorch(label, spec, optimizer, home, fraction,
                                                        train, paging, steps, tmp_path):
    captured, plan, report = _planned(spec, optimizer, home, fraction, tmp_path, train, paging,
                                      steps=steps, batch=8, image=16)
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["loss_equal"]
    assert len(report["steps"]) == steps
    expected = _eager_parameters(spec, optimizer, train, captured.example_args, steps=steps,
                                 batch=8, image=16)
    actual = captured.module.state_dict()
    assert expected.keys() == actual.keys()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    assert all(s["ledger_peak_bytes"] <= report["predicted_peak_bytes"] for s in report["steps"])
    # Below it only by the step state not yet made at the plan's peak (docs/boards.md): the
    # plan counts all of it (batch norm's new statistics, the loss) from the step's start
    gap = report["predicted_peak_bytes"] - max(s["ledger_peak_bytes"] for s in report["steps"])
    assert gap <= captured.graph.capture["fixed"].get("step_state", 0), gap
    if label == "frozen-flash":  # its peak, in the pool, comes before block2's batch norms
        later = [captured.module.block2.bn1, captured.module.block2.bn2]
        new_statistics = sum(2 * bn.running_mean.nbytes + bn.num_batches_tracked.nbytes
                             for bn in later)
        assert gap == new_statistics + 4, gap  # and the loss, a float32 scalar
    assert report["predicted_peak_bytes"] <= plan.budget_bytes
    # Where the memory went: the classes add up to the plan's peak and to the ledger's.
    split = report["memory_by_class"]
    assert sum(split["planned"].values()) == report["predicted_peak_bytes"]
    step = report["steps"][split["measured_step"] - 1]
    assert sum(split["measured"].values()) == step["ledger_peak_bytes"]
    assert split["planned"]["parameters"] > 0 and split["measured"]["parameters"] > 0
    assert split["planned"]["activations"] > 0 and split["measured"]["activations"] > 0
    # Both at one moment, where the plan peaks: class by class the ledger holds what the plan
    # does (QA: each at its own peak, the plan's 0.1 MiB of gradients beside the ledger's 16.3
    # read as a plan that forgot them), but for what the ledger cannot see (the running op's
    # workspace, what the first calls leave) and the step state the plan counts from the start
    moment = split["at_plan_peak"]
    unseen = ("workspace", "runtime_warm")
    planned = {name: moment["planned"][name] for name in split["classes"] if name not in unseen}
    measured = {name: moment["measured"][name] for name in planned}
    later = planned["activations"] - measured["activations"]
    assert 0 <= later <= captured.graph.capture["fixed"].get("step_state", 0), (planned, measured)
    assert {**planned, "activations": 0} == {**measured, "activations": 0}
    if home == "flash":
        kinds = {n.kind for n in captured.graph.nodes}
        assert {"param", "update"} <= kinds
    if paging != "none":
        assert report["page_outs"] > 0
    if train is not None:  # frozen parameters never change
        initial = capture_model(spec, batch=8, image=16).module.state_dict()
        frozen = [n for n, p in captured.module.named_parameters() if not p.requires_grad]
        assert frozen and all(torch.equal(initial[n], actual[n]) for n in frozen)


def test_the_ledger_counts_a_gradient_that_is_a_view_as_a_gradient(tmp_path):
    """mlp's weight gradients are transposes of an mm's result: the ledger keys them by the mm,
    and counted them as activations (the report's memory line said gradients 6.0 / 0.0 and
    activations 0.0 / 6.0). At the peak, where the plan holds every gradient, both count alike."""
    captured, plan, report = _planned("mlp", "sgd", "ram", 0.9, tmp_path, steps=1)
    split = report["memory_by_class"]
    assert report["steps"][0]["ledger_peak_bytes"] == report["predicted_peak_bytes"]
    assert split["planned"]["gradients"] > 0
    assert split["measured"] == split["planned"]


def test_each_optimizers_state_bytes_are_what_torch_keeps():
    """The planner's optimizer state (copies of the trainable parameters, plus a step count per
    tensor) against the state torch's optimizer really holds after a step, for every optimizer
    --optimizer takes (sgd-nesterov, adam and adam-amsgrad added to sgd and adamw)."""
    from edge_remat_agent.capture import DEFAULT_LR
    from edge_remat_agent.capture.optimizer import OPTIMIZERS, TORCH_OPTIMIZERS, torch_optimizer
    assert set(OPTIMIZERS) == set(TORCH_OPTIMIZERS) == set(DEFAULT_LR)
    for name, costs in OPTIMIZERS.items():
        module = torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3))
        optimizer = torch_optimizer(name, module)
        module(torch.randn(4, 6)).square().sum().backward()
        optimizer.step()
        held = sum(t.nbytes for state in optimizer.state.values() for t in state.values()
                   if isinstance(t, torch.Tensor))
        params = list(module.parameters())
        assert costs.state_bytes(sum(p.nbytes for p in params), len(params)) == held, name


def test_dropout_on_a_transposed_tensor_draws_as_eager(tmp_path):
    """nn.TransformerEncoderLayer (batch first) drops out attention's transposed output: the
    plan's losses and parameters stay eager's bit for bit, and its ledger peak is the plan's.
    It passed the plan by 4,124 bytes (398,284 against 394,160): out_proj's weight gradient, a
    view of another node's storage that kept it alive (4,096), and mse_loss's result on the
    storage of the 8 elementwise losses (28)."""
    spec = user_model("make_encoder")
    captured, _, report = _planned(spec, "sgd", "ram", 0.6, tmp_path, batch=8, image=16)
    assert report["grad_check"]["bitwise_equal"] and report["grad_check"]["loss_equal"]
    assert all(s["ledger_peak_bytes"] <= report["predicted_peak_bytes"] for s in report["steps"])
    expected = _eager_parameters(spec, "sgd", None, captured.example_args, batch=8, image=16)
    actual = captured.module.state_dict()
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


@pytest.mark.parametrize("factory", ["make_bag_of_words", "make_bag_of_words_max"])
def test_an_embedding_bag_in_mean_or_max_mode_is_counted_as_eager_allocates_it(factory,
                                                                               tmp_path):
    """Eager's CPU _embedding_bag makes offset2bag one element longer than it returns it (48
    indices: 392 bytes, where the traced value has 384): the ledger passed the plan by 8 bytes
    (a CLIP-style model with an EmbeddingBag text tower: 169,256 against 169,248)."""
    captured = capture_model(user_model(factory), operator_level=True)
    report = run_plan(captured.graph, keep_all(captured.graph), 1, str(tmp_path / "pages"),
                      captured=captured, seed=0)
    assert report["grad_check"]["bitwise_equal"]
    assert report["steps"][0]["ledger_peak_bytes"] == report["predicted_peak_bytes"]


def test_lora_on_a_language_model_with_the_base_paged_read_only(tmp_path):
    captured, plan, report = _planned("gpt-tiny-lora", "adamw", "flash", 0.5, tmp_path)
    expected = _eager_parameters("gpt-tiny-lora", "adamw", None, captured.example_args)
    actual = captured.module.state_dict()
    assert all(torch.equal(expected[n], actual[n]) for n in expected)
    trained = {n for n, p in captured.module.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in n for n in trained)
    updated = {p for n in captured.graph.nodes if n.kind == "update" for p in n.attrs["params"]}
    assert updated == trained  # frozen groups have no update node: never written


# --- the memory floor, and what goes wrong -----------------------------------------------------

def test_planned_state_lowers_the_floor_and_the_floor_names_its_node():
    floors = {}
    for home, update in (("ram", "step"), ("ram", "fused"), ("flash", "fused")):
        graph = capture_model("resnet18", batch=16, image=32, params_home=home,
                              update=update).graph
        with pytest.raises(InfeasibleBudget) as caught:
            build_problem(graph, 1000).check_budget()
        floors[(home, update)] = caught.value.smallest_bytes / plain_peak_bytes(graph)
        # the node whose inputs set it: by its working set, or the pebbling floor's node
        assert re.search(r"node '?\d+'? \(.+\) needs .* at once", str(caught.value))
    assert floors[("flash", "fused")] < floors[("ram", "fused")] < floors[("ram", "step")]


def test_a_full_flash_home_fails_clearly_and_keeps_the_old_parameters(tmp_path):
    weight = torch.nn.Parameter(torch.arange(1024, dtype=torch.float32))
    module = torch.nn.Module()
    module.weight = weight
    old = weight.detach().clone()
    store = FlashStore(tmp_path, capacity_bytes=6000, fsync=False)
    home = ParameterHome(store, module, ["weight"])
    home.move_out()
    with pytest.raises(PageStoreFull, match="capacity"):
        home.commit({("param", "weight"): old + 1})  # the new version beside the old: no room
    assert torch.equal(home.load("weight"), old)  # never half-updated
    store.close()


def test_a_group_moves_to_and_from_its_home_as_one_file(tmp_path):
    """A param node's group is read, and an update's new parameters and state written, as one
    file (one open, one fsync): a file per tensor made BERT-mini's layer reads 2.9x and its
    updates 2.5x what the plan charged. From the second update on, the group's file is
    written over in place."""
    module = torch.nn.Module()
    for name, size in (("a", 300), ("b", 7), ("c", 50)):
        setattr(module, name, torch.nn.Parameter(torch.randn(size)))
    old = {name: p.detach().clone() for name, p in module.named_parameters()}
    store = FlashStore(tmp_path, fsync=True, drop_cache=True)
    home = ParameterHome(store, module, ["a", "b", "c"], groups=[["a", "b"], ["c"]])
    home.move_out()
    assert len(os.listdir(store.directory)) == 2  # one file per group
    for name, value in zip(["b", "a"], home.load_many(["b", "a"])):
        assert torch.equal(value, old[name])
    for step in range(1, 4):
        home.commit({("param", "a"): old["a"] + step, ("param", "b"): old["b"] + step,
                     ("state", "a", "momentum_buffer"): old["a"] * step,
                     ("state", "b", "momentum_buffer"): old["b"] * step})
        # the new version's file, the old one kept as a spare (the first one held no state),
        # and c's
        assert len(os.listdir(store.directory)) == 3 and store.spare_bytes > 0
        a, b = home.load_many(["a", "b"])
        assert torch.equal(a, old["a"] + step) and torch.equal(b, old["b"] + step)
        assert torch.equal(home.get_many([("state", "b", "momentum_buffer")])[0],
                           old["b"] * step)
        if step == 2:
            steady = set(os.listdir(store.directory))
    assert set(os.listdir(store.directory)) == steady  # rewritten in place
    store.close()


def test_a_run_whose_flash_cannot_hold_the_parameters_is_refused_before_training(tmp_path):
    captured = capture_model("mlp", batch=2, image=8, params_home="flash")
    p = build_problem(captured.graph, 0.9)
    plan = solve(p, "heuristic:split").plan
    with pytest.raises(ExecutorError):
        run_plan(captured.graph, plan, 1, None, captured=captured)
    # A copy of the module is untouched by the refusal.
    assert all(p.numel() for p in copy.deepcopy(captured.module).parameters())


def test_reports_name_the_parameters_home_io_apart_from_compute():
    """Reading parameters from flash is IO, not compute: before, `plan` and `simulate` put it
    all in compute (resnet18 operator-level, params on flash: 'time 4.567 s (paging 0 s)'
    where the nodes' own times summed to 1.426 s)."""
    from edge_remat.reports.report import plan_table
    from edge_remat_agent.costs import build_costs, home_io_cost
    from edge_remat_agent.simulate import simulate
    graph = capture_model("mlp", batch=2, image=8, params_home="flash").graph
    costs = build_costs(graph)
    io = sum(home_io_cost(node, {})[0] for node in graph.nodes)
    assert io > 0
    plan = solve(build_problem(graph, 1.0), "heuristic:keep-all").plan
    result = simulate(graph, costs, plan.stages)
    assert result.home_io_time_s == pytest.approx(io)
    assert result.compute_time_s - result.home_io_time_s == pytest.approx(
        sum(node.time_s for node in graph.nodes))
    assert "parameters' home IO" in plan_table(plan.to_dict())
