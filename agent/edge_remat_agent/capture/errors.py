"""The one error type of capture; free of torch, so the CLI can catch it without importing torch."""


class CaptureError(ValueError):
    """A model that cannot be captured: names the model and, where known, the offending op."""

    def __init__(self, model: str, problem: str, op: str | None = None, module: str | None = None):
        self.model, self.problem, self.op, self.module = model, problem, op, module
        where = f" in module '{module}'" if module else ""
        what = f": op {op}{where}" if op else where
        super().__init__(f"cannot capture model '{model}'{what}: {problem}")


class GraphMismatch(CaptureError):
    """Capturing again on this machine gave another graph than the file (torch, model code)."""
