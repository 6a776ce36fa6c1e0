"""The trained weights a run hands back (OUT/weights.pt, --save) and a run started from them
(--init): real runs on a local board and over SSH on loopback, compared with plain PyTorch
training the same model on the same data, bit for bit.

The file holds no optimizer state: a run from --init starts a fresh optimizer, so it is held
against plain PyTorch that loads the file and trains with a fresh optimizer too."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from helpers.board_fixtures import local_board, loopback_ssh_board, needs_socat, needs_sshd
from test_pages import tiny_filesystem  # noqa: F401 - fixture: a real 1 MiB tmpfs
from test_serial import board_agent, ptys, serial_device  # noqa: F401 - fixtures
from edge_remat.cli import app
from edge_remat.run import RunOptions, run
from edge_remat.transport import Board
from edge_remat_agent.capture.models import load_model
from edge_remat_agent.executor.run import run_plain
from edge_remat_agent.executor.errors import BadInput
from edge_remat_agent.executor.saved_weights import read_weights_file, save_weights
from edge_remat_agent.formats import load_graph

pytestmark = [pytest.mark.slow, pytest.mark.loopback]

REPO = Path(__file__).resolve().parents[1]
PROFILE = str(REPO / "profiles" / "this-machine.json")  # measured: no profiling in the test
QUICK = dict(profile=PROFILE, plots=False, time_limit=3)


def plain_pytorch_after(out: Path, steps: int, data: str, init: "Path | None" = None,
                        **training) -> dict:
    """The state_dict of the run's model trained plainly for `steps` steps from its own
    weights (or `init`'s), on the same data and optimizer (a fresh one); `training`: run_plain's
    lr, lr_schedule, warmup."""
    graph = load_graph(out / "graph.json")
    source = graph.capture["source"]
    module, args = load_model(source["model"], source.get("batch"), source.get("image"),
                              source.get("seq"), source.get("seed", 0))
    if init is not None:
        missing, unexpected = module.load_state_dict(torch.load(init), strict=False)
        assert not unexpected
    run_plain(graph, steps, data=data, model=(module, args), seed=0, **training)
    return module.state_dict()


def assert_bitwise(saved: dict, expected: dict) -> None:
    assert saved, "nothing saved"
    for name, value in saved.items():
        assert torch.equal(value, expected[name]), name


def test_trained_weights_from_flash_equal_plain_pytorch_and_init_goes_on(tmp_path):
    """digits-cnn with its parameters homed on flash (saved tensor by tensor from there),
    then 3 more steps from the file with them in RAM."""
    with local_board(tmp_path, "bench"):
        first = run(RunOptions(device="bench", model="digits-cnn", batch=16, budget="60%",
                               steps=3, params_home="flash", paging="flash",
                               out=str(tmp_path / "first"), **QUICK))
        second = run(RunOptions(device="bench", model="digits-cnn", batch=16, budget="60%",
                                steps=3, params_home="ram", init=first["weights"]["file"],
                                out=str(tmp_path / "second"), **QUICK))
    first_file = tmp_path / "first" / "weights.pt"
    assert first["weights"]["file"] == str(first_file)
    assert first["weights"]["tensors"] == len(torch.load(first_file))
    saved = torch.load(first_file)
    module, _ = load_model("digits-cnn", 16)
    assert set(saved) == set(module.state_dict())  # every parameter trains, and BN's buffers
    assert_bitwise(saved, plain_pytorch_after(tmp_path / "first", 3, "digits"))
    assert second["status"] == "finished" and second["grad_check"]["bitwise_equal"] is True
    assert_bitwise(torch.load(tmp_path / "second" / "weights.pt"),
                   plain_pytorch_after(tmp_path / "second", 3, "digits", first_file))
    assert not list((tmp_path / "first").glob("*.tmp")) + \
        list((tmp_path / "first").rglob("*.part"))  # written whole, renamed


@needs_sshd
def test_a_lora_run_over_ssh_starts_from_init_and_hands_back_its_adapters_only(tmp_path):
    """--init travels to the board over SSH (adapters moved off their zero start), and the
    trained adapters come back."""
    module, _ = load_model("gpt-tiny-lora", 2, None, 32)
    trainable = {name for name, p in module.named_parameters() if p.requires_grad}
    start = tmp_path / "start.pt"
    torch.save({name: p.detach() + 0.01 for name, p in module.named_parameters()
                if name in trainable}, start)
    with loopback_ssh_board(tmp_path) as (config, _sshd, _workdir):
        report = run(RunOptions(device=str(config), model="gpt-tiny-lora", batch=2, seq=32,
                                budget="70%", steps=2, init=str(start),
                                out=str(tmp_path / "out"), **QUICK))
    assert report["status"] == "finished" and report["grad_check"]["bitwise_equal"] is True
    saved = torch.load(tmp_path / "out" / "weights.pt")
    assert set(saved) == trainable and all("lora" in name for name in saved)
    assert_bitwise(saved, plain_pytorch_after(tmp_path / "out", 2, "example", start))
    # the loaded file makes the fresh model the trained one
    missing, unexpected = module.load_state_dict(saved, strict=False)
    assert not unexpected and set(missing).isdisjoint(saved)


def test_an_init_file_of_another_model_is_refused_naming_the_first_mismatch(tmp_path):
    other = tmp_path / "other.pt"
    torch.save({"stem.weight": torch.zeros(3, 3)}, other)
    with local_board(tmp_path, "bench"):
        result = CliRunner().invoke(app, ["run", "--device", "bench", "--model", "digits-cnn",
                                          "--batch", "16", "--budget", "60%", "--steps", "1",
                                          "--init", str(other), "--profile", PROFILE,
                                          "--no-plots", "--out", str(tmp_path / "out")])
        bad_choice = CliRunner().invoke(app, ["run", "--device", "bench", "--model",
                                              "digits-cnn", "--budget", "60%", "--save",
                                              "best", "--out", str(tmp_path / "out2")])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert "'stem.weight' is [3, 3] float32 in the file but [16, 1, 3, 3] float32 in this " \
           "model" in lines[-1], lines
    assert "Traceback" not in result.output + result.stderr
    assert not list((tmp_path / "out").glob("*"))  # bad input leaves no files
    assert bad_choice.exit_code == 2 and "unknown --save 'best'" in bad_choice.stderr


def test_deploy_refuses_an_init_file_of_another_model_on_the_host_before_sending_anything(
        tmp_path):
    """deploy --init checks the file's names, shapes and dtypes against the model its graph
    recorded (capture["state_dict"]): one line, exit 2, and no job on the board, where the
    file was shipped and refused there as a failed job (exit 1). A run's own weights.pt
    passes the check and trains (the board checks it again)."""
    made = tmp_path / "run"

    def deploy(init: Path, out: Path):
        return CliRunner().invoke(app, ["deploy", str(made / "plan.json"), "--graph",
                                        str(made / "graph.json"), "--device", "bench",
                                        "--steps", "1", "--init", str(init), "--out", str(out)])

    shape, name = tmp_path / "shape.pt", tmp_path / "name.pt"
    torch.save({"stem.weight": torch.zeros(3, 3)}, shape)
    torch.save({"stem.conv.weight": torch.zeros(16, 1, 3, 3)}, name)
    with local_board(tmp_path, "bench"):
        run(RunOptions(device="bench", model="digits-cnn", batch=16, budget="60%", steps=1,
                       params_home="ram", out=str(made), **QUICK))
        jobs = set((tmp_path / "board" / "jobs").iterdir())
        refused = {file: deploy(file, tmp_path / "refused") for file in (shape, name)}
        sent = set((tmp_path / "board" / "jobs").iterdir())
        deployed = deploy(made / "weights.pt", tmp_path / "deployed")
    for file, words in [(shape, "'stem.weight' is [3, 3] float32 in the file but "
                                "[16, 1, 3, 3] float32 in this model"),
                        (name, "'stem.conv.weight' is not a parameter or buffer of this "
                               "model (its names begin blocks.0.0.weight")]:
        result = refused[file]
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"error: --init {file}: {words}"), lines
        assert "Traceback" not in result.output
    assert sent == jobs and not (tmp_path / "refused").exists()  # nothing sent or written
    assert deployed.exit_code == 0, deployed.output
    assert (tmp_path / "deployed" / "weights.pt").is_file()


def test_a_damaged_missing_or_foreign_init_file_is_one_line(tmp_path):
    """read_weights_file's refusals (torch_file.py's loader, which --resume's checkpoint
    shares, in --init's words)."""
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(b"PK\x03\x04 not a zip at all")
    with pytest.raises(BadInput, match=r"^--init .*damaged.pt is not a weights file that "
                                       r"torch.load reads \(.+\): give one a run saved"):
        read_weights_file(damaged)
    with pytest.raises(BadInput, match=r"^--init .*missing.pt: no such file$"):
        read_weights_file(tmp_path / "missing.pt")
    # torch's own line goes on to advise weights_only=False (a pickle that can run code) for a
    # file that holds no weights: only its first sentence is said
    foreign = tmp_path / "graph.json"
    foreign.write_text('{"format": "edge-remat/graph"}')
    with pytest.raises(BadInput) as refused:
        read_weights_file(foreign)
    assert "(Weights only load failed)" in str(refused.value)
    assert "weights_only" not in str(refused.value)
    listed = tmp_path / "list.pt"
    torch.save([torch.zeros(2)], listed)
    with pytest.raises(BadInput, match="holds no dict of named tensors"):
        read_weights_file(listed)


def test_deploy_fetches_the_weights_next_to_the_report(tmp_path):
    """deploy of the plan a run made: weights.pt lands beside run_report.json, and --save none
    sends none. deploy trains on --data with --lr and its schedule as run does (it had none of
    them: the graph's example batch at the optimizer's default rate)."""
    with local_board(tmp_path, "bench"):
        run(RunOptions(device="bench", model="digits-cnn", batch=16, budget="60%", steps=1,
                       params_home="ram", save="none", out=str(tmp_path / "run"), **QUICK))
        assert not (tmp_path / "run" / "weights.pt").exists()
        result = CliRunner().invoke(app, ["deploy", str(tmp_path / "run" / "plan.json"),
                                          "--graph", str(tmp_path / "run" / "graph.json"),
                                          "--device", "bench", "--steps", "2", "--json",
                                          "--data", "digits", "--lr", "0.05", "--lr-schedule",
                                          "cosine", "--warmup", "1",
                                          "--out", str(tmp_path / "deployed")])
    assert result.exit_code == 0, result.output
    record = json.loads(result.stdout)
    assert record["result"]["saved_weights"]["save"] == "trained"
    assert_bitwise(torch.load(tmp_path / "deployed" / "weights.pt"),
                   plain_pytorch_after(tmp_path / "run", 2, "digits", lr=0.05,
                                       lr_schedule="cosine", warmup=1))


@needs_socat
def test_a_fetch_over_a_slow_serial_line_resumes_after_a_pulled_cable(board_agent, ptys,
                                                                       tmp_path):
    """A weights file over serial at 115200 baud: requests of what the line carries in ~4 s
    (1 MiB ones took 91 s each, past the 30 s request timeout), and a cable pulled mid-fetch
    resumes from what had arrived."""
    data = os.urandom(1536 << 10)
    local = tmp_path / "weights.pt"
    local.write_bytes(data)
    dest = tmp_path / "out" / "weights.pt"
    part = dest.with_name(dest.name + ".part")

    def pull_the_cable_at_half() -> None:
        while not (part.is_file() and part.stat().st_size >= len(data) // 2):
            time.sleep(0.005)
        ptys.restart()

    with Board(serial_device(tmp_path, ptys, baud=115200)) as board:
        board.hello()
        remote = board.push_input(local)
        assert board.session().get_chunk == 44 << 10  # 11.5 KB/s for 4 s
        assert board.session().put_chunk == 44 << 10  # uploads too (256 KiB took 23 s)
        puller = threading.Thread(target=pull_the_cable_at_half, daemon=True)
        puller.start()
        board.fetch(remote, dest)
        puller.join(5)
        assert board.reconnects >= 1
        resumed = board.session().last_get
    assert dest.read_bytes() == data and not part.exists()
    assert resumed["resumed_from"] >= len(data) // 2
    assert resumed["bytes"] == len(data) - resumed["resumed_from"]


def test_a_peft_model_also_gets_its_adapter_as_peft_reads_it(tmp_path):
    """hf:llama with a LoRA adapter (the README's): OUT/adapter loads into a fresh base with
    PeftModel.from_pretrained and holds the trained tensors of OUT/weights.pt."""
    peft = pytest.importorskip("peft")
    (tmp_path / "llama.json").write_text(
        '{"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}')
    (tmp_path / "lora.json").write_text(
        '{"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]}')
    base = f"hf:llama?config={tmp_path / 'llama.json'}"
    with local_board(tmp_path, "bench"):
        report = run(RunOptions(device="bench", model=f"{base}&adapter={tmp_path / 'lora.json'}",
                                budget="70%", steps=2, out=str(tmp_path / "out"), **QUICK))
    saved = torch.load(tmp_path / "out" / "weights.pt")
    assert report["weights"]["peft_adapter"] == str(tmp_path / "out" / "adapter")
    assert all(".lora_" in name for name in saved)
    fresh, _ = load_model(base)
    adapted = peft.PeftModel.from_pretrained(fresh.model, report["weights"]["peft_adapter"])
    state = adapted.state_dict()
    assert_bitwise(saved, state)
    assert not torch.equal(saved[next(n for n in saved if "lora_B" in n)],
                           torch.zeros_like(state[next(n for n in saved if "lora_B" in n)]))


def test_the_adapter_is_written_after_a_host_check_of_parameters_homed_on_flash(tmp_path):
    """Under a memory limit the host checks the plan's gradients with its own capture, whose
    parameters a flash home leaves empty there: the adapter still holds the board's trained
    tensors (QA: load_state_dict refused "[8, 64] into [0]", exit 70 after the run)."""
    pytest.importorskip("peft")
    from safetensors.torch import load_file
    from edge_remat.planner.build import build_problem
    from edge_remat.planner.solve import solve
    from edge_remat.run.orchestrate import host_gradient_check
    from edge_remat.run.peft_adapter import write_peft_adapter
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.capture.own_names import state_root
    config = {"num_hidden_layers": 2, "hidden_size": 64, "intermediate_size": 128,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 512}
    lora = {"peft_type": "LORA", "r": 8, "target_modules": ["q_proj", "v_proj"]}
    captured = capture_model(f"hf:llama?config={json.dumps(config)}&adapter={json.dumps(lora)}",
                             params_home="flash")
    from edge_remat_agent.formats import load_profile
    plan = solve(build_problem(captured.graph, "0.7", load_profile(PROFILE), paging="flash"),
                 "auto", time_limit=5).plan
    plan.save(tmp_path / "plan.json")
    check = host_gradient_check(captured.graph, tmp_path / "plan.json", lambda _: None, captured)
    assert check["bitwise_equal"] is True
    root, _ = state_root(captured.module)
    emptied = {n: p.shape for n, p in root.named_parameters() if p.requires_grad}
    assert emptied and all(shape.numel() == 0 for shape in emptied.values())  # as the run left it
    shapes = {n: torch.Size(t.shape) for n, t in load_model(
        f"hf:llama?config={json.dumps(config)}&adapter={json.dumps(lora)}")[0].model
        .state_dict().items() if ".lora_" in n}
    trained = {n: torch.randn(shape) for n, shape in shapes.items()}
    torch.save(trained, tmp_path / "weights.pt")
    written = write_peft_adapter(captured.module, tmp_path / "weights.pt", tmp_path)
    adapter = load_file(str(Path(written) / "adapter_model.safetensors"))
    assert len(adapter) == len(trained) == 8
    for name, value in trained.items():
        key = name.replace(".default.", ".")
        assert torch.equal(adapter[key], value), name


def test_a_full_disk_leaves_no_half_written_weights_file(tiny_filesystem):
    """The run job catches the OSError and still hands back its report (saved_weights_error)."""
    module = torch.nn.Linear(1024, 1024)  # 4 MiB of weights for a 1 MiB filesystem
    with pytest.raises(OSError) as error:
        save_weights(module, None, "all", tiny_filesystem / "weights.pt")
    assert error.value.errno == 28  # ENOSPC
    assert os.listdir(tiny_filesystem) == []
