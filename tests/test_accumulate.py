"""Gradient accumulation (`--accumulate K`): one optimizer step over K micro-batches.

Each micro-batch's loss is divided by K, the gradients are summed into buffers that stay
resident across the K passes of the plan (fixed memory, `gradient_accumulators`), or live on
flash beside parameters homed there, and the optimizer steps once. The parameters after N steps must equal plain PyTorch's loop doing
exactly that, bit for bit, with recomputation, paging, parameters homed on flash, frozen
parameters and tied weights; the ledger's tensor peak must be the plan's; K < 1 is refused in
one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from helpers.bad_inputs import BAD_INPUT, cli as cli_process, refused
from helpers.board_fixtures import local_board
from helpers.executor_plans import problem_near_floor
from helpers.user_models import spec as user_model

from edge_remat_agent.capture import capture_model
from edge_remat_agent.capture.optimizer import fixed_memory, optimizer_named
from edge_remat_agent.executor import torch_optimizer
from edge_remat_agent.executor.gradcheck import deterministic
from edge_remat_agent.executor.run import run_plan
from edge_remat_agent.formats import Tier
from edge_remat_agent.plain_train import train_plain
from edge_remat.cli import app
from edge_remat.planner.build import build_problem, plain_peak_bytes
from edge_remat.planner.solve import solve

REPO = Path(__file__).resolve().parents[1]
USER_MODEL = f"{REPO / 'examples' / 'my_model.py'}:make_model"  # dropout and batch norm
FLASH = {"flash": Tier(read_bytes_per_s=5e8, write_bytes_per_s=2e8, latency_s=1e-4)}
PROFILE = str(REPO / "profiles" / "this-machine.json")  # measured here: no profiling
STEPS = 3


def micro_batches(example_args):
    """Step -> a batch shaped like the example, different at every micro-batch (the same batch
    K times would not show the order of the sums)."""
    def batch(step: int) -> tuple:
        gen = torch.Generator().manual_seed(1000 + step)
        return tuple(torch.randn(a.shape, generator=gen) if a.is_floating_point() else
                     torch.randint(0, int(a.max()) + 1, a.shape, generator=gen)
                     for a in example_args)
    return batch


def _planned(spec, optimizer, home, fraction, paging, k, tmp_path, train=None, solver=None,
             clip=None):
    # module-level groups (refined=False) for the heuristics, as tests/test_every_byte.py;
    # CP-SAT plans the refined graph, recomputing and paging at once
    captured = capture_model(spec, optimizer=optimizer, params_home=home, train=train,
                             refined=solver == "cpsat", batch=4, image=16, accumulate=k,
                             clip_grad_norm=clip)
    graph = captured.graph
    problem = problem_near_floor(graph, fraction, paging, FLASH)
    solver = solver or ("heuristic:split" if paging == "none" else "heuristic:paging")
    plan = solve(problem, solver, time_limit=30).plan
    data = micro_batches(captured.example_args)
    report = run_plan(graph, plan, STEPS, str(tmp_path / "pages"), data=data,
                      captured=captured, seed=0, keep_parameters=True)
    return captured, plan, report, data


def _eager(spec, optimizer, train, k, data, clip=None):
    """Plain PyTorch's loop, written out: K micro-batches a step, each loss / K, the
    gradients left to add up in .grad, (their sums clipped,) one optimizer step."""
    module = capture_model(spec, optimizer=optimizer, train=train, batch=4, image=16).module
    opt = torch_optimizer(optimizer, module)
    torch.manual_seed(0)
    losses, norms = [], []
    with deterministic(torch.device("cpu")):
        for i in range(STEPS):
            opt.zero_grad(set_to_none=True)
            micro = []
            for j in range(k):
                loss = module(*data(i * k + j))
                (loss / k).backward()
                micro.append(float(loss.detach()))
            if clip is not None:
                norms.append(float(torch.nn.utils.clip_grad_norm_(module.parameters(), clip)))
            opt.step()
            losses.append(sum(micro) / k)
    if clip is not None:
        assert min(norms) > clip, norms  # every step clipped: the clip changed something
    return module.state_dict(), losses


CASES = [
    # K = 1: as before, no accumulation
    ("k1", USER_MODEL, "sgd", "ram", 0.6, "flash", 1, None, "cpsat"),
    # dropout (a draw per micro-batch) and batch norm (statistics after each), activations
    # recomputed and paged to flash (0.6: at 0.7 of the reference, which now holds a
    # micro-batch's gradients beside the sums, nothing was paged)
    ("k3-recompute-paging", USER_MODEL, "sgd", "ram", 0.6, "flash", 3, None, "cpsat"),
    # AdamW, parameters and optimizer state homed on flash, activations paged to flash
    ("k3-adamw-flash-paging", USER_MODEL, "adamw", "flash", 0.5, "flash", 3, None, None),
    # frozen parameters: read-only pages, no gradient, no buffer
    ("k2-frozen-flash", USER_MODEL, "sgd", "flash", 0.4, "none", 2, ["head.*", "block2.*"],
     None),
    # a head tied to the embedding (one buffer for the one tensor), activations recomputed
    ("k3-tied", user_model("make_tied_lm"), "sgd", "flash", 0.5, "none", 3, None, None),
]


@pytest.mark.slow
@pytest.mark.parametrize("label,spec,optimizer,home,fraction,paging,k,train,solver", CASES,
                         ids=[c[0] for c in CASES])
def test_parameters_after_accumulated_steps_equal_plain_pytorch(label, spec, optimizer, home,
                                                                fraction, paging, k, train,
                                                                solver, tmp_path):
    captured, plan, report, data = _planned(spec, optimizer, home, fraction, paging, k,
                                            tmp_path, train, solver)
    check = report["grad_check"]
    assert check["bitwise_equal"] and check["loss_equal"] and check["compared"] > 0, check
    expected, losses = _eager(spec, optimizer, train, k, data)
    actual = captured.module.state_dict()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    assert [s["loss"] for s in report["steps"]] == losses  # the micro-batches' mean
    if paging != "none":
        assert report["page_outs"] > 0
    if home == "ram":  # not keep-all (homed on flash, parameters are loaded anyway)
        assert report["recomputed"] + report["page_outs"] > 0
    if label == "k3-recompute-paging":
        assert report["recomputed"] > 0 and report["page_outs"] > 0
    # Memory: the buffers are fixed memory the plan counts, and the ledger counts them too;
    # a group homed on flash keeps its sums there, read and written by its sums node (which
    # adds the pass's gradients), and read by its update node to step with.
    fixed, planned = captured.graph.capture["fixed"], captured.graph.capture["planned_state"]
    sums = fixed["gradients"] + planned["gradients"] if k > 1 else 0
    homed_sums = planned.get("gradient_accumulators", 0)
    assert homed_sums == (sums if home == "flash" else 0)
    assert fixed.get("gradient_accumulators", 0) == sums - homed_sums
    assert homed_sums == sum(n.attrs.get("sum_bytes", 0) for n in captured.graph.nodes
                             if "update_grads" in n.attrs)
    peaks = [s["ledger_peak_bytes"] for s in report["steps"]]
    gap = report["predicted_peak_bytes"] - max(peaks)
    assert 0 <= gap <= fixed.get("step_state", 0), gap  # the step state, as without K
    split = report["memory_by_class"]
    assert sum(split["planned"].values()) == report["predicted_peak_bytes"]
    assert split["measured"]["gradients"] >= fixed.get("gradient_accumulators", 0)


@pytest.mark.slow
@pytest.mark.parametrize("home,fraction", [("ram", 0.7), ("flash", 0.5)])
def test_clipping_accumulated_gradients_clips_their_sums_as_plain_pytorch_does(home, fraction,
                                                                               tmp_path):
    """--clip-grad-norm with --accumulate: the global norm is the summed gradients', taken in
    the last micro-pass (clip_grad_norm_ after the K backwards), with recomputation and paging
    to flash (and the sums on flash with the parameters); parameters after 3 steps equal plain
    PyTorch's bit for bit, and the ledger's peak is the plan's."""
    captured, plan, report, data = _planned(USER_MODEL, "adamw", home, fraction, "flash", 3,
                                            tmp_path, clip=0.05)
    check = report["grad_check"]
    assert check["bitwise_equal"] and check["compared"] > 0, check
    expected, losses = _eager(USER_MODEL, "adamw", None, 3, data, clip=0.05)
    actual = captured.module.state_dict()
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    assert [s["loss"] for s in report["steps"]] == losses
    assert report["page_outs"] > 0
    gap = report["predicted_peak_bytes"] - max(s["ledger_peak_bytes"] for s in report["steps"])
    assert 0 <= gap <= captured.graph.capture["fixed"].get("step_state", 0), gap


def test_the_buffers_are_the_trainable_gradients_and_frozen_ones_have_none():
    """Only trainable parameters get a buffer (LoRA, --train); the plan's peak grows by it
    once. Plain PyTorch's .grad buffers are the sums, and a micro-batch's gradients are
    temporaries added into them: the plain reference grows by at most those (QA: it left
    them out, and 100% of mlp with --accumulate 2 was below the floor)."""
    train = ["head.*"]
    once = capture_model(USER_MODEL, train=train, batch=4, image=16, refined=False)
    three = capture_model(USER_MODEL, train=train, batch=4, image=16, refined=False,
                          accumulate=3)
    head = sum(p.numel() * p.element_size() for n, p in three.module.named_parameters()
               if n.startswith("head."))
    assert three.graph.capture["fixed"]["gradient_accumulators"] == head > 0
    assert three.graph.fixed_bytes - once.graph.fixed_bytes == head
    assert three.graph.capture["accumulate"] == 3 and "accumulate" not in once.graph.capture
    assert plain_peak_bytes(once.graph) <= plain_peak_bytes(three.graph) <= \
        plain_peak_bytes(once.graph) + head
    everything = fixed_memory(three.module, three.example_args, optimizer_named("sgd", "m"))
    assert head < everything["parameters"]


def test_a_budget_of_the_whole_plain_peak_plans_with_accumulation():
    """QA: with --accumulate 2, 100% of mlp's plain peak (21.23 MiB) was refused: its floor
    was 27.18 MiB, the micro-batch's gradient beside the sums, which plain PyTorch holds too."""
    from edge_remat.planner.solve import solve
    graph = capture_model("mlp", accumulate=2).graph
    report = solve(build_problem(graph, "100%"), "auto", time_limit=5)
    assert report.plan.predicted["peak_bytes"] <= plain_peak_bytes(graph)


def test_with_parameters_on_flash_the_sums_live_there_and_leave_fixed_memory():
    """--params-home flash: each group's sums node reads its sums from the home, adds the
    pass's gradients and writes them back, and the update node reads them to step with, so
    they are those nodes' workspace and flash traffic, not fixed memory; the floor then falls
    by them."""
    from edge_remat_agent.formats.graph import ram_homed_signature
    from edge_remat_agent.memory_classes import workspace_classes
    once = capture_model(USER_MODEL, optimizer="adamw", params_home="flash", batch=4,
                         image=16, refined=False)
    three = capture_model(USER_MODEL, optimizer="adamw", params_home="flash", batch=4,
                          image=16, refined=False, accumulate=3)
    assert three.graph.fixed_bytes == once.graph.fixed_bytes  # no sum is fixed
    grads = sum(p.numel() * p.element_size() for p in three.module.parameters())
    assert three.graph.capture["planned_state"]["gradient_accumulators"] == grads
    assert three.graph.capture["fixed"]["gradient_accumulators"] == 0
    before = {n.name: n for n in once.graph.nodes if n.kind == "update"}
    summing = [n for n in three.graph.nodes if n.op == "grad_sums"]
    assert sum(n.attrs["sum_bytes"] for n in summing) == grads
    for node in summing:
        io = node.attrs["io"]
        assert io["read_bytes"] == io["write_bytes"] == node.attrs["sum_bytes"] > 0
        assert node.workspace_bytes == node.attrs["sum_bytes"]
    for node in (n for n in three.graph.nodes if n.op == "adamw_update"):
        sums, other = node.attrs["sum_bytes"], before[node.name]
        assert sums > 0 and node.workspace_bytes == other.workspace_bytes + sums
        assert node.attrs["io"]["read_bytes"] == other.attrs["io"]["read_bytes"] + sums
        # state and parameters written back; the sums are done with
        assert node.attrs["io"]["write_bytes"] == other.attrs["io"]["write_bytes"]
        assert workspace_classes(node, node.workspace_bytes)["gradients"] == sums
        # a profile of the graph without the sums does not give this node its workspace
        assert node.signature == other.signature + ":sums"
        assert ram_homed_signature(node) == ram_homed_signature(other)
    assert "gradient_accumulators" not in once.graph.capture["planned_state"]  # K 1 as before
    # Clipping: each group-norm node reads, adds and writes back its group's sums; the
    # update node reads them in the last pass only, to step with.
    clipped = capture_model(USER_MODEL, optimizer="adamw", params_home="flash", batch=4,
                            image=16, refined=False, accumulate=3, clip_grad_norm=1.0)
    assert clipped.graph.capture["fixed"]["gradient_accumulators"] == 0
    by_op = {}
    for node in clipped.graph.nodes:
        by_op.setdefault(node.op, []).append(node)
    norms, updates = by_op["grad_norms"], by_op["adamw_update"]
    assert sum(n.attrs["sum_bytes"] for n in norms) == grads == \
        sum(n.attrs["sum_bytes"] for n in updates)
    in_ram = {n.name: n for n in capture_model(
        USER_MODEL, optimizer="adamw", params_home="ram", batch=4, image=16, refined=False,
        accumulate=3, clip_grad_norm=1.0).graph.nodes}
    for node in norms:
        io = node.attrs["io"]
        assert io["read_bytes"] == io["write_bytes"] == node.attrs["sum_bytes"]
        # a board's profile times the graph with parameters in RAM: that node's key matches
        assert ram_homed_signature(node) == in_ram[node.name].signature
    for node in updates:
        io, state = node.attrs["io"], node.attrs["state_bytes"]
        assert io["read_bytes"] == state + node.attrs["sum_bytes"]
        assert io["write_bytes"] == state + node.attrs["sum_bytes"]  # state and parameters
        assert ram_homed_signature(node) == in_ram[node.name].signature


def test_plain_training_accumulates_like_the_planned_run(tmp_path):
    """plain_train.py (the board's `run --plain` job) takes K micro-batches of the same data
    as a planned run: the same losses step after step, and not those of K = 1."""
    k = 3
    captured = capture_model("digits-cnn", batch=8, refined=False, accumulate=k)
    plan = solve(build_problem(captured.graph, 0.7, None, "time", None, "none", FLASH),
                 "heuristic:split").plan
    planned = run_plan(captured.graph, plan, STEPS, str(tmp_path / "pages"), data="digits",
                       captured=captured, seed=0)
    plain = train_plain("digits-cnn", STEPS, batch=8, data="digits", accumulate=k)
    assert [s["loss"] for s in planned["steps"]] == plain["loss"]
    assert planned["grad_check"]["bitwise_equal"]
    assert train_plain("digits-cnn", STEPS, batch=8, data="digits")["loss"] != plain["loss"]


@pytest.mark.parametrize("command", [
    ("graph", "--model", "mlp"),
    ("run", "--device", "local", "--model", "digits-cnn", "--budget", "50%"),
])
@pytest.mark.parametrize("k", [0, -2])
def test_fewer_than_one_micro_batch_is_refused_in_one_line(command, k, tmp_path):
    proc = cli_process(*command, "--accumulate", k, cwd=tmp_path)
    refused(proc, BAD_INPUT, "--accumulate", "at least 1")
    assert not any(tmp_path.iterdir())  # nothing captured, nothing written


# --- end to end, as a user runs it -----------------------------------------------------------

def cli(*args):
    result = CliRunner().invoke(app, [str(a) for a in args])
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    with local_board(tmp_path_factory.mktemp("accumulate"), "accumulate-board") as root:
        yield root


@pytest.mark.slow
@pytest.mark.parametrize("model", [
    ("--model", "digits-cnn", "--batch", 8, "--budget", "60%"),
    # a small language model, its last block trained (the rest frozen), on the bundled text
    ("--model", "gpt-tiny", "--batch", 2, "--seq", 16, "--train", "blocks.1.*", "--data",
     "text", "--budget", "70%"),
], ids=["digits-cnn", "gpt-tiny-train"])
def test_run_accumulates_on_the_board_bitwise_and_within_the_plan(board, model, tmp_path):
    code, out, err = cli("run", "--device", "accumulate-board", *model, "--accumulate", 3,
                         "--steps", 2, "--profile", PROFILE, "--out", tmp_path / "out",
                         "--no-plots", "--json")
    assert code == 0, err
    report = json.loads(out)
    assert report["status"] == "finished" and report["micro_batches"] == 3
    assert report["grad_check"]["bitwise_equal"], report["grad_check"]
    # the ledger's tensor peak is the plan's (less the runtime warm-up no tensor holds)
    assert report["tensor_peak_bytes"] <= report["predicted_tensor_peak_bytes"]
    assert report["tensor_peak_bytes"] >= 0.99 * report["predicted_tensor_peak_bytes"]
    graph = json.loads((tmp_path / "out" / "graph.json").read_text())
    assert graph["capture"]["accumulate"] == 3
    # the sums: fixed memory, or at the parameters' home where they moved to flash
    capture = graph["capture"]
    assert capture["fixed"]["gradient_accumulators"] + \
        capture["planned_state"].get("gradient_accumulators", 0) > 0
    plan = json.loads((tmp_path / "out" / "plan.json").read_text())
    # a step: three passes, the optimizer's step counted once (accumulated_step.py)
    step = plan["predicted"]["accumulated_step"]
    assert report["predicted_time_s"] == step["time_s"] < 3 * plan["predicted"]["time_s"]


def test_a_fleet_manifest_captures_with_accumulate_and_refuses_less_than_one(tmp_path):
    from edge_remat.fleet.manifest import ManifestError, load_manifest
    manifest = tmp_path / "fleet.toml"
    board = f'[[boards]]\nprofile = "{REPO / "profiles" / "rpi4.json"}"\n'
    manifest.write_text('budgets = ["50%"]\n[[models]]\nmodel = "mlp"\naccumulate = 4\n' + board)
    assert load_manifest(manifest).models[0].capture == {"accumulate": 4}
    manifest.write_text('budgets = ["50%"]\n[[models]]\nmodel = "mlp"\naccumulate = 0\n' + board)
    with pytest.raises(ManifestError, match=r"accumulate: expected a whole number >= 1, got 0"):
        load_manifest(manifest)
