"""The example scripts a user copies: each imports, says how to run it, and parses its options.

Running them is minutes of training (the ResNet-18 one under a memory cgroup): the settings they
run are those of tests/test_run_e2e.py, which runs them end to end. Here: `--help` in a fresh
interpreter (the imports and the parser work as a user starts them) and the defaults they are
documented with.
"""

from __future__ import annotations

import importlib.util
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
    from helpers import e2e_settings as e2e
    args = load("finetune_resnet18_emulated.py").parse_args([])
    model = dict(zip(e2e.MODEL[::2], e2e.MODEL[1::2]))
    assert (args.batch, args.image) == (model["--batch"], model["--image"])
    assert args.memory_limit == f"{e2e.LIMIT_MIB}MiB" and args.budget == e2e.BUDGET
    assert args.steps == e2e.STEPS


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
