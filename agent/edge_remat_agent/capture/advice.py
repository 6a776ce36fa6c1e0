"""What a user should hear about a capture before training it (the `graph` command's and the
run's warnings): a float16 model on a CPU without float16 kernels (precision.py), and Python
state the forward changes (python_state.py)."""

from __future__ import annotations


def capture_warnings(captured) -> list[str]:
    """The warnings for a Captured (pipeline.py), each one line, without "warning: "."""
    from .precision import slow_half_kernels
    from .python_state import changed_state_warning
    found = (slow_half_kernels(captured.module),
             changed_state_warning(captured.trace.forward_changes))
    return [line for line in found if line is not None]
