"""Entry point (a Hydra sweeper plugin): `python -m nanogpt.run -m hydra/sweeper=tune`.

Searches a space written in Hydra's own grammar (hydra.sweeper.params, or the command line:
`'perf.batch_size=choice(4,8,16)'`, `range(...)`, `interval(...)`) for the configuration with
the best tune.objective, driving Optuna's ask-and-tell API. Hydra discovers the plugin through
hydra_plugins/nanogpt_tune (Hydra accepts plugin classes from the `hydra_plugins` package
only); the search itself is here, and its plain logic in nanogpt/tune/ (docs/tune.md):

  1. probe      every candidate Optuna asks for, until hydra.sweeper.n_trials candidates have
                run or hydra.sweeper.time_limit_s has passed: composed and validated, its
                memory estimated (tune/fit.py: one that cannot fit is pruned before it runs),
                then measured over a short window (hydra.sweeper.probe). An `oom` or failed
                candidate is told to Optuna as infeasible (a constraint), never a failed search.
                A batch of `k` candidates (k: hydra/launcher=parallel's slots, else 1) is asked
                before any is told (Optuna's constant liar) and launched at once.
  2. full       the `leaders` best probes, measured with the configured protocol (left out
                when every leader is a finalist)
  3. repeats    the `finalists` best of those, `repeats` runs each (a job each, the finalists'
                runs round by round: frontend/grid_sweeper.run_rounds), pooled
  4. quality    the guard of the search's scenario (its guard face's `quality`): with real
                data each finalist's loss against the baseline's (tune/quality.py); with a
                target its runs' times to loss against the baseline's
  5. answer     best.yaml, tune.md, tune.json and a plot in the sweep dir (publish/tune_answer.py)

Every rung after the probes goes to the launcher as one batch: one `launch` call with all its
points (on several slots, all their rounds too, in round order), so the slots run them side by
side and none waits for a round of fewer points than slots.

The study lives in the sweep dir (SWEEP_DIR/study.journal, Optuna's journal file storage: no
database). Rerun the same command with hydra.sweep.dir=SWEEP_DIR after a kill: the study
continues, and the runner skips every point that already has an ok record (point_id), so no
point is measured twice. Ctrl-C stops it so too: the table of what ran, one line, exit 130.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import time
from pathlib import Path
from typing import Any, NoReturn

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict

from nanogpt.analysis import store
from nanogpt.config.errors import ConfigError
from nanogpt.frontend import tune_space as space
from nanogpt.frontend.callback import compose_point
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.grid_sweeper import Point, run_rounds
from nanogpt.frontend.presets import runs_here
from nanogpt.frontend.tune_space import as_overrides, merged, values_of
from nanogpt.publish import tune_answer as answer
from nanogpt.publish.sweep_outputs import publish, settings_of
from nanogpt.record.faults import CONFIG_EXIT, interrupted_exit
from nanogpt.record.swept import point_key  # a candidate's identity: its overrides, sorted
from nanogpt.scenarios import base as scenarios
from nanogpt.tune import fit, jobs, ladder, objectives

log = logging.getLogger(__name__)
STUDY_FILE = "study.journal"
STUDY_NAME = "tune"


class Search:
    """The search behind hydra_plugins/nanogpt_tune's TuneSweeper (Hydra's Sweeper API:
    setup, then sweep)."""

    def __init__(
        self,
        params: Any = None,
        n_trials: int = 16,
        time_limit_s: float | None = None,
        seed: int = 0,
        probe: Any = None,
        leaders: int = 4,
        finalists: int = 2,
        repeats: int = 3,
        memory_margin: float = 0.1,
        baseline: Any = None,
        quality: Any = None,
    ) -> None:
        self.params, self.quality = dict(params or {}), dict(quality or {})
        self.n_trials, self.time_limit_s, self.seed = n_trials, time_limit_s, seed
        self.leaders, self.finalists, self.repeats = leaders, finalists, repeats
        self.probe, self.baseline = as_overrides(probe), as_overrides(baseline)
        self.memory_margin = memory_margin
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.doing = "the search's start"  # what a Ctrl-C interrupts, for its line
        self.batch = 1  # candidates a probe batch asks before telling: the launcher's slots
        self.composed_runs: dict[tuple, int] = {}  # overrides -> runs (bench.repeats), composed
        self.composer: tuple | None = None  # (the config, callback.compose_point of it)

    def setup(self, *, hydra_context: HydraContext, config: DictConfig, launcher: Launcher) -> None:
        """Hydra's Sweeper.setup, less the launcher's instantiation: the plugin's face does that
        before it imports this module (hydra_plugins/nanogpt_tune)."""
        self.hydra_context = hydra_context
        self.config = config
        # hydra/launcher=parallel runs `slots` candidates side by side: a batch of that many
        self.batch = max(1, int(config.hydra.launcher.get("slots") or 1))
        self.launcher = launcher

    # ----------------------------------------------------------------------------------------
    def sweep(self, arguments: list[str]) -> Any:
        try:
            return self._sweep(arguments)
        except ConfigError as err:
            print(f"error: {err}", file=sys.stderr)
            sys.exit(CONFIG_EXIT)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (faults.Stopped), in this process
            self._stop()

    def _stop(self) -> NoReturn:
        """Ctrl-C as the search asks, composes or launches a candidate (one in a measurement is
        recorded and stops the sweep in callbacks.SweepReport.on_job_end). Nothing is undone:
        the trial stays open (a resume asks it first). As a grid: the table, one line, 130."""
        sweep_dir = Path(self.config.hydra.sweep.dir)
        with contextlib.suppress(KeyboardInterrupt):  # a second Ctrl-C: no table (nanogpt.report)
            if any(sweep_dir.rglob(store.RESULT_FILE)):  # as the multirun's end does
                publish(sweep_dir, settings_of(self.config))
        resume = f"rerun the same command with hydra.sweep.dir={sweep_dir} to resume"
        line = f"interrupted at {self.doing}; {resume} (the study and the ok points are kept)"
        print(line, file=sys.stderr)
        sys.exit(interrupted_exit())

    def _sweep(self, arguments: list[str]) -> Any:
        cfg = self.config
        self.started = time.time()
        self.sweep_dir = Path(cfg.hydra.sweep.dir)
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        fixed, dims, distributions = space.parse(parser, self.params, arguments)
        self.fixed, self.dims = fixed, dims
        self._refuse_what_every_candidate_shares()
        self.names = names = [getattr(o, "value", str(o)) for o in cfg.tune.objective]
        self.directions = [objectives.directions()[n] for n in names]
        self.prices = {"usd_per_hour": cfg.cost.usd_per_hour, "usd_per_kwh": cfg.cost.usd_per_kwh}
        self.scenario = scenarios.of_spec(cfg)  # what its runs are: time to loss with a target
        objectives.check(names, self.prices, self.scenario)  # one line, first
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        if hasattr(self.launcher, "start_slots"):  # hydra/launcher=parallel: its slots start
            self.launcher.start_slots(self.batch)  # while the study and first batch are made
        OmegaConf.save(cfg, self.sweep_dir / "multirun.yaml")
        self.jobs = jobs.JobNumbers(self.sweep_dir)
        # The memory of the device the points run on: unknown when a cluster's launcher runs
        # them (and then said), never this (login) node's
        device, budget_gib = str(cfg.bench.device), cfg.bench.max_batch_memory_gib
        self.budget = fit.device_budget(device, budget_gib, runs_here(cfg))
        if self.budget.bytes is None:
            print(fit.unknown_line(self.budget), file=sys.stderr)
        self.returns: list = []
        self.launched = 0  # jobs launched so far: the next one's number

        probes = self._probe_rung(distributions, ladder.grid_size(dims))
        if not any(e.feasible for e in probes):
            answer.write(self.sweep_dir, self._summary(probes, [], [], {}, dims))
            raise answer.none_feasible(probes, self.sweep_dir)
        leaders = ladder.climbers(probes, self.directions, self.leaders)
        if self.finalists < len(leaders):  # the leaders in one batch, as the finalists after
            full = self._measure_all([e.overrides for e in leaders], "full", [])
            finalists = ladder.climbers(full, self.directions, self.finalists)
        else:  # every leader is a finalist: one process each would decide nothing
            full, finalists = [], leaders
        repeats = [f"bench.repeats={self.repeats}"]  # the finalists' runs, round by round
        repeated = self._measure_all([e.overrides for e in finalists], "repeats", repeats)
        guard = self._quality(repeated)
        answer.write(self.sweep_dir, self._summary(probes, full, repeated, guard, dims))
        return self.returns

    def _refuse_what_every_candidate_shares(self) -> None:
        """A setting outside the space that no candidate can run with (a vocabulary below the
        tokenizer's, a device this machine lacks) is said now, with its fix, not after every
        trial has found it."""
        try:
            self._spec(merged(self.fixed, self.probe))
        except ConfigError as err:
            if err.key.lstrip("+") not in {key.lstrip("+") for key in self.dims}:
                said = str(err)[len(err.key) + 2 :]  # "problem; fix." after "key: "
                raise ConfigError(err.key, f"every candidate has it: {said}") from None

    # ----------------------------------------------------------------------------------------
    def _study(self) -> optuna.Study:
        storage = optuna.storages.JournalStorage(
            optuna.storages.journal.JournalFileBackend(str(self.sweep_dir / STUDY_FILE))
        )
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        study = optuna.create_study(
            study_name=STUDY_NAME,
            storage=storage,
            directions=self.directions,
            # Several trials asked before any is told (a batch for the launcher's slots): each
            # running one counts as a constant lie, so the batch spreads (Optuna's constant liar)
            sampler=optuna.samplers.TPESampler(
                seed=self.seed, n_startup_trials=4, constant_liar=self.batch > 1
            ),
            load_if_exists=True,
        )
        # A trial a kill or Ctrl-C left running: failed, its candidate asked again first (the runner
        # keeps a point already recorded ok, so nothing is measured twice).
        running = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,))
        for trial in running:
            study.tell(trial.number, state=optuna.trial.TrialState.FAIL)
            study.enqueue_trial(trial.params)
        return study

    def _probe_rung(self, distributions: dict, grid: int | None) -> list[ladder.Entry]:
        study = self._study()
        wanted = self.n_trials if grid is None else min(self.n_trials, grid)
        if not study.trials:  # a new search: first every value of every choice; every
            # candidate when n_trials covers the space (frontend/tune_space.py)
            whole = grid is not None and wanted == grid
            design = space.every_point if whole else space.initial_design
            for params in design(self.dims, distributions, self.seed):
                study.enqueue_trial(params)
        entries: dict[str, ladder.Entry] = {}
        for trial in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,)):
            overrides = [f"{k}={v}" for k, v in values_of(trial.params, self.dims).items()]
            if "entry" in trial.user_attrs:
                entries.setdefault(point_key(overrides), ladder.Entry(**trial.user_attrs["entry"]))
        ran = sum(1 for e in entries.values() if e.record)
        asks, limit = 0, 20 * max(wanted, 1) + len(entries)
        while ran < wanted and asks < limit:
            if self.time_limit_s is not None and time.time() - self.started > self.time_limit_s:
                log.info("tune: time limit reached after %d candidates", ran)
                break
            # A batch: up to `batch` new candidates asked before any is told, measured in one
            # launch (side by side on the parallel launcher's slots), then told
            asked: list[tuple[optuna.trial.Trial, list[str]]] = []
            new: dict[str, tuple[list[str], int]] = {}
            while len(new) < min(self.batch, wanted - ran) and asks < limit:
                asks += 1
                trial = study.ask(distributions)
                overrides = [f"{k}={v}" for k, v in values_of(trial.params, self.dims).items()]
                asked.append((trial, overrides))
                key = point_key(overrides)
                if key not in entries and key not in new:
                    new[key] = (overrides, trial.number)
                if grid is not None and len(entries) + len(new) >= grid:
                    break  # every point of the space is asked
            entries.update(self._probe_all(list(new.values())))
            for trial, overrides in asked:
                entry = entries[point_key(overrides)]
                trial.set_constraint("fits", 0.0 if entry.feasible else 1.0)
                trial.set_user_attr("entry", entry.__dict__)
                worst = [objectives.worst(n) for n in self.names]
                study.tell(trial, entry.values if entry.feasible else worst)
            ran = sum(1 for e in entries.values() if e.record)
            if grid is not None and len(entries) >= grid:
                break  # every point of the space has been tried
        self.study = study
        return list(entries.values())

    def _probe_all(self, candidates: list[tuple[list[str], int]]) -> dict[str, ladder.Entry]:
        """A batch of candidates' probes (each composed, validated, estimated: `_probe`), those
        that may fit measured in one launch; by candidate key."""
        entries = {point_key(p): self._probe(p, number) for p, number in candidates}
        measure = [(p, number) for p, number in candidates if entries[point_key(p)] is None]
        if measure:
            measured = self._measure_all([p for p, _ in measure], "probe", self.probe)
            for (_, number), entry in zip(measure, measured, strict=True):
                entry.trial = number
                entries[entry.key] = entry
        return entries

    def _probe(self, params: list[str], number: int) -> ladder.Entry | None:
        """One candidate's probe: composed, validated, estimated; None if it may fit (then
        measured, `_probe_all`)."""
        overrides = merged(self.fixed, params)
        entry = ladder.Entry(key=point_key(params), overrides=params, rung="probe", trial=number)
        self.doing = f"probe {entry.key}"
        try:
            spec = self._spec(merged(overrides, self.probe))
        except ConfigError as err:
            entry.reason = f"invalid: {err}"
            return entry
        misfit = fit.misfit(fit.estimate_bytes(spec), self.budget, fit.error_margin(spec))
        if misfit:
            entry.reason = f"pruned before running: {misfit}"
            return entry
        return None

    def _spec(self, overrides: list[str]):
        """A candidate's spec, validated for where it will run: a search submitted to a cluster
        from a login node asks none of that node's devices (presets.runs_here)."""
        loaded = self._compose(overrides)
        self.composed_runs[tuple(overrides)] = _runs_of(loaded)  # its launch composes no more
        with open_dict(loaded):
            del loaded["hydra"]
        return to_spec(loaded, runs_here(self.config))

    def _measure(
        self, params: list[str], rung: str, extra: list[str], trial: int | None = None
    ) -> ladder.Entry:
        """Run one candidate (the runner keeps a run already recorded ok) and judge it."""
        [entry] = self._measure_all([params], rung, extra, trial)
        return entry

    def _measure_all(
        self, candidates: list[list[str]], rung: str, extra: list[str], trial: int | None = None
    ) -> list[ladder.Entry]:
        """Run candidates together, their runs round by round (frontend/grid_sweeper.run_rounds)."""
        work = [(merged(self.fixed, p, extra), f"{rung} {point_key(p)}") for p in candidates]
        records = self._launch_all(work)
        return [
            ladder.judged(
                ladder.Entry(key=point_key(p), overrides=p, rung=rung, trial=trial, record=r),
                self.names,
            )
            for p, r in zip(candidates, records, strict=True)
        ]

    def _launch_all(self, work: list[tuple[list[str], str]]) -> list[dict]:
        """Launch (overrides, key) points in one batch, each in the dir its key keeps
        (tune/jobs.py; a key given twice is launched once), their runs round by round; what the
        search keeps of each point's record (pooled from its runs: analysis/store.pool_runs).
        On several slots every round goes in the one launch: a rung of fewer points than slots
        (one finalist's runs, the baseline's) fills them, and no slot waits for a round."""
        points: dict[str, Point] = {}
        for overrides, key in work:
            if key not in points:
                points[key] = Point(self.jobs.of(key), overrides, self._runs(overrides))
        self.doing = "; ".join(points)
        per_launch = max(p.runs for p in points.values()) if self.batch > 1 else 1
        done = run_rounds(
            self.launcher, list(points.values()), first_job=self.launched, per_launch=per_launch
        )
        self.launched += sum(len(returns) for returns in done.returns)
        self.returns += done.returns
        if done.interrupted:  # a run stopped by a signal: the sweep stops, as a grid's
            raise KeyboardInterrupt
        kept = {}
        for key, point in points.items():
            point_dir = self.sweep_dir / str(point.index)
            pooled = store.pool_runs(point_dir)
            outcomes = done.outcomes[point.index]
            record = pooled.to_dict() if pooled else (outcomes[-1].record if outcomes else {})
            record = record or {"status": "error", "error": "no run was launched"}
            kept[key] = jobs.kept(record, point_dir, self.names, self.prices)
        return [kept[key] for _, key in work]

    def _runs(self, overrides: list[str]) -> int:
        """A candidate's runs: its bench.repeats, composed (once: `_spec` keeps a probe's)."""
        if tuple(overrides) not in self.composed_runs:
            self.composed_runs[tuple(overrides)] = _runs_of(self._compose(overrides))
        return self.composed_runs[tuple(overrides)]

    def _compose(self, overrides: list[str]) -> DictConfig:
        """A candidate's config as its job's will be composed (callback.compose_point: the
        config groups composed once for the candidates that choose the same, each one's values
        set on a copy as Hydra sets them): 20 ms a candidate against Hydra's 100, serial
        between two batches on the 2-core machine."""
        if self.composer is None or self.composer[0] is not self.config:
            self.composer = (self.config, compose_point(self.config))
        return self.composer[1](overrides)

    # ----------------------------------------------------------------------------------------
    def _quality(self, finalists: list[ladder.Entry]) -> dict:
        """The quality guard of the search's scenario (its guard's `quality`): throughput's
        short seeded loss comparison, or with a target the finalists' runs' times to loss
        against the baseline's, run as often. Its points go through the launcher as the
        rungs' do, the search's fixed overrides under each."""
        search = scenarios.Searching(
            config=self.config,
            settings=self.quality,
            baseline=self.baseline,
            repeats=self.repeats,
            launch=lambda work: self._launch_all([(merged(self.fixed, o), k) for o, k in work]),
        )
        return self.scenario.guard.quality(finalists, search)

    def _summary(self, probes, full, repeated, guard, dims) -> dict:
        """The answer's data (publish/tune_answer.summarize): the rungs, the search, its limits."""
        rungs = {"probes": probes, "full": full, "repeated": repeated, "guard": guard}
        search = {"names": self.names, "directions": self.directions, "fixed": self.fixed}
        space = {"dims": dims, "budget": self.budget, "margin": self.memory_margin}
        limits = {"n_trials": self.n_trials, "time_limit_s": self.time_limit_s}
        wall = time.time() - self.started
        return answer.summarize(**rungs, **search, **space, **limits, search_wall_s=wall)


def _runs_of(loaded: DictConfig) -> int:
    """A composed point's runs: its bench.repeats."""
    return max(1, int(OmegaConf.select(loaded, "bench.repeats") or 1))
