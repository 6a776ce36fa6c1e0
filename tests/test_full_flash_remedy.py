"""A full flash's remedy names what a user can do with the commands that exist. QA: it said
"plan with a smaller flash capacity", and neither `plan --help` nor `run --help` has a capacity
option. Plans hold their page-outs to the profile's flash capacity (tiers.flash.capacity_bytes:
the free space when it was measured, or the profile job's flash_capacity param), so the remedy
says how to measure it again or set it, and each command and option it names is checked here
against that command's --help."""

from __future__ import annotations

import re

import pytest

from edge_remat_agent.pages import FlashStore, PageStoreFull
from helpers.bad_inputs import cli


def _full_store_message(tmp_path) -> str:
    import torch
    with FlashStore(tmp_path / "pages", capacity_bytes=1024) as store, \
            pytest.raises(PageStoreFull) as full:
        store.put("big", torch.zeros(4096, dtype=torch.uint8))
    return str(full.value)


def test_the_remedy_of_a_full_flash_names_only_options_that_exist(tmp_path):
    message = _full_store_message(tmp_path)
    assert "Remedy:" in message and "smaller flash capacity" not in message, message
    remedy = message.split("Remedy:", 1)[1]
    commands = [span for span in re.findall(r"`([^`]+)`", remedy)
                if span.startswith("edge-remat ")]
    assert {span.split()[1] for span in commands} >= {"run", "profile"}, remedy
    helps = {}
    for span in commands + [span for span in re.findall(r"`(--[^`]+)`", remedy)]:
        command = span.split()[1] if span.startswith("edge-remat ") else "run"
        if command not in helps:
            proc = cli(command, "--help", timeout=60)
            assert proc.returncode == 0, proc.stderr
            helps[command] = proc.stdout
        for option in re.findall(r"(--[a-z][a-z-]*)", span):
            assert re.search(rf"{option}(?![\w-])", helps[command]), (command, option, remedy)
    # `--param flash_capacity=SIZE`: a profile job's param as the board reads it, and the
    # capacity the flash tier is measured with
    assert "--param flash_capacity=SIZE" in remedy and "capacity_bytes" in remedy, remedy
    from edge_remat_agent.profiler import measure_flash
    from edge_remat_agent.profiler.measure import ProfileOptions
    options = ProfileOptions.from_params({"flash_capacity": "16MiB",
                                          "page_dir": str(tmp_path / "probe")})
    assert options.flash_capacity == 16 * 2**20
    flash = measure_flash(options.page_dir, sizes=(4096, 65536), min_window_s=0.001,
                          capacity_bytes=options.flash_capacity, share_s=0)
    assert flash.capacity_bytes == 16 * 2**20
