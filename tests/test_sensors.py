"""Power sensors against fixture trees.

This machine has none of the boards, so each test builds, under tmp_path, the exact sysfs /
procfs file names and value formats the real kernel drivers expose, and points the
sensor's `root` at it. Vendor command output (vcgencmd) and I2C registers are injected.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from edge_remat_agent.sensors import (
    SENSORS, AndroidBatterySensor, EnergyMeter, Ina219Sensor, Ina260Sensor,
    JetsonIna3221Sensor, ModelSensor, PowerSensor, RaplSensor, Rpi5PmicSensor, SensorError,
    detect, open_sensor, trapezoid_energy_j)
from edge_remat_agent.sensors.android_battery import guess_current_unit, guess_voltage_unit
from edge_remat_agent.sensors.rpi5_pmic import parse_pmic_adc


def write(root: Path, path: str, value: object) -> Path:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(f"{value}\n")
    return target


# --- Jetson INA3221 ----------------------------------------------------------------------

def jetpack4_nano(root: Path) -> None:
    """Jetson Nano, L4T 32: one chip, iio layout, rails POM_5V_IN / POM_5V_GPU / POM_5V_CPU."""
    dev = "/sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0"
    for k, (label, mw, ma, mv) in enumerate([("POM_5V_IN", 4512, 890, 5072),
                                             ("POM_5V_GPU", 120, 24, 5064),
                                             ("POM_5V_CPU", 1030, 204, 5048)]):
        write(root, f"{dev}/rail_name_{k}", label)
        write(root, f"{dev}/in_power{k}_input", mw)
        write(root, f"{dev}/in_current{k}_input", ma)
        write(root, f"{dev}/in_voltage{k}_input", mv)


def jetpack5_orin_nano(root: Path) -> None:
    """Orin Nano, L4T 35: mainline hwmon layout, channels 1..3, in4..in7 unlabelled shunts."""
    dev = "/sys/bus/i2c/drivers/ina3221/1-0040/hwmon/hwmon3"
    for k, (label, mv, ma) in enumerate([("VDD_IN", 5072, 1234),
                                         ("VDD_CPU_GPU_CV", 5064, 300),
                                         ("VDD_SOC", 5056, 400)], start=1):
        write(root, f"{dev}/in{k}_label", label)
        write(root, f"{dev}/in{k}_input", mv)
        write(root, f"{dev}/curr{k}_input", ma)
    write(root, f"{dev}/in4_input", 12)  # shunt voltage channel: no label, not a rail
    write(root, f"{dev}/name", "ina3221")


def test_jetpack4_iio_total_rail_in_milliwatts(tmp_path):
    jetpack4_nano(tmp_path)
    sensor = JetsonIna3221Sensor(root=tmp_path)
    assert sensor.read_power_w() == pytest.approx(4.512)
    info = sensor.describe()
    assert info["layout"] == "jetpack4-iio" and info["rails"] == ["POM_5V_IN"]
    assert info["units"] == {"power": "mW"} and info["summed"] is False
    assert info["paths"][0].endswith("iio:device0/in_power0_input")
    assert sensor.energy_counter_j() is None


def test_jetpack4_without_power_file_uses_voltage_times_current(tmp_path):
    jetpack4_nano(tmp_path)
    for k in range(3):
        (tmp_path / f"sys/bus/i2c/drivers/ina3221x/6-0040/iio:device0/in_power{k}_input").unlink()
    assert JetsonIna3221Sensor(root=tmp_path).read_power_w() == pytest.approx(5.072 * 0.890)


def test_jetpack5_hwmon_power_is_volts_times_amps(tmp_path):
    jetpack5_orin_nano(tmp_path)
    sensor = JetsonIna3221Sensor(root=tmp_path)
    assert sensor.read_power_w() == pytest.approx(6.259, abs=1e-3)
    info = sensor.describe()
    assert info["layout"] == "jetpack5-hwmon" and info["rails"] == ["VDD_IN"]
    assert info["units"]["voltage"] == "mV" and info["units"]["current"] == "mA"
    assert set(info["all_rails"]) == {"VDD_IN", "VDD_CPU_GPU_CV", "VDD_SOC"}


def test_jetson_without_total_rail_sums_all_and_says_so(tmp_path):
    # AGX Xavier style: GPU / CPU / SOC on one chip, no VDD_IN label anywhere.
    dev = "/sys/bus/i2c/drivers/ina3221x/1-0040/iio:device0"
    for k, (label, mw) in enumerate([("GPU", 1000), ("CPU", 2000), ("SOC", 500)]):
        write(tmp_path, f"{dev}/rail_name_{k}", label)
        write(tmp_path, f"{dev}/in_power{k}_input", mw)
    sensor = JetsonIna3221Sensor(root=tmp_path)
    assert sensor.read_power_w() == pytest.approx(3.5)
    info = sensor.describe()
    assert info["summed"] is True and "sum of all rails" in info["note"]


def test_jetson_rail_override_and_missing_hardware(tmp_path):
    jetpack5_orin_nano(tmp_path)
    assert JetsonIna3221Sensor(root=tmp_path, rail="VDD_SOC").read_power_w() == pytest.approx(
        5.056 * 0.4)
    with pytest.raises(SensorError, match="VDD_GPU"):
        JetsonIna3221Sensor(root=tmp_path, rail="VDD_GPU")
    with pytest.raises(SensorError, match="ina3221x.*Remedy"):
        JetsonIna3221Sensor(root=tmp_path / "empty")


# --- RAPL --------------------------------------------------------------------------------

MAX_RANGE_UJ = 262143328850


def rapl_tree(root: Path, energy_uj: int = 1_000_000) -> Path:
    base = "/sys/class/powercap"
    write(root, f"{base}/intel-rapl:0/name", "package-0")
    write(root, f"{base}/intel-rapl:0/max_energy_range_uj", MAX_RANGE_UJ)
    counter = write(root, f"{base}/intel-rapl:0/energy_uj", energy_uj)
    # Sub-domain (core) and platform domain: must not be added to the package.
    write(root, f"{base}/intel-rapl:0:0/name", "core")
    write(root, f"{base}/intel-rapl:0:0/max_energy_range_uj", MAX_RANGE_UJ)
    write(root, f"{base}/intel-rapl:0:0/energy_uj", 5)
    write(root, f"{base}/intel-rapl:1/name", "psys")
    write(root, f"{base}/intel-rapl:1/max_energy_range_uj", MAX_RANGE_UJ)
    write(root, f"{base}/intel-rapl:1/energy_uj", 7)
    (root / base.lstrip("/") / "intel-rapl").mkdir()  # the control-type dir, no counter
    return counter


def test_rapl_uses_package_domains_only(tmp_path):
    rapl_tree(tmp_path)
    sensor = RaplSensor(root=tmp_path)
    info = sensor.describe()
    assert info["domains"] == ["package-0"] and info["skipped_domains"] == ["psys"]
    assert [Path(p).parent.name for p in info["paths"]] == ["intel-rapl:0"]


def test_rapl_counter_wraps_around(tmp_path):
    counter = rapl_tree(tmp_path, energy_uj=MAX_RANGE_UJ - 1_000_000)  # 1 J before the wrap
    sensor = RaplSensor(root=tmp_path)
    before = sensor.energy_counter_j()
    counter.write_text("2000000\n")  # wrapped, then 2 J more
    after = sensor.energy_counter_j()
    assert after - before == pytest.approx(3.0, abs=1e-6)
    counter.write_text("2500000\n")
    assert sensor.energy_counter_j() - after == pytest.approx(0.5, abs=1e-6)
    assert sensor.describe()["wraps_seen"] == 1


def test_rapl_power_from_two_counter_reads(tmp_path):
    counter = rapl_tree(tmp_path, energy_uj=10_000_000)
    state = {"t": 100.0, "uj": 10_000_000, "watts": 25.0}

    def fake_sleep(seconds):  # time passes while the CPU burns state["watts"]
        state["t"] += seconds
        state["uj"] += int(state["watts"] * 1e6 * seconds)
        counter.write_text(f"{state['uj']}\n")

    sensor = RaplSensor(root=tmp_path, min_interval_s=0.02, max_age_s=1.0,
                        clock=lambda: state["t"], sleep=fake_sleep)
    assert sensor.read_power_w() == pytest.approx(25.0, rel=1e-6)
    state["watts"] = 0.0
    fake_sleep(0.5)  # a recent previous read is reused: 0.5 s at 0 W
    assert sensor.read_power_w() == pytest.approx(0.0, abs=1e-9)
    fake_sleep(5.0)  # 5 s idle, then a 40 W burst: a stale read is not averaged over
    state["watts"] = 40.0
    assert sensor.read_power_w() == pytest.approx(40.0, rel=1e-6)


def test_rapl_unreadable_counter_gives_remedy(tmp_path):
    # Since 2020 energy_uj is mode 0400 root. Tests run as root here, and root ignores
    # file modes, so chmod 000 cannot simulate it: the file reader is injected instead and
    # raises the PermissionError a non-root open() would.
    rapl_tree(tmp_path)

    def root_only(path):
        if path.endswith("energy_uj"):
            raise PermissionError(13, "Permission denied", path)
        return Path(path).read_text().strip()

    with pytest.raises(SensorError) as caught:
        RaplSensor(root=tmp_path, read_file=root_only)
    message = str(caught.value)
    assert "not readable" in message and "intel-rapl:0/energy_uj" in message
    assert "run as root" in message
    assert "sudo chmod o+r /sys/class/powercap/intel-rapl:*/energy_uj" in message


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads mode-000 files anyway")
def test_rapl_unreadable_counter_real_permissions(tmp_path):
    counter = rapl_tree(tmp_path)
    counter.chmod(0)
    with pytest.raises(SensorError, match="sudo chmod o\\+r"):
        RaplSensor(root=tmp_path)


def test_rapl_absent(tmp_path):
    with pytest.raises(SensorError, match="intel_rapl_msr"):
        RaplSensor(root=tmp_path)


# --- Android battery ---------------------------------------------------------------------

def battery(root: Path, current, voltage, status="Discharging", name="battery") -> Path:
    supply = f"/sys/class/power_supply/{name}"
    write(root, f"{supply}/current_now", current)
    write(root, f"{supply}/voltage_now", voltage)
    write(root, f"{supply}/status", status)
    return root / supply.lstrip("/")


@pytest.mark.parametrize("current, voltage, units, sign", [
    (-523000, 3876000, ("uA", "uV"), -1),  # kernel ABI: uA, uV, discharge negative
    (523000, 3876000, ("uA", "uV"), 1),    # uA, uV, discharge positive (some vendors)
    (-523, 3876, ("mA", "mV"), -1),        # mA, mV, discharge negative
    (523, 3876, ("mA", "mV"), 1),          # mA, mV, discharge positive
    (1523, 3876000, ("mA", "uV"), 1),      # mixed: current in mA, voltage in uV
])
def test_android_battery_calibration(tmp_path, current, voltage, units, sign):
    battery(tmp_path, current, voltage)
    sensor = AndroidBatterySensor(root=tmp_path)
    amps = abs(current) * (1e-6 if units[0] == "uA" else 1e-3)
    volts = voltage * (1e-6 if units[1] == "uV" else 1e-3)
    assert sensor.read_power_w() == pytest.approx(amps * volts)
    assert sensor.read_power_w() > 0
    calibration = sensor.describe()["calibration"]
    assert (calibration["current_unit"], calibration["voltage_unit"]) == units
    assert calibration["discharge_sign"] == sign
    assert "Discharging" in calibration["decided_by"]["discharge_sign"]


def test_android_battery_charging_status_sets_sign(tmp_path):
    supply = battery(tmp_path, 1200000, 4200000, status="Charging")  # ABI: charging positive
    sensor = AndroidBatterySensor(root=tmp_path)
    assert sensor.describe()["calibration"]["discharge_sign"] == -1
    assert sensor.read_power_w() == pytest.approx(-1.2 * 4.2)  # power flows in: negative
    (supply / "current_now").write_text("-800000\n")
    assert sensor.read_power_w() == pytest.approx(0.8 * 4.2)


def test_android_battery_overrides_and_bms_name(tmp_path):
    battery(tmp_path, 900, 3900, status="Unknown", name="bms")
    sensor = AndroidBatterySensor(root=tmp_path, current_unit="mA", voltage_unit="mV",
                                  discharge_sign=1)
    assert sensor.read_power_w() == pytest.approx(0.9 * 3.9)
    assert sensor.describe()["calibration"]["decided_by"] == {
        "current_unit": "override", "voltage_unit": "override", "discharge_sign": "override"}
    # Unknown status and no override: the kernel ABI's "discharge negative".
    auto = AndroidBatterySensor(root=tmp_path)
    assert auto.describe()["calibration"]["discharge_sign"] == -1
    assert "ABI" in auto.describe()["calibration"]["decided_by"]["discharge_sign"]


def test_android_battery_unit_heuristic_and_zero_current(tmp_path):
    assert guess_voltage_unit(4_100_000) == "uV" and guess_voltage_unit(4100) == "mV"
    assert guess_current_unit(-250_000) == "uA" and guess_current_unit(250) == "mA"
    assert guess_current_unit(3000) == "mA"  # 3 A in mA, not 3 mA in uA
    supply = battery(tmp_path, 0, 3800000)
    sensor = AndroidBatterySensor(root=tmp_path)
    assert sensor.read_power_w() == 0.0 and sensor.current_unit is None  # decision postponed
    (supply / "current_now").write_text("-400000\n")
    assert sensor.read_power_w() == pytest.approx(0.4 * 3.8)
    assert sensor.current_unit == "uA"


def test_android_battery_absent(tmp_path):
    write(tmp_path, "/sys/class/power_supply/BAT0/current_now", 1)
    with pytest.raises(SensorError, match="battery,bms,Battery"):
        AndroidBatterySensor(root=tmp_path)


# --- Raspberry Pi 5 PMIC -----------------------------------------------------------------

PI5_OUTPUT = """\
 3V7_WL_SW_A current(0)=0.00000000A
   3V3_SYS_A current(1)=0.05662940A
   1V8_SYS_A current(2)=0.18934560A
  DDR_VDD2_A current(3)=0.02147040A
  DDR_VDDQ_A current(4)=0.00000000A
   1V1_SYS_A current(5)=0.18834000A
   0V8_SYS_A current(6)=0.32307060A
  VDD_CORE_A current(7)=2.45990000A
   3V3_DAC_A current(17)=0.00048840A
   3V3_ADC_A current(18)=0.00030528A
   0V8_AON_A current(16)=0.00468288A
      HDMI_A current(22)=0.02239320A
     3V7_WL_SW_V volt(8)=3.71462400V
       3V3_SYS_V volt(9)=3.30097200V
       1V8_SYS_V volt(10)=1.79853600V
      DDR_VDD2_V volt(11)=1.11086400V
      DDR_VDDQ_V volt(12)=0.60537600V
       1V1_SYS_V volt(13)=1.10937600V
       0V8_SYS_V volt(14)=0.80024400V
      VDD_CORE_V volt(15)=0.87910000V
       3V3_DAC_V volt(20)=3.30768000V
       3V3_ADC_V volt(21)=3.30036000V
       0V8_AON_V volt(19)=0.80036400V
          HDMI_V volt(23)=5.14320000V
         EXT5V_V volt(24)=5.14656000V
          BATT_V volt(25)=0.00000000V
"""


def test_pi5_parses_real_output_and_pairs_rails():
    amps, volts = parse_pmic_adc(PI5_OUTPUT)
    assert amps["VDD_CORE"] == pytest.approx(2.4599) and volts["VDD_CORE"] == pytest.approx(0.8791)
    assert len(amps) == 12 and len(volts) == 14 and "EXT5V" not in amps
    calls = []
    sensor = Rpi5PmicSensor(runner=lambda argv: calls.append(tuple(argv)) or PI5_OUTPUT)
    expected = sum(volts[r] * amps[r] for r in amps)
    assert sensor.read_power_w() == pytest.approx(expected)
    assert expected == pytest.approx(3.303, abs=1e-3)  # by hand; 2.163 W of it on VDD_CORE
    assert calls[0] == ("vcgencmd", "pmic_read_adc")
    assert "EXT5V" not in sensor.describe()["rails"] and len(sensor.describe()["rails"]) == 12


def test_pi5_missing_command_and_bad_output():
    with pytest.raises(SensorError, match="not found.*raspi-utils"):
        Rpi5PmicSensor(command=("vcgencmd-that-does-not-exist", "pmic_read_adc"))
    with pytest.raises(SensorError, match="Raspberry Pi 5"):
        Rpi5PmicSensor(runner=lambda argv: "error=1 error_msg=\"Command not registered\"\n")


# --- INA219 / INA260 ---------------------------------------------------------------------

class Registers:
    """Stands in for /dev/i2c-N: register number -> 16-bit word."""

    def __init__(self, words):
        self.words = words

    def read_word(self, reg):
        return self.words[reg]


def test_ina260_register_decoding():
    # 12.000 V = 9600 LSB, 1.500 A = 1200 LSB, 18.00 W = 1800 LSB.
    sensor = Ina260Sensor(backend=Registers({0x01: 1200, 0x02: 9600, 0x03: 1800}))
    assert sensor.read_bus_voltage_v() == pytest.approx(12.0)
    assert sensor.read_current_a() == pytest.approx(1.5)
    assert sensor.read_power_w() == pytest.approx(18.0)
    reversed_shunt = Ina260Sensor(backend=Registers({0x01: 0xFC18, 0x02: 4000, 0x03: 500}))
    assert reversed_shunt.read_current_a() == pytest.approx(-1.25)  # 0xFC18 = -1000 LSB
    assert reversed_shunt.read_power_w() == pytest.approx(5.0)
    assert reversed_shunt.describe()["units"]["power"] == "10 mW/LSB"


def test_ina219_register_decoding():
    # Bus 5.000 V = 1250 LSB of 4 mV, in bits 15..3, with the conversion-ready bit (1) set.
    bus_word = (1250 << 3) | 0b010
    sensor = Ina219Sensor(backend=Registers({0x01: 2000, 0x02: bus_word}))
    assert sensor.read_bus_voltage_v() == pytest.approx(5.0)
    assert sensor.read_shunt_voltage_v() == pytest.approx(0.020)
    assert sensor.read_current_a() == pytest.approx(0.2)  # 20 mV / 0.1 ohm
    assert sensor.read_power_w() == pytest.approx(1.0)
    negative = Ina219Sensor(backend=Registers({0x01: 0xF830, 0x02: bus_word}), shunt_ohms=0.01)
    assert negative.read_current_a() == pytest.approx(-2.0)  # -2000 LSB = -20 mV / 0.01 ohm
    assert negative.read_power_w() == pytest.approx(10.0)
    assert negative.describe()["calibration"]["shunt_ohms"] == 0.01


def test_ina_real_backend_reports_missing_bus(tmp_path):
    with pytest.raises(SensorError, match="i2c-7.*modprobe i2c-dev"):
        open_sensor("ina219", root=tmp_path, bus=7)


# --- model estimate ----------------------------------------------------------------------

STAT_HEAD = "cpu  {user} 0 {system} {idle} {iowait} 0 0 0 0 0\ncpu0 1 2 3 4 5 0 0 0 0 0\n"


def test_model_estimate_from_two_proc_stat_snapshots(tmp_path):
    stat = write(tmp_path, "/proc/stat", STAT_HEAD.format(user=1000, system=500, idle=8000,
                                                          iowait=500))
    sensor = ModelSensor(root=tmp_path, idle_w=3.0, active_w=11.0)
    # 300 busy (user 200 + system 100) of 400 ticks (idle 80, iowait 20): 75 % busy.
    stat.write_text(STAT_HEAD.format(user=1200, system=600, idle=8080, iowait=520))
    assert sensor.read_power_w() == pytest.approx(3.0 + 0.75 * 8.0)
    assert sensor.read_power_w() == pytest.approx(9.0)  # no tick since: last estimate kept
    stat.write_text(STAT_HEAD.format(user=1200, system=600, idle=8180, iowait=520))
    assert sensor.read_power_w() == pytest.approx(3.0)  # fully idle
    info = sensor.describe()
    assert info["estimate"] is True and info["calibration"] == {"idle_w": 3.0, "active_w": 11.0}


# --- registry and detection --------------------------------------------------------------

def test_registry_names():
    assert set(SENSORS) == {"jetson-ina3221", "rapl", "android-battery", "rpi5-pmic",
                            "ina219", "ina260", "model"}
    assert all(cls.name == name for name, cls in SENSORS.items())
    with pytest.raises(SensorError, match="rapl"):
        open_sensor("thermocouple")


def test_open_and_detect(tmp_path):
    rapl_tree(tmp_path)
    assert isinstance(open_sensor("rapl", root=tmp_path), RaplSensor)
    reasons = []
    assert isinstance(detect(tmp_path, reasons=reasons), RaplSensor)
    assert [name for name, _ in reasons] == ["jetson-ina3221", "android-battery"]
    jetpack5_orin_nano(tmp_path)
    assert isinstance(detect(tmp_path), JetsonIna3221Sensor)
    assert detect(tmp_path / "nothing") is None


def test_detect_pi5_only_on_a_pi5(tmp_path):
    write(tmp_path, "/proc/device-tree/model", "Raspberry Pi 5 Model B Rev 1.0\x00")
    options = {"rpi5-pmic": {"runner": lambda argv: PI5_OUTPUT}}
    assert isinstance(detect(tmp_path, options=options), Rpi5PmicSensor)
    assert detect(tmp_path / "other-board", options=options) is None


# --- EnergyMeter -------------------------------------------------------------------------

class ConstantPower(PowerSensor):
    name = "constant"

    def __init__(self, watts):
        super().__init__()
        self.watts = watts

    def read_power_w(self):
        return self.watts

    def describe(self):
        return {"kind": self.name}


class CountingConstantPower(ConstantPower):
    """A sensor with a hardware energy counter that integrates a constant power exactly."""

    def __init__(self, watts):
        super().__init__(watts)
        self.t0 = time.monotonic()

    def energy_counter_j(self):
        return self.watts * (time.monotonic() - self.t0)


def test_trapezoid_rule():
    assert trapezoid_energy_j([(0.0, 1.0), (1.0, 3.0), (3.0, 3.0)]) == pytest.approx(8.0)
    assert trapezoid_energy_j([(0.0, 5.0)]) == 0.0


def test_energy_meter_integrates_constant_power():
    with EnergyMeter(ConstantPower(7.5), period_s=0.01) as meter:
        time.sleep(0.3)
    assert meter.method == "integrated samples"
    assert meter.duration_s >= 0.3
    assert meter.energy_j == pytest.approx(7.5 * meter.duration_s, rel=0.03)
    # At most 100 Hz plus the entry/exit samples; the floor leaves room for a loaded machine.
    assert len(meter.samples) >= 3 and 5 <= meter.sampling_hz <= 150
    assert all(b[0] >= a[0] for a, b in zip(meter.samples, meter.samples[1:]))
    assert meter.result()["mean_power_w"] == pytest.approx(7.5, rel=0.03)


class SlowReadConstantPower(ConstantPower):
    """Constant power whose reads take a while (as the utilisation model's first read waits
    50 ms for clock ticks): the samples span the block shifted by that latency."""

    def read_power_w(self):
        time.sleep(0.05)
        return self.watts


def test_a_slow_sensor_still_gives_its_constant_power_exactly():
    # A short block: divided by the block's duration, the samples' integral was off by the
    # reads' jitter (test_power_falls_back_to_the_labelled_model failed once on a loaded host).
    with EnergyMeter(SlowReadConstantPower(2.0), period_s=0.02) as meter:
        time.sleep(0.01)
    assert meter.mean_power_w == pytest.approx(2.0, rel=1e-9)
    assert meter.energy_j == pytest.approx(2.0 * meter.duration_s, rel=1e-9)


def test_energy_meter_prefers_the_counter():
    with EnergyMeter(CountingConstantPower(12.0), period_s=0.01) as meter:
        time.sleep(0.2)
    assert meter.method == "counter"
    assert meter.energy_j == pytest.approx(12.0 * meter.duration_s, rel=0.03)
    assert len(meter.samples) >= 5


def test_energy_meter_with_rapl_fixture_counter(tmp_path):
    counter = rapl_tree(tmp_path, energy_uj=MAX_RANGE_UJ - 500_000)
    sensor = RaplSensor(root=tmp_path)
    with EnergyMeter(sensor, period_s=0.01) as meter:
        counter.write_text("1500000\n")  # 2 J across a wrap while the block runs
        time.sleep(0.05)
    assert meter.method == "counter"
    assert meter.energy_j == pytest.approx(2.0, abs=1e-6)


def test_energy_meter_reports_sampling_failure():
    class Failing(ConstantPower):
        calls = 0

        def read_power_w(self):
            self.calls += 1
            if self.calls > 2:
                raise OSError("sensor unplugged")
            return self.watts

    with pytest.raises(SensorError, match="sensor unplugged"):
        with EnergyMeter(Failing(1.0), period_s=0.005):
            time.sleep(0.1)
