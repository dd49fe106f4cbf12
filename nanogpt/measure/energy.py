"""Energy and clocks over the measured steps: what a point costs in joules, and whether the
device ran at full speed while it was measured.

- CUDA: NVML's total-energy counter (millijoules since the driver loaded; Volta and newer), read
  at the start and the end of the measured steps. The counter is updated periodically: a window
  shorter than its update period reads no change, which is recorded as null, not 0. At the end
  of each measured window, before the device is synced (so while it still works through the
  queued steps), the probe samples the SM clock, the temperature and the clock-event
  ("throttle") reasons, the figures llm.c and Megatron log. The device is NVML's by UUID
  (devices.nvml_handle).
- CPU: RAPL (Linux powercap, /sys/class/powercap/intel-rapl:N, also on AMD), the package
  domains summed: the whole CPU packages, all processes on them. Null, with the reason in
  `energy_source`, where it is not readable (VMs, containers, no root).

Derived figures (J per step and per token, tokens per kWh, mean power) come from
results/derive.py.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import torch

from nanogpt.devices import nvml_handle
from nanogpt.results.record import Energy

POWERCAP = Path("/sys/class/powercap")
PACKAGE_DOMAIN = re.compile(r"intel-rapl:\d+$")  # intel-rapl:0, not its sub-domain intel-rapl:0:0
# NVML clock-event reason bits (nvml.h, nvmlClocksEventReason*), named as there.
CLOCK_EVENT_REASONS = {
    0x1: "gpu_idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}


class EnergyProbe:
    """start() before the measured steps, sample() at the end of each window (before its sync),
    stop() after the last."""

    def __init__(self, device: torch.device, powercap: Path = POWERCAP):
        self.energy = Energy()
        self._started_s = 0.0
        self._start: list[int] | None = None  # counter readings at start()
        self._clocks: list[float] = []
        self._temps: list[float] = []
        self._reasons: int | None = None  # the bits seen; None: never readable
        self._handle = None
        self._rapl: list[Path] = []
        if device.type == "cuda":
            self._handle, which = nvml_handle(device)
            self.energy.energy_source = (
                f"nvml total energy ({which})" if self._handle else f"none: {which}"
            )
            self.energy.power_limit_w = self._nvml(
                lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3
            )
        elif device.type == "cpu":
            self._rapl, why = rapl_domains(powercap)
            self.energy.energy_source = why
        else:
            self.energy.energy_source = f"none: no energy counter for {device.type}"

    def start(self) -> None:
        self._start = self._read()
        self._started_s = time.perf_counter()

    def sample(self) -> None:
        if self._handle is None:
            return
        clock = self._nvml(lambda nv, h: nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM))
        temp = self._nvml(lambda nv, h: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU))
        reasons = self._nvml(lambda nv, h: nv.nvmlDeviceGetCurrentClocksEventReasons(h))
        if reasons is None:  # drivers before R535 know it by its former name, same bits
            reasons = self._nvml(lambda nv, h: nv.nvmlDeviceGetCurrentClocksThrottleReasons(h))
        self._clocks += [clock] if clock is not None else []
        self._temps += [temp] if temp is not None else []
        if reasons is not None:
            self._reasons = (self._reasons or 0) | reasons

    def stop(self) -> Energy:
        """The figures of the measured steps (call after the device was synced)."""
        end = self._read()
        energy = self.energy
        energy.energy_s = time.perf_counter() - self._started_s
        if self._start is not None and end is not None:
            joules = self._joules_between(self._start, end)
            if joules > 0:
                energy.energy_j = joules
            else:  # shorter than the counter's update period: unknown, not zero
                energy.energy_source += "; the counter did not advance during the measured steps"
        if self._clocks:
            energy.sm_clock_mean_mhz = sum(self._clocks) / len(self._clocks)
        if self._temps:
            energy.temperature_max_c = max(self._temps)
        if self._reasons is not None:
            energy.clock_event_reasons = [
                name for bit, name in CLOCK_EVENT_REASONS.items() if self._reasons & bit
            ]
        return energy

    def _read(self) -> list[int] | None:
        """The raw counters: NVML's one (mJ) or each RAPL package domain's (uJ)."""
        if self._handle is not None:
            mj = self._nvml(lambda nv, h: nv.nvmlDeviceGetTotalEnergyConsumption(h))
            return None if mj is None else [mj]
        if self._rapl:
            return read_rapl_uj(self._rapl)
        return None

    def _joules_between(self, start: list[int], end: list[int]) -> float:
        if self._handle is not None:
            return (end[0] - start[0]) / 1e3  # a 64-bit mJ counter: it does not wrap
        # Each RAPL counter wraps to 0 past max_energy_range_uj (minutes at full power).
        ranges = [int((d / "max_energy_range_uj").read_text()) for d in self._rapl]
        return sum((e - s) % r for s, e, r in zip(start, end, ranges, strict=True)) / 1e6

    def _nvml(self, query):
        try:
            import pynvml

            return query(pynvml, self._handle)
        except Exception:  # a query this device or driver does not support
            return None


def rapl_domains(powercap: Path = POWERCAP) -> tuple[list[Path], str]:
    """The readable RAPL package domains, and the energy_source that says what they measure."""
    domains = sorted(p for p in powercap.glob("intel-rapl:*") if PACKAGE_DOMAIN.search(p.name))
    if not domains:
        return [], f"none: no RAPL package domain under {powercap}"
    try:
        names = [(d / "name").read_text().strip() for d in domains]
        read_rapl_uj(domains)
    except OSError as exc:
        return [], f"none: RAPL is not readable ({exc.strerror or exc}); it usually needs root"
    return domains, f"rapl ({', '.join(names)}: whole CPU packages, all processes)"


def read_rapl_uj(domains: list[Path]) -> list[int]:
    return [int((d / "energy_uj").read_text()) for d in domains]
