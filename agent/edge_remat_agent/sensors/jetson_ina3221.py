"""NVIDIA Jetson on-board INA3221 power monitor (3 channels per chip, 1-2 chips per board).

Two kernel drivers, two sysfs layouts:

* JetPack 4 (L4T 32, NVIDIA's iio driver "ina3221x"):
    /sys/bus/i2c/drivers/ina3221x/<bus>-<addr>/iio:device<N>/
        rail_name_<K>        e.g. "VDD_IN", "POM_5V_IN"
        in_power<K>_input    milliwatts
        in_current<K>_input  milliamps
        in_voltage<K>_input  millivolts
* JetPack 5+ (L4T 35+, mainline hwmon driver "ina3221"):
    /sys/bus/i2c/drivers/ina3221/<bus>-<addr>/hwmon/hwmon<N>/
        in<K>_label          e.g. "VDD_IN" (K = 1..3; in4..in7 are shunt voltages, no label)
        in<K>_input          bus voltage, millivolts
        curr<K>_input        milliamps        -> power = V * I

The total board input rail is picked by label; boards without one (Jetson AGX Xavier,
AGX Orin) fall back to the sum of all rails, which describe() reports.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any

from .base import PowerSensor, SensorError, glob_sorted, read_number, read_text

# Labels of the rail that feeds the whole module, in order of preference.
TOTAL_RAIL_LABELS = ("VDD_IN", "POM_5V_IN")
# Channels wired to nothing are labelled "NC" on some carrier boards.
UNUSED_LABELS = ("NC",)

IIO_GLOB = "/sys/bus/i2c/drivers/ina3221x/*/iio:device*"
HWMON_GLOB = "/sys/bus/i2c/drivers/ina3221/*/hwmon/hwmon*"


@dataclass
class Rail:
    label: str
    # Either power_path (mW), or voltage_path (mV) and current_path (mA).
    power_path: str | None
    voltage_path: str | None
    current_path: str | None

    def read_w(self) -> float:
        if self.power_path is not None:
            return read_number(self.power_path) / 1e3
        assert self.voltage_path is not None and self.current_path is not None
        return read_number(self.voltage_path) * read_number(self.current_path) / 1e6

    def paths(self) -> list[str]:
        return [p for p in (self.power_path, self.voltage_path, self.current_path) if p]


class JetsonIna3221Sensor(PowerSensor):
    name = "jetson-ina3221"

    def __init__(self, root: str | os.PathLike = "/", rail: str | None = None):
        super().__init__(root)
        self.layout, rails = self._find_rails()
        if not rails:
            raise SensorError(
                f"no INA3221 rails under {self.path(IIO_GLOB)} (JetPack 4) or "
                f"{self.path(HWMON_GLOB)} (JetPack 5+)",
                "run on a Jetson module with the ina3221/ina3221x driver loaded, or pick "
                "another sensor (see edge_remat_agent.sensors.SENSORS)")
        self.all_rails = rails
        wanted = (rail,) if rail else TOTAL_RAIL_LABELS
        chosen = next((r for label in wanted for r in rails if r.label == label), None)
        if rail and chosen is None:
            raise SensorError(f"no INA3221 rail labelled {rail!r}; found "
                              + ", ".join(r.label for r in rails),
                              "pass one of the labels found, or no rail to auto-select")
        self.summed = chosen is None
        self.rails = rails if chosen is None else [chosen]
        self.read_power_w()  # fail now, not in the middle of a measurement

    def _find_rails(self) -> tuple[str, list[Rail]]:
        iio = [self._iio_rails(d) for d in glob_sorted(self.root, IIO_GLOB)]
        rails = [r for found in iio for r in found]
        if rails:
            return "jetpack4-iio", rails
        hwmon = [self._hwmon_rails(d) for d in glob_sorted(self.root, HWMON_GLOB)]
        return "jetpack5-hwmon", [r for found in hwmon for r in found]

    @staticmethod
    def _iio_rails(device_dir: str) -> list[Rail]:
        rails = []
        for name_path in glob_sorted(device_dir, "rail_name_*"):
            k = name_path.rsplit("_", 1)[1]
            label = _label(name_path)
            power = os.path.join(device_dir, f"in_power{k}_input")
            volt = os.path.join(device_dir, f"in_voltage{k}_input")
            curr = os.path.join(device_dir, f"in_current{k}_input")
            if label in UNUSED_LABELS:
                continue
            if os.path.exists(power):
                rails.append(Rail(label, power, None, None))
            elif os.path.exists(volt) and os.path.exists(curr):
                rails.append(Rail(label, None, volt, curr))
        return rails

    @staticmethod
    def _hwmon_rails(hwmon_dir: str) -> list[Rail]:
        rails = []
        for label_path in glob_sorted(hwmon_dir, "in*_label"):
            match = re.fullmatch(r"in(\d+)_label", os.path.basename(label_path))
            if match is None:
                continue
            k = match.group(1)
            label = _label(label_path)
            volt = os.path.join(hwmon_dir, f"in{k}_input")
            curr = os.path.join(hwmon_dir, f"curr{k}_input")
            if label not in UNUSED_LABELS and os.path.exists(volt) and os.path.exists(curr):
                rails.append(Rail(label, None, volt, curr))
        return rails

    def read_power_w(self) -> float:
        try:
            return sum(r.read_w() for r in self.rails)
        except OSError as error:
            raise SensorError(f"cannot read INA3221 rail: {error}",
                              "check that the driver is loaded and the files are readable") from error

    def describe(self) -> dict[str, Any]:
        if self.layout == "jetpack4-iio":
            units = {"power": "mW"} if self.rails[0].power_path else {"voltage": "mV", "current": "mA"}
        else:
            units = {"voltage": "mV", "current": "mA", "power": "V*I"}
        rails = [r.label for r in self.rails]
        note = (f"no total-input rail ({'/'.join(TOTAL_RAIL_LABELS)}) found: power is the sum of "
                "all rails, which may miss regulator losses and parts on no monitored rail"
                if self.summed else f"total-input rail {rails[0]}")
        return {"kind": self.name, "layout": self.layout, "rails": rails,
                "all_rails": [r.label for r in self.all_rails], "summed": self.summed,
                "paths": [p for r in self.rails for p in r.paths()], "units": units,
                "calibration": "none (driver reports SI-prefixed units)", "note": note}


def _label(path: str) -> str:
    try:
        return read_text(path)
    except OSError:
        return os.path.basename(path)

