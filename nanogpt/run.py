"""Entry point: `python -m nanogpt.run [-m] key=value ...`.

An entry point: with the other entry points (calibrate, report, callbacks) and
nanogpt/frontend/compose.py,
the only modules that know Hydra. Hydra composes the config from conf/ against the schema in
nanogpt/config/; from here on the library sees a plain RunSpec, and nanogpt/launch runs the
point (ARCHITECTURE.md follows one point through the layers).

Data parallelism (nanogpt/train/distributed.py): under `torchrun --nproc_per_node=N -m nanogpt.run`,
or as one of N submitit tasks (hydra/launcher=slurm with tasks_per_node=N), this process is a
rank. Rank 0 runs the point and writes its record; the other ranks follow it.

Light at its top: the standard library and four small modules, no Hydra, OmegaConf or launch
code; each function imports what it uses. Every child of a sweep's fork server runs the sweep's
main module again (multiprocessing does; runner/forkserver.py says why), and under
`python -m nanogpt.run` that is this module: so it costs a child milliseconds.
"""

from __future__ import annotations

import atexit
import errno
import gc
import logging
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nanogpt.config.errors import ConfigError
from nanogpt.logs import capture_warnings, say_once_per_sweep
from nanogpt.record.faults import CONFIG_EXIT, IO_EXIT, handle_sigterm
from nanogpt.train.distributed import World, adopt_submitit_tasks

if TYPE_CHECKING:
    from omegaconf import DictConfig

    from nanogpt.config.spec import RunSpec
    from nanogpt.runner.handoff import Job
    from nanogpt.runner.job import Outcome


def job_from_hydra(cfg: DictConfig) -> Job:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode
    from omegaconf import OmegaConf

    from nanogpt.analysis.store import run_number, sweep_id
    from nanogpt.runner.handoff import Job

    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    # absolute, as Hydra's output_dir is: the default hydra.sweep.dir (multirun/DATE/TIME) is
    # relative, and a run's place in its sweep is job_dir relative to it
    sweep_dir = Path(hc.sweep.dir).resolve() if multirun else None
    job_dir = Path(hc.runtime.output_dir)
    return Job(
        job_dir=job_dir,
        run=run_number(job_dir) if multirun and ours(hc) else None,  # POINT/run-R
        overrides=list(hc.overrides.task),
        sweep_dir=sweep_dir,
        group=sweep_id(sweep_dir) if sweep_dir else None,
        config=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
        logging=OmegaConf.to_container(hc.job_logging, resolve=True) if hc.job_logging else None,
    )


def as_rank(spec: RunSpec, world: World, by_torchrun: bool) -> RunSpec:
    """The spec of a point that this process measures as rank 0 of a world already running.

    It is measured here: the ranks are this process and its peers, so there is no child process
    to isolate it in, and no torchrun to start (dist.nproc). A multirun under torchrun by hand
    is refused: its points would run one after another in the same processes, unisolated, and
    one failed point would end them all. Under hydra/launcher=slurm, dist.nproc=N is a job of
    N tasks (nanogpt/frontend/launchers/slurm.py): its ranks are those tasks.
    """
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    if spec.dist.nproc != 1 and (by_torchrun or spec.dist.nproc != world.size):
        raise ConfigError(
            "dist.nproc",
            f"is {spec.dist.nproc} but this process already is rank 0 of {world.size} "
            "(started by torchrun or as a submitit task)",
            "drop dist.nproc: the ranks are already there",
        )
    if by_torchrun and HydraConfig.get().mode == RunMode.MULTIRUN:
        raise ConfigError(
            "--multirun",
            "under torchrun all points would run one after another in the same processes",
            "sweep with `python -m nanogpt.run -m dist.nproc=N ...`: each point starts torchrun",
        )
    from nanogpt.frontend.compose import in_place

    return in_place(spec)


def ours(hc) -> bool:
    """Whether the multirun's sweeper is this project's (configs.OUR_SWEEPERS)."""
    from nanogpt.frontend.presets import OUR_SWEEPERS

    return hc.runtime.choices.get("hydra/sweeper") in OUR_SWEEPERS


def refuse_runs_under_another_sweeper(spec: RunSpec) -> None:
    """Under a sweeper that is not this project's (Hydra's basic, Optuna, Ax, ...) a job is one
    run: it cannot order a point's runs with the others', so bench.repeats > 1 is refused."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from nanogpt.frontend.presets import repeats_refusal

    hc = HydraConfig.get()
    if hc.mode == RunMode.MULTIRUN and not ours(hc) and spec.bench.repeats > 1:
        sweeper = hc.runtime.choices.get("hydra/sweeper")
        raise ConfigError(*repeats_refusal(sweeper, spec.bench.repeats))


def refuse_a_preset_without_multirun() -> None:
    """A preset (+sweep=NAME) is a list of points: run once, it would measure one default point
    and say nothing of the others (Hydra sweeps only under -m)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from nanogpt.frontend.presets import SWEEP_GROUP

    hc = HydraConfig.get()
    preset = hc.runtime.choices.get(SWEEP_GROUP)
    if preset and hc.mode != RunMode.MULTIRUN:
        raise ConfigError(
            f"+{SWEEP_GROUP}={preset}",
            "a sweep preset runs its points only as a multirun, and this is a single run",
            f"add -m: `python -m nanogpt.run -m +{SWEEP_GROUP}={preset} ...`",
        )


def main(cfg: DictConfig) -> Outcome | float | tuple[float, ...] | int:
    """Hydra's task function (hydra_main): one run of a point, composed. Its return: the run's
    Outcome (status, record, objective) under this project's sweepers and for a single run, the
    objective alone under another sweeper (Optuna's, ...)."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from nanogpt.frontend.compose import check_launcher_nodes, launcher_name, to_spec
    from nanogpt.runner.job import run_point, run_single

    handle_sigterm()  # a scheduler's SIGTERM stops the point like Ctrl-C: recorded, then exit 143
    capture_warnings()  # warnings into the job's log too (conf/hydra/job_logging), one line each
    by_submitit = adopt_submitit_tasks()
    world = World.from_env()
    if not world.is_main:  # a submitit task of rank > 0 (under torchrun: see __main__ below)
        return _follow()
    try:
        refuse_a_preset_without_multirun()
        # a multirun's jobs: what composing says, the sweep said once at its start
        spec = to_spec(cfg, say=HydraConfig.get().mode != RunMode.MULTIRUN)
        refuse_runs_under_another_sweeper(spec)
        check_launcher_nodes(spec.dist.nodes, launcher_name({"hydra": HydraConfig.get()}))
        if world.size > 1:
            spec = as_rank(spec, world, by_torchrun=not by_submitit)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        if world.size > 1:
            _release_followers(world)
        sys.exit(CONFIG_EXIT)
    job = job_from_hydra(cfg)
    say_once_per_sweep(job.sweep_dir)  # a line every point says alike: once on the console
    outcome = run_point(spec, job) if job.sweep_dir else run_single(spec, job)
    status = outcome.status
    if world.size > 1 and status not in ("ok", "skipped"):
        # No more messages: a follower may still be stuck in a collective. Under torchrun, exit
        # non-zero so that torchrun stops them. A submitit task returns (a failed task would
        # cost the whole sweep); its followers fail or exit with this process.
        if not by_submitit:
            sys.exit(1)
    elif by_submitit:
        _release_followers(world)  # this task's one job is done
    from nanogpt.tune.objectives import objective_of

    outcome.objective = objective_of(spec, outcome.record)
    hc = HydraConfig.get()
    return outcome if job.sweep_dir is None or ours(hc) else outcome.objective


def hydra_main() -> None:
    """Hydra's own main around `main`: it composes the config, then runs one point or, under
    -m, the sweep (decorated here, when called, so that importing this module imports no
    Hydra)."""
    import hydra

    import nanogpt.frontend.compose  # noqa: F401 - the schema (base_config) and resolvers conf/ builds on
    from nanogpt.frontend.presets import CONF_DIR

    hydra.main(version_base="1.3", config_path=CONF_DIR, config_name="config")(main)()


def disk_error_line(err: OSError) -> str:
    """One sentence for a file that cannot be written: the path, why, and what to do."""
    where = err.filename or "writing below the run's dir"
    if err.errno == errno.ENOSPC:
        fix = "free space there"
    elif err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        fix = "make it writable"
    else:
        fix = "check that disk"
    return (
        f"{where}: {err.strerror or err}; {fix} or give another hydra.sweep.dir (hydra.run.dir), "
        "then rerun the same command: the points already recorded ok are kept."
    )


def main_with_one_line_errors() -> None:
    """Hydra prints its composition errors over several lines; we print one sentence, as for a
    disk that is full or not writable. HYDRA_FULL_ERROR=1 (set by the user) keeps Hydra's full
    report and traceback."""
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from nanogpt.frontend.compose import hydra_error_line

    if os.environ.get("HYDRA_FULL_ERROR") == "1":
        hydra_main()
        return
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra then raises its config errors to us
    logging.raiseExceptions = False  # a full disk: no traceback from Hydra's job log file
    try:
        hydra_main()
    except (HydraException, OmegaConfBaseException) as err:
        print(f"error: {hydra_error_line(err)}", file=sys.stderr)
        sys.exit(CONFIG_EXIT)
    except OSError as err:
        print(f"error: {disk_error_line(err)}", file=sys.stderr)
        sys.exit(IO_EXIT)
    except ValueError as err:  # Hydra's command-line checks (e.g. -m with --cfg)
        if not raised_by_hydra(err):
            raise
        print(f"error: {err}; see `python -m nanogpt.run --hydra-help`.", file=sys.stderr)
        sys.exit(CONFIG_EXIT)


def raised_by_hydra(err: BaseException) -> bool:
    """Whether the exception was raised inside Hydra's own code (its last frame)."""
    tb = err.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and f"{os.sep}hydra{os.sep}" in tb.tb_frame.f_code.co_filename


def _follow() -> int:
    """A rank > 0 measures what rank 0 sends (worker.follow)."""
    from nanogpt.runner.worker import follow  # the measuring code, and torch, only here

    return follow()


def _release_followers(world: World) -> None:
    """Rank 0 is done: the ranks waiting in worker.follow exit (none in a single-rank run, which
    so never imports the measuring code: a sweep's own process does without torch)."""
    if world.size > 1:
        from nanogpt.runner.worker import release_followers

        release_followers(world)


def cli() -> None:
    """`python -m nanogpt.run` and the `nanogpt-run` command."""
    # Under torchrun by hand only rank 0 runs Hydra, so there is one run dir (named by rank 0's
    # clock: each rank's own would differ across a second boundary), one .hydra/ and one log.
    # The other ranks never compose a config: they measure the point rank 0 sends them
    # (worker.follow) in lockstep and write nothing to the run dir. Rank 0 tells them it is
    # done once Hydra returns, whether it ran a point or not (--help, --cfg); after an error it
    # exits non-zero instead, and torchrun stops them.
    world = World.from_env()
    if not world.is_main:
        world.exit(_follow())
    from nanogpt.runner.process import collector_paused

    # What every run of this process imports (Hydra, the schema, the multirun's callback) with
    # the collector paused, then frozen (process.collector_paused): a sweep's process, 0.9 CPU-s
    # on 2 cores, spends half of it importing (pandas, for the table, at the sweep's end)
    with collector_paused():
        import hydra  # noqa: F401

        import nanogpt.frontend.callback  # noqa: F401
        import nanogpt.frontend.compose  # noqa: F401
    from nanogpt.frontend.presets import expose_checkout_plugins

    # Registered first, so run last of the exit's handlers (files, logs and the launcher's
    # slots are closed by theirs): what this process made is left to the exit, not walked by
    # the interpreter's final collections first. A sweep's process holds Hydra, Optuna, pandas
    # and torch: 0.6-1 s of a search's wall time on the 2-core machine, the last thing its user
    # waits for (benchmarks/search_slots.py)
    atexit.register(gc.freeze)
    expose_checkout_plugins()  # before Hydra scans for its launchers and sweepers
    try:
        main_with_one_line_errors()
    except SystemExit as stop:
        if stop.code:
            raise
    if world.size > 1:
        _release_followers(world)
        world.exit(0)


if __name__ == "__main__":
    cli()
