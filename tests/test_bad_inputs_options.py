"""Bad-input catalogue, options and numbers, and where outputs go: every case is refused
before any graph is solved or captured, in one line, and leaves no file behind (no half-written
plan, no `plan.json.tmp`)."""

from __future__ import annotations

import os

import pytest

from helpers.bad_inputs import BAD_INPUT, REPO, cli, no_new_files, refused, tiny_graph, tiny_plan, tree

pytestmark = pytest.mark.slow

# (case, plan's extra arguments, words the error line must hold)
PLAN_OPTION_CASES = [
    ("budget 1e400", ["--budget", "1e400"], ["larger than any board"]),
    ("budget as words", ["--budget", "lots"], ["lots"]),
    ("budget negative", ["--budget", "-5MiB"], ["budget '-5MiB' must be positive"]),
    # it said "cannot read budget '-1'", where 0 "must be positive"
    ("budget negative fraction", ["--budget", "-1"], ["budget '-1' must be positive"]),
    ("budget zero", ["--budget", "0"], ["positive"]),
    ("budget 2000%", ["--budget", "2000%"], ["times the plain peak"]),
    ("budget and sweep", ["--budget", "0.8", "--sweep", "0.5:1:0.1"], ["exactly one"]),
    ("neither budget nor sweep", [], ["exactly one"]),
    ("sweep of 10^300 budgets", ["--sweep", "0.1:1e300:1e-300"], ["too wide"]),
    ("sweep as words", ["--sweep", "a:b:c"], ["START:STOP:STEP"]),
    ("deadline zero", ["--budget", "0.8", "--deadline", "0"], ["positive"]),
    ("deadline infinite", ["--budget", "0.8", "--deadline", "inf"], ["finite"]),
    ("time limit negative", ["--budget", "0.8", "--time-limit", "-1"], ["--time-limit"]),
    ("time limit nan", ["--budget", "0.8", "--time-limit", "nan"], ["--time-limit"]),
    ("no workers", ["--budget", "0.8", "--workers", "0"], ["--workers"]),
    ("unknown backend", ["--budget", "0.8", "--backend", "gurobi"], ["gurobi"]),
    ("unknown solver", ["--budget", "0.8", "--solver", "magic"], ["magic", "heuristic:split"]),
    ("unknown objective", ["--budget", "0.8", "--objective", "speed"], ["objective"]),
    ("unknown paging", ["--budget", "0.8", "--paging", "sideways"], ["paging"]),
    ("one flash bandwidth", ["--budget", "0.8", "--flash-read-bw", "90MB"], ["both"]),
    ("unknown option", ["--budget", "0.8", "--budjet", "1"], ["--budjet", "--help"]),
    ("workers not a number", ["--budget", "0.8", "--workers", "many"], ["--workers"]),
    ("infeasible budget", ["--budget", "0.1"], ["needs at least"]),
    # it said "finds no schedule within the budget" at the plain peak: nothing to page to
    ("paging heuristic without a tier", ["--budget", "1.0", "--solver", "heuristic:paging"],
     ["heuristic:paging", "--paging flash"]),
]


@pytest.mark.parametrize("case,args,words", PLAN_OPTION_CASES,
                         ids=[c[0] for c in PLAN_OPTION_CASES])
def test_plan_options(tmp_path, case, args, words):
    graph = tiny_graph(tmp_path)
    before = tree(tmp_path)
    refused(cli("plan", "--graph", graph, *args, "-o", tmp_path / "plan.json"), BAD_INPUT,
            *words)
    no_new_files(before, tmp_path)


def test_missing_required_option_is_one_line(tmp_path):
    refused(cli("plan", "--budget", "0.8"), BAD_INPUT, "--graph", "edge-remat plan --help")


def test_unknown_command_is_one_line():
    refused(cli("plna"), BAD_INPUT, "plna")


# (case, command line, words): each refused before anything is captured or run.
OTHER_OPTION_CASES = [
    ("graph: both model and onnx", ["graph", "--model", "mlp", "--onnx", "m.onnx"],
     ["exactly one"]),
    ("graph: unknown optimizer", ["graph", "--model", "mlp", "--optimizer", "lion"], ["lion"]),
    ("graph: operator level of an onnx file", ["graph", "--onnx", "m.onnx", "--operator-level"],
     ["--operator-level", "--model"]),
    ("graph: batch 0", ["graph", "--model", "mlp", "--batch", "0"], ["--batch"]),
    ("graph: empty module", ["graph", "--model", ":make"],  # was "importing  raised ..."
     ["MODULE (before the ':') is empty", "MODULE:FACTORY"]),
    ("graph: empty factory", ["graph", "--model", "m.py:"], ["FACTORY (after the ':') is empty"]),
    # the example inputs are real tensors: one of 1.1 PiB, past any address space (even with
    # overcommit), was an internal error (exit 70)
    ("graph: batch no machine holds", ["graph", "--model", "mlp", "--batch", str(10**11),
                                       "-o", "g.json"],
     [f"example inputs of batch {10**11}", "cannot allocate", "use a smaller --batch"]),
    # below 2^63 but with the bytes of the whole input past 64 bits: "Storage size calculation
    # overflowed", exit 70
    ("graph: batch whose bytes pass 64 bits", ["graph", "--model", "mlp", "--batch",
                                               str(2**62), "-o", "g.json"],
     [f"example inputs of batch {2**62}", "size in bytes passes 64 bits",
      "use a smaller --batch"]),
    # it said "of batch 2 ... use a smaller --batch", where the image was what no machine holds
    ("graph: image no machine holds", ["graph", "--model", "mlp", "--batch", "2", "--image",
                                       str(10**6), "-o", "g.json"],
     [f"example inputs of batch 2, image {10**6}", "use a smaller --batch or --image"]),
    # past 64 bits torch cannot even take the size: "Overflow when unpacking long long", exit 70
    ("graph: batch past a tensor's extent", ["graph", "--model", "mlp", "--batch", str(10**21),
                                             "-o", "g.json"],
     [f"--batch {10**21} does not fit a tensor's 64-bit size", "use a smaller --batch"]),
    ("graph: seq past a tensor's extent", ["graph", "--model", "gpt-tiny", "--seq", str(2**63),
                                           "-o", "g.json"], [f"--seq {2**63}"]),
    ("run: no budget, no limit", ["run", "--device", "local", "--model", "mlp"],
     ["--budget"]),
    ("run: steps 0", ["run", "--device", "local", "--model", "mlp", "--budget", "0.5",
                      "--steps", "0"], ["--steps"]),
    ("run: budget as words", ["run", "--device", "local", "--model", "mlp", "--budget", "half"],
     ["half"]),
    ("run: unknown solver", ["run", "--device", "local", "--model", "mlp", "--budget", "0.5",
                             "--solver", "magic"], ["magic"]),
    ("run: negative lr", ["run", "--device", "local", "--model", "mlp", "--budget", "0.5",
                          "--lr", "-1"], ["--lr"]),
    ("run: memory limit as fraction", ["run", "--device", "local", "--model", "mlp",
                                       "--memory-limit", "50%"], ["memory-limit"]),
    ("run: missing profile", ["run", "--device", "local", "--model", "mlp", "--budget", "0.5",
                              "--profile", "nope.json"], ["nope.json"]),
    ("run: unknown device", ["run", "--device", "no-such-board", "--model", "mlp",
                             "--budget", "0.5"], ["no-such-board"]),
    # it said "give a step before --steps 1 (1 to 0)"
    ("run: --stop-after in a run of one step", ["run", "--device", "local", "--model", "mlp",
                                                "--budget", "0.9", "--steps", "1",
                                                "--stop-after", "1"],
     ["a run of --steps 1 has no step to stop after", "--steps of 2 or more"]),
    ("job: bad --param", ["job", "echo", "--device", "local", "--param", "novalue"],
     ["KEY=VALUE"]),
    ("job: --params not an object", ["job", "echo", "--device", "local", "--params", "[1]"],
     ["JSON object"]),
    # it said "expected a JSON object, got 'Expecting value'": the parser's words as the value
    ("job: --params not JSON", ["job", "echo", "--device", "local", "--params", "{seconds: 1}"],
     ["got '{seconds: 1}'", "it is not JSON (Expecting property name"]),
    ("job: missing input file", ["job", "echo", "--device", "local", "--input", "x=nope.bin"],
     ["nope.bin"]),
]


@pytest.mark.parametrize("case,args,words", OTHER_OPTION_CASES,
                         ids=[c[0] for c in OTHER_OPTION_CASES])
def test_other_options(tmp_path, case, args, words):
    before = tree(tmp_path)
    refused(cli(*args, cwd=tmp_path, timeout=60), BAD_INPUT, *words)
    no_new_files(before, tmp_path)


# --- where outputs go ------------------------------------------------------------------------

def _unwritable_folder(tmp_path):
    """A folder this user cannot write in: /sys as root (mode bits do not stop root)."""
    if os.geteuid() == 0:
        return "/sys"
    folder = tmp_path / "locked"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


def test_plan_output_is_an_existing_file(tmp_path):
    graph = tiny_graph(tmp_path)
    mine = tmp_path / "plan.json"
    mine.write_text("my notes")
    refused(cli("plan", "--graph", graph, "--budget", "0.8", "-o", mine), BAD_INPUT,
            "already exists", "--force")
    assert mine.read_text() == "my notes"
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "-o", mine, "--force")
    assert proc.returncode == 0, proc.stderr
    assert '"edge-remat/plan"' in mine.read_text()
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob(".*.tmp"))


def test_plan_output_is_a_folder(tmp_path):
    graph = tiny_graph(tmp_path)
    (tmp_path / "out").mkdir()
    before = tree(tmp_path)
    refused(cli("plan", "--graph", graph, "--budget", "0.8", "-o", tmp_path / "out"),
            BAD_INPUT, "is a folder")
    no_new_files(before, tmp_path)


def test_plan_output_in_unwritable_folder(tmp_path):
    graph = tiny_graph(tmp_path)
    folder = _unwritable_folder(tmp_path)
    refused(cli("plan", "--graph", graph, "--budget", "0.8", "-o", f"{folder}/plan.json"),
            BAD_INPUT, "cannot")


def test_plan_output_in_proc_gives_the_true_reason(tmp_path):
    """/proc answers a new file with ENOENT: the line said "cannot write in /proc: No such file
    or directory", of a folder that is there."""
    refused(cli("plan", "--graph", tiny_graph(tmp_path), "--budget", "0.8", "-o",
                "/proc/x.json"), BAD_INPUT,
            "cannot write in /proc: its filesystem does not let files be made in it")


def test_plan_output_under_a_file(tmp_path):
    graph = tiny_graph(tmp_path)
    before = tree(tmp_path)
    refused(cli("plan", "--graph", graph, "--budget", "0.8", "-o", graph / "plan.json"),
            BAD_INPUT, "not a folder")
    no_new_files(before, tmp_path)


def test_plan_output_in_new_folders_is_made(tmp_path):
    graph = tiny_graph(tmp_path)
    target = tmp_path / "a" / "b" / "plan.json"
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "-o", target)
    assert proc.returncode == 0, proc.stderr
    assert target.is_file()


def test_sweep_output_is_a_file(tmp_path):
    graph = tiny_graph(tmp_path)
    refused(cli("plan", "--graph", graph, "--sweep", "0.8:1:0.1", "-o", graph), BAD_INPUT,
            "not a folder")


@pytest.mark.parametrize("command,option,what", [
    (["plan", "--budget", "0.8"], "-o", "a file name"),
    (["plan", "--sweep", "0.8:1:0.1"], "-o", "a folder name"),
    (["graph", "--model", "mlp"], "-o", "a file name"),
    (["plot", "--plan", "PLAN"], "--out", "a folder name"),
    (["job", "echo", "--device", "local"], "--out", "a folder name"),
], ids=["plan", "sweep", "graph", "plot", "job"])
def test_an_empty_output_path_is_refused(tmp_path, command, option, what):
    # `-o ''` printed the table, wrote nothing and exited 0 (an empty path read as no -o)
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph) if "PLAN" in command else None
    command = [plan if arg == "PLAN" else arg for arg in command]
    if command[0] in ("plan", "plot"):
        command += ["--graph", graph]
    before = tree(tmp_path)
    refused(cli(*command, option, "", cwd=tmp_path), BAD_INPUT, f"{option} is empty",
            f"give {what}")
    no_new_files(before, tmp_path)


@pytest.mark.parametrize("reads", ["--graph", "--profile", "--model", "--onnx"])
def test_an_output_that_is_the_commands_own_input_is_refused_even_with_force(tmp_path, reads):
    # `plan --graph G -o G --force` replaced the graph with its plan
    graph = tiny_graph(tmp_path)
    kept = tmp_path / "input"
    kept.write_text('{"format": "edge-remat/profile"}')
    command = {"--graph": ["plan", "--graph", kept, "--budget", "0.8"],
               "--profile": ["plan", "--graph", graph, "--profile", kept, "--budget", "0.8"],
               "--model": ["graph", "--model", f"{kept}:make"],
               "--onnx": ["graph", "--onnx", kept]}[reads]
    before = tree(tmp_path)
    refused(cli(*command, "-o", tmp_path / "." / "input", "--force"), BAD_INPUT,
            f"is the {reads} file", "give another file name")
    no_new_files(before, tmp_path)
    assert kept.read_text() == '{"format": "edge-remat/profile"}'


@pytest.mark.parametrize("reads", ["--graph", "--profile"])
def test_a_sweep_folder_whose_plan_names_an_input_is_refused(tmp_path, reads):
    # `plan --graph D/plan-0.80.json --sweep 0.8:0.8:0.1 -o D` replaced the graph with a plan:
    # only output files were checked against the inputs, not the files written into a folder
    out = tmp_path / "sweep"
    out.mkdir()
    graph = tiny_graph(tmp_path)
    kept = out / "plan-0.80.json"
    kept.write_bytes((REPO / "profiles" / "jetson-nano.json").read_bytes() if reads == "--profile"
                     else graph.read_bytes())
    before, text = tree(tmp_path), kept.read_text()
    inputs = {"--graph": ["--graph", kept], "--profile": ["--graph", graph, "--profile", kept]}
    refused(cli("plan", *inputs[reads], "--sweep", "0.8:0.8:0.1", "-o", out), BAD_INPUT,
            f"-o {out} is where this command writes plan-0.80.json, the {reads} file it reads")
    no_new_files(before, tmp_path)
    assert kept.read_text() == text


def test_a_run_folder_that_holds_an_input_at_an_output_name_is_refused(tmp_path):
    """run writes report.json (and graph.json, plan.json, ...) into --out: a --profile kept
    there under one of those names would be replaced at the end of the run."""
    out = tmp_path / "run"
    out.mkdir()
    kept = out / "report.json"
    kept.write_bytes((REPO / "profiles" / "jetson-nano.json").read_bytes())
    before, text = tree(tmp_path), kept.read_text()
    refused(cli("run", "--device", "local", "--model", "mlp", "--budget", "0.5", "--profile",
                kept, "--out", out), BAD_INPUT, "writes report.json, the --profile file")
    no_new_files(before, tmp_path)
    assert kept.read_text() == text


def test_a_sweep_folder_beside_its_inputs_is_fine(tmp_path):
    graph = tiny_graph(tmp_path)
    done = cli("plan", "--graph", graph, "--sweep", "1.0:1.0:0.1", "-o", tmp_path,
               "--solver", "heuristic:keep-all")
    assert done.returncode == 0 and (tmp_path / "plan-1.00.json").is_file(), done.stderr


def test_graph_output_is_a_folder_refused_before_capture(tmp_path):
    before = tree(tmp_path)
    refused(cli("graph", "--model", "mlp", "-o", tmp_path), BAD_INPUT, "is a folder")
    no_new_files(before, tmp_path)


def test_run_out_is_a_file(tmp_path):
    target = tmp_path / "run"
    target.write_text("x")
    refused(cli("run", "--device", "local", "--model", "mlp", "--budget", "0.5", "--out",
                target), BAD_INPUT, "not a folder")


def test_plot_out_unwritable(tmp_path):
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph)
    refused(cli("plot", "--plan", plan, "--graph", graph, "--out",
                f"{_unwritable_folder(tmp_path)}/plots"), BAD_INPUT, "--out")


def test_plan_output_through_a_link_is_written_where_it_points(tmp_path):
    # QA: -o LINK --force replaced the link with a regular file, the file it named untouched
    graph = tiny_graph(tmp_path)
    (tmp_path / "real").mkdir()
    target = tmp_path / "real" / "plan.json"
    target.write_text("old plan")
    link = tmp_path / "link.json"
    link.symlink_to(target)
    proc = cli("plan", "--graph", graph, "--budget", "0.8", "-o", link, "--force")
    assert proc.returncode == 0, proc.stderr
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert '"edge-remat/plan"' in target.read_text()


def test_profile_refuses_an_unknown_model_before_reaching_the_board(tmp_path):
    # QA: it failed on the board, exit 1, after the job was sent; run refuses it at once
    before = tree(tmp_path)
    refused(cli("profile", "--device", "local", "--model", "nosuchmodel", "--out",
                tmp_path / "p", cwd=tmp_path), BAD_INPUT, "not a zoo model", "mlp")
    no_new_files(before, tmp_path)


def test_profile_refuses_a_model_file_of_this_machine_and_names_the_graph_route(tmp_path):
    # QA: the board measured for 16 s, then failed with "No module named 'sq'"
    (tmp_path / "sq.py").write_text("def make():\n    pass\n")
    before = tree(tmp_path)
    refused(cli("profile", "--device", "local", "--model", "sq.py:make", "--out",
                tmp_path / "p", cwd=tmp_path), BAD_INPUT, "names a file of this machine",
            "edge-remat graph --model sq.py:make --output graph.json", "--graph graph.json")
    no_new_files(before, tmp_path)


def test_profile_keeps_its_graph_and_an_earlier_profile_in_its_out_folder(tmp_path):
    # QA: `--graph D/profile.json --out D` replaced the graph with the profile (exit 0), and a
    # second profile into D replaced the first in silence; plan, graph and plot refuse both
    graph = tmp_path / "d" / "profile.json"
    assert cli("graph", "--model", "mlp", "--output", graph).returncode == 0
    before = graph.read_bytes()
    refused(cli("profile", "--device", "local", "--graph", graph, "--out", graph.parent,
                "--force", cwd=tmp_path), BAD_INPUT, "the --graph file it reads",
            "would replace it")
    assert graph.read_bytes() == before
    earlier = tmp_path / "e" / "profile.json"
    earlier.parent.mkdir()
    earlier.write_text("{}")
    refused(cli("profile", "--device", "local", "--out", earlier.parent, cwd=tmp_path),
            BAD_INPUT, "already holds profile.json", "--force")
    assert earlier.read_text() == "{}"


def test_the_profiler_says_a_model_it_cannot_import_before_measuring_anything(tmp_path):
    """The agent's own check, for a MODULE:FACTORY the board lacks: a ValueError (a job's
    one-line error) before the flash is touched, where it came after all the measurements."""
    from edge_remat_agent.profiler.measure import ProfileOptions, measure_profile
    pages = tmp_path / "pages"
    options = ProfileOptions(page_dir=str(pages), model="no_such_module_here:make",
                             idle_s=0.0, busy_s=0.0)
    with pytest.raises(ValueError, match="--model no_such_module_here:make: cannot import "
                       "no_such_module_here.*builds --model to measure"):
        measure_profile(options, say=lambda line: None)
    assert not pages.exists()


def test_the_profilers_footprint_builds_an_hf_spec_as_the_capture_does():
    # it imported a module named 'hf' and failed after the measurements
    from edge_remat_agent.profiler.measure import model_builder
    config = ('hf:bert?config={"hidden_size":32,"num_hidden_layers":1,'
              '"num_attention_heads":2,"intermediate_size":64,"vocab_size":100}')
    module, args = model_builder(config)()
    assert sum(p.numel() for p in module.parameters()) > 0 and args


def test_plan_output_dash_is_refused_not_written_as_a_file_named_dash(tmp_path):
    graph = tiny_graph(tmp_path)
    refused(cli("plan", "--graph", graph, "--budget", "0.8", "-o", "-", cwd=tmp_path),
            BAD_INPUT, "not to stdout")
    assert not (tmp_path / "-").exists()


def test_plan_output_that_is_a_pipe_is_refused_even_with_force(tmp_path):
    # QA: a FIFO (and, as root, /dev/full) became a regular file, and plan said "written"
    graph = tiny_graph(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    refused(cli("plan", "--graph", graph, "--budget", "0.8", "-o", fifo, "--force"),
            BAD_INPUT, "not a regular file")
    assert fifo.is_fifo()


def test_a_sweep_overwrites_plans_in_its_folder_only_with_force(tmp_path):
    # QA: a second sweep into the same folder replaced the first's plans in silence
    graph = tiny_graph(tmp_path)
    out = tmp_path / "sweep"
    out.mkdir()
    (out / "plan-0.90.json").write_text("someone's plan")
    refused(cli("plan", "--graph", graph, "--sweep", "0.8:1:0.1", "-o", out), BAD_INPUT,
            "already holds plan-0.90.json", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["plan-0.90.json"]
    (out / "plan-0.50.json").write_text("an earlier sweep's plan")
    proc = cli("plan", "--graph", graph, "--sweep", "0.8:1:0.1", "-o", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert '"edge-remat/plan"' in (out / "plan-0.90.json").read_text()
    # with --force the earlier sweep's other plans go too, said (QA: they stayed, read as this
    # sweep's)
    assert sorted(p.name for p in out.iterdir()) == ["plan-0.80.json", "plan-0.90.json",
                                                     "plan-1.00.json", "sweep.json"]
    assert f"removed 1 plan of an earlier sweep from {out} (plan-0.50.json)" in proc.stderr


def test_plot_overwrites_its_pngs_only_with_force(tmp_path):
    # plot replaced existing PNGs in silence, where plan -o and graph -o refuse without --force
    graph = tiny_graph(tmp_path)
    plan = tiny_plan(tmp_path, graph)
    out = tmp_path / "plots"
    out.mkdir()
    (out / "memory.png").write_text("someone's figure")
    refused(cli("plot", "--plan", plan, "--graph", graph, "--out", out), BAD_INPUT,
            "memory.png already exists", "--force")
    assert sorted(p.name for p in out.iterdir()) == ["memory.png"]
    assert (out / "memory.png").read_text() == "someone's figure"
    proc = cli("plot", "--plan", plan, "--graph", graph, "--out", out, "--force")
    assert proc.returncode == 0, proc.stderr
    assert (out / "memory.png").read_bytes().startswith(b"\x89PNG")


def test_job_out_is_a_file(tmp_path):
    target = tmp_path / "f"
    target.write_text("x")
    refused(cli("job", "echo", "--device", "local", "--out", target), BAD_INPUT,
            "not a folder")


@pytest.mark.parametrize("where", ["before", "after"])
def test_debug_shows_the_traceback_and_keeps_the_exit_status(tmp_path, where):
    """--debug turned bad input's exit status 2 into Python's 1 (a job failed, by the table)."""
    graph = tiny_graph(tmp_path)
    args = ["plan", "--graph", graph, "--budget", "lots"]
    proc = cli(*(["--debug", *args] if where == "before" else [*args, "--debug"]))
    assert proc.returncode == BAD_INPUT, proc.stderr
    assert "Traceback" in proc.stderr
    assert proc.stderr.rstrip().splitlines()[-1].startswith("error: cannot read budget")
    missing = cli("plan", "--debug", "--graph", tmp_path / "none.json", "--budget", "0.5",
                  "-o", tmp_path / "p.json")
    assert missing.returncode == BAD_INPUT and "Traceback" in missing.stderr
