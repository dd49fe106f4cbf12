"""The environment a run measured in, stored with every result so that a number can be traced to
the software and hardware that made it; and the device's human-readable name.

Each probe is guarded: a missing driver or a tarball checkout must cost a None, not the run.
"""

from __future__ import annotations

import os
import platform
import socket
from pathlib import Path

import torch

from nanogpt.hardware.cpu import cpu_model_name, physical_cores, run_command


def device_name(device: torch.device | str) -> str:
    """A human-readable name for the device a run trains on (the key the peak lookup uses)."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    if device.type == "cpu":
        return cpu_model_name()
    if device.type == "mps":
        return f"Apple MPS ({cpu_model_name()})"
    return device.type


_PROJECT_ROOT = Path(__file__).resolve().parents[2]


def environment() -> dict:
    """Versions, devices, CPU, host and git state as a JSON-ready dict. Never raises."""
    commit = run_command(["git", "rev-parse", "HEAD"], cwd=_PROJECT_ROOT)
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _guarded(torch.backends.cudnn.version),
        "nvidia_driver": nvidia_driver(),
        "device_count": _guarded(torch.cuda.device_count) or 0,
        "gpu_names": _guarded(_gpu_names) or [],
        "cpu_model": _guarded(cpu_model_name),
        "cpu_logical_cores": _guarded(os.cpu_count),
        "cpu_physical_cores": _guarded(physical_cores),
        "torch_threads": _guarded(torch.get_num_threads),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "hostname": _guarded(socket.gethostname),
        "git_commit": commit,
        "git_dirty": _git_dirty() if commit else None,  # dirty relative to a commit
    }


def _guarded(probe):
    """probe(), or None if it raises: one failed probe must not lose the whole record."""
    try:
        return probe()
    except Exception:
        return None


def _gpu_names() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


def nvidia_driver() -> str | None:
    """Driver version via NVML (the nvidia-ml-py package); None without an NVIDIA driver."""
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            version = pynvml.nvmlSystemGetDriverVersion()
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # No package, no libnvidia-ml.so, or no driver loaded.
        return None
    return version.decode() if isinstance(version, bytes) else str(version)


def _git_dirty() -> bool | None:
    """True if tracked files differ from HEAD; None if git cannot tell.

    --no-optional-locks stops `git status` from rewriting the index while we only look, so it
    cannot collide with a git command someone runs in the same checkout. Untracked files
    (outputs, caches) do not count as dirty.
    """
    status = run_command(
        ["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
        cwd=_PROJECT_ROOT,
        keep_empty=True,
    )
    return None if status is None else status != ""
