"""Power sensors, one class per board family behind PowerSensor, found by name.

    sensor = open_sensor("rapl")          # or detect() to take the first that works
    with EnergyMeter(sensor) as m:
        step()
    print(m.energy_j, m.method)

Every sensor takes `root` (default "/"), prefixed to the sysfs/proc paths it reads.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from .android_battery import AndroidBatterySensor
from .base import EnergyMeter, PowerSensor, SensorError, trapezoid_energy_j
from .ina2xx import Ina219Sensor, Ina260Sensor
from .jetson_ina3221 import JetsonIna3221Sensor
from .model import ModelSensor
from .rapl import RaplSensor
from .rpi5_pmic import Rpi5PmicSensor, is_raspberry_pi_5

SENSORS: dict[str, type[PowerSensor]] = {
    cls.name: cls for cls in (JetsonIna3221Sensor, RaplSensor, AndroidBatterySensor,
                              Rpi5PmicSensor, Ina219Sensor, Ina260Sensor, ModelSensor)
}

# Built-in sensors first, most board-wide and precise first. The external INA219/INA260 are
# not probed (their bus and address are wiring choices, and blind I2C writes can upset other
# chips), and the model is an estimate: both only by name.
DETECT_ORDER = ("jetson-ina3221", "rpi5-pmic", "android-battery", "rapl")

_log = logging.getLogger(__name__)


def open_sensor(name: str, root: str | os.PathLike = "/", **options: Any) -> PowerSensor:
    try:
        cls = SENSORS[name]
    except KeyError:
        raise SensorError(f"no power sensor named {name!r}",
                          "use one of " + ", ".join(sorted(SENSORS))) from None
    return cls(root=root, **options)


def detect(root: str | os.PathLike = "/", *, options: dict[str, dict[str, Any]] | None = None,
           reasons: list[tuple[str, str]] | None = None) -> PowerSensor | None:
    """The first built-in sensor that opens, or None.

    `options` maps a sensor name to its keyword arguments. Why each candidate was passed
    over is appended to `reasons` (and logged), so a None can be explained: RAPL that exists
    but is root-only, for instance.
    """
    options = options or {}
    for name in DETECT_ORDER:
        if name == "rpi5-pmic" and not is_raspberry_pi_5(os.fspath(root)):
            continue  # not a Pi 5: do not run vcgencmd at all
        try:
            return open_sensor(name, root, **options.get(name, {}))
        except SensorError as error:
            _log.debug("power sensor %s not usable: %s", name, error)
            if reasons is not None:
                reasons.append((name, str(error)))
    return None


__all__ = ["SENSORS", "DETECT_ORDER", "open_sensor", "detect", "PowerSensor", "SensorError",
           "EnergyMeter", "trapezoid_energy_j", "JetsonIna3221Sensor", "RaplSensor",
           "AndroidBatterySensor", "Rpi5PmicSensor", "Ina219Sensor", "Ina260Sensor",
           "ModelSensor"]
