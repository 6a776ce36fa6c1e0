"""`edge-remat run`: the whole way from a model to a fine-tuned model on a board, reported.

    orchestrate.py  capture -> profile (or a cached one) -> plan -> deploy -> train -> report
    profiles.py     which profile a run plans with: given, cached, measured now, or modelled

The report itself is ../reports/run_report.py, the pictures ../reports/plots.py, the emulated
board (a memory cgroup on this machine) ../transport/emulated.py.
"""

from .orchestrate import RunOptions, RunProblem, run, run_default

__all__ = ["RunOptions", "RunProblem", "run", "run_default"]
