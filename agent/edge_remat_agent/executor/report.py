"""The run report: one record per step, and a summary of measured against predicted.

Every figure is in bytes, seconds or joules. `ledger_peak_bytes` is what the plan's memory model
predicts (its own live-tensor ledger); `rss_peak_bytes` is what the process really held,
measured independently (sampled RSS and the kernel's high-water mark, the larger).
"""

from __future__ import annotations

import statistics
from typing import Any

from ..accumulated_step import step_figure
from ..diverged import LossTally, Remedy
from ..profiler import StepMeasurement
from .interpreter import StepCounts

FORMAT = "edge-remat/run-report"
def step_record(step: int, loss: float, measured: StepMeasurement, counts: StepCounts | None,
                device_peak_bytes: int | None = None,
                device_reserved_peak_bytes: int | None = None) -> dict[str, Any]:
    record = {"step": step, "loss": loss, "step_time_s": measured.wall_s,
              "cpu_time_s": measured.cpu_s, "minor_faults": measured.minor_faults,
              "ledger_peak_bytes": measured.ledger_peak_bytes if counts is not None else None,
              "rss_peak_bytes": measured.rss_peak_bytes,
              "rss_start_bytes": measured.rss_start_bytes,
              "rss_peak_kernel_bytes": measured.rss_peak_kernel_bytes,
              "device_peak_bytes": device_peak_bytes,  # CUDA's allocator peak; None on the CPU
              "device_reserved_peak_bytes": device_reserved_peak_bytes,  # taken from the driver
              "energy_j": measured.energy_j, "energy_method": measured.energy_method}
    if counts is not None:
        record.update(counts.to_dict())
    return record


def first_steps_of_starts(starts: list) -> set[int]:
    """The indices of the steps that began a start of the job: the first, and each whose
    job_start (a record's, see job_starts; None: not said) differs from the step before."""
    return {i for i, start in enumerate(starts) if i == 0 or start != starts[i - 1]}


def steady(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The steps that did not begin a start of the job: a start's first step warms caches and
    allocators, reads pages afresh and checks the gradients. All steps where none is left."""
    firsts = first_steps_of_starts([r.get("job_start") for r in records])
    return [r for i, r in enumerate(records) if i not in firsts] or records


def job_starts(records: list[dict[str, Any]], finished_after: int | None = None) -> list[dict]:
    """Which steps each start of the job trained, from the records' job_start:
    [{"start": 1, "after_step": 0, "steps": 4}, {"start": 2, "after_step": 4, "steps": 4}].
    `finished_after`: a last start that trained none (its daemon started the job again after
    its last step's checkpoint), after that step."""
    starts: list[dict] = []
    firsts = first_steps_of_starts([r.get("job_start") for r in records])
    for i, record in enumerate(records):
        if i in firsts:
            starts.append({"start": record.get("job_start") or 1,
                           "after_step": record["step"] - 1, "steps": 0})
        starts[-1]["steps"] += 1
    if finished_after is not None:
        starts.append({"start": (starts[-1]["start"] if starts else 0) + 1,
                       "after_step": finished_after, "steps": 0})
    return starts


def summarize(records: list[dict[str, Any]], predicted: dict[str, Any] | None = None,
              remedy: Remedy | str | None = None) -> dict[str, Any]:
    """Steady-state figures (the first step of each start of the job warms caches and
    allocators: medians skip it when there are more steps) and, for a plan, measured against
    predicted. `remedy`: what to try should a loss not be finite (diverged.remedy_for), told
    of the run's checkpoints: the one a resumed run began after, and each step's that wrote
    one (`checkpoint_s`)."""
    steady_steps = steady(records)
    losses = LossTally(remedy)
    if records and records[0]["step"] > 1:  # resumed from the checkpoint after the step before
        losses.checkpointed(records[0]["step"] - 1)
    for r in records:  # by their own steps: a resumed run's first is not step 1
        losses.see_record(r["step"], r)
    energies = [r["energy_j"] for r in records]
    out: dict[str, Any] = {
        "steps": len(records),
        "step_time_s": statistics.median(r["step_time_s"] for r in steady_steps),
        "first_step_time_s": records[0]["step_time_s"],
        "rss_peak_bytes": max(r["rss_peak_bytes"] for r in records),
        "energy_j": None if any(e is None for e in energies) else sum(energies),
        "final_loss": records[-1]["loss"],
        "nonfinite_loss": losses.found,
    }
    if predicted is None:
        return out
    ledger_peak = max(r["ledger_peak_bytes"] for r in records)
    compute = statistics.median(r["compute_s"] for r in steady_steps)
    recompute = statistics.median(r["recompute_s"] for r in steady_steps)
    paging = statistics.median(r["page_out_s"] + r["page_in_s"] for r in steady_steps)
    io_wait = statistics.median(r.get("io_wait_s", 0.0) for r in steady_steps)
    # the IO thread's time: paging, and reading parameters from their home ahead of use
    io_busy = statistics.median(r["page_out_s"] + r["page_in_s"] + r.get("home_read_s", 0.0)
                                for r in steady_steps)
    out.update({
        "ledger_peak_bytes": ledger_peak,
        "predicted_peak_bytes": predicted["peak_bytes"],
        "ledger_over_predicted_bytes": ledger_peak - predicted["peak_bytes"],
        # The graph's fixed memory counts what the executor holds to the step's end (batch-norm
        # statistics, the loss): the ledger is never above the prediction.
        "ledger_within_prediction": ledger_peak <= predicted["peak_bytes"],
        "predicted_time_s": step_figure(predicted, "time_s"),  # K micro-passes' (--accumulate)
        "compute_s": compute, "recompute_s": recompute, "paging_s": paging,
        "predicted_paging_s": predicted.get("paging_time_s"),
        # Overlapped paging: the time the step waited on the IO thread, and the share of the
        # IO thread's time that compute hid (planned: the simulator's IO timeline).
        "io_wait_s": io_wait,
        "paging_hidden_share": (max(0.0, 1.0 - io_wait / io_busy) if io_busy > 0 and
                                records[-1].get("overlapped") else None),
        "predicted_paging_hidden_share": predicted.get("paging_hidden_share"),
        # Time spent recomputing, as a share of computing each node once: the plan's TDI.
        "recompute_overhead_percent": 100.0 * recompute / compute if compute > 0 else 0.0,
        "predicted_recompute_overhead_percent": predicted.get("tdi_percent"),
    })
    return out
