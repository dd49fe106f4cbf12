"""Energy and clocks over the measured steps: what a point costs in joules, and whether the
device ran at full speed while it was measured.

- CUDA: NVML's total-energy counter (millijoules since the driver loaded; Volta and newer),
  polled while the steps run (probes/counters.py: a mean power from the counter's own update
  edges, null with the reason when it advanced fewer than MIN_UPDATES times). At the end of
  each measured window, before the device is synced (so while it still works through the
  queued steps), the probe samples the SM clock, the temperature and the clock-event
  ("throttle") reasons, the figures llm.c and Megatron log. The device is NVML's by UUID
  (devices.nvml_handle). One GPU: `energy_ranks` is 1.
- CPU: RAPL (Linux powercap, /sys/class/powercap/intel-rapl:N, also on AMD), the package
  domains summed: the whole CPU packages, all processes on them, so under torchrun every rank
  on this host (`energy_ranks` = LOCAL_WORLD_SIZE: J/token divides by all of their tokens).
  Null, with the reason in `energy_source`, where it is not readable (VMs, containers, no root).

Derived figures (J per step and per token, tokens per kWh, mean power, the over-limit flag)
come from analysis/derive.py.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from nanogpt.hardware.devices import nvml_handle
from nanogpt.probes.counters import CounterSampler, NvmlCounter, RaplCounter
from nanogpt.record import Clocks, Energy

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
    stop() after the last. `counter` replaces the device's own (tests: a counter that advances
    in steps, as NVML's does, on a machine without one)."""

    def __init__(self, device: torch.device, powercap: Path = POWERCAP, counter=None):
        self.energy = Energy(energy_ranks=1)
        self._clocks: list[float] = []
        self._temps: list[float] = []
        self._reasons: int | None = None  # the bits seen; None: never readable
        self._handle = None
        if device.type == "cuda":
            self._handle, which = nvml_handle(device)
            self.energy.energy_source = (
                f"nvml total energy ({which})" if self._handle else f"none: {which}"
            )
            self.energy.power_limit_w = self._nvml(
                lambda nv, h: nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3
            )
            if self._handle is not None and counter is None:
                counter = NvmlCounter(self._handle)
        elif device.type == "cpu":
            domains, why = rapl_domains(powercap)
            self.energy.energy_source = why
            # RAPL counts the whole packages: every rank that torchrun started on this host.
            self.energy.energy_ranks = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
            if domains and counter is None:
                counter = RaplCounter(domains)
        else:
            self.energy.energy_source = f"none: no energy counter for {device.type}"
        self._sampler = CounterSampler(counter) if counter is not None else None

    @property
    def sampling(self) -> bool:
        """Whether a thread polls a counter during the measured steps (the record lists it)."""
        return self._sampler is not None

    def start(self) -> None:
        if self._sampler is not None:
            self._sampler.start()

    def halt(self) -> None:
        """A point that failed mid-window: the sampler thread stops polling."""
        if self._sampler is not None:
            self._sampler.halt()

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
        energy = self.energy
        if self._sampler is not None:
            reading = self._sampler.stop()
            energy.energy_s = reading.window_s
            energy.energy_j = reading.energy_j
            energy.energy_updates = reading.updates
            energy.energy_update_ms = reading.update_ms
            energy.energy_error_pct = reading.error_pct
            if reading.note:  # too few updates: unknown, not zero
                energy.energy_source += f"; {reading.note}"
        return energy

    def clocks(self) -> Clocks:
        """The SM clock, temperature and clock-event reasons sampled at the measured windows."""
        clocks = Clocks()
        if self._clocks:
            clocks.sm_clock_mean_mhz = sum(self._clocks) / len(self._clocks)
            clocks.sm_clock_first_mhz, clocks.sm_clock_last_mhz = self._clocks[0], self._clocks[-1]
        if self._temps:
            clocks.temperature_max_c = max(self._temps)
        if self._reasons is not None:
            clocks.clock_event_reasons = [
                name for bit, name in CLOCK_EVENT_REASONS.items() if self._reasons & bit
            ]
        return clocks

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
