"""A tier's compute_share, measured (profiler/contention.py): what its IO costs compute beside
it, from real stores and a real compute loop."""

from __future__ import annotations

import os
import time

import pytest
import torch

from edge_remat_agent.formats import load_profile
from edge_remat_agent.pages import MemoryStore
from edge_remat_agent.profiler import measure_flash, measured_profile, PowerMeasurement
from edge_remat_agent.profiler.contention import ROUNDS, measure_compute_share


class WaitingStore(MemoryStore):
    """IO that waits without CPU, as a device's DMA would: it should cost compute nothing."""

    def put(self, key, tensor):
        time.sleep(0.002)
        return super().put(key, tensor)


class SpinningStore(MemoryStore):
    """IO that holds the interpreter for 2 ms each put: compute interpreted op by op waits."""

    def put(self, key, tensor):
        end = time.perf_counter() + 0.002
        while time.perf_counter() < end:
            pass
        return super().put(key, tensor)


@pytest.fixture
def one_thread():
    """Compute on one torch thread, as benchmarks/end_to_end.py --threads 1 runs on a loaded
    machine (two spinning intra-op threads on two busy cores stall for seconds here)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_io_that_spins_costs_compute_more_than_io_that_waits(one_thread):
    # More time than the profiler's default 4 s: beside the spinning store a pair takes
    # seconds (compute hardly runs), and the medians compared below need a few pairs each.
    waiting = measure_compute_share(WaitingStore(), page_bytes=64 * 2**10, max_s=30)
    spinning = measure_compute_share(SpinningStore(), page_bytes=64 * 2**10, max_s=30)
    for measured in (waiting, spinning):
        assert 0.0 <= measured.share <= 1.0 and 3 <= len(measured.rounds) <= ROUNDS
        assert measured.threads == 1 and measured.io_cpu_per_io_s is not None
    assert waiting.share < 0.25 < 0.5 < spinning.share
    assert waiting.io_cpu_per_io_s < spinning.io_cpu_per_io_s


def test_the_flash_tier_share_is_measured_and_written(tmp_path, one_thread):
    measurement = measure_flash(tmp_path / "pages", (4096, 65536), min_window_s=0.001)
    share = measurement.contention
    assert share is not None and share.share is not None and 0.0 <= share.share <= 1.0
    assert measurement.fit().compute_share == share.share
    assert os.listdir(tmp_path / "pages") == []  # the probe page is gone
    power = PowerMeasurement(idle_w=1.0, active_w=2.0, sensor="model", estimate=True)
    profile = measured_profile({"machine": "x86_64"}, power, flash=measurement)
    profile.save(tmp_path / "p.json")
    loaded = load_profile(tmp_path / "p.json")
    assert loaded.tiers["flash"].compute_share == share.share
    recorded = loaded.measurements["tiers"]["flash"]["compute_share"]
    assert recorded["share"] == share.share and 0 < len(recorded["rounds"]) <= ROUNDS


def test_unmeasured_share_is_zero(tmp_path):
    measurement = measure_flash(tmp_path, (4096,), min_window_s=0.001, share_s=0)
    assert measurement.contention is None and measurement.fit().compute_share == 0.0
