"""`edge-remat run`: the whole way from a model to a fine-tuned model on a board, reported.

    options.py      what a run is asked for, and every check of it before any work
    orchestrate.py  capture -> profile (or a cached one) -> plan -> deploy -> train -> report
    profiles.py     which profile a run plans with: given, cached, measured now, or modelled;
                    one the run's steps contradict is taken out of the cache

The report itself is ../reports/run_report.py, the pictures ../reports/plots.py, the emulated
board (a memory cgroup on this machine) ../transport/emulated.py.
"""

from .options import RunOptions, RunProblem, run_default
from .orchestrate import run

__all__ = ["RunOptions", "RunProblem", "run", "run_default"]
