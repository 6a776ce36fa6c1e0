"""The benchmark scripts' bad command-line values: each is refused while argparse reads it, as
one "error: argument --x: ..." line naming the value, exit status 2 and no traceback, before
any benchmark work (QA found tracebacks, typos that ran nothing with exit 0, and values taken
as given: a negative budget or time limit, `--rounds 0` run as 3 rounds). The readers
themselves (benchmarks/arguments.py) are tested in this process; each case QA reported runs
its script as a subprocess."""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.bad_inputs import env

REPO = Path(__file__).resolve().parents[1]
BENCHMARKS = REPO / "benchmarks"


def _arguments_module():
    # Loaded by path: putting benchmarks/ on sys.path would let its script names (cuda.py,
    # capture.py...) shadow modules for the rest of this test process.
    spec = importlib.util.spec_from_file_location("benchmark_arguments",
                                                  BENCHMARKS / "arguments.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


arguments = _arguments_module()


# -- the readers, in this process ------------------------------------------------------------

def test_each_reader_takes_a_valid_value(tmp_path):
    from edge_remat.units import parse_budget
    assert arguments.positive_int("3") == 3
    assert arguments.non_negative_int("0") == 0
    assert arguments.int_at_least(3)("3") == 3
    assert arguments.positive_float("0.5") == 0.5
    assert arguments.non_negative_float("0") == 0.0
    assert arguments.positive_float_or("floor")("floor") == "floor"
    assert arguments.positive_float_or("floor")("0.50") == "0.50"  # kept as written
    assert arguments.positive_size("64MiB") == 64 * 2**20
    assert arguments.existing_folder(str(tmp_path)) == str(tmp_path)
    assert arguments.checked_by(parse_budget)("55%") == "55%"
    assert arguments.zoo_model("resnet18") == "resnet18"
    assert arguments.positive_floats("0.9, 0.8,") == [0.9, 0.8]  # blanks skipped
    assert arguments.positive_ints("4,8") == [4, 8]
    assert arguments.comma_list(arguments.positive_int, allow_empty=True)("") == []
    assert arguments.names_among(["resnet18", "bert-mini"])("bert-mini,resnet18") == \
        ["bert-mini", "resnet18"]
    assert arguments.none_or(arguments.positive_ints)("none") == []
    assert arguments.none_or(arguments.positive_ints)("500") == [500]


@pytest.mark.parametrize("reader, text, said", [
    ("positive_int", "abc", "whole number"),
    ("positive_int", "0", ">= 1"),
    ("non_negative_int", "-1", ">= 0"),
    ("positive_int", "1.5", "whole number"),
    ("positive_float", "abc", "number"),
    ("positive_float", "-0.5", "> 0"),
    ("positive_float", "inf", "finite"),
    ("positive_float", "nan", "finite"),
    ("non_negative_float", "-1", ">= 0"),
    ("positive_size", "0", "above 0"),
    ("positive_size", "12parsecs", "cannot read size"),
    ("positive_floats", "0.9,abc", "number"),
    ("positive_floats", ",", "at least one"),
    ("positive_ints", "4,0", ">= 1"),
    ("existing_folder", "/nonexistent/x", "does not exist"),
    ("zoo_model", "nosuch", "zoo models: "),
])
def test_each_reader_refuses_a_bad_value_naming_it(reader, text, said):
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        getattr(arguments, reader)(text)
    message = str(refused.value)
    assert said in message, message
    if text.strip(","):  # the bad value itself, or (a list) its bad item
        assert repr(text.split(",")[-1]) in message, message


def test_a_file_is_no_folder(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(argparse.ArgumentTypeError, match="is not a folder"):
        arguments.existing_folder(str(tmp_path / "file"))


def test_an_unknown_name_is_refused_with_the_known_ones():
    read = arguments.names_among(["resnet18", "bert-mini"], "model")
    with pytest.raises(argparse.ArgumentTypeError) as refused:
        read("resnet18,nosuch")
    assert str(refused.value) == "unknown model 'nosuch' (known: resnet18, bert-mini)"


def test_a_value_is_kept_as_written_or_refused_with_its_words():
    read = arguments.positive_float_or("floor")
    with pytest.raises(argparse.ArgumentTypeError, match="> 0 or floor, got 'flor'"):
        read("flor")


def test_argparse_reads_a_string_default_and_refuses_in_one_line(capsys):
    parser = argparse.ArgumentParser(prog="bench")
    parser.add_argument("--budgets", type=arguments.positive_floats, default="0.9,0.8")
    assert parser.parse_args([]).budgets == [0.9, 0.8]
    with pytest.raises(SystemExit) as stopped:
        parser.parse_args(["--budgets", "abc"])
    assert stopped.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == \
        "bench: error: argument --budgets: expected a number, got 'abc'"


# -- what QA ran: each script refuses while parsing --------------------------------------------

CASES = [  # (script, its arguments, the option refused, the value it names)
    ("published_graphs.py", ["--budgets", "abc"], "--budgets", "abc"),
    ("published_graphs.py", ["--graphs", "rl100", "--budgets", "-0.5"], "--budgets", "-0.5"),
    ("published_graphs.py", ["--graphs", "rl100", "--budgets", "0.8", "--time-limit", "-1"],
     "--time-limit", "-1"),
    ("executor.py", ["--quick", "--budgets", "abc"], "--budgets", "abc"),
    ("planner_scaling.py", ["--sizes", "abc"], "--sizes", "abc"),
    ("planner_scaling.py", ["--sizes", "0", "--png", "x.png"], "--sizes", "0"),
    ("floors.py", ["--models", "mlp"], "--models", "mlp"),  # a zoo model floors.py lacks
    ("arena.py", ["--quick", "--models", "nosuch"], "--models", "nosuch"),
    ("page_writes.py", ["--quick", "--page-dir", "/nonexistent/x"], "--page-dir",
     "/nonexistent/x"),
    ("page_writes.py", ["--quick", "--rounds", "0"], "--rounds", "0"),  # was: 3 rounds
    # typos that ran no model and exited 0
    ("end_to_end.py", ["--quick", "--models", "nosuch"], "--models", "nosuch"),
    ("overlap.py", ["--quick", "--models", "nosuch"], "--models", "nosuch"),
    ("home_reads.py", ["--quick", "--models", "nosuch"], "--models", "nosuch"),
]


@pytest.mark.parametrize("script, args, option, value", CASES,
                         ids=[f"{c[0]} {' '.join(c[1])}" for c in CASES])
def test_a_bad_value_is_one_error_line_and_exit_2(script, args, option, value):
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args],
                          capture_output=True, text=True, cwd=REPO, env=env(), timeout=120)
    assert done.returncode == 2, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stdout == "", done.stdout  # refused before the benchmark printed anything
    last = done.stderr.strip().splitlines()[-1]
    assert f"error: argument {option}: " in last, last
    assert repr(value) in last, last
