"""Raspberry Pi 5 PMIC rail monitor, read with `vcgencmd pmic_read_adc`.

The firmware prints one line per ADC channel, currents then voltages:

       VDD_CORE_A current(7)=2.45990000A
      VDD_CORE_V volt(15)=0.87910000V
         EXT5V_V volt(24)=5.14656000V

Power is the sum over rails of V * A for rails that have both a `<RAIL>_A` and a `<RAIL>_V`
line (EXT5V and BATT have a voltage only). That is the power leaving the PMIC's regulators:
it leaves out their conversion losses and whatever USB devices draw from 5 V directly.
"""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any, Callable, Sequence

from .base import PowerSensor, SensorError

COMMAND = ("vcgencmd", "pmic_read_adc")
LINE = re.compile(r"^\s*(?P<rail>\S+)_(?P<kind>[AV])\s+(?:current|volt)\(\d+\)="
                  r"(?P<value>[-+]?\d+(?:\.\d*)?(?:[eE][-+]?\d+)?)[AV]\s*$")
MODEL_FILES = ("/proc/device-tree/model", "/sys/firmware/devicetree/base/model")

Runner = Callable[[Sequence[str]], str]


def run_vcgencmd(argv: Sequence[str], timeout_s: float = 5.0) -> str:
    """Default runner: the real command, stdout as text."""
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError as error:
        raise SensorError(f"`{argv[0]}` not found on PATH (needed for {' '.join(argv)})",
                          "install it (`sudo apt install raspi-utils`, or libraspberrypi-bin on "
                          "older images) on a Raspberry Pi 5") from error
    except subprocess.TimeoutExpired as error:
        raise SensorError(f"`{' '.join(argv)}` did not answer within {timeout_s} s",
                          "check the firmware mailbox (/dev/vcio) is not busy") from error
    if done.returncode != 0:
        raise SensorError(f"`{' '.join(argv)}` failed ({done.returncode}): "
                          f"{(done.stderr or done.stdout).strip()}",
                          "run on a Raspberry Pi 5 with current firmware, as a user in the "
                          "`video` group (access to /dev/vcio)")
    return done.stdout


def parse_pmic_adc(text: str) -> tuple[dict[str, float], dict[str, float]]:
    """(amps by rail, volts by rail) from `vcgencmd pmic_read_adc` output."""
    amps: dict[str, float] = {}
    volts: dict[str, float] = {}
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            target = amps if match["kind"] == "A" else volts
            target[match["rail"]] = float(match["value"])
    return amps, volts


def is_raspberry_pi_5(root: str = "/") -> bool:
    for model_file in MODEL_FILES:
        try:
            with open(os.path.join(root, model_file.lstrip("/")), "rb") as handle:
                if b"Raspberry Pi 5" in handle.read():
                    return True
        except OSError:
            continue
    return False


class Rpi5PmicSensor(PowerSensor):
    name = "rpi5-pmic"

    def __init__(self, root: str | os.PathLike = "/", runner: Runner | None = None,
                 command: Sequence[str] = COMMAND):
        """`runner(argv) -> stdout` is injectable, so tests can feed recorded output."""
        super().__init__(root)
        self.runner: Runner = runner or run_vcgencmd
        self.command = tuple(command)
        self.rails: list[str] = []
        self.read_power_w()  # fail now if the command or its output is unusable

    def read_rails(self) -> dict[str, tuple[float, float]]:
        """(volts, amps) for each rail that has both readings."""
        amps, volts = parse_pmic_adc(self.runner(self.command))
        both = {rail: (volts[rail], amps[rail]) for rail in amps if rail in volts}
        if not both:
            raise SensorError(f"no <RAIL>_A / <RAIL>_V line pairs in the output of "
                              f"`{' '.join(self.command)}`",
                              "this needs a Raspberry Pi 5 (earlier Pis have no such PMIC) "
                              "with firmware from late 2023 or newer (`sudo rpi-eeprom-update`)")
        return both

    def read_power_w(self) -> float:
        rails = self.read_rails()
        self.rails = sorted(rails)
        return sum(v * a for v, a in rails.values())

    def describe(self) -> dict[str, Any]:
        return {"kind": self.name, "command": " ".join(self.command), "rails": self.rails,
                "paths": [], "units": {"current": "A", "voltage": "V"},
                "calibration": "none (firmware reports SI units)",
                "scope": "sum of PMIC rail outputs; excludes regulator losses and USB 5 V loads"}
