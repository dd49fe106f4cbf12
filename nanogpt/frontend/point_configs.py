"""A sweep's jobs composed as Hydra composes them, each choice of config groups once.

Hydra's launchers compose every job whole (`config_loader.load_sweep_config`): the defaults
list read again, every config file merged into the schema again, then the job's overrides set.
That is 60-70 ms of CPU a job on 2 cores, most of it OmegaConf's copies, for a result that for
most jobs differs from the last only in a few values (a sweep's points mostly differ in
`key=value`s; a run's job adds its `hydra.sweep.subdir`).

Hydra composes in two steps: the config groups the overrides choose give the defaults list and
its composition; then each `key=value` is set on the result in order (`OmegaConf.update`,
merge=True), after the master's own hydra overrides. `PointConfigs` does the first step once
for the jobs that choose the same groups (by Hydra, from the same master), and the second on a
copy, as Hydra does it; then records the overrides where Hydra does (hydra.overrides.task and
.hydra, hydra.job.override_dirname). What it returns equals Hydra's own composition of the job,
hydra node and all (tests/test_config.py compares them): about 15 ms a job.

A job with anything else is composed by Hydra whole, with Hydra's own error where it has one: an
override that adds or deletes a key (`+key=`, `~key`), a dict or list value, a key that is no
plain value of the composition, a value that does not fit its key, and a hydra setting other
than the run's subdir (some, as hydra.job.env_copy, act in Hydra's composition itself).

The sweepers give their launcher a `PointConfigs` in place of Hydra's loader (grid_sweeper,
tune_sweeper), and the callback's check of every point composes through the same one
(`PointConfigs.of`): the sweep composes each choice of groups once, whichever asks first. It
pickles to a loader with empty caches (a parallel launcher's slot, a SLURM job).
"""

from __future__ import annotations

import copy
import weakref
from typing import Any

from hydra._internal.config_loader_impl import get_overrides_dirname  # Hydra's own, not a copy
from hydra.core.config_loader import ConfigLoader
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override, OverrideType
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

# The one hydra setting a job's overrides set on the copy: the run's dir in its point's
# (grid_sweeper.run_rounds), a plain value that nothing in Hydra's composition reads.
JOB_HYDRA_VALUES = frozenset({"hydra.sweep.subdir"})

_of_loader: weakref.WeakKeyDictionary[ConfigLoader, PointConfigs] = weakref.WeakKeyDictionary()


def with_point_configs(hydra_context: HydraContext) -> HydraContext:
    """The sweep's HydraContext for its launcher: its config loader's PointConfigs."""
    return HydraContext(
        config_loader=PointConfigs.of(hydra_context.config_loader),
        callbacks=hydra_context.callbacks,
    )


class PointConfigs:
    """Hydra's ConfigLoader, with `load_sweep_config` composing each choice of groups once (the
    module's docstring); every other method is the wrapped loader's."""

    def __init__(self, loader: ConfigLoader) -> None:
        self.loader = loader
        self._groups: frozenset[str] | None = None
        self._parsed: dict[str, Override] = {}  # an override's text -> Hydra's parse of it
        self._master: DictConfig | None = None  # the master the bases are of (a sweep has one)
        self._bases: dict[tuple[str, ...], DictConfig] = {}  # the groups' overrides -> Hydra's

    @classmethod
    def of(cls, loader: ConfigLoader) -> PointConfigs:
        """The one PointConfigs of `loader` in this process (Hydra's, or a PointConfigs)."""
        if isinstance(loader, PointConfigs):
            return loader
        if loader not in _of_loader:
            _of_loader[loader] = cls(loader)
        return _of_loader[loader]

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):  # pickle's and copy's questions are the class's
            raise AttributeError(name)
        return getattr(self.__dict__["loader"], name)

    def __getstate__(self) -> dict:
        return {"loader": self.loader}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["loader"])

    # ----------------------------------------------------------------------------------------
    def load_sweep_config(
        self, master_config: DictConfig, sweep_overrides: list[str]
    ) -> DictConfig:
        """What Hydra's `load_sweep_config(master_config, sweep_overrides)` returns."""
        overrides = list(sweep_overrides)
        parsed = self._parse(overrides)
        if parsed is None:
            return self.loader.load_sweep_config(master_config, overrides)
        groups = self._group_names()
        chosen = [o for o in parsed if o.key_or_group.split("/")[0] in groups]
        values = [o for o in parsed if o.key_or_group.split("/")[0] not in groups]
        if not all(_a_plain_value(o) for o in values):
            return self.loader.load_sweep_config(master_config, overrides)
        cfg = copy.deepcopy(self._base(master_config, tuple(o.input_line for o in chosen)))
        try:
            for o in values:
                if not _a_value_in(cfg, o.key_or_group):
                    return self.loader.load_sweep_config(master_config, overrides)
                OmegaConf.update(cfg, o.key_or_group, o.value(), merge=True)
        except OmegaConfBaseException:  # Hydra's own error, from its own composition
            return self.loader.load_sweep_config(master_config, overrides)
        # where Hydra records the overrides (config_loader_impl._load_configuration_impl)
        task = [o for o in parsed if not o.is_hydra_override()]
        cfg.hydra.overrides.task = [o.input_line for o in task]
        cfg.hydra.overrides.hydra = [
            *master_config.hydra.overrides.hydra,
            *(o.input_line for o in parsed if o.is_hydra_override()),
        ]
        dirname = cfg.hydra.job.config.override_dirname
        cfg.hydra.job.override_dirname = get_overrides_dirname(
            overrides=task,
            kv_sep=dirname.kv_sep,
            item_sep=dirname.item_sep,
            exclude_keys=dirname.exclude_keys,
        )
        OmegaConf.copy_cache(from_config=master_config, to_config=cfg)
        return cfg

    def _base(self, master: DictConfig, chosen: tuple[str, ...]) -> DictConfig:
        """The composition of the master with the groups `chosen` (Hydra's, kept)."""
        if master is not self._master:
            self._master, self._bases = master, {}
        if chosen not in self._bases:
            self._bases[chosen] = self.loader.load_sweep_config(master, list(chosen))
        return self._bases[chosen]

    def _parse(self, overrides: list[str]) -> list[Override] | None:
        """Hydra's parse of each override (kept: a sweep's jobs repeat them), or None for any
        that Hydra would refuse (it then composes the job, and says why)."""
        new = [line for line in dict.fromkeys(overrides) if line not in self._parsed]
        if new:
            try:
                parsed = OverridesParser.create().parse_overrides(new)
                self._parsed.update(zip(new, parsed, strict=True))
            except Exception:  # noqa: BLE001 - Hydra's own parse raises its own error later
                return None
        return [self._parsed[line] for line in overrides]

    def _group_names(self) -> frozenset[str]:
        if self._groups is None:
            self._groups = frozenset(self.loader.list_groups(""))
        return self._groups


def _a_plain_value(override: Override) -> bool:
    """`a.b=value`: a change of one key to a value that is no dict or list (of the hydra node,
    the run's subdir alone)."""
    return (
        override.type == OverrideType.CHANGE
        and override.package is None
        and "." in override.key_or_group
        and not override.is_sweep_override()
        and (not override.is_hydra_override() or override.key_or_group in JOB_HYDRA_VALUES)
        and not isinstance(override.value(), (dict, list))
    )


def _a_value_in(cfg: DictConfig, key: str) -> bool:
    """Whether `key` (a.b.c) is a value of `cfg`, not a dict or list, read without resolving
    anything (an interpolation's resolver may ask torch for the device: model=auto)."""
    path, _, last = key.rpartition(".")
    parent = OmegaConf.select(cfg, path)
    if not OmegaConf.is_dict(parent) or last not in parent.keys():
        return False
    return OmegaConf.is_interpolation(parent, last) or not OmegaConf.is_config(parent[last])
