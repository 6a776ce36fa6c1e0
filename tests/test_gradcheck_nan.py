"""The gradient check's comparison: the same NaN in eager's and the plan's gradient is equal."""

import torch
from torch import nn

from edge_remat_agent.executor.gradcheck import Reference, compare


def _check(eager_grad, planned_grad):
    module = nn.Linear(2, 1, bias=False)
    reference = Reference(torch.tensor(1.0), {"weight": eager_grad})
    return compare(reference, torch.tensor(1.0), {"weight": planned_grad}, module)


def test_the_same_nan_gradient_is_equal():
    grad = torch.tensor([[float("nan"), 0.5]])
    result = _check(grad, grad.clone())
    assert result["bitwise_equal"] and result["differing"] == []


def test_a_nan_where_the_other_has_a_number_differs():
    result = _check(torch.tensor([[float("nan"), 0.5]]), torch.tensor([[0.0, 0.5]]))
    assert not result["bitwise_equal"] and result["differing"] == ["weight"]
    assert not _check(torch.tensor([[0.0, 0.5]]), torch.tensor([[0.0, 0.25]]))["bitwise_equal"]
