"""The runtime baseline: what the kernel charges the agent before the first step.

Interpreter, torch, model code, the agent daemon beside it: memory no plan can move. Read from
the memory cgroup the agent runs in (an emulated board's, or a board's own) just before the
first step, where that group has a memory limit; otherwise the process's resident set. A group
without a limit is only a unit of accounting (a container's, a login session's) and holds
whatever else runs there: in this project's CI container it charged 2 GB to a run whose process
peaked at 0.4 GB. The model's parameters and buffers
already in RAM then are planned memory (the plan's fixed bytes), so they are taken out. The
physical memory of training is then (kernel peak - runtime baseline), held against the plan's
predicted peak, so the group's high-water mark restarts here where the kernel lets it
(`peak_restarted`): before, it held the board's capture (a child process that builds and traces
the model, 461 MiB against the steps' 449 MiB for an hf: Llama under a 700 MiB limit) and the
move of the parameters to flash, and the report put them on training. At the job's end
`group_peak` reads that mark back: a board the host does not hold in a cgroup of its own (one
reached over SSH, whose agent runs under a memory limit) reports its kernel peak so.

The allocator's free memory is given back first (glibc's malloc_trim(0), jemalloc's purge:
allocator.give_back_freed_memory), as the profile's runtime figure is read with the heap
trimmed. What the set-up freed (the capture's tracing, the parameters' move to their home)
stays resident in the heap's free chunks otherwise, counted in the baseline, and the steps
then reuse it without a new charge, so the physical figure read low by as much as the set-up
happened to leave: QA's 4-layer hf:gpt2 at operator level, glibc executor, 10 steps, in a
2 GiB cgroup (a throwaway script running run_plan on the run's graph and plan): 10.1 MiB of
free heap chunks at the baseline, 9.5 MiB of it given back; physical 15.1 MiB (3 steps) and
19.7 MiB (10 steps) against a 14.75 MiB plan without the give-back, 31.6 and 31.4 MiB with it.
Under jemalloc (arena executor) the baseline held its dirty pages: `run --allocator arena`
read 0.50x the plan. `given_back_bytes` says how much it was.
"""

from __future__ import annotations

from typing import Any

import torch

from ..allocator import give_back_freed_memory
from ..cgroup_memory import (RESTARTED_PEAK_SCOPE, cgroup_memory_limit_bytes, cgroup_memory_peak,
                             cgroup_memory_usage, restart_cgroup_peak)
from ..profiler.memory import current_rss_bytes


def runtime_baseline(module: torch.nn.Module) -> dict[str, Any]:
    limited = cgroup_memory_limit_bytes() is not None
    before = _charged(limited)[0]
    give_back_freed_memory()  # the heap's free chunks are the steps' to pay (module docstring)
    charged, source, from_cgroup = _charged(limited)
    model = _resident_model_bytes(module)
    restarted = from_cgroup and restart_cgroup_peak()
    return {"bytes": None if charged is None else max(0, charged - model),
            "charged_bytes": charged, "resident_model_bytes": model, "source": source,
            "peak_restarted": restarted, "from_cgroup": from_cgroup,
            # what the allocator held free and gave back just before: not the runtime's
            "given_back_bytes": None if before is None or charged is None
            else max(0, before - charged)}


def _charged(limited: bool) -> tuple[int | None, str, bool]:
    """What the kernel charges now, where it was read, and whether from the memory-limited
    cgroup (else the process's resident set)."""
    group = cgroup_memory_usage() if limited else None
    if group is not None:
        return group[0], group[1], True
    return _rss_bytes(), "process resident set (no memory-limited cgroup)", False


def group_peak(baseline: dict[str, Any]) -> dict[str, Any] | None:
    """The memory-limited cgroup's high-water mark now, where the runtime baseline read that
    group: {"bytes", "source"}, the source saying what it spans. None where it read the
    process's resident set instead."""
    peak = cgroup_memory_peak() if baseline.get("from_cgroup") else None
    if peak is None:
        return None
    scope = (RESTARTED_PEAK_SCOPE if baseline.get("peak_restarted")
             else "since the group began (the kernel lets no restart: capture and set-up in it)")
    return {"bytes": peak[0], "source": f"{peak[1]}, {scope}, to the job's end; read by the "
                                        "board's agent: everything in its group"}


def _resident_model_bytes(module: torch.nn.Module) -> int:
    seen: set[int] = set()
    total = 0
    for tensor in [*module.parameters(), *module.buffers()]:
        storage = tensor.untyped_storage()
        if tensor.device.type != "cpu" or storage.data_ptr() in seen:
            continue
        seen.add(storage.data_ptr())
        total += storage.nbytes()
    return total


def _rss_bytes() -> int | None:
    try:
        return current_rss_bytes()
    except (OSError, ValueError, IndexError):
        return None
