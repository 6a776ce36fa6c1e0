"""Integer scaling for CP-SAT: byte counts round exactly, however large the common unit."""

from __future__ import annotations

from edge_remat.planner.scaling import cost_scale, memory_scale


def test_a_budget_one_byte_short_of_a_gigabyte_unit_rounds_down():
    # Every size shares a 2 GiB divisor: the unit is 2 GiB. A budget one byte short of two
    # units holds one tensor, not two (a float tolerance of 1e-9 units, 2 bytes here, let it
    # round up to two, and a plan the solver accepted passed the budget).
    gib2 = 2**31
    scale = memory_scale([gib2, gib2, 2 * gib2], 2 * gib2 - 1)
    assert scale.exact and scale.unit == gib2
    assert scale.down(2 * gib2 - 1) == 1
    assert scale.down(2 * gib2) == 2
    assert scale.up(gib2) == 1
    assert scale.up(gib2 + 1) == 2


def test_small_units_and_decimal_costs_round_as_before():
    scale = memory_scale([4096, 8192], 1 << 20)
    assert (scale.unit, scale.down((1 << 20) - 1), scale.up(4097)) == (4096, 255, 2)
    cost = cost_scale([0.1, 0.2, 0.3], 1.0)
    assert cost.exact and (cost.down(0.3), cost.up(0.3)) == (3, 3)
