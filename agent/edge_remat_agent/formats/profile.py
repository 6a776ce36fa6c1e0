"""The profile format: what a board's operators, power and storage cost, measured or modelled.

Units: seconds, joules, watts, bytes, bytes per second. An operator's `energy_j` is the energy
above idle (dynamic); idle power is charged separately for the whole step as static energy.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from .errors import FormatError
from .fields import Reader, check_figure, check_header, dump_json, load_json

VERSIONS = (1,)
TIER_NAMES = ("flash", "host")


@dataclass
class Tier:
    """A place to page tensors to: the board's flash, or the host over the link."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    latency_s: float = 0.0
    read_j_per_byte: float = 0.0
    write_j_per_byte: float = 0.0
    capacity_bytes: int | None = None
    # Per-direction latencies, when measured: a flash write with fsync waits milliseconds, a
    # read microseconds. Each overrides latency_s for its direction; absent, latency_s serves both.
    read_latency_s: float | None = None
    write_latency_s: float | None = None
    # What the tier's IO costs compute that runs beside it: seconds of compute lost per second
    # of IO overlapping it, in [0, 1] (0: a spare core, the IO is free; 1: IO stops compute).
    # Measured by the profiler (profiler/contention.py); absent, 0 (written only when not 0).
    compute_share: float = 0.0
    # The measured (bytes, seconds) of each direction, ascending: where present, a transfer's
    # time is read off them (TransferCurve) rather than the line above. A tier's rate changes
    # with size (caches, page faults on fresh buffers), so no one line fits 64 KiB and 8 MiB:
    # the line, fitted on relative error, put a host link's 8 MiB writes at a quarter of the
    # time the profiler measured and a run then paid. The line stays for people, and for tiers
    # given by their figures (a modelled profile, the command line).
    write_curve: "TransferCurve | None" = None
    read_curve: "TransferCurve | None" = None
    # Flash only: reads of a model's frozen weight file (weights/store.py), which go from the
    # device straight into the tensor, with no page header or checksum: 0.97 GB/s for 256 MiB
    # on this machine where a page read, its CRC32 and its staging copy included, took 0.46.
    # Absent (a profile made before it was measured), such reads cost a page's.
    weights_read_curve: "TransferCurve | None" = None

    def write_cost(self, nbytes: int) -> tuple[float, float]:
        latency = self.latency_s if self.write_latency_s is None else self.write_latency_s
        seconds = latency + nbytes / self.write_bytes_per_s if self.write_curve is None \
            else self.write_curve.seconds(nbytes, latency)
        return seconds, nbytes * self.write_j_per_byte

    def read_cost(self, nbytes: int) -> tuple[float, float]:
        return self._read_off(self.read_curve, nbytes)

    def weights_read_cost(self, nbytes: int) -> tuple[float, float]:
        """A read of `nbytes` from the frozen weight file: off its own curve where measured."""
        return self._read_off(self.weights_read_curve or self.read_curve, nbytes)

    def _read_off(self, curve: "TransferCurve | None", nbytes: int) -> tuple[float, float]:
        latency = self.latency_s if self.read_latency_s is None else self.read_latency_s
        seconds = latency + nbytes / self.read_bytes_per_s if curve is None \
            else curve.seconds(nbytes, latency)
        return seconds, nbytes * self.read_j_per_byte

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items()
               if (v is not None or k not in ("read_latency_s", "write_latency_s") + _CURVES)
               and (v != 0.0 or k != "compute_share")}
        for key in _CURVES:
            if out.get(key) is not None:
                out[key] = out[key].to_list()
        return out


_CURVES = ("write_curve", "read_curve", "weights_read_curve")


@dataclass(frozen=True)
class TransferCurve:
    """Measured transfer times, (bytes, seconds) ascending in both, and the time of any size
    read off them: linear between two measured sizes; below the smallest, on the line from
    (0, latency) to it; beyond the largest, at the rate of the last stretch (the marginal cost
    of more bytes, which is what large pages pay)."""

    points: tuple[tuple[int, float], ...]

    def __post_init__(self) -> None:
        sizes = [n for n, _ in self.points]
        times = [t for _, t in self.points]
        if not self.points or sizes[0] <= 0 or times[0] <= 0:
            raise ValueError("a transfer curve needs points of > 0 bytes and > 0 seconds")
        if any(b <= a for a, b in zip(sizes, sizes[1:])) or \
                any(b < a for a, b in zip(times, times[1:])):
            raise ValueError("a transfer curve's sizes must ascend and its times not fall")

    @classmethod
    def measured(cls, sizes: list[int], seconds: list[float]) -> "TransferCurve":
        """From timings, one per size (any order): a smaller size measured slower than a larger
        one is noise, and the larger is taken to cost at least as much."""
        points, slowest = [], 0.0
        for n, t in sorted(zip(sizes, seconds)):
            slowest = max(slowest, t)
            points.append((int(n), slowest))
        return cls(tuple(points))

    def seconds(self, nbytes: int, latency_s: float = 0.0) -> float:
        sizes = [n for n, _ in self.points]
        k = bisect.bisect_left(sizes, nbytes)
        if k < len(sizes) and sizes[k] == nbytes:
            return self.points[k][1]
        if k == 0:
            n1, t1 = self.points[0]
            t0 = min(max(latency_s, 0.0), t1)
            return t0 + (t1 - t0) * nbytes / n1
        if k == len(sizes):
            n1, t1 = self.points[-1]
            if len(sizes) == 1:
                rate = t1 / n1
            else:
                n0, t0 = self.points[-2]
                rate = (t1 - t0) / (n1 - n0) or t1 / n1
            return t1 + (nbytes - n1) * rate
        (n0, t0), (n1, t1) = self.points[k - 1], self.points[k]
        return t0 + (t1 - t0) * (nbytes - n0) / (n1 - n0)

    def to_list(self) -> list[list[float]]:
        return [[n, t] for n, t in self.points]


@dataclass
class OpCost:
    time_s: float
    energy_j: float | None = None
    out_bytes: int | None = None
    workspace_bytes: int | None = None
    # Memory the op's first call leaves to the process for good (oneDNN's primitives and their
    # scratch, kernel caches): fixed memory from the first step on (costs.runtime_warm_bytes).
    persistent_bytes: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class ComputeRates:
    """A board's roofline, for the operators a profile did not time (a modelled profile times
    none): an op takes max(FLOPs / flops_per_s, bytes moved / bytes_per_s) plus a dispatch
    overhead, as the capture's estimate does at its own rates (capture/estimate.py)."""

    flops_per_s: float
    bytes_per_s: float
    op_overhead_s: float | None = None  # absent: the capture's

    def to_dict(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


@dataclass
class Profile:
    source: str  # "measured" | "modelled"
    device: dict[str, Any]
    idle_w: float
    active_w: float
    tiers: dict[str, Tier] = field(default_factory=dict)
    ops: dict[str, OpCost] = field(default_factory=dict)
    ram_total_bytes: int | None = None
    runtime_baseline_bytes: int | None = None
    published_sources: list[str] = field(default_factory=list)  # where a modelled figure came from
    name: str = "profile"
    # How a measured profile's figures were obtained (raw points, fits, sensor, method). Free
    # form, for people and reports; nothing plans from it. Written only when non-empty.
    measurements: dict[str, Any] = field(default_factory=dict)
    compute: ComputeRates | None = None

    @property
    def plan_only(self) -> bool:
        """A board no agent runs on (a microcontroller): its profile plans, it never runs."""
        return bool(self.device.get("plan_only"))

    def to_dict(self) -> dict[str, Any]:
        return {"format": "edge-remat/profile", "version": 1, "name": self.name,
                "source": self.source, "device": self.device,
                "power": {"idle_w": self.idle_w, "active_w": self.active_w},
                "tiers": {k: t.to_dict() for k, t in self.tiers.items()},
                "ops": {k: c.to_dict() for k, c in self.ops.items()},
                **({"compute": self.compute.to_dict()} if self.compute else {}),
                "ram_total_bytes": self.ram_total_bytes,
                "runtime_baseline_bytes": self.runtime_baseline_bytes,
                "published_sources": self.published_sources,
                **({"measurements": self.measurements} if self.measurements else {})}

    def save(self, path: str | Path) -> None:
        dump_json(self.to_dict(), path, finite=True)  # read back strictly, as plans and graphs


_FIELDS = {"format", "version", "name", "source", "device", "power", "tiers", "ops",
           "ram_total_bytes", "runtime_baseline_bytes", "published_sources", "measurements",
           "compute"}
_TIER_FIELDS = {"read_bytes_per_s", "write_bytes_per_s", "latency_s", "read_j_per_byte",
                "write_j_per_byte", "capacity_bytes", "read_latency_s", "write_latency_s",
                "compute_share", "write_curve", "read_curve", "weights_read_curve"}


POWER_NOISE = 0.05  # of idle power: how far a measured busy power may read below idle


def power_noise_w(idle_w: float) -> float:
    """How far below idle a profile's busy power may read and still be taken (as idle: its
    marginal compute power is 0, costs.py): a sensor's noise, 5% of idle power (at least
    0.01 W). Beyond it the profile is refused."""
    return max(POWER_NOISE * idle_w, 0.01)


def profile_from_dict(obj: Any, source: str = "<profile>") -> Profile:
    r = Reader(obj, source)
    check_header(r, "profile", VERSIONS)
    r.reject_unknown(_FIELDS)
    power = r.child("power")
    power.reject_unknown({"idle_w", "active_w"})
    tiers_r = r.child("tiers", {})
    tiers = {}
    for name in tiers_r.obj:
        if name not in TIER_NAMES:
            raise tiers_r.error(name, "a tier named " + " or ".join(TIER_NAMES))
        tiers[name] = tier_from(tiers_r.child(name))
    ops_r = r.child("ops", {})
    ops = {}
    for sig in ops_r.obj:
        o = ops_r.child(sig)
        o.reject_unknown({"time_s", "energy_j", "out_bytes", "workspace_bytes",
                          "persistent_bytes"})
        ops[sig] = OpCost(time_s=o.figure("time_s", "s"),
                          energy_j=o.figure("energy_j", "J", None),
                          out_bytes=o.size("out_bytes", None),
                          workspace_bytes=o.size("workspace_bytes", None),
                          persistent_bytes=o.size("persistent_bytes", None))
    device = r.object("device", None) or {}
    idle_w, active_w = power.figure("idle_w", "W"), power.figure("active_w", "W")
    if idle_w - active_w > power_noise_w(idle_w):
        # QA: idle 10, active 1 planned "compute -8.017 J", and --objective energy would have
        # favoured recomputing; a busy board draws no less than an idle one
        raise FormatError(source, "power.active_w", f"a busy power no lower than idle_w "
                          f"({idle_w:g} W) beyond noise ({power_noise_w(idle_w):g} W)", active_w,
                          "a busy board draws at least its idle power: measure both again "
                          "(edge-remat profile) or correct power.idle_w / power.active_w")
    return Profile(source=r.str("source", choices=("measured", "modelled")), device=device,
                   idle_w=idle_w, active_w=active_w,
                   tiers=tiers, ops=ops, ram_total_bytes=r.size("ram_total_bytes", None),
                   runtime_baseline_bytes=r.size("runtime_baseline_bytes", None),
                   published_sources=list(r.list("published_sources", [])),
                   name=r.str("name", "profile"),
                   measurements=r.object("measurements", None) or {},
                   compute=_compute_from(r))


def _compute_from(r: Reader) -> ComputeRates | None:
    if r.obj.get("compute") is None:
        return None
    c = r.child("compute")
    c.reject_unknown({"flops_per_s", "bytes_per_s", "op_overhead_s"})
    return ComputeRates(flops_per_s=c.rate("flops_per_s", "a rate", "FLOP/s"),
                        bytes_per_s=c.rate("bytes_per_s"),
                        op_overhead_s=c.figure("op_overhead_s", "s", None))


def tier_from(r: Reader) -> Tier:
    r.reject_unknown(_TIER_FIELDS)
    tier = Tier(read_bytes_per_s=r.rate("read_bytes_per_s"),
                write_bytes_per_s=r.rate("write_bytes_per_s"),
                latency_s=r.figure("latency_s", "s", 0.0),
                read_j_per_byte=r.figure("read_j_per_byte", "J", 0.0),
                write_j_per_byte=r.figure("write_j_per_byte", "J", 0.0),
                capacity_bytes=r.size("capacity_bytes", None),
                read_latency_s=r.figure("read_latency_s", "s", None),
                write_latency_s=r.figure("write_latency_s", "s", None),
                compute_share=r.number("compute_share", 0.0, minimum=None),
                write_curve=_curve_from(r, "write_curve"), read_curve=_curve_from(r, "read_curve"),
                weights_read_curve=_curve_from(r, "weights_read_curve"))
    if not 0.0 <= tier.compute_share <= 1.0:
        raise r.error("compute_share", "a share of compute lost per second of IO, from 0 (a "
                      "spare core) to 1 (IO stops compute)", tier.compute_share)
    return tier


def _curve_from(r: Reader, key: str) -> TransferCurve | None:
    rows = r.list(key, None)
    if rows is None:
        return None
    expected = ("[bytes, seconds] pairs, bytes > 0 ascending, seconds > 0 and not falling "
                "(measured transfer times)")
    if not rows or not all(isinstance(row, list) and len(row) == 2 and
                           all(isinstance(x, (int, float)) and not isinstance(x, bool)
                               for x in row) for row in rows):
        raise r.error(key, expected, rows)
    for i, (_, seconds) in enumerate(rows):
        check_figure(r.source, f"{r._path(key)}[{i}][1]", seconds, "s")
    try:
        return TransferCurve(tuple((int(n), float(t)) for n, t in rows))
    except (ValueError, OverflowError):  # OverflowError: a float past 2**63 bytes
        raise r.error(key, expected, rows) from None


def load_profile(path: str | Path) -> Profile:
    return profile_from_dict(load_json(path), str(path))


def share_notes(measurements: dict) -> list[str]:
    """A profile's tiers whose compute_share is not the one measured beside compute, in words
    (from its `measurements` record, which profiler/contention.py writes; none for profiles
    before the fallback existed). Here, not beside the measurement: `plan` reads it and
    imports no torch."""
    notes = []
    for name, tier in sorted((measurements.get("tiers") or {}).items()):
        record = tier.get("compute_share") if isinstance(tier, dict) else None
        if isinstance(record, dict) and record.get("source", "measured") != "measured":
            notes.append(f"{name} compute_share {record.get('share', 0):.2f} is a fallback, "
                         f"not measured beside compute: {record.get('note')}")
    return notes
