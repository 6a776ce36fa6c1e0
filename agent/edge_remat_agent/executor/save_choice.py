"""What a run saves of its trained weights (`--save`), and the file's name: without torch, so
that the run job reads them before its capture (traced in a child process while this one has
not imported torch: executor/jobs.py) and the host's command line loads no torch for them."""

from __future__ import annotations

from .errors import BadInput

SAVE_CHOICES = ("trained", "all", "none")
DEFAULT_SAVE = "trained"
WEIGHTS_FILE = "weights.pt"  # the run job's output file, fetched by the host


def check_save_choice(which: str) -> str:
    if which not in SAVE_CHOICES:
        raise BadInput(f"unknown save choice {which!r}: use {' | '.join(SAVE_CHOICES)}")
    return which
