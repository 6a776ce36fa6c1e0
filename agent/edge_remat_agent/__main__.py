"""`python -m edge_remat_agent` is `edge-remat-agent` (how the daemon restarts itself from source)."""

from .cli import run_as_process

run_as_process()
