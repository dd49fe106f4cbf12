"""What a GPU loan needs before it starts: the suite collects its CUDA tests on a machine without
the optional packages (the GPU machines have no optuna, wandb, torchao or submitit:
../shared/device/README.md), and benchmarks/gpu_check.sh refuses a machine without CUDA in one
line and fits its parts in 9 minutes.

Real processes: pytest collecting the real suite in a fresh interpreter whose imports of those
packages fail as they do where they are not installed; the real script under bash.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
import torch

from .conftest import REPO

pytestmark = pytest.mark.slow

# Not installed on the GPU machines (../shared/device/README.md lists what is): the optional
# extras, W&B, the notebook's runners and pyarrow, which the image's list does not name.
ABSENT_THERE = (
    "optuna",
    "wandb",
    "wandb_workspaces",
    "torchao",
    "submitit",
    "hydra_plugins.hydra_submitit_launcher",
    "nbformat",
    "nbclient",
    "papermill",
    "pyarrow",
)

# pytest in an interpreter where importing any of ABSENT_THERE (or a submodule) raises
# ModuleNotFoundError, as on a machine without them; argv: pytest's arguments.
WITHOUT_THEM = """
import sys
from importlib.abc import MetaPathFinder

ABSENT = {absent!r}


class Absent(MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if any(name == a or name.startswith(a + ".") for a in ABSENT):
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, Absent())
import pytest

sys.exit(pytest.main(sys.argv[1:]))
"""


def test_the_cuda_tests_collect_without_the_packages_the_gpu_machines_lack():
    code = WITHOUT_THEM.format(absent=ABSENT_THERE)
    args = ["--collect-only", "-q", "-m", "cuda", "-p", "no:cacheprovider", "tests"]
    proc = subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTEST_ADDOPTS": ""},
    )
    out = proc.stdout + proc.stderr
    # A module that fails to import is a collection error: pytest then runs nothing at all.
    assert proc.returncode == 0 and "during collection" not in out, out[-3000:]
    collected = {line.split("::")[0] for line in proc.stdout.splitlines() if "::" in line}
    # Every file that marks a test cuda has its tests collected (none skipped at import).
    marked = {
        f"tests/{path.name}"
        for path in (REPO / "tests").glob("test_*.py")
        if re.search(r"pytest\.mark\.cuda\b", path.read_text())
    }
    assert marked and marked <= collected, (marked - collected, out[-3000:])


GPU_CHECK = REPO / "benchmarks" / "gpu_check.sh"


def gpu_check(*args: str, tmp_path) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "OUT": str(tmp_path / "out"),
        "WORK": str(tmp_path / "work"),
    }
    return subprocess.run(
        ["bash", str(GPU_CHECK), *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def test_gpu_check_dry_run_lists_the_parts_in_order_within_nine_minutes(tmp_path):
    proc = gpu_check("--dry-run", tmp_path=tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = re.findall(r"^(\w+)\s+(\d+) s\s", proc.stdout, flags=re.M)
    parts = [name for name, _ in rows]
    assert parts == [
        "setup",
        "cuda_tests",
        "readme_sweep",
        "parallel",
        "search",
        "fp8",
        "chunked_loss",
        "default_gap",  # the least needed, last: it ran past its box on the first loan
    ]
    grace = int(re.search(r"^each part: \+(\d+) s", proc.stdout, flags=re.M).group(1))
    total = int(re.search(r"^total: (\d+) s", proc.stdout, flags=re.M).group(1))
    assert total == sum(int(box) for _, box in rows) + grace * (len(rows) - 1)
    assert total <= 9 * 60
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


@pytest.mark.skipif(torch.cuda.is_available(), reason="here it would run the whole check")
def test_gpu_check_without_cuda_says_so_in_one_line_and_exits_non_zero(tmp_path):
    proc = gpu_check(tmp_path=tmp_path)
    assert proc.returncode == 1
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith("gpu_check: no CUDA here (torch ") and "sees no CUDA device" in line
    assert line.endswith("run it on a GPU machine (docs/benchmarks.md)")
    assert not (tmp_path / "out").exists() and not (tmp_path / "work").exists()
