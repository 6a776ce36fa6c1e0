"""Fused parameter updates and the parameters' home: what a fused graph's update and param
nodes do at run time (capture/state.py builds them).

ParameterHome  the page store where parameter groups homed on a tier live between uses, with
               their optimizer state: moved out once before the first step, read by param
               nodes, written back by update nodes (a new version first, then the switch: a
               store's put replaces a page atomically, so a failed write leaves the old one),
               and read back into the module at the end of a run when asked. A group moves
               as one (the store's put_many and get_many: one file on flash).
FusedUpdates   one torch optimizer per update node, over that node's parameter group: stepping
               the groups one by one as their gradients complete gives bit for bit the one
               `optimizer.step()` of plain training (foreach off: every parameter's step is
               computed on its own; capture/optimizer.py). With clipping (a graph captured
               with clip_grad_norm), the norm nodes compute the global norm and each update
               scales its gradients by it (grad_clip.py) in place, or copies where they are
               read again (_step).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ..accumulation import GradientBuffers
from ..capture.optimizer import torch_optimizer, torch_optimizer_over
from ..capture.replay import StepRunner
from ..formats import Graph, Node
from ..formats.graph import CLIP_OP, GRAD_SUMS_OP, GROUP_NORMS_OP, sums_added_apart
from ..grad_clip import clip_with_norm, norm_of_norms, tensor_norms
from ..pages import PageStore


def homed_parameters(graph: Graph) -> dict[str, str]:
    """Parameter name -> its home tier, for the parameters the graph's param nodes load."""
    return {name: node.attrs["home"] for node in graph.nodes if node.kind == "param"
            for name in node.attrs["params"]}


class ParameterHome:
    """Values kept under versioned keys: ("param", name), ("state", name, key) and, while a
    step accumulates micro-batches, ("sum", name) (FusedUpdates.step). An update
    writes the group's new versions beside the old ones and switches only when every write
    succeeded, so a store that fills up mid-update leaves the whole group as it was."""

    def __init__(self, store: PageStore, module: nn.Module, names: list[str],
                 frozen: Any = None, groups: list[list[str]] | None = None):
        """`frozen`: where frozen parameters already live read-only (a weights.PagedWeights
        over the weight page store): those are read from it and never written to `store`.
        `groups`: the names each param node loads together (else one group each)."""
        self.store = store
        self.params = dict(module.named_parameters(remove_duplicate=False))
        self.names = list(names)
        self.frozen = frozen
        self.served = set(frozen.names) & set(self.names) if frozen is not None else set()
        self.versions: dict[tuple, int] = {}
        self.groups = groups if groups is not None else [[name] for name in self.names]

    def move_out(self) -> None:
        """Write every homed parameter to the store, group by group, and release its RAM."""
        moved = set()
        for group in [*self.groups, *([name] for name in self.names)]:  # any in no group alone
            new = [name for name in dict.fromkeys(group)
                   if name not in moved and name not in self.served]
            moved.update(new)
            if new:
                self.commit({("param", name): self.params[name].detach() for name in new})
        for name in self.names:
            self.params[name].data = _empty_like(self.params[name])

    def load(self, name: str) -> torch.Tensor:
        return self.load_many([name])[0]

    def load_many(self, names: list[str]) -> list[torch.Tensor]:
        """A param node's group: read together where the store can."""
        stored = [name for name in names if name not in self.served]
        values = dict(zip(stored, self.get_many([("param", name) for name in stored])))
        return [self.frozen.load(name) if name in self.served else values[name]
                for name in names]

    def get(self, key: tuple) -> torch.Tensor:
        return self.store.get((*key, self.versions[key]))

    def get_many(self, keys: list[tuple]) -> list[torch.Tensor]:
        return self.store.get_many([(*key, self.versions[key]) for key in keys]) if keys else []

    def has(self, key: tuple) -> bool:
        return key in self.versions

    def commit(self, values: dict[tuple, torch.Tensor]) -> None:
        written = [(key, self.versions.get(key, -1) + 1) for key in values]
        # all or none: a failed write leaves every old version
        self.store.put_many([((*key, version), values[key]) for key, version in written])
        for key, version in written:
            old = self.versions.get(key)
            self.versions[key] = version
            if old is not None:
                self.store.discard((*key, old))

    def bring_back(self) -> None:
        """The stored values into the module (for the gradient check's eager reference, and
        at the end of a run that keeps its trained parameters)."""
        from ..weights.deferred import set_parameter  # a served parameter may be on meta
        for name in self.names:
            set_parameter(self.params[name], self.frozen.file.read(name)
                          if name in self.served else self.load(name))

    def release(self) -> None:
        for name in self.names:
            self.params[name].data = _empty_like(self.params[name])


class FusedUpdates:
    def __init__(self, graph: Graph, module: nn.Module, optimizer: str, lr: float | None,
                 home: ParameterHome | None = None, ledger: Any = None,
                 sums: GradientBuffers | None = None):
        """`sums`: the step's gradient sums when it accumulates micro-batches."""
        self.home, self.ledger, self.sums = home, ledger, sums
        self.params = dict(module.named_parameters(remove_duplicate=False))
        self.optimizers: dict[Any, torch.optim.Optimizer] = {}
        self._optimizer_of: dict[int, torch.optim.Optimizer] = {}  # id(parameter) ->
        self._homed_under: dict[int, str] = {}  # id(homed parameter) -> its state's name
        for node in graph.nodes:
            if node.kind == "update" and "update_grads" in node.attrs:
                group = _unique(self.params[name] for name in node.attrs["params"])
                self.optimizers[node.id] = torch_optimizer_over(optimizer, group, lr)
                self._optimizer_of.update((id(p), self.optimizers[node.id]) for p in group)
                if "home" in node.attrs:  # step() keeps a tied group's state under its first
                    for name in node.attrs["params"]:
                        self._homed_under.setdefault(id(self.params[name]), name)
        self._state_keys: dict[str, list[str]] = {}  # homed parameter -> its state's keys
        self._in_ledger: list[tuple] = []  # ledger keys of state loaded for this update
        self._placeholder = {}  # parameter name -> the placeholder its param node loads into
        for node in graph.nodes:
            if node.kind == "param":
                self._placeholder.update(zip(node.attrs["params"], node.attrs["outputs"]))
        self.norms: dict[str, torch.Tensor] = {}  # parameter name -> its gradient's norm
        self.grad_norm: torch.Tensor | None = None  # the step's, from its norm node
        # An accumulating graph run one pass without sums (the profiler): the gradients its
        # sums nodes would add, handed as they are to the update that steps with them, until
        # `release`.
        self._hand_over = sums is None and any(n.attrs.get("summed_apart") for n in graph.nodes)
        self._handed: dict[str, torch.Tensor] = {}

    def _norms(self, node: Node, runner: StepRunner) -> None:
        """Clipping's nodes (capture/clip_nodes.py): a group's gradients' norms, or the
        global norm of all of them that the updates clip with; accumulating, a group's nodes
        add its gradients into the sums (a sums node, capture/sum_nodes.py, does only that)."""
        if node.op in (GROUP_NORMS_OP, GRAD_SUMS_OP):
            pairs = node.attrs["norm_grads" if node.op == GROUP_NORMS_OP else "sum_grads"]
            names = [name for _, name in pairs]
            grads = [runner.env[value] for value, _ in pairs]
            homed_sums = self.sums is not None and "sum_bytes" in node.attrs
            if self.sums is not None:  # the norm is the summed gradients', in the last pass
                if homed_sums and self.sums.index > 0:
                    self._bring_sums(names)
                for name, grad in zip(names, grads):
                    self.sums.add(name, grad)
                if not self.sums.last or node.op == GRAD_SUMS_OP:
                    if homed_sums:
                        self._send_sums_home(names)
                    return
                grads = [self.sums.sums[name] for name in names]
            elif self._hand_over:
                self._handed.update(zip(names, grads))
            if node.op == GRAD_SUMS_OP:
                return
            norms = tensor_norms(grads)
            self.norms.update(zip(names, norms))
            if homed_sums:  # back home until the update node steps with them
                self._send_sums_home(names)
        elif self.sums is None or self.sums.last:
            self.grad_norm = norm_of_norms([self.norms[n] for n in node.attrs["norm_order"]])

    def step(self, node: Node, runner: StepRunner) -> None:
        """The optimizer's step for the node's parameter group, with the gradients the runner
        holds; a homed group's parameters are the values its param node loaded, and its state
        comes from and goes back to the home."""
        if node.op in (GROUP_NORMS_OP, CLIP_OP, GRAD_SUMS_OP):
            return self._norms(node, runner)
        homed_sums = self.sums is not None and "sum_bytes" in node.attrs
        if self.sums is not None:  # accumulating: add, and step in the last micro-pass only
            value_of = {name: value for value, name in node.attrs["update_grads"].items()}
            names = list(value_of)
            # a sums node or clipping's group-norm node added the pass's gradients (_norms)
            added_before = sums_added_apart(node)
            if homed_sums and (self.sums.last if added_before else self.sums.index > 0):
                self._bring_sums(names)
            if not added_before:
                for name, value in value_of.items():
                    self.sums.add(name, runner.env[value])
            if not self.sums.last:
                if homed_sums and not added_before:
                    self._send_sums_home(names)
                return
            grads = {name: self.sums.sums[name] for name in names}
        elif self._hand_over:
            grads = {name: self._handed[name]
                     for name in dict.fromkeys(node.attrs["update_grads"].values())}
        else:
            grads = {name: runner.env[value]
                     for value, name in node.attrs["update_grads"].items()}
        self._step(node, runner, grads)
        if homed_sums:  # stepped with: out of RAM, to the home where the check reads them
            if self.sums.checked:
                self._send_sums_home(list(grads))
            else:
                for name in grads:
                    self.sums.send(name, None)

    def release(self, node: Node) -> None:
        """The gradients handed to update node `node` dropped: the profiler, done with the
        node (it times one step of it many times)."""
        for name in node.attrs.get("update_grads", {}).values():
            self._handed.pop(name, None)

    def _bring_sums(self, names: list[str]) -> None:
        for name, value in zip(names, self.home.get_many([("sum", name) for name in names])):
            self.sums.bring(name, value)

    def _send_sums_home(self, names: list[str]) -> None:
        """The group's sums written to its home and out of RAM (the optimizer does not write
        into a gradient, so the last pass's are sent after its step)."""
        self.home.commit({("sum", name): self.sums.sums[name] for name in names})
        for name in names:
            self.sums.send(name, lambda name=name: self.home.get(("sum", name)))

    def _step(self, node: Node, runner: StepRunner, grads: dict[str, torch.Tensor]) -> None:
        """The group's optimizer step with `grads` (this pass's, or the summed ones)."""
        optimizer = self.optimizers[node.id]
        homed = "home" in node.attrs
        names = node.attrs["params"]
        if homed:
            for name in names:
                self.params[name].data = runner.env[self._placeholder[name]]
            self._load_state(optimizer, names)
        clip = node.attrs.get("clip_grad_norm")
        if clip is None:
            for name, grad in grads.items():
                self.params[name].grad = grad
        else:
            # Scaled in place, as torch's clip_grad_norm_ scales .grad, but on a copy where
            # the gradient is read again: one whose storage another value holds (the plan
            # counts its copy), or the step's gradients kept for the check (its cost, as
            # the kept gradients are).
            copies = set(node.attrs.get("clip_copies", ()))
            checked = runner.keep_grads or (self.sums is not None and self.sums.checked)
            for name, grad in grads.items():
                self.params[name].grad = self._copy(name, grad, name in copies) \
                    if checked or name in copies else grad
        try:
            if clip is not None:
                clip_with_norm([self.params[name] for name in names], clip, self.grad_norm)
            optimizer.step()
        finally:
            for name in names:
                self.params[name].grad = None
            if not homed:
                self._forget_loaded_state()  # the clipped copies
        if homed:
            new = {("param", name): self.params[name].detach() for name in names}
            for name in names:
                state = optimizer.state.pop(self.params[name], {})
                new.update({("state", name, key): value for key, value in state.items()})
                self._state_keys[name] = list(state)
            try:
                self.home.commit(new)  # all or nothing: the old versions stay on failure
            finally:
                self._forget_loaded_state()
                for name in names:
                    self.params[name].data = _empty_like(self.params[name])

    def _copy(self, name: str, grad: torch.Tensor, planned: bool) -> torch.Tensor:
        copy = grad.clone()
        if planned and self.ledger is not None:  # in RAM for the update: its workspace
            self.ledger.register_tensor(("clipped", name), copy)
            self._in_ledger.append(("clipped", name))
        return copy

    def state_values(self) -> list[tuple[torch.Tensor, str, Any]]:
        """(parameter, state key, value) of all the optimizer state, where it lives: a RAM
        group's value as it is, a homed group's as a function that reads it from the home
        (a checkpoint reads them one at a time: checkpoint.py)."""
        out = [(param, key, value) for opt in self.optimizers.values()
               for param, state in opt.state.items() for key, value in state.items()]
        for name, keys in self._state_keys.items():
            out.extend((self.params[name], key,
                        lambda name=name, key=key: self.home.get(("state", name, key)))
                       for key in keys)
        return out

    def restore_state(self, param: torch.Tensor, state: dict[str, Any]) -> None:
        """A parameter's optimizer state from a checkpoint, before the first step: into its
        group's optimizer, or written to the home tensor by tensor for a homed group."""
        name = self._homed_under.get(id(param))
        if name is None:
            self._optimizer_of[id(param)].state[param] = state
            return
        self.home.commit({("state", name, key): value for key, value in state.items()})
        self._state_keys[name] = list(state)

    def state_tensors(self) -> list[torch.Tensor]:
        """The optimizer state held in RAM (groups whose home is RAM)."""
        return [t for opt in self.optimizers.values() for state in opt.state.values()
                for t in state.values() if isinstance(t, torch.Tensor)]

    def _load_state(self, optimizer: torch.optim.Optimizer, names: list[str]) -> None:
        # before the group's first step there is none: the optimizer makes its state
        wanted = [(name, key) for name in names for key in self._state_keys.get(name, ())]
        values = iter(self.home.get_many([("state", name, key) for name, key in wanted]))
        for name in names:
            keys = self._state_keys.get(name)
            if not keys:
                continue
            state = {key: next(values) for key in keys}
            optimizer.state[self.params[name]] = state
            if self.ledger is not None:  # in RAM for the update: the node's workspace
                for key, value in state.items():
                    self.ledger.register_tensor(("state", name, key), value)
                    self._in_ledger.append(("state", name, key))

    def _forget_loaded_state(self) -> None:
        for key in self._in_ledger:
            self.ledger.unregister(key)
        self._in_ledger.clear()


def make_optimizer(graph: Graph, module: torch.nn.Module, lr: float | None,
                   home: ParameterHome | None, ledger, sums: GradientBuffers | None = None
                   ) -> torch.optim.Optimizer | FusedUpdates:
    """What steps the parameters: a fused graph's update nodes, group by group, or one
    optimizer step after the backward."""
    name = graph.capture.get("optimizer", "sgd")
    if graph.capture.get("update") == "fused":
        return FusedUpdates(graph, module, name, lr, home, ledger, sums)
    return torch_optimizer(name, module, lr)


def optimizers_of(optimizer: torch.optim.Optimizer | FusedUpdates) -> list:
    """The torch optimizers that step the parameters (a fused graph's: one per update node)."""
    if isinstance(optimizer, FusedUpdates):
        return list(optimizer.optimizers.values())
    return [optimizer]


def _empty_like(param: torch.Tensor) -> torch.Tensor:
    return torch.empty(0, dtype=param.dtype, device=param.device)


def _unique(params) -> list[torch.Tensor]:
    seen, out = set(), []
    for p in params:
        if id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out
