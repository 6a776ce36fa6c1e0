"""A plan that pages to the host run through `job run` on an SSH board (a real sshd on
loopback): the job gets the host's page service for its life, as deploy's does; `job run
--detach` of it is refused at submit (nothing would hold the service); and the board itself
refuses a run of such a plan without a service, as `edge-remat-agent run` does, rather than
keep the pages in its own RAM. QA: `job run` of a plan with 58 page-outs to the host trained
at 644 MiB RSS, exit 0, the pages in the board's RAM, only run_report.json's note saying so
(deploy's ServiceStore: 391 MiB).
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from helpers.bad_inputs import BAD_INPUT, cli, env, refused, tree
from helpers.board_fixtures import loopback_ssh_board, needs_sshd

pytestmark = [pytest.mark.loopback, needs_sshd]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """The example model's graph and a plan whose every forward node is recomputed from a page
    on `host` (as tests/test_host_pages.py makes it)."""
    from helpers.executor_plans import EXAMPLE, FLASH, every_forward_recomputed, with_paging
    from edge_remat_agent.capture import capture_model
    from edge_remat_agent.costs import build_costs
    from edge_remat_agent.formats import Instruction
    from edge_remat_agent.simulate import simulate
    folder = tmp_path_factory.mktemp("files")
    graph = capture_model(EXAMPLE, batch=4, image=16).graph
    plan = with_paging(every_forward_recomputed(graph), graph, every=1)
    stages = [[Instruction(i.op, i.node, "host") if i.tier == "flash" else i for i in stage]
              for stage in plan.stages]
    sim = simulate(graph, build_costs(graph, None, {"host": FLASH}), stages)
    plan = dataclasses.replace(plan, stages=stages, predicted=sim.summary(),
                               tiers={"host": FLASH})
    graph.save(folder / "graph.json")
    plan.save(folder / "plan.json")
    return folder / "graph.json", folder / "plan.json"


@pytest.fixture(scope="module")
def board(tmp_path_factory):
    with loopback_ssh_board(tmp_path_factory.mktemp("ssh")) as (config, _sshd, workdir):
        yield config, workdir


def test_job_run_pages_to_the_host_page_service(files, board, tmp_path):
    graph, plan = files
    config, _ = board
    out = tmp_path / "out"
    proc = cli("job", "run", "--device", config, "--input", f"plan={plan}", "--input",
               f"graph={graph}", "--param", "steps=1", "--out", out, timeout=300,
               environ=env(HOME=str(tmp_path / "home")))
    assert proc.returncode == 0, proc.stderr
    assert "host pages: page service at 127.0.0.1:" in proc.stderr
    assert "(SSH reverse forward)" in proc.stderr
    report = json.loads((out / "run_report.json").read_text())
    tier = report["tiers"]["host"]
    assert report["page_outs"] > 0 and tier["store"] == "ServiceStore", tier
    assert tier["service"]["peak_bytes"] > 0


def test_job_run_detach_of_a_plan_paging_to_the_host_is_refused_at_submit(files, board,
                                                                          tmp_path):
    graph, plan = files
    config, workdir = board
    before = tree(workdir)
    line = refused(cli("job", "run", "--device", config, "--input", f"plan={plan}", "--input",
                       f"graph={graph}", "--param", "steps=1", "--detach", timeout=120,
                       environ=env(HOME=str(tmp_path / "home"))),
                   BAD_INPUT, "job run --detach", "pages to the host", "page-outs",
                   f"edge-remat deploy {plan} --device {config} --graph {graph}",
                   "--paging flash")
    assert "Traceback" not in line
    assert tree(workdir) == before  # nothing sent


def test_the_board_refuses_a_plan_paging_to_the_host_without_a_page_service(files, board,
                                                                            tmp_path):
    """The plan given as a board path (a file in the loopback board's workdir): the host sees
    no plan to start a service for; the run job refuses it before capturing, exit 2."""
    import shutil
    config, workdir = board
    (workdir / "given").mkdir(parents=True, exist_ok=True)
    for path in files:
        shutil.copy(path, workdir / "given")
    refused(cli("job", "run", "--device", config, "--param", "plan=given/plan.json", "--param",
                "graph=given/graph.json", "--param", "steps=1", timeout=300,
                environ=env(HOME=str(tmp_path / "home"))),
            BAD_INPUT, "the plan pages to the host", "no host page service was given",
            "free none of its RAM", "edge-remat deploy", "--paging flash")


def test_the_agents_own_run_refuses_a_plan_paging_to_the_host(files):
    graph, plan = files
    proc = subprocess.run([sys.executable, "-m", "edge_remat_agent", "run", str(plan),
                           "--graph", str(graph), "--steps", "1"], capture_output=True,
                          text=True, timeout=120, env=env())
    refused(proc, BAD_INPUT, "the plan pages to the host", "this command has none",
            "--paging flash")
