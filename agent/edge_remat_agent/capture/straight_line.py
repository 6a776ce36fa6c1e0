"""A planner node's ops as one straight-line Python function, generated once per runner.

The runner's per-op loop cost ours about 4% of a step's CPU time on bert-mini (`perf`:
libpython 4.8% of ours' samples against 1.2% of eager's): each op unpacked a dozen fields,
built its argument list, looked values up in a dict and went through the hold bookkeeping.
Here the same work is written out, op by op, as Python source and compiled: values are local
variables, arguments are written in place, and a value that lives and dies inside the node (a
temporary) is registered in and dropped from the ledger directly, without the runner's hold
counts (nothing outside the node can hold it). What the node keeps (its outputs, gradients,
batch-norm statistics, the loss), values a node replays (views another node may hold too)
and results that are not one tensor go through the runner's `hold`/`release`, as before.

The function takes the runner's environment and returns the kept values by name; on an error
it releases what it holds and re-raises. The semantics are those of StepRunner's ops: the
same calls with the same arguments in the same order, the same ledger keys at the same
points, so the ledger's live bytes and peak are what they were.
"""

from __future__ import annotations

import functools
import keyword
from typing import Any, Callable

import torch
from torch import fx

DIRECT, HELD, UNHELD = "direct", "held", "unheld"  # how a value is counted (module docstring)


def compile_node(steps, keep: set[str], replayed: set[str], gradient_values: set[str],
                 ledger: Any, hold: Callable, release: Callable,
                 writer: Any = None) -> Callable[[dict], dict]:
    """`steps`: the node's replay._OpStep list (getitems folded, drops resolved)."""
    code = _Source()
    var: dict[str, str] = {}  # value name -> its local variable
    kind: dict[str, str] = {}
    key: dict[str, str] = {}  # value name -> the slot of its ledger key

    def counted(name: str, value_meta: Any, held: bool) -> str:
        if not held:
            return UNHELD
        if ledger is not None and name not in keep and name not in replayed \
                and name not in gradient_values and isinstance(value_meta, torch.Tensor):
            return DIRECT
        return HELD

    def expr(arg: Any) -> str:
        if isinstance(arg, fx.Node):
            return var[arg.name] if arg.name in var else f"E[{code.const(arg.name)}]"
        if isinstance(arg, (list, tuple)) and any(_has_node(a) for a in arg):
            inner = ", ".join(expr(a) for a in arg)
            return f"[{inner}]" if isinstance(arg, list) else f"({inner},)"
        return code.const(arg)

    for k, step in enumerate(steps):
        # The writer's call for this op (executor/arena.OutWriter.for_op), None: never.
        into = writer.for_op(step.op) if writer is not None and not step.grad_mode else None
        args = ", ".join(expr(a) for a in step.op.args)
        kwargs = ", ".join(f"{name}={expr(value)}" if _plain_name(name)
                           else f"**{{{code.const(name)}: {expr(value)}}}"
                           for name, value in step.kwargs.items())
        call = f"{code.const(step.call)}({', '.join(p for p in (args, kwargs) if p)})"
        # A folded op's tuple goes as soon as its items are taken: a variable holding it
        # would keep every item alive until the node ends.
        result = f"r{k}" if step.items else _new_var(var, step.name)
        if step.grad_mode:  # see trace.GRAD_MODE_OPS: the writer never runs these
            code.line("with _enable_grad():")
            code.line(f"    {result} = {call}")
        elif into is not None:
            kw = ", ".join(f"{code.const(name)}: {expr(value)}"
                           for name, value in step.kwargs.items())
            code.line(f"{result} = {code.const(into)}([{args}], {{{kw}}})")
            code.line(f"if {result} is None:")
            code.line(f"    {result} = {call}")
        else:
            code.line(f"{result} = {call}")
        values = [(step.name, step.op.meta.get("val"), step.held)] if not step.items \
            else [(name, _item_meta(step.op, i), True) for i, name, _ in step.items]
        for i, name, _ in step.items:
            code.line(f"{_new_var(var, name)} = {result}[{i}]")
        if step.items:
            code.line(f"del {result}")
        for name, meta, held in values:
            kind[name] = counted(name, meta, held)
            if kind[name] == DIRECT:
                key[name] = code.const(("value", name, 0))
                code.line(f"_register({key[name]}, {var[name]})")
            elif kind[name] == HELD:
                code.line(f"_hold({code.const(name)}, {var[name]})")
        for name in step.drop:
            if kind[name] == DIRECT:
                code.line(f"_unregister({key[name]})")
            elif kind[name] == HELD:
                code.line(f"_release({code.const(name)})")
            code.line(f"del {var[name]}")
    kept = ", ".join(f"{code.const(name)}: {var[name]}" for name in var if name in keep)
    code.line(f"return {{{kept}}}")

    cleanup = [(var[name], kind[name], name, code.slots[key[name]] if name in key else None)
               for name in var if kind[name] != UNHELD]

    def release_all(bound: dict) -> None:
        for v, how, name, ledger_key in cleanup:
            if v not in bound:
                continue
            if how == HELD:
                release(name)
            elif ledger_key in ledger:  # registered (its registration did not fail)
                ledger.unregister(ledger_key)

    source = "def run(E):\n    try:\n" + "".join(f"        {line}\n" for line in code.lines) \
        + "    except BaseException:\n        _release_all(locals())\n        raise\n"
    namespace = dict(code.slots, _enable_grad=torch.enable_grad, _hold=hold,
                     _release=release, _release_all=release_all,
        _register=getattr(ledger, "register_tensor", None),
        _unregister=getattr(ledger, "unregister", None))
    exec(_compiled(source), namespace)  # noqa: S102 - our own source, as fx does
    return namespace["run"]


@functools.lru_cache(maxsize=4096)
def _compiled(source: str):
    """Compiled once per process: every run_plan makes a new runner, and compiling a model's
    nodes cost about 20 ms (bert-mini) on each run's first step."""
    return compile(source, "<planner node>", "exec")


class _Source:
    def __init__(self):
        self.lines: list[str] = []
        self.slots: dict[str, Any] = {}  # name in the generated code -> the object
        self._slot_of: dict[int, str] = {}

    def line(self, text: str) -> None:
        self.lines.append(text)

    def const(self, value: Any) -> str:
        """A name for `value` in the generated code (objects by identity, no repr round trip)."""
        if value is None or value is True or value is False:
            return repr(value)
        if type(value) is int or type(value) is str:
            return repr(value)
        slot = self._slot_of.get(id(value))
        if slot is None:
            slot = self._slot_of[id(value)] = f"c{len(self.slots)}"
            self.slots[slot] = value
        return slot


def _new_var(var: dict[str, str], name: str) -> str:
    var[name] = f"v{len(var)}"
    return var[name]


def _plain_name(name: str) -> bool:
    return name.isidentifier() and not keyword.iskeyword(name) and not name.startswith("_")


def _has_node(arg: Any) -> bool:
    if isinstance(arg, fx.Node):
        return True
    if isinstance(arg, (list, tuple)):
        return any(_has_node(a) for a in arg)
    return False


def _item_meta(op: fx.Node, i: int) -> Any:
    meta = op.meta.get("val")
    return meta[i] if isinstance(meta, (list, tuple)) and i < len(meta) else None
