"""The kernel's peak a run reports spans the steps, not the board's capture before them.

On an emulated board the job captures the graph in a child process (torch, the model, the
tracer) and moves homed parameters to flash before step 1; the cgroup's high-water mark held
them, and "kernel peak - runtime baseline" put them on training: an hf: Llama with a LoRA
adapter under a 700 MiB limit, capture child 461 MiB, the steps' highest 449 MiB, reported
1.16x the plan where the steps were 1.02x. The runtime baseline restarts the mark where the
kernel lets it (cgroup v1), and the agent reads the mark back at the job's end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from edge_remat.cgroup import MemoryCgroup, unavailable_reason

MiB = 2**20
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# In the group: 96 MiB touched and given back (what a capture leaves behind), then the baseline.
CHILD = """
import json, mmap, torch
from edge_remat_agent.cgroup_memory import cgroup_memory_usage
from edge_remat_agent.executor.baseline import group_peak, runtime_baseline
setup = mmap.mmap(-1, 96 << 20)
setup.write(b"x" * (96 << 20))
setup.close()
group = "/sys/fs/cgroup/memory" + open("/proc/self/cgroup").read().split("memory:")[1].split()[0]
peak = lambda: int(open(group + "/memory.max_usage_in_bytes").read())
before = peak()
baseline = runtime_baseline(torch.nn.Linear(2, 2))
after = peak()
step = mmap.mmap(-1, 48 << 20)  # what the steps touch, read back as the job's kernel peak
for _ in range(48):
    step.write(b"x" * (1 << 20))  # a MiB at a time: no 48 MiB bytes object beside it
step.close()
print(json.dumps({"before": before, "after": after, "usage": cgroup_memory_usage()[0],
                  "restarted": baseline.get("peak_restarted"), "end": group_peak(baseline)}))
"""


@pytest.mark.cgroup
def test_the_runtime_baseline_restarts_the_kernels_peak():
    if unavailable_reason() is not None:
        pytest.skip(f"no memory cgroup: {unavailable_reason()}")
    group = MemoryCgroup.ensure(f"test-peak-{uuid.uuid4().hex[:8]}", 1024 * MiB)
    try:
        if group.version != 1:
            pytest.skip("cgroup v2: memory.peak has no reset for the whole group")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(
            [os.path.join(REPO, "agent"), os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run(group.exec_prefix() + [sys.executable, "-c", CHILD], env=env,
                             capture_output=True, text=True, timeout=300, check=True).stdout
        figures = json.loads(out.splitlines()[-1])
    finally:
        group.remove()
    assert figures["before"] > figures["usage"] + 64 * MiB  # the set-up's 96 MiB is in it
    assert figures["after"] < figures["usage"] + 16 * MiB, figures  # from the baseline on
    assert figures["restarted"]
    # read back at the job's end, by the agent itself (a board over SSH reports it so)
    end = figures["end"]
    assert figures["usage"] + 40 * MiB < end["bytes"] < figures["usage"] + 64 * MiB, figures
    assert "since the runtime baseline, just before step 1" in end["source"], end


def test_a_boards_summary_says_the_kernel_peak_its_agent_read():
    """The agent's own words (its `run`, and `deploy`'s), on a real report with the reading
    added: the kernel peak, and how far above the runtime baseline it went."""
    from edge_remat_agent.run_command import summary_text
    report = json.loads((Path(REPO) / "tests" / "data" / "h200_bert_mini_run.json").read_text())
    assert "kernel peak" not in summary_text(report)
    source = ("cgroup v1 memory.max_usage_in_bytes of board, since the runtime baseline, just "
              "before step 1, to the job's end; read by the board's agent: everything in its group")
    read = {**report, "runtime_baseline_bytes": 300 * MiB,
            "kernel_peak": {"bytes": 700 * MiB, "source": source}}
    assert f"  kernel peak  700 MiB ({source}); 400 MiB above the runtime baseline" \
        in summary_text(read).splitlines()
