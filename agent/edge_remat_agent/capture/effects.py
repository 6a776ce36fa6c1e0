"""Effect tokens out of the joint graph: ops AOTAutograd orders by a token become plain calls.

AOTAutograd threads a token through ops registered as having side effects and wraps each in
`with_effects(token, op, *args)`, with the token a graph input and output of its own. The one a
user's model meets is `aten._linalg_check_errors`, which linalg.solve, inv and cholesky run on
their LAPACK status to raise as eager does on a singular or not positive-definite matrix. It
returns nothing, so the token only keeps it in order: a captured graph runs its nodes in the
order traced, which keeps it there too. Unwrapped, it is a node without output that raises
in the planned step where eager raises. Any other effectful op is refused by name.
"""

from __future__ import annotations

import operator

import torch
from torch import fx

from .errors import CaptureError

# Effectful ops with no output that only check their inputs: safe to run as plain calls.
CHECKS = (torch.ops.aten._linalg_check_errors.default,)


def drop_effect_tokens(model: str, gm: fx.GraphModule) -> None:
    """Replace each `with_effects(token, CHECK, *args)` by `CHECK(*args)` and remove the
    token inputs and outputs; their descriptors' positions become None, which callers skip."""
    from torch._functorch._aot_autograd import descriptors as d
    from torch._higher_order_ops.effects import with_effects
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not with_effects:
            continue
        token, op, *args = node.args
        if op not in CHECKS:
            raise CaptureError(model, f"the model calls {op}, an op with side effects that "
                               "AOTAutograd orders by a token, which the executor does not "
                               "run: remove it from the training step (print, for one, "
                               "outside the model)")
        with graph.inserting_before(node):
            call = graph.call_function(op, tuple(args), dict(node.kwargs))
        call.meta.update({k: v for k, v in node.meta.items() if k != "val"}, val=None)
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem:
                user.replace_all_uses_with(token if user.args[1] == 0 else call)
                graph.erase_node(user)
        graph.erase_node(node)
    output = next(n for n in graph.nodes if n.op == "output")
    descs = output.meta.get("desc") or []
    values = list(output.args[0])
    for position, desc in enumerate(descs):
        if isinstance(desc, d.ForwardTokenAOTOutput):
            values[position] = None
    output.args = (type(output.args[0])(values),)
    for node in list(graph.nodes):
        if node.op == "placeholder" and isinstance(node.meta.get("desc"), d.ForwardTokenAOTInput):
            if node.users:
                raise CaptureError(model, f"effect token {node.name} is still read after "
                                   "its ops were unwrapped")
            graph.erase_node(node)
    gm.recompile()
