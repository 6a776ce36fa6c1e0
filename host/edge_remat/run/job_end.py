"""How a run job that ran to its end ended: every step taken ("finished"), or stopped at a
diverged step by --stop-on-nonfinite ("stopped"). Either way the job itself ended well, so its
outputs (report, checkpoint, weights) came back; the other endings (killed, failed,
cancelled, link_lost) bring none."""

from __future__ import annotations

ENDED_WELL = ("finished", "stopped")


def ended_well_status(result: dict) -> str:
    """"stopped" for a job result with a `stopped_at_step`, else "finished"."""
    return "stopped" if result.get("stopped_at_step") else "finished"
