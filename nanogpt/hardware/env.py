"""The environment a run measured in, stored with every result so that a number can be traced to
the software and hardware that made it; and the device's human-readable name.

Each probe is guarded: a missing driver or a tarball checkout must cost a None, not the run.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import socket
import sys
from pathlib import Path

import torch

from nanogpt.analysis.versions import USED_PACKAGES
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
    """Versions, devices, CPU, host and git state as a JSON-ready dict. Never raises.

    Called once the run has measured (runner/worker.py finish_record): a package of
    USED_PACKAGES gets its version where this process imported it, null where the run never
    did (analysis/versions.py names the keys the footer and `report --compare` read)."""
    commit = run_command(["git", "rev-parse", "HEAD"], cwd=_PROJECT_ROOT)
    return {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "cudnn": _guarded(torch.backends.cudnn.version),
        "nccl": _guarded(_nccl_version),
        **{name: _version_if_imported(name) for name in USED_PACKAGES},
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


def _nccl_version() -> str | None:
    """NCCL's version as torch was built with it ("2.28.9"); None on a build without NCCL."""
    if not torch.distributed.is_available() or not torch.distributed.is_nccl_available():
        return None
    version = torch.cuda.nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _version_if_imported(name: str) -> str | None:
    """The installed version of a package this process imported; None when it did not (the
    run did not use it) or its metadata is missing (a source checkout on sys.path)."""
    if name not in sys.modules:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return getattr(sys.modules[name], "__version__", None)


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
