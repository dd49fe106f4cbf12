"""Entry point: `python -m nanogpt.run [-m] key=value ...`.

This module and nanogpt/callbacks.py are the only ones that know Hydra. Hydra composes the
config from conf/ against the schema in nanogpt/config.py; from here on the library sees a
plain RunSpec.
"""

from __future__ import annotations

import sys
from pathlib import Path

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from nanogpt.config import RunSpec
from nanogpt.errors import ConfigError
from nanogpt.job import Job, run_point
from nanogpt.validate import check

CONF_DIR = str(Path(__file__).resolve().parent.parent / "conf")

ConfigStore.instance().store(name="base_config", node=RunSpec)


def to_spec(cfg: DictConfig) -> RunSpec:
    """The plain, validated spec of a composed config (raises ConfigError)."""
    spec = OmegaConf.to_object(cfg)
    check(spec)
    return spec


def job_from_hydra(cfg: DictConfig) -> Job:
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    sweep_dir = Path(hc.sweep.dir) if multirun else None
    return Job(
        job_dir=Path(hc.runtime.output_dir),
        overrides=list(hc.overrides.task),
        sweep_dir=sweep_dir,
        group=sweep_dir.name if sweep_dir else None,
        config=OmegaConf.to_container(cfg, resolve=True),
    )


@hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")
def main(cfg: DictConfig) -> str:
    try:
        spec = to_spec(cfg)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        sys.exit(2)
    return run_point(spec, job_from_hydra(cfg))["status"]


if __name__ == "__main__":
    main()
