"""Android (and other Linux phone) battery fuel gauge: power drawn from the battery.

    /sys/class/power_supply/<battery|bms|Battery>/current_now
    /sys/class/power_supply/<battery|bms|Battery>/voltage_now
    /sys/class/power_supply/<...>/status      "Discharging", "Charging", "Full", ...

The kernel ABI says microamps / microvolts with discharge negative, but vendors differ:
some report mA or mV, some report discharge as positive. Calibration, decided once when the
sensor opens and recorded in describe():

* voltage: |v| > 1e5 -> microvolts, else millivolts (a phone cell is 3-4.5 V: ~4e6 uV or
  ~4e3 mV, so the two ranges are far apart).
* current: plausible phone currents are 1 mA .. 10 A, i.e. 1e3..1e7 in uA or 1..1e4 in mA.
  |i| > 1e4 -> microamps (more than 10 A in mA is implausible), else milliamps. The overlap
  (1e3..1e4: 1-10 A in mA, or 1-10 mA in uA) is read as mA because a phone that is running a
  workload draws far more than 10 mA. A reading of 0 postpones the decision to the next
  non-zero reading.
* sign: from `status` (Discharging/Charging) when the current is non-zero, else the ABI's
  "discharge negative".

Each of the three can be forced with `current_unit` ("uA"/"mA"), `voltage_unit` ("uV"/"mV")
and `discharge_sign` (-1: discharge reads negative, +1: discharge reads positive).
The reported power is positive while discharging (and negative while charging).
"""

from __future__ import annotations

import os
from typing import Any

from .base import PowerSensor, SensorError, read_number, read_text

SUPPLY_DIR = "/sys/class/power_supply"
BATTERY_NAMES = ("battery", "bms", "Battery")
UNIT_SCALE = {"uA": 1e-6, "mA": 1e-3, "uV": 1e-6, "mV": 1e-3}
MICRO_VOLT_ABOVE = 1e5
MICRO_AMP_ABOVE = 1e4


def guess_voltage_unit(raw: float) -> str:
    return "uV" if abs(raw) > MICRO_VOLT_ABOVE else "mV"


def guess_current_unit(raw: float) -> str:
    return "uA" if abs(raw) > MICRO_AMP_ABOVE else "mA"


class AndroidBatterySensor(PowerSensor):
    name = "android-battery"

    def __init__(self, root: str | os.PathLike = "/", supply: str | None = None,
                 current_unit: str | None = None, voltage_unit: str | None = None,
                 discharge_sign: int | None = None):
        super().__init__(root)
        for unit, allowed in ((current_unit, ("uA", "mA")), (voltage_unit, ("uV", "mV"))):
            if unit is not None and unit not in allowed:
                raise ValueError(f"unit {unit!r} is not one of {allowed}")
        if discharge_sign not in (None, -1, 1):
            raise ValueError(f"discharge_sign must be -1 or +1, got {discharge_sign!r}")
        self.directory = self._find_supply((supply,) if supply else BATTERY_NAMES)
        self.current_path = os.path.join(self.directory, "current_now")
        self.voltage_path = os.path.join(self.directory, "voltage_now")
        self.status_path = os.path.join(self.directory, "status")
        self.current_unit, self.voltage_unit = current_unit, voltage_unit
        self.discharge_sign = discharge_sign
        self.sources = {"current_unit": "override" if current_unit else "pending",
                        "voltage_unit": "override" if voltage_unit else "pending",
                        "discharge_sign": "override" if discharge_sign else "pending"}
        self.read_power_w()  # calibrates from the first reading, and fails early

    def _find_supply(self, names: tuple[str, ...]) -> str:
        for supply in names:
            directory = self.path(f"{SUPPLY_DIR}/{supply}")
            if all(os.path.exists(os.path.join(directory, f)) for f in ("current_now", "voltage_now")):
                return directory
        raise SensorError(
            f"no current_now + voltage_now under {self.path(SUPPLY_DIR)}/"
            f"{{{','.join(names)}}}",
            "run on a phone whose fuel gauge exposes them (root or `adb shell` may be needed "
            "on recent Android), or pass supply=<name> from /sys/class/power_supply")

    def _calibrate(self, raw_current: float, raw_voltage: float) -> None:
        if self.voltage_unit is None:
            self.voltage_unit = guess_voltage_unit(raw_voltage)
            self.sources["voltage_unit"] = f"magnitude of {raw_voltage:g}"
        if raw_current == 0:
            return
        if self.current_unit is None:
            self.current_unit = guess_current_unit(raw_current)
            self.sources["current_unit"] = f"magnitude of {raw_current:g}"
        if self.discharge_sign is None:
            status = self._status()
            current_sign = 1 if raw_current > 0 else -1
            if status == "Discharging":
                self.discharge_sign = current_sign
                self.sources["discharge_sign"] = f"status Discharging with current {raw_current:g}"
            elif status == "Charging":
                self.discharge_sign = -current_sign
                self.sources["discharge_sign"] = f"status Charging with current {raw_current:g}"
            else:
                self.discharge_sign = -1
                self.sources["discharge_sign"] = f"kernel ABI default (status {status!r})"

    def _status(self) -> str:
        try:
            return read_text(self.status_path)
        except OSError:
            return "unknown"

    def read_power_w(self) -> float:
        try:
            raw_current = read_number(self.current_path)
            raw_voltage = read_number(self.voltage_path)
        except OSError as error:
            raise SensorError(f"cannot read battery gauge: {error}",
                              "check the files are readable (root may be needed)") from error
        self._calibrate(raw_current, raw_voltage)
        if raw_current == 0 or self.current_unit is None or self.discharge_sign is None:
            return 0.0
        volts = raw_voltage * UNIT_SCALE[self.voltage_unit]
        amps = raw_current * UNIT_SCALE[self.current_unit]
        return volts * amps * self.discharge_sign

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "paths": [self.current_path, self.voltage_path],
                "units": {"current": self.current_unit, "voltage": self.voltage_unit},
                "calibration": {"current_unit": self.current_unit,
                                "voltage_unit": self.voltage_unit,
                                "discharge_sign": self.discharge_sign,
                                "decided_by": dict(self.sources)},
                "scope": "whole phone, from the battery; positive while discharging",
                "note": "invalid while on USB power: the charger then feeds the phone"}
