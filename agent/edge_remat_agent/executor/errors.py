"""What can stop a run, in words an operator can act on. The CLI prints one line, never a
traceback; the daemon's job record carries the same line."""

from __future__ import annotations

from ..daemon.registry import InputRefused
from ..formats import Graph, Instruction


class ExecutorError(RuntimeError):
    """Base class: a run that cannot start or cannot go on."""


class BadInput(ExecutorError, InputRefused):
    """The run's inputs are wrong (plan, graph, batches, options): nothing ran. A board's job
    that raises it is refused as a bad param is (InputRefused)."""


class PlanMismatch(BadInput):
    """The plan was made for another graph than the one captured here."""


class BadBatch(BadInput):
    """A batch from `data` that the captured graph cannot take."""


class InstructionFailed(ExecutorError):
    """An instruction that failed on the board: says which one, and why."""

    def __init__(self, stage: int, position: int, instruction: Instruction, graph: Graph,
                 problem: str):
        self.stage, self.position, self.instruction = stage, position, instruction
        node = graph.node(instruction.node)
        super().__init__(f"stage {stage}, instruction {position} ({instruction}, node "
                         f"'{node.name}'): {problem}")


class OutOfMemory(InstructionFailed):
    """The board ran out of RAM while running an instruction."""


OOM_REMEDY = ("plan with a smaller budget (leave room for the runtime's own footprint, see "
              "the profile's runtime_baseline_bytes), or free memory on the board")


def is_out_of_memory(error: BaseException) -> bool:
    """MemoryError, or the allocator's out-of-memory RuntimeError (CPU or CUDA)."""
    if isinstance(error, MemoryError):
        return True
    if not isinstance(error, RuntimeError):
        return False
    text = str(error).lower()
    return "out of memory" in text or "can't allocate memory" in text \
        or "cannot allocate memory" in text


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
