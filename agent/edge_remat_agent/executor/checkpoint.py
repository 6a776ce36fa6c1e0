"""A run's checkpoint (`--checkpoint-every N`) and a run resumed from one (`--resume`).

The checkpoint holds what the next step depends on, so that a run of 6 steps and a run of 3
resumed for 3 more end bit for bit the same:

  weights/NAME        the parameters that train and the persistent buffers (state_dict names,
                      as saved_weights.py's "trained" file)
  optimizer/NAME/KEY  every optimizer state tensor (Adam's step and moments, SGD's momentum),
                      by the parameter's name in the module
  rng/cpu, rng/cuda   the generators' states after the last step (dropout draws from them)
  checkpoint          a plain dict: format, version, steps_done, batches_taken (the data's
                      position: batches already drawn), steps (the run's --steps, which a
                      decaying schedule spans), identity (the options a resume must match),
                      history (the job's step records up to steps_done, each marked with the
                      job_start that trained it, its gradient check, and after_step: the step
                      the job began after, an explicit --resume's): a job its daemon starts
                      again goes on from its own checkpoint and reports every step, and one
                      started again after its last checkpoint trains nothing more;
                      lr_history (the base learning rate by step: --lr may change on a
                      --resume, lr_schedule.lr_history)

It is torch.save's format, written by saved_weights.write_tensors: one tensor at a time
(parameters and optimizer state homed on flash are read from their home one by one, never all
in RAM), under a temporary name renamed over the last checkpoint, so that a kill mid-write
leaves the previous one whole. It is read with mmap: a homed group's state goes from the file
to its home tensor by tensor.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..capture.replay import rng_state, set_rng_state
from .checkpoint_step import FORMAT, META  # torch-free: the job reads the step before torch
from .errors import BadInput
from .save_choice import identity_mismatch
from .saved_weights import _reader, _tensors, load_tensors, write_tensors
from .torch_file import load_torch_file

VERSION = 1
WEIGHTS, OPTIMIZER, RNG = "weights/", "optimizer/", "rng/"
HISTORY = "history"  # the meta's key of the job's steps so far
LR_HISTORY = "lr_history"  # the meta's key of the base learning rate by step


@dataclass
class Checkpointing:
    """What run_plan does about checkpoints: write one to `path` after every `every`-th step
    (0: none but) after the last one it runs, stop after step `stop_after` (None: --steps),
    and start from `resume`. `identity`: the options written into each, which `resume`'s must
    equal."""

    path: Path | None = None
    every: int = 0
    identity: dict = field(default_factory=dict)
    resume: "Checkpoint | None" = None
    stop_after: int | None = None
    written: list = field(default_factory=list)  # each checkpoint's figures
    # `resume` is the job's own newest checkpoint (its daemon started the job again): the
    # job's earlier steps are its own, and a checkpoint after its last step is its end
    own: bool = False

    def due(self, done: int, last: int) -> bool:
        return self.path is not None and (done == last or (self.every > 0
                                                            and done % self.every == 0))

    def history(self) -> dict:
        """What the job's earlier starts left (its own checkpoint's history): their step
        records, gradient check and the step the job began after. A fresh job has none, and
        so has a job resumed with --resume: another job, whose report covers its own steps."""
        if self.resume is None:
            return {"after_step": 0, "steps": [], "grad_check": None}
        kept = self.resume.meta.get(HISTORY) if self.own else None
        if not isinstance(kept, dict):  # --resume (or a checkpoint that kept no history)
            return {"after_step": self.resume.steps_done, "steps": [], "grad_check": None}
        return {"after_step": int(kept.get("after_step") or 0),
                "steps": list(kept.get("steps") or []), "grad_check": kept.get("grad_check")}

    def figures(self) -> dict | None:
        if not self.written and self.resume is None:
            return None
        last = self.written[-1] if self.written else None
        after = self.history()["after_step"]
        return {"file": self.path.name if self.path is not None else None,
                "every": self.every, "written": len(self.written), "last": last,
                # the step of the checkpoint the file holds now
                "step": last["step"] if last else self.resume.steps_done if self.own else None,
                "write_s": sum(w["save_s"] for w in self.written),
                **({"resumed_from_step": after} if after else {}),
                **({"restarted_after_step": self.resume.steps_done} if self.own else {})}


def write_checkpoint(path: Path, module: nn.Module, home, optimizer, steps_done: int,
                     batches_taken: int, steps: int, identity: dict,
                     device: torch.device, history: dict | None = None,
                     lr_history: list | None = None) -> dict:
    """Write the checkpoint after `steps_done` steps; returns its figures. `home`: the run's
    ParameterHome (None: every parameter in RAM); `optimizer`: a torch optimizer or the fused
    graph's FusedUpdates; `history`: the job's steps so far (Checkpointing.history's form);
    `lr_history`: the base learning rate by step (lr_schedule.lr_history)."""
    started = time.perf_counter()
    entries = [(WEIGHTS + key, _reader(name, tensor, home))
               for key, name, tensor in _tensors(module, "trained")]
    values: dict[str, dict] = {}  # optimizer state that is no tensor (a float step, None)
    for name, key, value in _state_values(module, optimizer):
        if callable(value):
            entries.append((f"{OPTIMIZER}{name}/{key}", value))
        elif isinstance(value, torch.Tensor):
            entries.append((f"{OPTIMIZER}{name}/{key}", lambda v=value: v.detach().cpu()))
        else:
            values.setdefault(name, {})[key] = value
    cpu, accelerator = rng_state(device)
    entries.append((RNG + "cpu", lambda: cpu))
    if accelerator is not None:
        entries.append((RNG + "cuda", lambda: accelerator.cpu()))
    meta = {"format": FORMAT, "version": VERSION, "steps_done": steps_done,
            "batches_taken": batches_taken, "steps": steps, "identity": dict(identity),
            "optimizer_values": values, **({HISTORY: history} if history else {}),
            **({LR_HISTORY: lr_history} if lr_history else {})}
    write_tensors(entries, Path(path), {META: meta})
    return {"step": steps_done, "bytes": Path(path).stat().st_size, "tensors": len(entries),
            "save_s": time.perf_counter() - started}


def _state_values(module: nn.Module, optimizer):
    """(parameter name, state key, value or reader) of all the optimizer's state."""
    from .updates import FusedUpdates
    names: dict[int, str] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), name)
    if isinstance(optimizer, FusedUpdates):
        triples = optimizer.state_values()
    else:
        triples = [(param, key, value) for param, state in optimizer.state.items()
                   for key, value in state.items()]
    return [(names[id(param)], key, value) for param, key, value in triples]


@dataclass
class Checkpoint:
    path: Path
    tensors: dict  # torch.load's dict (memory-mapped)
    meta: dict

    @property
    def steps_done(self) -> int:
        return int(self.meta["steps_done"])

    @property
    def batches_taken(self) -> int:
        return int(self.meta["batches_taken"])

    @property
    def lr_history(self) -> list | None:
        """The base learning rate by step up to here (None: a checkpoint that kept none)."""
        kept = self.meta.get(LR_HISTORY)
        return kept if isinstance(kept, list) else None

    def weights(self) -> dict[str, torch.Tensor]:
        return {key[len(WEIGHTS):]: value for key, value in self.tensors.items()
                if key.startswith(WEIGHTS)}

    def optimizer_state(self) -> dict[str, dict[str, Any]]:
        """Parameter name -> its optimizer state (tensors and plain values)."""
        out: dict[str, dict] = {name: dict(values) for name, values in
                                (self.meta.get("optimizer_values") or {}).items()}
        for key, value in self.tensors.items():
            if key.startswith(OPTIMIZER):
                name, _, state_key = key[len(OPTIMIZER):].rpartition("/")
                out.setdefault(name, {})[state_key] = value
        return out

    def rng(self) -> tuple:
        return self.tensors[RNG + "cpu"], self.tensors.get(RNG + "cuda")


def read_checkpoint(path: "str | Path", what: str = "--resume") -> Checkpoint:
    """The checkpoint at `path`; a missing, damaged or foreign file is refused in one line."""
    path = Path(path)
    loaded = load_torch_file(
        path, f"{what}: no checkpoint at {path}",
        lambda why: f"{what}: {path} is not a checkpoint torch.load reads (damaged? {why}): "
                    "resume from an intact one, or start afresh without --resume", mmap=True)
    meta = loaded.get(META) if isinstance(loaded, dict) else None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise BadInput(f"{what}: {path} is no edge-remat checkpoint (a weights file? give the "
                       "folder of a run made with --checkpoint-every)")
    if meta.get("version") != VERSION:
        raise BadInput(f"{what}: {path} is a version {meta.get('version')} checkpoint; this "
                       f"agent reads version {VERSION}: resume with the edge-remat that wrote it")
    tensors = {k: v for k, v in loaded.items() if k != META}
    if not all(isinstance(v, torch.Tensor) for v in tensors.values()) or \
            RNG + "cpu" not in tensors:
        raise BadInput(f"{what}: {path} is missing part of a checkpoint: resume from an intact "
                       "one, or start afresh without --resume")
    return Checkpoint(path, tensors, meta)


def check_resumable(checkpoint: Checkpoint, identity: dict, steps: int, stop_after: int | None,
                    what: str = "--resume", own: bool = False) -> None:
    """A checkpoint this run can go on from: the same options, steps left to take. `own`:
    the job's own checkpoint (its daemon started it again), which may be after its last step
    where it keeps the job's step records: the job then writes its outputs from it."""
    mismatch = identity_mismatch(checkpoint.meta.get("identity") or {}, identity)
    if mismatch:
        raise BadInput(f"{what}: {mismatch}")
    last = stop_after or steps
    finished = own and checkpoint.steps_done == last and \
        bool((checkpoint.meta.get(HISTORY) or {}).get("steps"))
    if checkpoint.steps_done >= last and not finished:
        raise BadInput(f"{what}: the checkpoint is after step {checkpoint.steps_done}, and this "
                       f"run would stop at step {last}: give --steps more than "
                       f"{checkpoint.steps_done}")


def restore_weights(checkpoint: Checkpoint, module: nn.Module, what: str = "--resume") -> None:
    """The checkpoint's parameters and buffers into `module`, before its parameters move to
    their home; refused where they are not exactly the ones this run trains."""
    weights = checkpoint.weights()
    wanted = {key for key, _, _ in _tensors(module, "trained")}
    if set(weights) != wanted:
        odd = sorted(set(weights) ^ wanted)[:3]
        raise BadInput(f"{what}: {checkpoint.path} holds other trained tensors than this run "
                       f"trains ({', '.join(odd)}, ...): it is another model's, or one built "
                       "with other --train or model options")
    load_tensors(module, weights, f"{what} {checkpoint.path}")


def restore_optimizer(checkpoint: Checkpoint, module: nn.Module, optimizer,
                      device: torch.device, what: str = "--resume") -> None:
    """The checkpoint's optimizer state into `optimizer` (a homed group's into its home):
    each parameter's state alone, not torch's load_state_dict, whose param groups would bring
    back the checkpoint's run's learning rate over this run's --lr."""
    from .updates import FusedUpdates
    params = dict(module.named_parameters(remove_duplicate=False))
    for name, state in checkpoint.optimizer_state().items():
        if name not in params or not params[name].requires_grad:
            raise BadInput(f"{what}: {checkpoint.path} has optimizer state for {name!r}, which "
                           "this run does not train: it is another model's checkpoint")
        state = {key: value.to(device, copy=True) if isinstance(value, torch.Tensor)
                 else value for key, value in state.items()}
        if isinstance(optimizer, FusedUpdates):
            optimizer.restore_state(params[name], state)
        else:
            optimizer.state[params[name]] = state


def restore_rng(checkpoint: Checkpoint, device: torch.device) -> None:
    cpu, accelerator = checkpoint.rng()
    set_rng_state((cpu.clone(), accelerator if device.type == "cuda" else None), device)
