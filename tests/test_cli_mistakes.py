"""Mistakes at the command line found by QA: each is refused as bad input (exit 2), in one line
that names the option at fault, and what the CLI tells the user to pass works when passed."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, refused, tiny_graph, tiny_plan
from helpers.exact_problems import problem
from helpers.small_graphs import training_chain

REPO = Path(__file__).resolve().parents[1]


def captured_graph(folder):
    """The tiny graph as if captured from a model: the executor replays its ops' order."""
    path = tiny_graph(folder, "captured.json")
    graph = json.loads(path.read_text())
    for node in graph["nodes"]:
        node["attrs"] = {"outputs": [node["op"]]}
    path.write_text(json.dumps(graph))
    return path


def test_order_memory_on_a_captured_graph_is_bad_input(tmp_path):
    refused(cli("plan", "--graph", captured_graph(tmp_path), "--budget", "98%", "--order",
                "memory", "-o", tmp_path / "plan.json"),
            BAD_INPUT, "--order memory", "captured from a model", "--order given or auto")
    assert not (tmp_path / "plan.json").exists()


def test_the_smallest_deadline_named_is_met_when_passed_back(tmp_path):
    graph = training_chain(4, 1)  # its fastest schedule takes 1.26923...x the plain time
    path = tmp_path / "chain.json"
    path.write_text(json.dumps(graph.to_dict()))
    budget = problem(graph, 0.5).budget_bytes
    args = ["plan", "--graph", path, "--budget", budget, "--objective", "energy"]
    line = refused(cli(*args, "--deadline", "1.0"), BAD_INPUT, "smallest deadline")
    named = re.search(r"can be met is (?:at most )?([0-9.]+)x", line).group(1)
    assert float(named) > 1.269  # rounded up, not to the nearest
    proc = cli(*args, "--deadline", named, "--json")
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("command", [["plan", "--budget", "0.8"],
                                     ["run", "--device", "local", "--model", "mlp",
                                      "--budget", "0.8"]], ids=["plan", "run"])
def test_a_deadline_it_cannot_read_is_named(tmp_path, command):
    """The line said "cannot read 'abc'", unlike the budget's, which names its option."""
    graph = ["--graph", tiny_graph(tmp_path)] if command[0] == "plan" else []
    refused(cli(*command, *graph, "--deadline", "abc", "--out" if command[0] == "run" else "-o",
                tmp_path / "out"), BAD_INPUT, "cannot read --deadline 'abc'")


def test_a_size_no_board_holds_names_the_limit_in_an_accepted_unit(tmp_path):
    """It said "1 EiB", a unit the parser refuses."""
    line = refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget",
                       "2000000000000000000"), BAD_INPUT, "9007199254740992 bytes, "
                   "8192 TiB")
    assert "EiB" not in line and "PiB" not in line
    assert cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "8192TiB",
               "--solver", "heuristic:keep-all", "-o", tmp_path / "p.json").returncode == 0


@pytest.mark.parametrize("limit", ["0", "-1", "nan"])
@pytest.mark.parametrize("command", [["plan", "--budget", "0.8"], ["plan", "--sweep",
                                                                    "0.5:1.0:0.25"]],
                         ids=["plan", "sweep"])
def test_plan_refuses_a_time_limit_that_is_not_positive(tmp_path, command, limit):
    refused(cli(command[0], "--graph", tiny_graph(tmp_path), *command[1:], "--time-limit",
                limit), BAD_INPUT, "--time-limit must be a positive number of seconds")


@pytest.mark.parametrize("args,words", [
    (["--memory-limit", "foo"], ["cannot read --memory-limit 'foo'", "a size"]),
    (["--memory-limit", "50%"], ["--memory-limit '50%'", "a size"]),
], ids=["unreadable", "fraction"])
def test_run_names_the_memory_limit_it_cannot_read(tmp_path, args, words):
    refused(cli("run", "--device", "local", "--model", "mlp", *args, "--out", tmp_path),
            BAD_INPUT, *words)


@pytest.mark.parametrize("limit,shown", [("10MiB", "10.00 MiB"), ("600", "600 B")],
                         ids=["10MiB", "bare number"])
def test_run_refuses_a_memory_limit_the_agent_cannot_start_in(tmp_path, limit, shown):
    """Both exited 3 after the capture ("the agent did not start ... the other end closed the
    connection"), leaving OUT/graph.json and the memory cgroup; now refused before any work."""
    refused(cli("run", "--device", "local", "--model", "mlp", "--memory-limit", limit,
                "--budget", "80%", "--out", tmp_path / "out"), BAD_INPUT,
            f"--memory-limit {shown} is below the 64 MiB", "give at least 64MiB",
            "a number without a unit is bytes")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("read,write,words", [
    ("0", "0", ["--flash-read-bw '0' must be positive"]),
    ("90MB", "0", ["--flash-write-bw '0' must be positive"]),
    ("90MB", "50%", ["--flash-write-bw '50%' is a percentage", "bytes a second (90MB/s"]),
    # QA: a bandwidth was said as a memory size: "larger than any board's memory", "a size"
    ("1e30", "90MB", ["--flash-read-bw '1e30' is faster than any flash or link",
                      "at most 2^60 bytes a second"]),
    ("90MB", "fast", ["cannot read --flash-write-bw 'fast'", "bytes a second (90MB/s"]),
    ("90MB", "-4MB/s", ["--flash-write-bw '-4MB/s' must be positive"]),
    ("90MB/h", "90MB", ["cannot read --flash-read-bw '90MB/h'", "bytes a second"]),
], ids=["read zero", "write zero", "write fraction", "read 1e30", "write words",
        "write negative", "read per hour"])
def test_plan_names_the_flash_bandwidth_it_cannot_read(tmp_path, read, write, words):
    line = refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.8",
                       "--flash-read-bw", read, "--flash-write-bw", write), BAD_INPUT, *words)
    assert "memory" not in line and "a size" not in line, line


@pytest.mark.parametrize("read,write,figures", [
    ("90MB/s", "40MB/s", (90e6, 40e6)),  # QA: "use a size (512MiB, ...)"
    ("1.2 GB/s", "500MiB/s", (1.2e9, 500 * 2**20)),
    ("90MBps", "40mb/sec", (90e6, 40e6)),
    ("90MB", "40000000", (90e6, 40e6)),
])
def test_a_bandwidth_is_read_as_a_rate_as_users_write_one(tmp_path, read, write, figures):
    plan = tmp_path / "plan.json"
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "1.0", "--paging", "flash",
              "--flash-read-bw", read, "--flash-write-bw", write, "--solver",
              "heuristic:split", "-o", plan)
    assert run.returncode == 0, run.stderr
    tier = json.loads(plan.read_text())["tiers"]["flash"]
    assert (tier["read_bytes_per_s"], tier["write_bytes_per_s"]) == figures


def test_a_small_bare_bandwidth_is_bytes_a_second_not_a_fraction(tmp_path):
    """'--flash-read-bw 1' was refused as 'a fraction of the plain peak' (the budget's rule for
    a bare number below 16): a bandwidth is never a fraction, so it is 1 byte a second."""
    plan = tmp_path / "plan.json"
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "1.0", "--paging", "flash",
              "--flash-read-bw", "1", "--flash-write-bw", "8", "--solver", "heuristic:split",
              "-o", plan)
    assert run.returncode == 0, run.stderr
    tier = json.loads(plan.read_text())["tiers"]["flash"]
    assert (tier["read_bytes_per_s"], tier["write_bytes_per_s"]) == (1, 8)


@pytest.mark.parametrize("figures,words", [
    (["--flash-latency", "-1"], ["--flash-latency", ">= 0"]),
    (["--flash-latency", "nan"], ["--flash-latency", "finite"]),
    (["--flash-latency", "inf"], ["--flash-latency", "finite"]),
    (["--flash-energy-per-byte", "-1e-6"], ["--flash-energy-per-byte", ">= 0"]),
    (["--flash-energy-per-byte", "nan"], ["--flash-energy-per-byte", "finite"]),
], ids=["latency negative", "latency nan", "latency inf", "energy negative", "energy nan"])
def test_plan_refuses_flash_figures_a_profile_could_not_hold(tmp_path, figures, words):
    """A negative energy made the energy objective page at a budget of 100% (paging 'earned'
    joules); NaN was an internal error. Refused as a profile's tier is, before the graph is
    read (it does not exist here), and nothing is written."""
    refused(cli("plan", "--graph", tmp_path / "missing.json", "--budget", "1.0", "--paging",
                "flash", "--flash-read-bw", "90MB", "--flash-write-bw", "40MB", *figures,
                "-o", tmp_path / "plan.json"), BAD_INPUT, *words)
    assert not (tmp_path / "plan.json").exists()


def test_a_flash_latency_without_bandwidths_is_refused_not_ignored(tmp_path):
    refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "1.0", "--flash-latency",
                "-1"), BAD_INPUT, "both bandwidths")


@pytest.mark.parametrize("options,flash_offered", [
    (["--paging", "host", "--profile", REPO / "profiles" / "rpi4.json"], False),  # flash only
    (["--paging", "both", "--profile", REPO / "profiles" / "rpi4.json"], False),
    (["--paging", "both"], True),
], ids=["host", "both, flash in the profile", "both, no profile"])
def test_paging_to_the_host_without_its_tier_names_no_flash_option(tmp_path, options,
                                                                    flash_offered):
    """The host tier is measured over the board's link: the --flash-* options, which the line
    offered for --paging host too, cannot give it."""
    line = refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.8", *options),
                   BAD_INPUT, "host tier", "edge-remat profile")
    assert ("--flash-read-bw" in line) == flash_offered, line


def test_arena_fit_without_an_arena_is_refused(tmp_path):
    """--arena none --arena-fit planned without a word, no fit attempted."""
    refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.9", "--arena", "none",
                "--arena-fit", "-o", tmp_path / "plan.json"), BAD_INPUT, "--arena-fit",
            "--arena none")
    assert not (tmp_path / "plan.json").exists()


FLASH = ["--flash-read-bw", "90MB", "--flash-write-bw", "40MB"]


@pytest.mark.parametrize("options,words", [
    (["--paging", "none", *FLASH], ["--flash-*", "--paging none"]),
    (["--solver", "heuristic:split", "--backend", "highs"], ["--backend", "heuristic:split"]),
    (["--solver", "heuristic:split", "--arena-time-limit", "5"], ["--arena-time-limit",
                                                                   "best-fit"]),
    (["--solver", "heuristic:split", "--paging-time", "free"], ["--paging-time free",
                                                                "pages nothing"]),
    (["--solver", "heuristic:split", "--paging", "none", "--paging-time", "free"],
     ["--paging-time free", "--paging none"]),
    # the table's joules were the step time at 1 W, said as a board's
    (["--solver", "heuristic:split", "--objective", "energy"], ["--objective energy", "1 W",
                                                                "--profile"]),
], ids=["flash figures, no paging", "backend, no MILP", "arena time, no cpsat arena",
        "paging time, no tier", "paging time, paging none", "energy, no power"])
def test_an_option_that_others_rule_out_is_a_warning(tmp_path, options, words):
    """Each was ignored in silence; the plan is still made and written, with one warning line
    that names the option and why it does nothing."""
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.9", "--time-limit", "3",
              *options, "-o", tmp_path / "plan.json")
    assert run.returncode == 0, run.stderr
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and all(word in warnings[0] for word in words), run.stderr
    assert (tmp_path / "plan.json").exists()


@pytest.mark.parametrize("budget,warned", [("50", True), ("16", True), ("100", True),
                                            ("15", False), ("101", False), ("50%", False),
                                            ("0.5", False), ("50KiB", False)])
def test_a_bare_number_read_as_a_few_bytes_is_a_warning(tmp_path, budget, warned):
    """`--budget 50` is 50 bytes, by the documented rule: said only as 'budget 50 bytes is too
    small', where 50% was meant."""
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", budget, "--time-limit", "3",
              "-o", tmp_path / "plan.json")
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning: ")]
    if warned:
        assert warnings == [f"warning: --budget {budget} is read as {budget} bytes (a bare "
                            "number below 16 is a fraction of the plain peak, from 16 up "
                            f"bytes): for {budget}% of the plain peak, write {budget}%"], \
            run.stderr
    else:
        assert not [w for w in warnings if "read as" in w], run.stderr


def test_arena_options_with_a_sweep_are_a_warning(tmp_path):
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--sweep", "0.9:1.0:0.1", "--solver",
              "heuristic:split", "--arena-fit")
    assert run.returncode == 0, run.stderr
    assert run.stderr.startswith("warning: the --arena* options are unused with --sweep")


def test_options_that_take_effect_are_no_warning(tmp_path):
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.9", "--time-limit", "3",
              "--solver", "milp", "--backend", "highs", "--paging-time", "free", *FLASH,
              "--arena", "cpsat", "--arena-time-limit", "5")
    assert run.returncode == 0 and "warning" not in run.stderr, run.stderr


def test_energy_with_the_power_of_a_profile_or_of_the_graph_is_no_warning(tmp_path):
    profile = REPO / "profiles" / "jetson-nano.json"
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.9", "--solver",
              "heuristic:split", "--objective", "energy", "--profile", profile)
    assert run.returncode == 0 and "warning" not in run.stderr, run.stderr
    graph = json.loads(tiny_graph(tmp_path).read_text())
    for node in graph["nodes"]:
        node["energy_j"] = 2 * node["time_s"]
    (tmp_path / "energies.json").write_text(json.dumps(graph))
    run = cli("plan", "--graph", tmp_path / "energies.json", "--budget", "0.9", "--solver",
              "heuristic:split", "--objective", "energy")
    assert run.returncode == 0 and "warning" not in run.stderr, run.stderr


def test_energy_with_a_profile_of_zero_watts_is_a_warning(tmp_path):
    """QA: a profile whose idle_w and active_w were 0 planned every budget at 0 J, "proven
    optimal", without a word. (Paging's energy per byte zeroed too: where paging costs energy
    the objective still chooses, and no warning comes.)"""
    profile = json.loads((REPO / "profiles" / "jetson-nano.json").read_text())

    def zero(node):
        if isinstance(node, dict):
            for key, value in node.items():
                node[key] = 0.0 if key in ("idle_w", "active_w", "read_j_per_byte",
                                           "write_j_per_byte") else zero(value)
        elif isinstance(node, list):
            return [zero(item) for item in node]
        return node
    (tmp_path / "zero.json").write_text(json.dumps(zero(profile)))
    run = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.9", "--solver",
              "heuristic:split", "--objective", "energy", "--profile", tmp_path / "zero.json",
              "--json")
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["energy_j"] == 0
    warnings = [line for line in run.stderr.splitlines() if line.startswith("warning: ")]
    assert len(warnings) == 1 and "is 0 W, idle and busy" in warnings[0] and \
        "every plan costs 0 J" in warnings[0], run.stderr


def test_memory_limit_on_a_remote_board_is_bad_input(tmp_path):
    refused(cli("run", "--device", "rpi4", "--memory-limit", "600MiB", "--model", "mlp",
                "--out", tmp_path), BAD_INPUT, "--memory-limit", "--device local")


def test_simulate_refuses_a_plan_over_its_own_budget_and_says_so(tmp_path):
    graph = tiny_graph(tmp_path)
    assert cli("plan", "--graph", graph, "--budget", "1.0", "-o", tmp_path / "p.json"
               ).returncode == 0
    plan = json.loads((tmp_path / "p.json").read_text())
    plan["budget_bytes"] = plan["predicted"]["peak_bytes"] - 1
    (tmp_path / "p.json").write_text(json.dumps(plan))
    refused(cli("simulate", tmp_path / "p.json", "--graph", graph), BAD_INPUT,
            f"peak, {plan['predicted']['peak_bytes']} bytes, is over its budget")
    # --json: the one object says so too (it was the replay's alone, "valid": true, no error)
    proc = cli("simulate", tmp_path / "p.json", "--graph", graph, "--json")
    refused(proc, BAD_INPUT, "over its budget", json_out=True)
    said = json.loads(proc.stdout)
    assert said["status"] == "error" and said["fits_budget"] is False
    assert said["peak_bytes"] == plan["predicted"]["peak_bytes"]


def test_simulate_without_the_plans_profile_says_whose_costs_it_replays(tmp_path):
    graph = tiny_graph(tmp_path)
    plan = tmp_path / "p.json"
    profile = REPO / "profiles" / "rpi4.json"
    assert cli("plan", "--graph", graph, "--budget", "0.9", "--profile", profile, "-o", plan
               ).returncode == 0
    proc = cli("simulate", plan, "--graph", graph)
    assert proc.returncode == 0, proc.stderr
    assert "made with the profile" in proc.stderr and "give --profile" in proc.stderr
    assert "made with the profile" not in cli("simulate", plan, "--graph", graph, "--profile",
                                              profile).stderr


def test_simulate_pages_at_another_boards_tiers_and_says_where_it_keeps_the_plans(tmp_path):
    """QA: simulate --profile replayed paging at the tier figures the plan recorded, whatever
    the profile said: a Jetson's flash (30x the Pi's) gave the Pi's paging time, called the
    Jetson's, and a Pi profile edited to a flash 1000x slower the same, without a word."""
    graph = tiny_graph(tmp_path)
    plan = tmp_path / "p.json"
    pi, jetson = REPO / "profiles" / "rpi4.json", REPO / "profiles" / "jetson-orin-nano.json"
    assert cli("plan", "--graph", graph, "--budget", "0.7", "--profile", pi, "--paging",
               "flash", "--solver", "heuristic:paging", "-o", plan).returncode == 0

    def paging_time(profile: Path) -> tuple[float, str]:
        proc = cli("simulate", plan, "--graph", graph, "--profile", profile, "--json")
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout)["paging_time_s"], proc.stderr

    on_pi, said = paging_time(pi)
    assert on_pi > 0 and "other figures" not in said
    on_jetson, _ = paging_time(jetson)
    assert 0 < on_jetson < on_pi / 5
    slow = json.loads(pi.read_text())
    slow["tiers"]["flash"]["read_bytes_per_s"] /= 1000
    on_slow, said = paging_time(_written(tmp_path / "slow-pi.json", slow))
    assert on_slow == on_pi  # the plan's own board: its figures are the plan's
    assert "gives other figures for flash than the plan was made with" in said


def test_simulate_gives_and_checks_a_step_of_micro_passes(tmp_path):
    """QA: with --accumulate 2, simulate said nothing of the step of two passes that plan
    printed, and an edited accumulated_step (7 passes, 99 s) replayed as a valid plan."""
    graph, plan = tmp_path / "graph.json", tmp_path / "plan.json"
    assert cli("graph", "--model", "mlp", "--accumulate", "2", "-o", graph).returncode == 0
    assert cli("plan", "--graph", graph, "--budget", "100%", "--time-limit", "5", "-o", plan
               ).returncode == 0
    proc = cli("simulate", plan, "--graph", graph)
    assert proc.returncode == 0 and "(2 micro-passes, --accumulate" in proc.stdout, proc
    assert "records figures" not in proc.stderr
    edited = json.loads(plan.read_text())
    step = edited["predicted"]["accumulated_step"]
    assert json.loads(cli("simulate", plan, "--graph", graph, "--json").stdout
                      )["accumulated_step"] == step
    step.update(micro_batches=7, time_s=99.0)
    proc = cli("simulate", _written(tmp_path / "edited.json", edited), "--graph", graph)
    assert "accumulated_step.micro_batches 7 (the replay: 2); accumulated_step.time_s 99 " \
        in proc.stderr, proc.stderr


def test_run_names_every_parameter_home_before_it_captures(tmp_path):
    proc = cli("run", "--device", "local", "--model", "mlp", "--budget", "90%",
               "--params-home", "disk", "--out", tmp_path / "out")
    refused(proc, BAD_INPUT, "--params-home", "auto", "ram", "flash", "disk")
    assert "capturing" not in proc.stderr


def test_graph_refuses_run_only_parameter_home_as_an_option_not_a_capture(tmp_path):
    """QA: `graph --params-home auto` said "cannot capture model 'mlp': the parameters' home
    must be one of ram, flash", a model's failure, for an option run takes and graph cannot."""
    proc = cli("graph", "--model", "mlp", "--params-home", "auto", "-o", tmp_path / "g.json")
    refused(proc, BAD_INPUT, "--params-home", "ram or flash", "auto is run's")
    assert "cannot capture" not in proc.stderr


@pytest.mark.parametrize("param,words", [("bogus=1", ["unknown profile param 'bogus'"]),
                                         ("window_s=0", ["--window-s", "positive"]),
                                         ("share_s=-1", ["--share-s", "0 or more"]),
                                         # QA: measured until killed, or an OverflowError
                                         ("busy_s=inf", ["--busy-s", "at most 3600"]),
                                         ("idle_s=1e400", ["--idle-s", "not inf"]),
                                         ("min_size=128MiB", ["--min-size (128 MiB)",
                                                              "--max-size (64 MiB)"]),
                                         # QA: one size fitted latency 0 and a bandwidth
                                         # 100x too low, in silence
                                         ("sizes=4KiB", ["--sizes gives 1 size", "two"]),
                                         ("min_size=64MiB", ["less than --max-size (64 MiB)",
                                                             "two sizes"])])
def test_profile_params_the_board_would_refuse_are_refused_before_it_is_reached(tmp_path, param,
                                                                                  words):
    proc = cli("profile", "--device", "local", "--param", param, "--out", tmp_path / "p")
    line = refused(proc, BAD_INPUT, *words)
    assert proc.stderr.strip().splitlines() == [line]  # nothing else: no board was reached


@pytest.mark.parametrize("options,words", [(["--page-dir", ""], ["--page-dir is empty"]),
                                           (["--page-dir", ".", "--window-s", "-1"],
                                            ["--window-s", "not -1"])])
def test_the_agents_storage_profile_refuses_options_no_measurement_can_use(tmp_path, options,
                                                                             words):
    import subprocess
    import sys
    out = tmp_path / "profile.json"
    proc = subprocess.run([sys.executable, "-m", "edge_remat_agent", "profile-storage", *options,
                           "-o", str(out), "--sizes", "4KiB,8KiB", "--no-footprint"],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120)
    refused(proc, BAD_INPUT, *words)
    assert not out.exists()


@pytest.mark.parametrize("command", [
    ["profile-storage", "--page-dir", ".", "--sizes", "4KiB,8KiB", "--no-footprint"],
    ["profile", "--sizes", "4KiB,8KiB", "--no-footprint"],
    ["run", "plan.json", "--graph", "graph.json"]])
def test_the_agents_commands_refuse_an_empty_output_name_before_any_work(tmp_path, command):
    """As the host's commands do (outputs.py, the same check): before, `profile -o ''` measured
    the board and then failed to write '.' ('Device or resource busy'), and run's -o '' was
    taken as no -o."""
    import subprocess
    import sys
    from helpers.bad_inputs import env
    graph = tiny_graph(tmp_path)
    tiny_plan(tmp_path, graph)
    graph.rename(tmp_path / "graph.json")
    before = sorted(tmp_path.rglob("*"))
    proc = subprocess.run([sys.executable, "-m", "edge_remat_agent", *command, "-o", ""],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env())
    line = refused(proc, BAD_INPUT, "-o is empty: give a file name")
    assert proc.stderr.strip().splitlines() == [line]  # nothing measured or run first
    assert sorted(tmp_path.rglob("*")) == before


@pytest.mark.parametrize("command,words", [
    (["run", "plan.json", "--graph", ""], "--graph is empty: give a value"),
    (["run", "plan.json", "--graph="], "--graph is empty: give a value"),
    (["check-plan", "", "--graph", "graph.json"], "the plan argument is empty: give a value"),
    (["run", "", "--graph", ""], "the plan argument is empty: give a value"),  # the first
])
def test_the_agents_commands_refuse_an_empty_value(tmp_path, command, words):
    # As the host's commands do: `--graph ''` was "error: .: ... 'Is a directory'"
    import subprocess
    import sys
    from helpers.bad_inputs import env
    graph = tiny_graph(tmp_path)
    tiny_plan(tmp_path, graph)
    graph.rename(tmp_path / "graph.json")
    proc = subprocess.run([sys.executable, "-m", "edge_remat_agent", *command],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env())
    line = refused(proc, BAD_INPUT, words)
    assert proc.stderr.strip().splitlines() == [line]


@pytest.mark.parametrize("steps,words", [
    ("0", "--steps must be at least 1, not 0"),
    ("99999999999999999999", "is more than 10,000,000 steps"),
])
def test_the_agents_run_refuses_a_step_count_no_run_takes(tmp_path, steps, words):
    """As deploy and run refuse it (MAX_STEPS): `edge-remat-agent run --steps 0` captured the
    model and trained nothing, and a count past 2^64 would have trained forever."""
    import subprocess
    import sys
    from helpers.bad_inputs import env
    graph = tiny_graph(tmp_path)
    tiny_plan(tmp_path, graph)
    graph.rename(tmp_path / "graph.json")
    proc = subprocess.run([sys.executable, "-m", "edge_remat_agent", "run", "plan.json",
                           "--graph", "graph.json", "--steps", steps],
                          capture_output=True, text=True, cwd=tmp_path, timeout=120, env=env())
    line = refused(proc, BAD_INPUT, words)
    assert proc.stderr.strip().splitlines() == [line]


def test_an_error_no_agent_command_foresaw_is_one_line(monkeypatch, capsys):
    # e.g. a model whose own code raises in the gradient check's eager step (an hf model fed
    # more tokens than it has positions): one line, and the traceback on request
    from edge_remat_agent import cli as agent_cli
    from edge_remat_agent import run_command

    def raises(args):
        raise IndexError("index out of range in self")
    monkeypatch.setattr(run_command, "run", raises)
    monkeypatch.delenv("EDGE_REMAT_DEBUG", raising=False)
    assert agent_cli.main(["run", "p.json", "--graph", "g.json"]) == 1
    err = capsys.readouterr().err
    assert err.strip().splitlines() == [
        "error: run stopped: IndexError: index out of range in self (EDGE_REMAT_DEBUG=1 shows "
        "the traceback)"]
    monkeypatch.setenv("EDGE_REMAT_DEBUG", "1")
    with pytest.raises(IndexError):
        agent_cli.main(["run", "p.json", "--graph", "g.json"])


def test_the_agents_help_lists_only_the_commands_a_person_runs(capsys, tmp_path):
    from edge_remat_agent import cli as agent_cli

    with pytest.raises(SystemExit) as done:
        agent_cli.main(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "run-job" not in out and "SUPPRESS" not in out, out
    # the daemon's own command still parses (test_daemon.py runs jobs through it)
    with pytest.raises(SystemExit) as done:
        agent_cli.main(["_run-job", "--workdir", str(tmp_path)])
    assert done.value.code == 2 and "the following arguments are required: --job" in \
        capsys.readouterr().err


@pytest.mark.parametrize("command,label", [
    (["plan", "--graph", "GRAPH", "--budget", "0.9", "--profile", ""], "--profile"),
    (["plan", "--graph", "", "--budget", "0.9"], "--graph"),
    (["simulate", "", "--graph", "GRAPH"], "PLAN"),
    (["run", "--device", "local", "--model", "mlp", "--budget", "0.9", "--resume", ""],
     "--resume"),
    (["job", "echo", "--device", ""], "--device"),
    (["job-status", "", "--device", "local"], "ID"),
], ids=["plan-profile", "plan-graph", "simulate-plan", "run-resume", "job-device", "job-id"])
def test_an_empty_value_is_refused_not_read_as_left_out(tmp_path, command, label):
    # An unset shell variable (`--resume "$OUT"`): `--profile ''` planned with no profile,
    # `--resume ''` trained from step 1, `--graph ''` read the folder '.', `--device ''` was
    # "ambiguous: it could be android-termux, ..."; outputs keep their own words
    # (test_bad_inputs_options.py).
    graph = tiny_graph(tmp_path)
    command = [str(graph) if arg == "GRAPH" else arg for arg in command]
    proc = cli(*command, "-o", tmp_path / "out.json") if command[0] == "plan" else cli(*command)
    refused(proc, BAD_INPUT, f"{label} is empty: give a value")
    assert not (tmp_path / "out.json").exists()


def test_plot_names_the_kind_of_file_given_for_a_sweep(tmp_path):
    plan = tiny_plan(tmp_path, tiny_graph(tmp_path))
    refused(cli("plot", "--sweep", plan, "--out", tmp_path / "plots"), BAD_INPUT,
            "--sweep takes the JSON `edge-remat plan --sweep ... --json` prints",
            "got a file of format edge-remat/plan")
    assert not (tmp_path / "plots").exists()


@pytest.mark.parametrize("edit,words", [
    (lambda rows: rows[-1].update(energy_j="x"), ["sweep[", "energy_j", "finite number"]),
    (lambda rows: rows.clear(), ["at least one budget's row"]),
    (lambda rows: rows[-1].update(budget_bytes=-5), ["budget_bytes", ">= 1"]),
    (lambda rows: rows[-1].update(time_s=None), ["time_s", "where the row has an energy"]),
    (lambda rows: [row.update(energy_j=None, time_s=None, status="infeasible") for row in rows],
     ["no budget of the sweep has a plan", "nothing to draw"]),
], ids=["energy as words", "no rows", "negative budget", "energy without a time", "no plan"])
def test_plot_refuses_a_sweep_whose_rows_are_not_figures(tmp_path, edit, words):
    """A hand-edited sweep was drawn: "x" as a category among the energies (the axis out of
    order), no rows as an empty chart, exit 0; rows none of which planned, too (QA)."""
    graph = tiny_graph(tmp_path)
    proc = cli("plan", "--graph", graph, "--sweep", "0.9:1.0:0.1", "--solver",
               "heuristic:split", "--json")
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads(proc.stdout)
    assert cli("plot", "--sweep", _written(tmp_path / "ok.json", sweep), "--out",
               tmp_path / "ok").returncode == 0
    edit(sweep["sweep"])
    refused(cli("plot", "--sweep", _written(tmp_path / "edited.json", sweep), "--out",
                tmp_path / "plots"), BAD_INPUT, *words)
    assert not (tmp_path / "plots").exists()


def test_plot_with_a_bad_sweep_writes_no_plan_plots_either(tmp_path):
    """QA: schedule.png and memory.png were written before the sweep was refused, and the
    same command with a mended sweep then wanted --force."""
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph)
    proc = cli("plan", "--graph", graph, "--sweep", "0.9:1.0:0.1", "--solver",
               "heuristic:split", "--json")
    assert proc.returncode == 0, proc.stderr
    sweep = json.loads(proc.stdout)
    good = _written(tmp_path / "sweep.json", sweep)
    sweep["sweep"][-1]["energy_j"] = "x"
    bad = _written(tmp_path / "bad.json", sweep)
    out = tmp_path / "plots"
    refused(cli("plot", "--plan", plan, "--graph", graph, "--sweep", bad, "--out", out),
            BAD_INPUT, "energy_j")
    assert not list(out.glob("*.png")) if out.exists() else True
    proc = cli("plot", "--plan", plan, "--graph", graph, "--sweep", good, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.glob("*.png")) == ["memory.png", "schedule.png",
                                                         "sweep.png"]


def test_plot_of_a_plan_over_its_budget_draws_it_and_says_so(tmp_path):
    """QA: simulate refuses such a plan (exit 2), plot drew it without a word."""
    graph = tiny_graph(tmp_path)
    plan = json.loads(tiny_plan(tmp_path, graph).read_text())
    plan["budget_bytes"] = plan["predicted"]["peak_bytes"] - 1
    proc = cli("plot", "--plan", _written(tmp_path / "over.json", plan), "--graph", graph,
               "--out", tmp_path / "plots")
    assert proc.returncode == 0, proc.stderr
    assert f"peaks at {plan['predicted']['peak_bytes']} bytes, over its budget of " \
        f"{plan['budget_bytes']} bytes" in proc.stderr
    assert (tmp_path / "plots" / "memory.png").is_file()


def test_a_plan_optimal_by_its_cost_says_why_its_bound_is_below():
    """QA: "optimal (proven optimal by its cost: each node computed once, nothing paged)"
    beside a gap of 10.6% was put down to "costs scaled to integers"."""
    from edge_remat.reports.report import _gap_note
    said = _gap_note({"status": "optimal", "gap": 0.106, "bound_scope": "stage model",
                      "proven_optimal_by": "its cost: each node computed once, nothing paged"})
    assert said == "  (optimal by its cost, as the status says; the bound, stage model, does " \
        "not reach it)"


def test_plan_and_graph_without_an_output_say_nothing_was_written(tmp_path):
    """QA: both did all the work and wrote nothing, with no word of it."""
    proc = cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "1.0", "--solver",
               "heuristic:split", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith(
        "plan not written (no -o): give -o plan.json to keep it"), proc.stdout
    proc = cli("graph", "--model", "mlp", cwd=tmp_path)
    assert proc.returncode == 0 and proc.stdout.rstrip().endswith(
        "graph not written (no -o): give -o graph.json to keep it"), proc.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.json"]


def _written(path: Path, obj) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_an_unknown_hf_model_type_is_named_with_close_ones(tmp_path):
    transformers = pytest.importorskip("transformers", reason="pip install -e '.[hf]'")
    known = len(list(transformers.CONFIG_MAPPING.keys()))  # a lazy mapping: len() says 0
    line = refused(cli("graph", "--model", "hf:gtp2", "--seq", "8", "-o", tmp_path / "g.json"),
                   BAD_INPUT, "does not know the model type 'gtp2' (close: gpt2",
                   f"{known} types known", "local checkpoint directory")
    assert line.endswith("directory")  # whole: not transformers' list of every type, cut off


def test_a_command_that_fails_leaves_no_folder_it_made(tmp_path):
    # bad input writes nothing, not even the --out folder (nor the parents it made for it)
    graph = tiny_graph(tmp_path)
    out = tmp_path / "new" / "plots"
    refused(cli("plot", "--plan", graph, "--graph", graph, "--out", out), BAD_INPUT)
    assert not (tmp_path / "new").exists()
    (tmp_path / "kept").mkdir()  # a folder that was there before stays
    refused(cli("plot", "--plan", graph, "--graph", graph, "--out", tmp_path / "kept"),
            BAD_INPUT)
    assert (tmp_path / "kept").is_dir()


def test_ctrl_c_while_the_cli_imports_is_one_line_and_status_130(tmp_path):
    """A Ctrl-C among the CLI's imports (a second or more on a board) escaped every handler as
    a KeyboardInterrupt traceback. The interrupt is raised here by an import hook, the first
    time `typer` is imported, where a real Ctrl-C lands."""
    import subprocess
    import sys
    hook = ("import sys\n"
            "class Interrupt:\n"
            "    def find_spec(self, name, path=None, target=None):\n"
            "        if name == 'typer':\n"
            "            raise KeyboardInterrupt\n"
            "sys.meta_path.insert(0, Interrupt())\n"
            "sys.argv = ['edge-remat', 'devices']\n"
            "from edge_remat.entry import main\n"
            "main()\n")
    done = subprocess.run([sys.executable, "-c", hook], capture_output=True, text=True,
                          cwd=tmp_path, timeout=60)
    assert done.returncode == 130
    assert done.stderr == "error: interrupted (Ctrl-C)\n"


def _with_stdout_closed(*args, cwd=None):
    """The CLI with a stdout whose reader has gone, as under `edge-remat ... | head`."""
    import os
    import subprocess

    from helpers.bad_inputs import COMMAND, env
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run([*COMMAND, *map(str, args)], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=cwd, timeout=120,
                              env=env())
    finally:
        os.close(write_end)


@pytest.mark.parametrize("buffered", [False, True], ids=["unbuffered", "buffered"])
def test_a_reader_that_stops_reading_stdout_is_no_error(tmp_path, buffered, monkeypatch):
    """`plan -o P | true` said 'error: Broken pipe (check the path ...)', exit 2 (bad input,
    nothing written) though P was written, or exit 1 with --json. A reader that has gone is
    quiet, 141 (128 + SIGPIPE) as other commands; a command that fails keeps its status."""
    monkeypatch.setenv("PYTHONUNBUFFERED", "" if buffered else "1")
    graph = tiny_graph(tmp_path)
    plan = tmp_path / "plan.json"
    done = _with_stdout_closed("plan", "--graph", graph, "--budget", "1.0", "-o", plan)
    assert (done.returncode, done.stderr) == (141, "")
    assert json.loads(plan.read_text())["format"] == "edge-remat/plan"
    done = _with_stdout_closed("version")
    assert (done.returncode, done.stderr) == (141, "")
    done = _with_stdout_closed("plan", "--graph", graph, "--budget", "0.1", "--json")
    assert done.returncode == BAD_INPUT and done.stderr.startswith("error: budget"), done.stderr
    assert "Broken pipe" not in done.stderr


@pytest.mark.parametrize("command", [["--help"], ["plan", "--help"]], ids=" ".join)
def test_help_piped_into_head_is_quiet(command):
    # typer prints help through rich, and a reader gone during it (`edge-remat --help | head -1`)
    # was exit 1 (typer's own catch of EPIPE) with nothing said: 141 as any command's stdout
    done = _with_stdout_closed(*command)
    assert (done.returncode, done.stderr) == (141, "")


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(tmp_path):
    # only stdout's reader going is quiet: a broken pipe elsewhere (a socket, a FIFO written)
    # while stdout is read is reported
    import subprocess
    import sys

    from helpers.bad_inputs import env
    check = "from edge_remat.errors import stdout_closed; print(stdout_closed(BrokenPipeError()))"
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True,
                          env=env(), timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_a_usage_error_with_json_prints_the_object_too(tmp_path):
    """README: with --json a failure also prints one object on stdout; a usage error (a missing
    option, caught by typer before any command runs) printed only the line."""
    proc = cli("plan", "--json", cwd=tmp_path)
    assert proc.returncode == BAD_INPUT
    answer = json.loads(proc.stdout)
    assert answer["status"] == "error" and "Missing option '--graph'" in answer["error"]
    assert proc.stderr.startswith("error: Missing option '--graph'")


def test_a_second_ctrl_c_while_the_error_is_said_keeps_its_line(capsys, monkeypatch):
    """QA: Ctrl-C twice, 0.3 s apart, on `edge-remat job sleep --device B`: the first cancelled
    the job at once, the second came while the line was being made and the command ended at
    130 with no line. Here the second Ctrl-C is a real SIGINT sent to this process then."""
    import os
    import signal
    from edge_remat import errors, outputs

    @errors.cli_errors
    def command():
        raise errors.Interrupted("interrupted (Ctrl-C); cancelled job J on B", job="J",
                                 cancelled=True)
    monkeypatch.setattr(outputs, "remove_folders_left_empty",
                        lambda: os.kill(os.getpid(), signal.SIGINT))
    import typer
    try:
        with pytest.raises(typer.Exit) as ended:
            command()
    except KeyboardInterrupt:
        pytest.fail("the second Ctrl-C ended the command before its line")
    assert ended.value.exit_code == 130
    assert "error: interrupted (Ctrl-C); cancelled job J on B" in capsys.readouterr().err
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C works again


def test_a_heuristic_that_finds_nothing_points_to_the_solver_that_does(tmp_path):
    # it said "try --solver cpsat or milp", which on thousands of nodes is a model too large
    # to build; auto runs them where they fit, and plans here
    from edge_remat.synthetic import random_layered
    graph = tmp_path / "layered.json"
    random_layered(100, seed=3).save(graph)
    line = refused(cli("plan", "--graph", graph, "--budget", "0.5", "--solver", "heuristic:dtr",
                       "--time-limit", "2", "-o", tmp_path / "dtr.json"), BAD_INPUT)
    assert line.endswith("try --solver auto"), line
    proc = cli("plan", "--graph", graph, "--budget", "0.5", "--solver", "auto", "--time-limit",
               "3", "-o", tmp_path / "auto.json")
    assert proc.returncode == 0, proc.stderr
