"""The board-side profiler: storage tiers, memory, power and identity, written as a profile.

The per-operator profiler is ops.py (imported on its own: it runs captured graph nodes);
`edge-remat-agent profile --graph G` puts all of it into one measured profile.
"""

from .identity import board_identity, effective_ram_bytes
from .memory import (LiveTensorLedger, PeakRssSampler, RuntimeFootprint, current_rss_bytes,
                     measure_runtime_footprint)
from .power import PowerMeasurement, choose_sensor, measure_power
from .profile_writer import ProfileIncomplete, measured_profile, write_profile
from .step_meter import StepMeasurement, StepMeter
from .tiers import (DEFAULT_SIZES, SizePoint, TierMeasurement, measure_flash, measure_link,
                    measure_store, sizes_between)

__all__ = ["board_identity", "effective_ram_bytes", "LiveTensorLedger", "PeakRssSampler",
           "RuntimeFootprint", "current_rss_bytes", "measure_runtime_footprint",
           "PowerMeasurement", "choose_sensor", "measure_power", "ProfileIncomplete",
           "measured_profile", "write_profile", "StepMeasurement", "StepMeter",
           "DEFAULT_SIZES", "SizePoint", "TierMeasurement",
           "measure_flash", "measure_link", "measure_store", "sizes_between"]
