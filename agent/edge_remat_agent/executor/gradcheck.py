"""The first step's check: every gradient of the planned step against a plain step's.

The reference runs before the planned step, on the same parameters, batch and generator state,
and leaves the module, its buffers and the generators exactly as they were. Under
`torch.use_deterministic_algorithms(True)` the two must agree bit for bit: the plan runs the
very ATen ops the reference runs, recomputation replays the random state, and paging moves raw
bytes. The reference costs a plain step's memory once, and holds one set of gradients while the
planned step runs: on a board too small for plain training, turn the check off.

Which plain step: on the CPU, eager PyTorch itself. On a CUDA device, the captured step's own
ops replayed once each in the graph's order (`replay_reference`): the ops were traced on the
CPU, and eager on CUDA takes other kernels for some of them (cuDNN's batch norm, the fused
attention's backward, dropout's mask), so eager's gradients differ from any replay of the trace
by up to 0.08 (BERT-mini) or 1.7 (MobileNetV2) on an H200 (docs/boards.md), and a check against
them failed every CUDA run as "a bug". The replay differs from the planned step only in what
the plan decides (order, recomputation, paging, memory), which is what the check is for.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from typing import Any, Callable

import torch
from torch import nn

from ..capture.replay import rng_state, set_rng_state
from .errors import BadInput, ExecutorError, first_line, is_out_of_memory
from .step import eager_forward_backward


@dataclass
class Reference:
    loss: torch.Tensor
    grads: dict[str, torch.Tensor]  # parameter name (duplicates included) -> gradient
    kind: str = "eager"  # or "replay": the report's grad_check.reference (run_command.py)

    @property
    def nbytes(self) -> int:
        unique = {id(g): g for g in self.grads.values()}
        return sum(g.numel() * g.element_size() for g in unique.values())


def eager_reference(module: nn.Module, batch: tuple, device: torch.device | None = None,
                    more: tuple = ()) -> Reference:
    """`more`: the step's further micro-batches, when it accumulates gradients over them (the
    reference's gradients are then the sums, its loss the last micro-batch's)."""
    state = rng_state(device)
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    try:
        for micro in (batch, *more):
            loss = eager_forward_backward(module, micro, 1 + len(more))
        grads = {name: p.grad for name, p in module.named_parameters(remove_duplicate=False)
                 if p.grad is not None}
    except Exception as error:
        raise _out_of_memory(error) or error
    finally:
        for p in module.parameters():
            p.grad = None
        with torch.no_grad():
            for name, b in module.named_buffers():
                b.copy_(buffers[name])  # eager batch norm updated its statistics in place
        set_rng_state(state, device)
    return Reference(loss, grads)


def replay_reference(captured: Any, module: nn.Module, batch: tuple,
                     device: torch.device | None = None, more: tuple = (),
                     load_parameter: Callable[[str], torch.Tensor] | None = None
                     ) -> Reference:
    """The captured step's ops, each node once in the graph's order, its updates left out:
    the plain step of the ops the plan replays (on a device whose eager kernels differ from the
    traced ones). `more`: further micro-batches, their gradients summed in order as eager
    accumulates them; `load_parameter`: the parameters' home, for graphs whose param nodes
    load them."""
    from ..capture.replay import StepRunner
    state = rng_state(device)
    grads: dict[str, torch.Tensor] = {}
    try:
        runner = StepRunner(captured.trace, captured.graph, module, batch, device,
                            load_parameter=load_parameter)
        for micro in (batch, *more):
            runner.start_step(module, micro)
            runner.run_plain()
            for name, grad in runner.grads.items():
                grads[name] = grad if name not in grads else grads[name] + grad
            loss = runner.loss
        runner.release_all()
    except Exception as error:
        raise _out_of_memory(error) or error
    finally:
        set_rng_state(state, device)
    return Reference(loss.detach(), grads, "replay")


def _out_of_memory(error: Exception) -> ExecutorError | None:
    """The one-line error for a reference step that ran out of memory (None: another error)."""
    if not is_out_of_memory(error):
        return None
    failed = ExecutorError(f"the gradient check's plain step ran out of memory "
                           f"({first_line(error)}): this board cannot hold plain training; "
                           "run without the gradient check")
    failed.__cause__ = error
    return failed


def compare(reference: Reference, loss: torch.Tensor, grads: dict[str, torch.Tensor],
            module: nn.Module) -> dict:
    """Bitwise comparison of the loss and of every gradient; the largest absolute difference."""
    params = dict(module.named_parameters(remove_duplicate=False))
    covered = {id(params[name]) for name in grads}
    missing = sorted(name for name in reference.grads if id(params[name]) not in covered)
    extra = sorted(name for name in grads if name not in reference.grads)
    differing, max_diff = [], 0.0
    for name, grad in grads.items():
        ref = reference.grads.get(name)
        if ref is None:
            continue
        if ref.shape != grad.shape or ref.dtype != grad.dtype:
            differing.append(name)
            max_diff = float("inf")
            continue
        if not _equal(ref, grad):
            differing.append(name)
            max_diff = max(max_diff, _max_abs_diff(ref, grad))
    loss_equal = _equal(reference.loss, loss.detach())
    return {"bitwise_equal": not differing and not missing and not extra and loss_equal,
            "max_abs_diff": max_diff, "compared": len(grads) - len(extra),
            # eager_loss: the reference's loss, whichever it is (its name is older than the replay)
            "loss_equal": loss_equal, "eager_loss": float(reference.loss),
            "reference": reference.kind,
            "differing": differing[:20], "missing": missing[:20], "extra": extra[:20],
            "reference_bytes": reference.nbytes}


def _equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, NaN where the other has NaN too: a model whose eager gradients are NaN
    (a sqrt at 0 behind torch.where) is not 'different' when the plan's are the same NaN."""
    return torch.equal(a, b) or (a.is_floating_point() and
                                 torch.equal(a.isnan(), b.isnan()) and
                                 torch.equal(a.nan_to_num(0.0), b.nan_to_num(0.0)))


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    diff = (a.double() - b.double()).abs()
    return float(diff.max()) if diff.numel() else 0.0


@contextlib.contextmanager
def deterministic(device: torch.device):
    """torch.use_deterministic_algorithms(True) for the run, then as it was. On the CPU an op
    without a deterministic kernel raises; elsewhere it only warns (CUDA needs more settings,
    e.g. CUBLAS_WORKSPACE_CONFIG, that a library should not set behind the user's back).

    Deterministic mode also fills every new tensor's memory with NaN by default, a guard
    against ops that read memory they never wrote; no kernel we run does, and the fill cost
    5-25% of a step here (benchmarks/end_to_end.py probes), so it is off for the run."""
    fill = torch.utils.deterministic
    before = (torch.are_deterministic_algorithms_enabled(),
              torch.is_deterministic_algorithms_warn_only_enabled(),
              fill.fill_uninitialized_memory)
    torch.use_deterministic_algorithms(True, warn_only=device.type != "cpu")
    fill.fill_uninitialized_memory = False
    try:
        yield
    except Exception as error:
        # PyTorch's own line says to turn determinism off, which a run cannot do and stay exact
        op = re.search(r"(\w+) does not have a deterministic implementation", str(error))
        if op is None:
            raise
        raise BadInput(f"the model runs {op.group(1)}, which has no deterministic kernel on "
                       f"{device.type}: a planned step must repeat eager PyTorch's bit for bit, "
                       "so every op needs one; replace it in the model (nn.MaxUnpool2d, for "
                       "one: scatter the pooled values by their indices)") from None
    finally:
        torch.use_deterministic_algorithms(before[0], warn_only=before[1])
        fill.fill_uninitialized_memory = before[2]

