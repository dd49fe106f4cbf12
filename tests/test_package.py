"""The installable package: a real wheel, built with pip and installed (not editable) into a fresh
venv, carries every module, config and preset and runs from any directory through its console
commands.

The fresh venv gets its dependencies (torch, Hydra, ...) from this interpreter's site-packages
through a .pth line, so nothing is downloaded; the project itself comes from the wheel alone
(a .pth line does not run the editable install's own .pth hooks).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

from nanogpt.analysis.store import read_result

from .conftest import MICRO, REPO

pytestmark = pytest.mark.slow

COMMANDS = ("nanogpt-run", "nanogpt-report", "nanogpt-calibrate", "nanogpt-dashboard")
SKIP_DIRS = {".git", ".venv", "build", "dist", "multirun", "outputs", "wandb", "__pycache__"}


def source_files(folder: str, suffix: str) -> set[str]:
    return {
        path.relative_to(REPO / folder).as_posix()
        for path in (REPO / folder).rglob(f"*{suffix}")
        if not SKIP_DIRS & set(path.parts)
    }


def pip(*args: str, cwd: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(the wheel, the fresh venv's bin dir, an env without this checkout on PYTHONPATH)."""
    root = tmp_path_factory.mktemp("package")
    source = root / "source"  # a copy: the build writes build/ and *.egg-info beside its input
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(*SKIP_DIRS, ".venv*", "*.egg-info"))
    pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), ".", cwd=source)
    [wheel] = (root / "dist").glob("nanogpt_sweep-*.whl")

    env_dir = root / "venv"
    venv.EnvBuilder(with_pip=False).create(env_dir)
    bin_dir = env_dir / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    purelib = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    deps = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (Path(purelib) / "deps.pth").write_text("\n".join(sorted(deps)) + "\n")
    pip("--python", str(python), "install", "--no-deps", "--no-index", str(wheel), cwd=root)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    return wheel, bin_dir, env


def test_the_wheel_carries_every_module_config_and_preset(installed):
    wheel, _, _ = installed
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {f"nanogpt/{name}" for name in source_files("nanogpt", ".py")} <= names
    assert {f"nanogpt/conf/{name}" for name in source_files("conf", ".yaml")} <= names
    assert {f"nanogpt/sweeps/{name}" for name in source_files("sweeps", ".yaml")} <= names
    assert "nanogpt/sweeps/README.md" in names
    # hydra/sweeper=tune: Hydra finds its plugin in the hydra_plugins namespace package, which
    # must stay a namespace (no __init__.py) so that other plugins' modules join it
    assert "hydra_plugins/nanogpt_tune/plugin.py" in names
    assert "hydra_plugins/__init__.py" not in names
    entry_points = next(n for n in names if n.endswith("entry_points.txt"))
    text = zipfile.ZipFile(wheel).read(entry_points).decode()
    assert all(f"{command} = " in text for command in COMMANDS)
    assert not [n for n in names if n.startswith(("tests/", "conf/", "sweeps/"))]


def test_the_installed_commands_run_a_sweep_with_a_preset_from_any_directory(installed, tmp_path):
    _, bin_dir, env = installed
    where = subprocess.run(
        [bin_dir / "python", "-c", "import nanogpt.frontend.presets as c; print(c.CONF_DIR)"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    assert Path(where).is_relative_to(bin_dir.parent) and REPO not in Path(where).parents

    for command in COMMANDS:
        assert (bin_dir / command).is_file(), command
    sweep_dir = tmp_path / "sweep"
    micro = [o for o in MICRO if not o.startswith("perf.batch_size")]
    proc = subprocess.run(
        [
            bin_dir / "nanogpt-run",
            "-m",
            "+sweep=grad_accum",
            *micro,
            "bench.isolate=false",
            "+sweep/accum_split=16x1,8x2",  # the preset's 2 splits of fewest micro-steps
            "bench.measure_steps=2",
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [read_result(p) for p in sweep_dir.glob("*/result.json")]
    assert sorted((r["batch_size"], r["grad_accum"]) for r in records) == [(8, 2), (16, 1)]
    assert all(r["status"] == "ok" for r in records)

    report = subprocess.run(
        [bin_dir / "nanogpt-report", str(sweep_dir)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert report.returncode == 0, report.stderr[-3000:]
    assert (sweep_dir / "summary.csv").is_file()
    bad = subprocess.run(
        [bin_dir / "nanogpt-run", "perf.nosuch=1"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert bad.returncode == 2 and bad.stderr.startswith("error: perf.nosuch: ")
