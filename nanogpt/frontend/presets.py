"""Where the configs are, the sweep presets as Hydra's `sweep` group, and a multirun's points.

conf/ and sweeps/ sit at the top of a checkout. An installed wheel carries them inside the
package as nanogpt/conf and nanogpt/sweeps (pyproject.toml maps the two dirs there), so the tool
runs from any directory: `config_dir` takes the package's copy when there is one, else the
checkout's.

The presets are the `sweep` group (`+sweep=NAME`) without being a dir of conf/: each file of
sweeps/ (and of its sub-dirs, e.g. `sweep/accum_split`) is registered in Hydra's ConfigStore,
at the package its `# @package` header names. Hydra then lists, composes and completes them like
any group, from a checkout or a wheel alike.

Known to Hydra, like frontend/compose.py: only the entry points and app import this module.
"""

from __future__ import annotations

import functools
import importlib
import itertools
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

PACKAGE_DIR = Path(__file__).resolve().parents[1]  # nanogpt/
SWEEP_GROUP = "sweep"
PACKAGE_HEADER = "# @package "

# What a launcher can do, on its own class: nanogpt's say it (hydra_plugins/nanogpt_launchers/:
# `runs_elsewhere`, its points run on other machines and are not checked against this one's
# devices; `jobs_apart`, its jobs run in processes of their own, and the sweep's process says
# when the sweep stops). Launchers of other plugins carry no such attribute: Hydra's own for
# clusters and queues are named here, every other one runs its jobs here, in the sweep's process.
THEIR_LAUNCHERS = {
    "hydra_plugins.hydra_submitit_launcher.submitit_launcher.SlurmLauncher": (True, True),
    "hydra_plugins.hydra_ray_launcher.ray_aws_launcher.RayAWSLauncher": (True, True),
    "hydra_plugins.hydra_rq_launcher.rq_launcher.RQLauncher": (True, True),
}


@dataclass(frozen=True)
class Capabilities:
    runs_elsewhere: bool = False
    jobs_apart: bool = False


def launcher_capabilities(target: str) -> Capabilities:
    """What the launcher class `target` (its `_target_`) can do: its own attributes, imported
    (a plugin's face, cheap: Hydra imported it at its start), else THEIR_LAUNCHERS."""
    if target in THEIR_LAUNCHERS:
        return Capabilities(*THEIR_LAUNCHERS[target])
    module, _, name = target.rpartition(".")
    try:
        launcher = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError, ValueError):
        return Capabilities()
    return Capabilities(
        bool(getattr(launcher, "runs_elsewhere", False)),
        bool(getattr(launcher, "jobs_apart", False)),
    )


def config_dir(name: str) -> Path:
    """nanogpt/NAME in an installed package, else NAME at the top of the checkout."""
    installed = PACKAGE_DIR / name
    return installed if installed.is_dir() else PACKAGE_DIR.parent / name


def expose_checkout_plugins() -> None:
    """Let Hydra find this checkout's plugins (hydra/launcher=parallel|slurm, hydra/sweeper=tune)
    under an editable install. Hydra lists the folders of the `hydra_plugins` namespace; `pip
    install -e` maps the checkout's hydra_plugins/ in through an import hook that such a listing
    does not see (a wheel puts them in site-packages, where it does). The checkout's folder is
    added to the namespace's path; nothing changes where it is already there or absent."""
    import hydra_plugins

    here = PACKAGE_DIR.parent / "hydra_plugins"
    if here.is_dir() and str(here) not in list(hydra_plugins.__path__):
        hydra_plugins.__path__.append(str(here))


CONF_DIR = str(config_dir("conf"))
SWEEPS_DIR = config_dir("sweeps")


def _package_of(path: Path) -> str | None:
    """The package a config file's header names (`# @package _global_`), None for none."""
    with path.open(encoding="utf-8") as f:
        for line in f:
            if line.startswith(PACKAGE_HEADER):
                return line[len(PACKAGE_HEADER) :].strip()
            if line.strip() and not line.startswith("#"):
                return None
    return None


@functools.cache
def register_presets(sweeps_dir: Path = SWEEPS_DIR) -> list[str]:
    """Every preset below sweeps_dir in the `sweep` group (sub-dirs: sweep/SUBDIR); their
    names, as `+sweep=...` takes them."""
    store = ConfigStore.instance()
    names = []
    for path in sorted(sweeps_dir.rglob("*.yaml")):
        relative = path.relative_to(sweeps_dir).with_suffix("")
        group = "/".join([SWEEP_GROUP, *relative.parts[:-1]])
        store.store(
            group=group,
            name=relative.name,
            node=OmegaConf.load(path),
            package=_package_of(path),
            provider="nanogpt sweeps/",
        )
        names.append(relative.as_posix())
    return names


def expand(overrides: list[str]) -> list[list[str]] | None:
    """The points of a grid sweep, in Hydra's basic sweeper's order: the cartesian product of
    every comma list, each axis where its key first appears (a later override of a key replaces
    its values), through Hydra's public override parser. None for a sweep that is no grid
    (interval(...)), which the basic sweeper refuses itself."""
    axes: dict[str, list[str]] = {}
    for override in OverridesParser.create().parse_overrides(overrides):
        key = override.get_key_element()
        if not override.is_sweep_override():
            axes[key] = [f"{key}={override.get_value_element_as_str()}"]
        elif override.is_discrete_sweep():
            axes[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            return None
    return [list(point) for point in itertools.product(*axes.values())]


# This project's sweepers: they run a point's bench.repeats runs as jobs, round by round
# (nanogpt/frontend/grid_sweeper.py), and take a job's Outcome back; any other sweeper gets the
# objective.
OUR_SWEEPERS = ("grid", "tune")


def repeats_refusal(sweeper: str | None, repeats: int) -> tuple[str, str, str]:
    """The ConfigError's (key, problem, fix) for bench.repeats > 1 under another sweeper: it
    runs a job a point, and a job is one run, so it cannot order a point's runs."""
    return (
        "bench.repeats",
        f"is {repeats} but hydra/sweeper={sweeper} runs one job a point, and a job is one run",
        "drop hydra/sweeper=... (the default, grid, runs a point's runs round by round) or set "
        "bench.repeats=1",
    )


def sweep_points(config: DictConfig) -> list[list[str]] | None:
    """Every point's overrides, as the grid sweeper (and Hydra's basic one) will expand them
    (the preset's hydra.sweeper.params, then the command line); None for another sweeper
    (Optuna, Ax, ...), whose points are not known before it runs."""
    if config.hydra.runtime.choices.get("hydra/sweeper") not in ("grid", "basic"):
        return None
    params = config.hydra.sweeper.get("params") or {}
    return expand([*(f"{k}={v}" for k, v in params.items()), *config.hydra.overrides.task])


def runs_here(config: DictConfig) -> bool:
    """Whether the sweep's points run on this machine, not on a cluster's (the launcher's own
    `runs_elsewhere`)."""
    return not launcher_capabilities(str(config.hydra.launcher.get("_target_", ""))).runs_elsewhere
