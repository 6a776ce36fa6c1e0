"""External TI INA219 / INA260 power monitors on an I2C bus, read through /dev/i2c-<N>.

Registers are 16 bits, sent most significant byte first. The chip is put in the path of
the board's supply, so it sees the whole board.

    INA260 (integrated 2 mOhm shunt)         INA219 (external shunt resistor)
    0x01 current, signed, 1.25 mA/LSB        0x01 shunt voltage, signed, 10 uV/LSB
    0x02 bus voltage, 1.25 mV/LSB            0x02 bus voltage, bits 15..3, 4 mV/LSB
    0x03 power, 10 mW/LSB

The register reader is a small injectable object with `read_word(reg) -> int`, so tests can
supply register values; I2CDevice is the real one.
"""

from __future__ import annotations

import os
from typing import Any, Protocol

from .base import PowerSensor, SensorError

I2C_SLAVE = 0x0703  # ioctl request from <linux/i2c-dev.h>: address later reads/writes
DEFAULT_ADDRESS = 0x40


class RegisterReader(Protocol):
    def read_word(self, reg: int) -> int: ...


class I2CDevice:
    """A chip at `address` on /dev/i2c-<bus>: write the register pointer, read two bytes."""

    def __init__(self, bus: int, address: int, root: str = "/"):
        import fcntl  # POSIX only; imported here so the module loads anywhere

        self.path = os.path.join(root, f"dev/i2c-{bus}")
        self.address = address
        try:
            self.fd = os.open(self.path, os.O_RDWR)
        except FileNotFoundError as error:
            raise SensorError(f"no I2C bus device {self.path}",
                              "enable I2C (`sudo modprobe i2c-dev`; on a Pi `raspi-config`) "
                              "and pass the right bus number") from error
        except PermissionError as error:
            raise SensorError(f"{self.path} is not readable and writable by this user",
                              "run as root or add the user to the `i2c` group") from error
        try:
            fcntl.ioctl(self.fd, I2C_SLAVE, address)
        except OSError as error:
            os.close(self.fd)
            raise SensorError(f"cannot address I2C device 0x{address:02x} on {self.path}: {error}",
                              "check the address with `i2cdetect -y <bus>`; a kernel driver "
                              "bound to it (ina2xx hwmon) must be unbound first") from error

    def read_word(self, reg: int) -> int:
        os.write(self.fd, bytes([reg]))
        data = os.read(self.fd, 2)
        if len(data) != 2:
            raise SensorError(f"short read ({len(data)} bytes) from register 0x{reg:02x} "
                              f"of 0x{self.address:02x} on {self.path}",
                              "check the wiring and pull-up resistors")
        return int.from_bytes(data, "big")

    def close(self) -> None:
        os.close(self.fd)


def signed16(word: int) -> int:
    return word - 0x10000 if word & 0x8000 else word


class _Ina2xxSensor(PowerSensor):
    def __init__(self, root: str | os.PathLike = "/", bus: int = 1,
                 address: int = DEFAULT_ADDRESS, backend: RegisterReader | None = None):
        super().__init__(root)
        self.bus = bus
        self.address = address
        self.backend = backend if backend is not None else I2CDevice(bus, address, self.root)

    def read_bus_voltage_v(self) -> float:
        raise NotImplementedError

    def read_current_a(self) -> float:
        raise NotImplementedError

    def read_power_w(self) -> float:
        # The shunt's wiring direction decides the current's sign; the board draws power
        # either way, so the magnitude is what is reported.
        return abs(self.read_bus_voltage_v() * self.read_current_a())

    def _describe(self, **extra: Any) -> dict[str, Any]:
        return {"kind": self.name, "bus": self.bus, "address": f"0x{self.address:02x}",
                "paths": [getattr(self.backend, "path", "<injected backend>")], **extra}


class Ina260Sensor(_Ina2xxSensor):
    name = "ina260"

    def read_current_a(self) -> float:
        return signed16(self.backend.read_word(0x01)) * 1.25e-3

    def read_bus_voltage_v(self) -> float:
        return self.backend.read_word(0x02) * 1.25e-3

    def read_power_w(self) -> float:
        # The chip's own power register (|I| x V, averaged like the other two).
        return self.backend.read_word(0x03) * 10e-3

    def describe(self) -> dict[str, Any]:
        return self._describe(units={"current": "1.25 mA/LSB", "bus_voltage": "1.25 mV/LSB",
                                     "power": "10 mW/LSB"},
                              calibration="none (integrated shunt, factory trimmed)")


class Ina219Sensor(_Ina2xxSensor):
    name = "ina219"

    def __init__(self, root: str | os.PathLike = "/", bus: int = 1,
                 address: int = DEFAULT_ADDRESS, backend: RegisterReader | None = None,
                 shunt_ohms: float = 0.1):
        if shunt_ohms <= 0:
            raise ValueError(f"shunt_ohms must be > 0, got {shunt_ohms}")
        super().__init__(root, bus, address, backend)
        self.shunt_ohms = shunt_ohms

    def read_shunt_voltage_v(self) -> float:
        return signed16(self.backend.read_word(0x01)) * 10e-6

    def read_current_a(self) -> float:
        return self.read_shunt_voltage_v() / self.shunt_ohms

    def read_bus_voltage_v(self) -> float:
        # Bits 2..0 are flags (conversion ready, math overflow), not part of the value.
        return (self.backend.read_word(0x02) >> 3) * 4e-3

    def describe(self) -> dict[str, Any]:
        return self._describe(units={"shunt_voltage": "10 uV/LSB", "bus_voltage": "4 mV/LSB"},
                              calibration={"shunt_ohms": self.shunt_ohms,
                                           "current": "shunt voltage / shunt_ohms"})
