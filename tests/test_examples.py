"""The example scripts a user copies: each imports, says how to run it, and parses its options.

Running them is minutes of training (the ResNet-18 one under a memory cgroup): the settings they
run are those of tests/test_run_e2e.py, which runs them end to end. Here: `--help` in a fresh
interpreter (the imports and the parser work as a user starts them) and the defaults they are
documented with.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py")
                 if 'if __name__ == "__main__":' in p.read_text())


def load(name: str):
    spec = importlib.util.spec_from_file_location(f"example_{Path(name).stem}", EXAMPLES / name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_are_found():
    assert {"finetune_digits.py", "finetune_resnet18_emulated.py",
            "bert_mini_paging_to_flash.py", "plan_for_jetson.py"} <= set(SCRIPTS)


@pytest.mark.parametrize("name", SCRIPTS)
def test_each_example_says_how_to_run_it_and_answers_help(name):
    doc = load(name).__doc__
    assert doc and f"python examples/{name}" in doc, "the docstring shows the command"
    result = subprocess.run([sys.executable, str(EXAMPLES / name), "--help"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage:")
    assert doc.splitlines()[0] in " ".join(result.stdout.split())  # argparse wraps lines


def test_the_resnet18_example_defaults_to_the_setting_of_the_ci_test():
    """... but for its budget: what the limit leaves after the runtime and the 160 MiB a run
    keeps (QA: the CI test's 65% left 145-158 MiB of slack, and the example warned)."""
    from helpers import e2e_settings as e2e
    args = load("finetune_resnet18_emulated.py").parse_args([])
    model = dict(zip(e2e.MODEL[::2], e2e.MODEL[1::2]))
    assert (args.batch, args.image) == (model["--batch"], model["--image"])
    assert args.memory_limit == f"{e2e.LIMIT_MIB}MiB" and args.budget is None
    assert args.steps == e2e.STEPS


def test_the_resnet18_examples_plain_run_takes_no_profile():
    """QA: with --profile it warned '--profile shapes the plan, and --plain trains without
    one: ignored', passing it to its plain run too."""
    example = load("finetune_resnet18_emulated.py")
    plain, planned = example.run_options(example.parse_args(["--profile", "p.json"]))
    assert plain.plain and plain.profile is None
    assert not planned.plain and planned.profile == "p.json" and planned.budget is None


@pytest.mark.parametrize("name", ["finetune_resnet18_emulated.py", "bert_mini_paging_to_flash.py",
                                  "finetune_1b_lora_2gib.py"])
def test_the_training_examples_recommend_no_profile_of_another_graph(name):
    """QA: profiles/this-machine.json, which they recommended (the 1.1B one planned with it
    too), timed digits-cnn's graph and "measured 0 of 137/179/125 nodes" of theirs."""
    profile = json.loads((EXAMPLES.parent / "profiles" / "this-machine.json").read_text())
    assert profile["measurements"]["ops"]["graph"] == "digits-cnn"
    assert "--profile profiles/this-machine.json" not in load(name).__doc__
    module = ast.parse((EXAMPLES / name).read_text())
    strings = [node.value for node in ast.walk(module) if isinstance(node, ast.Constant)
               and isinstance(node.value, str) and node.value != ast.get_docstring(module,
                                                                                   clean=False)]
    assert not [s for s in strings if "this-machine" in s], "the code plans with it"


def test_the_bert_example_pages_to_flash_with_its_options():
    example = load("bert_mini_paging_to_flash.py")
    args = example.parse_args(["--budget", "60%", "--steps", "2", "--memory-limit", "600MiB"])
    assert (args.budget, args.steps, args.memory_limit) == ("60%", 2, "600MiB")
    assert args.objective == "energy" and args.profile is None
    with pytest.raises(SystemExit):
        example.parse_args(["--objective", "speed"])


def test_the_jetson_example_plans_the_users_model_and_an_onnx_file(tmp_path):
    """Planning only, no training: it runs in seconds, so it runs whole."""
    result = subprocess.run([sys.executable, str(EXAMPLES / "plan_for_jetson.py"), "--out",
                             str(tmp_path), "--time-limit", "2"],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.stdout.count("valid plan") == 2
    for name in ("my_model", "small_cnn_onnx"):
        assert (tmp_path / f"{name}.plan.json").exists()


def test_an_example_that_cannot_reach_its_board_ends_in_one_line(tmp_path):
    """The examples ended in a 25-line traceback (BoardUnreachable) where the CLI says one
    line; now the same line and exit status 3."""
    example = Path(__file__).resolve().parents[1] / "examples" / "finetune_digits.py"
    device = tmp_path / "far.toml"  # a board at an address that routes nowhere (TEST-NET-1)
    device.write_text('name = "far"\n[connection]\nkind = "ssh"\nhost = "192.0.2.1"\n'
                      "connect_timeout_s = 2\n")
    done = subprocess.run([sys.executable, str(example), "--device", str(device), "--no-limit",
                           "--budget", "40%", "--steps", "1", "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("error: ") and done.stderr.count("\n") == 1, done.stderr
