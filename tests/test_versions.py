"""The environment behind the figures (issue env): every record names the versions its figures
rest on, the table prints them once, `report --compare` says when two sweeps differ in any, and
the installed set is the lock's (requirements/lock.txt; lock-compat.txt on the oldest torch).
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
import torch
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

from nanogpt.analysis import versions

from .conftest import MICRO, REPO, report_cli

LOCKS = {name: REPO / "requirements" / f"{name}.txt" for name in ("lock", "lock-compat")}


def _pins(lock: Path) -> dict[str, Requirement]:
    """The lock's pins by canonical name (its `# via` lines and comments skipped)."""
    pins = {}
    for line in lock.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = req
    return pins


def _lock_for_this_torch() -> Path:
    """The lock this interpreter's environment was installed from: the one pinning its torch."""
    for lock in LOCKS.values():
        if _pins(lock)["torch"].specifier.contains(torch.__version__):
            return lock
    pytest.skip(f"torch {torch.__version__} is pinned by no lock: an environment made without it")


def test_the_installed_set_is_the_locks():
    """Every package in this environment (make setup's and setup-dev's, or test-compat's) is the
    version its lock pins: a fresh machine installing with `pip install -c` gets the set the
    suite ran on. The project itself is the one package the lock leaves out."""
    lock = _lock_for_this_torch()
    pins = _pins(lock)
    off = []
    # what pip installed into the environment's own site-packages: not what a package puts on
    # sys.path for itself (setuptools' vendored packages, once its pkg_resources is imported)
    installed = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    for dist in importlib.metadata.distributions(path=sorted(installed)):
        name = canonicalize_name(dist.metadata["Name"])
        if name == "nanogpt-sweep":
            continue
        if name not in pins:
            off.append(f"{name}=={dist.version} (not in the lock)")
        elif not pins[name].specifier.contains(dist.version, prereleases=True):
            off.append(f"{name}=={dist.version} (the lock: {pins[name].specifier})")
    assert not off, f"{lock.name}: {off}; install with make setup, or bump the lock: make lock"


def test_both_locks_differ_in_torch_and_what_torch_pins_alone():
    """lock-compat.txt is the lock with the oldest torch: every other pin is the same release
    unless that torch asks for another (its triton, its CUDA libraries, setuptools' cap)."""
    lock, compat = _pins(LOCKS["lock"]), _pins(LOCKS["lock-compat"])
    assert lock["torch"].specifier != compat["torch"].specifier
    floor = re.search(r'"torch>=([\d.]+)"', (REPO / "pyproject.toml").read_text()).group(1)
    assert compat["torch"].specifier.contains(floor), "make test-compat runs pyproject's floor"
    torch_pinned = {"torch", "triton", "setuptools", "cuda-toolkit", "cuda-bindings"}
    differ = {
        name
        for name in lock.keys() & compat.keys()
        if lock[name].specifier != compat[name].specifier
        and name not in torch_pinned
        and not name.startswith("nvidia-")
    }
    assert not differ, differ


def test_the_floors_file_pins_pyprojects_lower_bounds():
    """requirements/floors.txt (make lock-floors, run by make test-floors) holds each direct
    dependency at its pyproject.toml floor: a floor raised without resolving the file again
    would leave the old release as the one tested (2.1 pins 2.1.x; 12.535, 12.535.77)."""
    toml = pytest.importorskip("tomllib")  # Python 3.11+
    project = toml.loads((REPO / "pyproject.toml").read_text())["project"]
    floors = _pins(REPO / "requirements" / "floors.txt")
    off = []
    for line in [*project["dependencies"], *project["optional-dependencies"]["transformers"]]:
        req = Requirement(line)
        (bound,) = [Version(s.version) for s in req.specifier if s.operator == ">="]
        (pin,) = [Version(s.version) for s in floors[canonicalize_name(req.name)].specifier]
        if pin.release[: len(bound.release)] != bound.release or pin not in req.specifier:
            off.append(f"{req.name}: pyproject {req.specifier}, floors.txt {pin}")
    assert not off, f"{off}; resolve it again: make lock-floors, then make test-floors"


POINTS = [
    {
        "env": {
            "python": "3.11.2",
            "torch": "2.13.0+cpu",
            "git_commit": "a" * 40,
            "git_dirty": False,
        }
    },
    {
        "env": {
            "python": "3.11.2",
            "torch": "2.13.0+cpu",
            "git_commit": "a" * 40,
            "git_dirty": False,
        }
    },
]


def test_the_footer_names_each_version_once_and_each_value_a_key_differs_in():
    assert versions.footer(POINTS) == "versions: python 3.11.2, torch 2.13.0+cpu, nanogpt aaaaaaa"
    mixed = [*POINTS, {"env": {**POINTS[0]["env"], "torch": "2.11.0", "git_dirty": True}}]
    line = versions.footer(mixed)
    assert "torch 2.13.0+cpu | 2.11.0" in line and "nanogpt aaaaaaa | aaaaaaa-dirty" in line
    assert versions.footer([{"status": "error"}]) is None  # no env: no line, not an empty one


def test_the_compare_line_names_what_changed_and_nothing_else():
    assert versions.difference(POINTS, POINTS) is None
    newer = [{"env": {**p["env"], "torch": "2.11.0", "transformers": "5.25.0"}} for p in POINTS]
    line = versions.difference(POINTS, newer)
    assert line.startswith("versions differ: torch 2.13.0+cpu -> 2.11.0, transformers - -> 5.25.0")
    assert "python" not in line and "nanogpt" not in line


@pytest.mark.slow
def test_a_record_names_its_versions_and_the_table_prints_them(micro_sweep):
    proc, sweep_dir = micro_sweep
    record = json.loads(next(sweep_dir.glob("*/result.json")).read_text())
    env = record["env"]
    assert env["torch"] == torch.__version__ and env["python"] == sys.version.split()[0]
    assert {"cuda", "cudnn", "nccl", "triton", "torchao", "transformers"} <= set(env)
    # the built-in GPT's eager CPU points import none of the packages recorded where used
    assert (env["transformers"], env["torchao"]) == (None, None)
    line = f"versions: python {env['python']}, torch {env['torch']}"
    assert line in proc.stdout and line in (sweep_dir / "summary.md").read_text()


@pytest.mark.slow
@pytest.mark.compat
def test_compare_across_torch_versions_says_so_in_one_line(tmp_path):
    """The same micro point swept with this interpreter's torch and with the other environment's
    (make test's .venv from make test-compat's, and back): report --compare prints one line
    naming both torches."""
    here = Path(sys.executable)
    others = [REPO / ".venv" / "bin" / "python", REPO / ".venv-compat" / "bin" / "python"]
    other = next((p for p in others if p.is_file() and p.parent != here.parent), None)
    if other is None:
        pytest.skip("needs the other environment (make setup-dev and make test-compat's venvs)")
    probe = subprocess.run(
        [str(other), "-c", "import torch; print(torch.__version__)"],
        capture_output=True,
        text=True,
        check=True,
    )
    other_torch = probe.stdout.strip()
    if other_torch == torch.__version__:
        pytest.skip(f"both environments run torch {other_torch}")
    dirs = {}
    for name, python in (("here", here), ("other", other)):
        dirs[name] = tmp_path / name
        args = [*MICRO, "perf.compile=false", f"hydra.sweep.dir={dirs[name]}"]
        env = {**os.environ, "PATH": f"{python.parent}{os.pathsep}{os.environ['PATH']}"}
        done = subprocess.run(
            [str(python), "-m", "nanogpt.run", "-m", *args],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr[-2000:]
    compared = report_cli(dirs["here"], "--compare", dirs["other"])
    assert compared.returncode == 0, compared.stderr
    lines = [line for line in compared.stdout.splitlines() if line.startswith("versions differ")]
    assert len(lines) == 1 and f"torch {other_torch} -> {torch.__version__}" in lines[0], lines


def _make_dry_run(*targets: str) -> str:
    """What `make -n TARGETS` would run in a checkout whose venvs are all stale (every stamp
    older than its inputs: -B): make's own reading of the Makefile."""
    args = ["make", "-n", "-B", *targets]
    return subprocess.run(args, cwd=REPO, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow  # make's own processes
def test_ci_runs_the_suite_then_the_oldest_torch_and_installs_by_the_lock():
    """.ci/run calls the README's test command and then make test-compat, whose first line names
    the torch it runs; every pip install make runs is constrained by a lock, and make sweep's
    environment holds the package and torch alone (no dev or optional extra)."""
    ci = [line.split("#")[0].strip() for line in (REPO / ".ci" / "run").read_text().splitlines()]
    assert ci.index("make test") < ci.index("make test-compat")
    assert "make test" in (REPO / "README.md").read_text()
    compat = _make_dry_run("test-compat")
    assert 'print("test-compat: torch", torch.__version__' in compat
    installs = [
        line
        for target in ("sweep", "test", "test-compat")
        for line in _make_dry_run(target).splitlines()
        if "pip install" in line
    ]
    assert installs and all("-c requirements/lock" in line for line in installs), installs
    sweep = [line for line in _make_dry_run("sweep").splitlines() if "pip install" in line]
    assert not any("[dev" in line or "transformers" in line for line in sweep), sweep
