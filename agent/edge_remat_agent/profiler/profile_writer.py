"""Assemble what the profiler measured into a profile (`"source": "measured"`) and write it."""

from __future__ import annotations

import os
import time
from typing import Any

from ..formats.profile import OpCost, Profile
from .identity import effective_ram_bytes
from .memory import RuntimeFootprint
from .power import PowerMeasurement
from .tiers import TierMeasurement


class ProfileIncomplete(ValueError):
    """A measured profile cannot be written without a figure it needs (e.g. power)."""


def measured_profile(identity: dict[str, Any], power: PowerMeasurement,
                     flash: TierMeasurement | None = None, host: TierMeasurement | None = None,
                     footprint: RuntimeFootprint | None = None,
                     ops: dict[str, OpCost] | None = None, name: str | None = None,
                     not_measured: dict[str, str] | None = None) -> Profile:
    """`not_measured`: tier -> why, for a tier that was asked for and could not be measured
    (a lost link to the host's page service): kept in the measurements, as the profile says."""
    if not power.measured:
        raise no_power_figures(power.reasons)
    tiers = {m.name: m.fit() for m in (flash, host) if m is not None}
    measurements: dict[str, Any] = {
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "power": power.to_dict(),
        "tiers": {m.name: m.to_dict() for m in (flash, host) if m is not None},
    }
    if not_measured:
        measurements["tiers_not_measured"] = dict(not_measured)
    if footprint is not None:
        measurements["runtime_footprint"] = footprint.to_dict()
    device = dict(identity, sensor=power.sensor, power_estimate=power.estimate)
    return Profile(source="measured", device=device, idle_w=power.idle_w, active_w=power.active_w,
                   tiers=tiers, ops=dict(ops or {}), ram_total_bytes=effective_ram_bytes(identity),
                   runtime_baseline_bytes=footprint.baseline_bytes if footprint else None,
                   name=name or _default_name(identity), measurements=measurements)


def no_power_figures(reasons: list[str]) -> ProfileIncomplete:
    """Why a measured profile cannot be written without power, and what to do."""
    return ProfileIncomplete("no idle/active power figures: " + "; ".join(reasons)
                             + ". Remedy: attach or name a sensor (--sensor NAME), or let "
                             "--sensor auto fall back to the labelled model estimate")


def write_profile(profile: Profile, path: str | os.PathLike) -> None:
    """Through the formats' own writer (atomic: a crash never leaves half a profile)."""
    profile.save(path)


def _default_name(identity: dict[str, Any]) -> str:
    board = identity.get("board") or identity.get("cpu") or identity.get("machine") or "board"
    return f"{board} (measured)"
