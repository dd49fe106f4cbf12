"""hydra/sweeper=tune (docs/tune.md): the search, its constraints, its resume, its quality guard.

The slow tests run the real command (`python -m nanogpt.run -m hydra/sweeper=tune ...`) on the
micro model; the others check the plain logic (nanogpt/tune/) and the composed config.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest

# The search's engine: where it is not installed (the GPU machines) the module is skipped, not
# an error that stops pytest from running any test (the imports below need it:
# frontend/tune_space.py).
optuna = pytest.importorskip("optuna")

import torch
from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from nanogpt import report
from nanogpt.analysis.store import read_result
from nanogpt.config.errors import ConfigError
from nanogpt.frontend import tune_space as space
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.frontend.tune_sweeper import Search
from nanogpt.publish import tune_answer as answer
from nanogpt.scenarios import base
from nanogpt.scenarios.time_to_loss import guard as ttl_guard
from nanogpt.scenarios.time_to_loss import pool as ttl
from nanogpt.tune import fit, jobs, ladder, objectives, quality
from nanogpt.tune.objectives import objective_of

from .conftest import SHAKESPEARE, needs_shared, run_cli, with_micro
from .signalling import in_terminal, interrupt, wait_until

TUNE = "hydra/sweeper=tune"
SMALL_SEARCH = [  # every rung, kept short: two leaders, one finalist measured in two processes
    "hydra.sweeper.leaders=2",
    "hydra.sweeper.finalists=1",
    "hydra.sweeper.repeats=2",
    "hydra.sweeper.probe=['bench.measure_steps=2','bench.min_measure_steps=1','bench.diagnose=false']",
]


def _spec(*overrides: str):
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_spec(compose(config_name="config", overrides=with_micro(overrides)))


def _study(sweep_dir) -> optuna.Study:
    storage = optuna.storages.JournalStorage(
        optuna.storages.journal.JournalFileBackend(str(sweep_dir / "study.journal"))
    )
    return optuna.load_study(study_name="tune", storage=storage)


def _value(trial: optuna.trial.FrozenTrial, key: str) -> str:
    """The value a trial gave KEY, from the overrides it ran (an ordered choice's param is its
    position: tune_space.values_of)."""
    overrides = dict(o.split("=", 1) for o in trial.user_attrs["entry"]["overrides"])
    return overrides[key]


def _records(sweep_dir) -> dict:
    """point dir -> result.json, every point's record below the sweep dir (not its runs')."""
    return {
        p.parent.name: read_result(p)
        for p in sorted(sweep_dir.rglob("result.json"))
        if not p.parent.name.startswith("run-")
    }


# --- the plain logic ---------------------------------------------------------------------------


def test_tokens_per_step_sets_grad_accum_and_refuses_a_micro_batch_that_does_not_divide():
    spec = _spec("tune.tokens_per_step=128", "perf.batch_size=2")  # block 16: 2 x 16 x 4
    assert spec.perf.grad_accum == 4
    with pytest.raises(ConfigError, match=r"^tune.tokens_per_step: is 100"):
        _spec("tune.tokens_per_step=100")


def test_numeric_choices_are_ordered_for_the_sampler_and_read_back_as_values():
    parser = OverridesParser.create()
    params = {"perf.batch_size": "choice(8,1,4,2)", "perf.compile": "choice(true,false)"}
    fixed, dims, distributions = space.parse(parser, params, ["model.n_layer=2"])
    assert fixed == ["model.n_layer=2"] and dims["perf.batch_size"] == ["1", "2", "4", "8"]
    assert distributions["perf.batch_size"] == optuna.distributions.IntDistribution(0, 3)
    assert isinstance(distributions["perf.compile"], optuna.distributions.CategoricalDistribution)
    values = space.values_of({"perf.batch_size": 3, "perf.compile": "true"}, dims)
    assert values == {"perf.batch_size": "8", "perf.compile": "true"}
    # two numbers are no order worth learning: categorical, as Hydra spells them
    _, dims, distributions = space.parse(parser, {"perf.batch_size": "choice(4,2)"}, [])
    categorical = optuna.distributions.CategoricalDistribution
    assert isinstance(distributions["perf.batch_size"], categorical)


def test_a_new_search_starts_with_every_value_of_every_choice_once_and_no_repeat():
    """TPE's own random start left values untried and drew one candidate twice (seed 0 over
    this space); the first candidates are a Latin square over the choices instead."""
    parser = OverridesParser.create()
    params = {
        "perf.batch_size": "choice(1,2,4,8)",
        "perf.attention": "choice(auto,math,manual)",
        "perf.loss": "choice(full,chunked)",
        "optimizer.impl": "choice(for_loop,foreach)",
        "optimizer.lr": "interval(1e-4,1e-2)",
    }
    _, dims, distributions = space.parse(parser, params, [])
    for seed in range(5):
        design = space.initial_design(dims, distributions, seed)
        points = [space.values_of(p, dims) for p in design]
        assert len(points) == 4 and len({tuple(p.values()) for p in points}) == 4
        for key in ("perf.batch_size", "perf.attention", "perf.loss", "optimizer.impl"):
            assert {p[key] for p in points} == set(dims[key]), (seed, key)
        assert all("optimizer.lr" not in p for p in points)  # an interval: the sampler's
    assert design == space.initial_design(dims, distributions, 4)  # the seed decides it


def test_a_search_whose_trials_cover_its_space_probes_every_candidate_once_design_first():
    """With n_trials the space's size, TPE adds nothing but repeats: told a few candidates, it
    asks again for the best one (a 1-slot search over 12 candidates probed 6 and spent its
    asks on repeats, 2026-11-28). The search enqueues every candidate instead, the initial
    design's first, the rest in a seeded order."""
    parser = OverridesParser.create()
    params = {"perf.batch_size": "choice(1,2,4,8)", "perf.attention": "choice(auto,math,manual)"}
    _, dims, distributions = space.parse(parser, params, [])
    every = space.every_point(dims, distributions, 0)
    design = space.initial_design(dims, distributions, 0)
    points = [tuple(space.values_of(p, dims).values()) for p in every]
    assert len(points) == len(set(points)) == 12
    assert every[: len(design)] == design
    assert (
        every
        == space.every_point(dims, distributions, 0)
        != space.every_point(dims, distributions, 1)
    )


def test_the_estimate_prunes_what_cannot_fit_and_grows_with_the_batch():
    small, big = _spec("perf.batch_size=1"), _spec("perf.batch_size=64")
    assert fit.estimate_bytes(big) > fit.estimate_bytes(small)
    budget = fit.Budget(fit.estimate_bytes(small) + 1, "test")
    assert fit.misfit(fit.estimate_bytes(small), budget) is None
    assert "> budget" in fit.misfit(fit.estimate_bytes(big), budget)
    assert not fit.within_margin(budget.bytes, budget, 0.1)


# A machine with two GPUs, as NVML sees it (PCI order) and with a MIG slice of the second: UUID ->
# total bytes. NVML ignores CUDA_VISIBLE_DEVICES; CUDA numbers only the GPUs it leaves visible.
GIB = 2**30
GPUS = {"GPU-0a": 80 * GIB, "GPU-1b": 40 * GIB, "MIG-1b-slice": 10 * GIB}


def fake_gpus(monkeypatch, visible: str | None, nvml_fails: bool = False) -> None:
    """This CPU machine as one with GPUS: NVML (a pynvml module with the calls nanogpt makes)
    and the one CUDA answer asked for a device (its UUID; CUDA_VISIBLE_DEVICES read as CUDA
    reads it, NVML indices or UUIDs). Everything else is the real code."""
    nvml = types.ModuleType("pynvml")

    class NVMLError(Exception):
        pass

    def init():
        if nvml_fails:
            raise NVMLError("Driver Not Loaded")

    def by_uuid(uuid):
        if uuid not in GPUS:
            raise NVMLError("Not Found")
        return uuid

    whole = [uuid for uuid in GPUS if uuid.startswith("GPU-")]
    nvml.NVMLError, nvml.nvmlInit, nvml.nvmlShutdown = NVMLError, init, lambda: None
    nvml.nvmlDeviceGetHandleByIndex = lambda index: whole[index]
    nvml.nvmlDeviceGetHandleByUUID = by_uuid
    nvml.nvmlDeviceGetMemoryInfo = lambda handle: types.SimpleNamespace(total=GPUS[handle])
    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)

    def properties(device):  # torch's uuid prints without its GPU-/MIG- prefix
        names = os.environ.get("CUDA_VISIBLE_DEVICES")
        listed = [] if names is None else names.split(",")
        seen = [whole[int(n)] if n.isdigit() else n for n in listed] if listed else whole
        return types.SimpleNamespace(uuid=seen[torch.device(device).index or 0].split("-", 1)[1])

    monkeypatch.setattr(torch.version, "cuda", "12.8")  # a torch built with CUDA
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", properties)
    monkeypatch.setattr(fit, "_ask_child", fit.gpu_memory)  # the child's answer, asked here


@pytest.mark.parametrize(("visible", "gib"), [(None, 80), ("1", 40), ("MIG-1b-slice", 10)])
def test_the_gpu_budget_is_the_memory_of_the_gpu_the_points_see(monkeypatch, visible, gib):
    # Under SLURM (CUDA_VISIBLE_DEVICES=1) cuda:0 is NVML's GPU 1; under MIG a slice of it. The
    # GPU is found by its UUID (devices.nvml_handle), never by NVML's index.
    fake_gpus(monkeypatch, visible)
    for device in ("cuda", "cuda:0", "auto"):
        budget = fit.device_budget(device, None)
        assert budget.bytes == gib * GIB, (device, budget)
        assert budget.source.startswith("the GPU's memory (NVML, ")


def test_a_budget_that_cannot_be_read_is_unknown_and_said_never_another_devices(monkeypatch):
    fake_gpus(monkeypatch, "1", nvml_fails=True)  # a CUDA point, NVML not answering
    for device in ("cuda", "auto"):
        assert fit.device_budget(device, None) == fit.Budget(None, "unknown: no NVML (NVMLError)")
    line = fit.unknown_line(fit.device_budget("cuda", None))
    assert line.startswith("tune: memory budget unknown: no NVML (NVMLError); no candidate is")
    assert "set bench.max_batch_memory_gib to the memory of the points' device" in line
    # A cluster's launcher runs the points: this (login) node's memory is not theirs.
    elsewhere = fit.device_budget("cpu", None, here=False)
    assert elsewhere.bytes is None and "other machines" in elsewhere.source
    assert fit.device_budget("cuda", 12, here=False).bytes == 12 * GIB  # said, so known
    assert fit.unknown_line(fit.device_budget("cpu", None)) is None  # RAM here


@pytest.mark.slow
def test_the_gpu_is_asked_in_a_child_process_that_sees_what_the_points_see(monkeypatch):
    # The real child (python -m nanogpt.tune.fit) inherits CUDA_VISIBLE_DEVICES, as the points
    # do: with no GPU visible the budget of a CUDA search is unknown, not this machine's RAM.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    budget = fit.device_budget("cuda", None)
    assert budget == fit.Budget(None, "unknown: CUDA is not available here")


def test_a_search_on_a_cluster_checks_its_candidates_for_there_not_on_this_machine():
    # Submitted to SLURM from a login node without a GPU, a CUDA candidate is valid (it runs on
    # a GPU node); run here, on this machine without CUDA, it is invalid. The budget of one
    # byte prunes every valid candidate, so nothing is launched.
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher")
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from nanogpt.frontend.tune_sweeper import Search

    search, reasons = Search(), {}
    search.fixed = with_micro(["bench.device=cuda"])  # the task's overrides, as the sweep's
    search.budget = fit.Budget(1, "one byte")
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        loader = GlobalHydra.instance().config_loader()
        search.hydra_context = HydraContext(config_loader=loader, callbacks=None)
        for launcher in ("slurm", "basic"):
            overrides = [f"hydra/launcher={launcher}", *search.fixed]
            search.config = compose("config", overrides, return_hydra_config=True)
            reasons[launcher] = search._probe(["perf.dtype=bf16"], 0).reason
    assert reasons["slurm"].startswith("pruned before running: estimated"), reasons
    assert reasons["basic"].startswith("invalid: bench.device: cuda was asked for"), reasons


def test_pareto_front_and_climbers():
    dirs = ["maximize", "minimize"]  # tokens/s up, memory down
    points = [[100, 2.0], [90, 1.0], [80, 3.0], [100, 1.5]]
    assert ladder.pareto_front(points, dirs) == [1, 3]
    entries = [
        ladder.Entry(key=str(i), overrides=[], rung="probe", values=p) for i, p in enumerate(points)
    ]
    entries.append(ladder.Entry(key="oom", overrides=[], rung="probe", reason="oom"))
    assert [e.key for e in ladder.climbers(entries, dirs, 3)] == ["3", "1", "0"]
    assert [e.key for e in ladder.climbers(entries, dirs[:1], 2)] in (["0", "3"], ["3", "0"])
    assert ladder.winner(entries, dirs[:1], {"0": "no margin", "3": "trains worse"}).key == "1"


def test_objectives_read_the_record_and_name_what_they_need():
    record = {"status": "ok", "tokens_per_s": 1000.0, "mem_peak_rss_bytes": 2**30}
    record.update(peak_memory_bytes=2**31, peak_memory_from="rss warmup")  # as stored
    assert objectives.value(record, "tokens_per_s") == 1000.0
    assert objectives.value(record, "peak_memory_gib") == 2.0  # the stored peak, not re-ruled
    assert objectives.value(record, "usd_per_1m_tokens", usd_per_hour=3.6) == pytest.approx(1.0)
    assert objectives.value(record, "j_per_token") is None  # no energy counter: unknown
    assert objectives.value({**record, "status": "oom"}, "tokens_per_s") is None
    assert objectives.needs("usd_per_1m_tokens", None, None).startswith("cost.usd_per_hour")
    reached = {"status": "ok", "time_to_loss_s": 12.5, "ttl_note": "5 of 5 reached"}
    assert objectives.value(reached, "time_to_loss") == 12.5
    assert objectives.directions()["time_to_loss"] == "minimize"
    missed = {**reached, "time_to_loss_s": None, "ttl_note": "3 of 5 reached"}
    assert objectives.value(missed, "time_to_loss") is None  # infeasible, never a time
    # time_to_loss needs the search's runs to be its scenario's (a target set)
    assert objectives.needs("time_to_loss", None, None, searched=base.TIME_TO_LOSS) is None
    assert objectives.needs("time_to_loss", None, None).startswith("bench.target_loss:")
    with pytest.raises(ConfigError, match="tune.objective: time_to_loss cannot be computed"):
        objectives.check(
            ["time_to_loss"], {"usd_per_hour": 1.0, "usd_per_kwh": None}, base.THROUGHPUT
        )


def test_quality_verdict_uses_the_baselines_spread_as_the_floor():
    v = quality.verdict([5.00, 5.10], 5.05, min_rel=0.005)
    assert v["floor"] == pytest.approx(0.10) and not v["flagged"]
    assert quality.verdict([5.00, 5.10], 5.30, min_rel=0.005)["flagged"]
    # two seeds that agree by chance: the floor is still min_rel of the loss
    assert not quality.verdict([5.0, 5.0], 5.02, min_rel=0.005)["flagged"]  # floor 0.025
    assert quality.verdict([5.0, 5.0], 5.03, min_rel=0.005)["flagged"]


def _kept(runs: list) -> dict:
    """A target point's record as the search keeps it (tune/jobs.kept), from its runs' times."""
    reached = [t for t in runs if t is not None]
    every = len(reached) == len(runs)
    low, high = ttl.olympic_interval(reached) if every else (None, None)
    record = {
        "status": "ok",
        "time_to_loss_s": sum(reached) / len(reached) if every else None,
        "ttl_s_per_run": runs,
        "ttl_note": f"{len(reached)} of {len(runs)} reached",
        "ttl_ci_low": low,
        "ttl_ci_high": high,
    }
    return jobs.kept(record, Path("job"), ["time_to_loss"], {})


def _config(*overrides: str):
    """A composed config as the search holds it (its sections read as attributes)."""
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return compose(config_name="config", overrides=with_micro(overrides))


def test_with_a_target_the_quality_guard_is_time_to_loss_against_the_baselines_runs():
    """The guard where bench.target_loss is set, as the search asks it (the scenario of its
    composed config, its guard face): the baseline measured to the target with the finalists'
    runs, unless a finalist is the baseline; a finalist whose runs did not all reach, or that
    the baseline's runs beat to the target at p < report.ttl_alpha, is flagged; as fast or
    faster is not. The short loss comparison is not run (its seeds and steps are absent)."""
    config = _config("bench.target_loss=2.5", "report.ttl_alpha=0.02")
    scenario = base.of_spec(config)  # the search's (frontend/tune_sweeper.py)
    assert scenario is base.TIME_TO_LOSS and base.of_spec(_config()) is base.THROUGHPUT
    runs = [20.3, 19.6, 20.9, 19.9, 20.5]
    finalists = {
        "same": runs[::-1],
        "faster": [0.8 * t for t in runs],
        "slower": [1.2 * t for t in runs],
        "missed": [20.0, None, 19.0, None, 21.0],
    }
    entries = [
        ladder.Entry(key=k, overrides=[k], rung="repeats", record=_kept(times))
        for k, times in finalists.items()
    ]
    launched = []

    def launch(work: list) -> list[dict]:
        """The launcher's side: each point's record as the search keeps it."""
        launched.extend(work)
        return [_kept(runs) for _ in work]

    guard = scenario.guard.quality(entries, base.Searching(config, {}, ["lr=1"], 5, launch))
    assert launched == [(["lr=1", "bench.repeats=5"], "quality baseline")]  # as often
    assert guard["checked"] and "seeds" not in guard
    assert (guard["target_loss"], guard["alpha"]) == (2.5, 0.02)  # the search's config's
    flagged = {key: v["flagged"] for key, v in guard["verdicts"].items()}
    assert flagged == {"same": False, "faster": False, "slower": True, "missed": True}
    launched.clear()  # a finalist that is the baseline: its own record, nothing launched
    own = scenario.guard.quality(entries, base.Searching(config, {}, ["slower"], 5, launch))
    flagged = {key: v["flagged"] for key, v in own["verdicts"].items()}
    assert not launched  # and the slower finalist, now the baseline, beats none of the others
    assert flagged == {"same": False, "faster": False, "slower": False, "missed": True}
    assert guard["verdicts"]["slower"]["p_value"] < 0.01
    assert "3 of 5 reached" in guard["verdicts"]["missed"]["note"]
    unreached = ttl_guard.to_target(_kept([None, None]), entries, alpha=0.01, target=2.5)
    assert not unreached["checked"] and "the baseline did not reach" in unreached["note"]
    text = answer.markdown(_answer_of(guard, entries))  # tune.md says each finalist's verdict
    assert "FLAGGED" in text and "baseline sooner p=" in text
    # the answer's interval is the time to loss's (a target run has no tokens/s)
    assert "| time to loss [" in text and "tokens/s" not in text


def test_the_answers_interval_is_the_points_scenarios():
    """tune.md's 95 % interval: each scenario's guard says its own from the record the search
    keeps (tune/jobs.kept), and only its own."""
    throughput = jobs.kept(
        {"status": "ok", "tokens_per_s_ci_low": 990.2, "tokens_per_s_ci_high": 1010.4},
        Path("job"),
        ["tokens_per_s"],
        {},
    )
    target = _kept([7.0, 8.4, 7.5])
    assert base.THROUGHPUT.guard.interval(throughput) == "tokens/s [990, 1,010]"
    assert base.TIME_TO_LOSS.guard.interval(throughput) is None
    assert base.THROUGHPUT.guard.interval(target) is None
    assert base.TIME_TO_LOSS.guard.interval(target).startswith("time to loss [")
    assert base.TIME_TO_LOSS.guard.interval(_kept([7.0, None, 7.5])) is None  # not all reached


def _answer_of(guard: dict, entries: list) -> dict:
    for e in entries:
        e.values = [e.record["time_to_loss"] or 1.0]
    return {
        "objectives": ["time_to_loss"],
        "directions": ["minimize"],
        "space": {},
        "fixed": [],
        "grid_size": None,
        "budget": {"bytes": None, "source": "unknown"},
        "memory_margin": 0.1,
        "probes": [],
        "full": [],
        "repeats": [e.__dict__ for e in entries],
        "refused": {},
        "quality": guard,
        "best": None,
        "search_wall_s": 1.0,
    }


# --- the real search -------------------------------------------------------------------------


@pytest.mark.slow
def test_an_infeasible_candidate_is_a_constraint_not_a_failed_search(sweep):
    # batch 64 cannot fit the budget (pruned by the estimate, never run); the injected fault
    # makes one candidate run out of memory for real (the trainer's oom path): both are told
    # to Optuna as infeasible, and the search still answers with a feasible one. (oom@1000
    # is a fault at a step these short runs never reach: Hydra's choice() takes no null.)
    # batch 3 is invalid (1,024 tokens a step is no whole number of 3 x 16-token micro-batches):
    # told to Optuna as infeasible too, never run.
    budget = fit.estimate_bytes(_spec("perf.batch_size=8")) * 1.5 / 2**30
    proc, sweep_dir = sweep(
        TUNE,
        "tune.tokens_per_step=1024",
        "perf.batch_size=choice(2,3,64)",
        "bench.inject_fault=choice(oom@1000,oom@1)",
        f"bench.max_batch_memory_gib={budget}",
        "hydra.sweeper.n_trials=6",
        *SMALL_SEARCH,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    trials = _study(sweep_dir).get_trials()
    assert len(trials) == 6  # n_trials covers the space: each candidate asked once, no repeat
    by_params = {(_value(t, "perf.batch_size"), _value(t, "bench.inject_fault")): t for t in trials}
    for fault in ("oom@1000", "oom@1"):
        assert by_params[("64", fault)].constraints == {"fits": 1.0}
        assert "pruned before running" in by_params[("64", fault)].user_attrs["entry"]["reason"]
        assert by_params[("3", fault)].constraints == {"fits": 1.0}
        reason = by_params[("3", fault)].user_attrs["entry"]["reason"]
        assert reason.startswith("invalid: tune.tokens_per_step"), reason
    assert by_params[("2", "oom@1")].constraints == {"fits": 1.0}
    assert by_params[("2", "oom@1000")].constraints == {"fits": 0.0}
    statuses = sorted(r["status"] for r in _records(sweep_dir).values())
    assert "oom" in statuses and all(
        r["perf"]["batch_size"] == 2
        for r in [r["measured_config"] for r in _records(sweep_dir).values()]
    )
    best = (sweep_dir / "best.yaml").read_text()
    assert "perf.batch_size=2" in best and "bench.inject_fault=oom@1000" in best
    text = (sweep_dir / "tune.md").read_text()
    assert "oom" in text and not re.search(r"\de[+-]\d", text)  # numbers for people (12,345)
    # The console shows the finalists (the one here) compared within their rung, and closes with
    # the answer best.yaml holds, its interval and processes, then what the search cost.
    out = proc.stdout.strip().splitlines()
    (answer_line,) = [line for line in out if line.startswith("best (best.yaml): ")]
    assert "perf.batch_size=2 bench.inject_fault=oom@1000" in answer_line
    assert answer_line.endswith("over 2 processes") and out[-1].startswith("search: ")
    assert out.index(answer_line) > out.index(next(x for x in out if x.startswith("table: ")))
    table = out[out.index(next(line for line in out if line.lstrip().startswith("point"))) + 1]
    assert "1 (baseline)" in table and "bench.measure_steps" not in "".join(out[-6:])
    assert not any(line.startswith("fastest") for line in out)


# The search made to wait as it composes its second candidate (the first is measured by then;
# the first composition of all checks what every candidate shares), noting when it does: Ctrl-C
# then lands in the search's own work, where Hydra's config loader runs, not in a measuring
# process (which records its own interruption). The 60 s are a ceiling: the test signals as
# soon as the note is there.
SLOW_SECOND_CANDIDATE = (
    "import pathlib, time; from nanogpt.frontend import tune_sweeper as t; real = t.Search._spec; "
    "seen = []; t.Search._spec = lambda self, o: (seen.append(o), len(seen) == 3 and "
    "(pathlib.Path('composing').touch(), time.sleep(60)), real(self, o))[-1]"
)


@pytest.mark.slow
def test_ctrl_c_stops_a_search_in_one_line_and_the_same_command_resumes_it(tmp_path, capsys):
    sweep_dir = tmp_path / "sweep"
    args = [
        "-m",
        *with_micro(
            [TUNE, "perf.batch_size=choice(1,2,4)", "hydra.sweeper.n_trials=3", *SMALL_SEARCH]
        ),
        f"hydra.sweep.dir={sweep_dir}",
    ]
    code = (
        f"import runpy, sys; {SLOW_SECOND_CANDIDATE}; sys.argv[0] = 'nanogpt.run'; "
        "runpy.run_module('nanogpt.run', run_name='__main__')"
    )
    with (
        open(tmp_path / "stderr.txt", "wb") as stderr,
        in_terminal(
            [sys.executable, "-c", code, *args], tmp_path, stdout=subprocess.DEVNULL, stderr=stderr
        ) as first,
    ):
        wait_until(lambda: (tmp_path / "composing").exists(), "no second candidate", first)
        # a terminal's Ctrl-C, to the whole group
        interrupt(first)
    err = (tmp_path / "stderr.txt").read_text()
    assert first.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("interrupted at probe perf.batch_size="), last
    assert f"rerun the same command with hydra.sweep.dir={sweep_dir} to resume" in last
    before = {
        job: r["finished_at"] for job, r in _records(sweep_dir).items() if r["status"] == "ok"
    }
    assert len(before) == 1 and (sweep_dir / "summary.csv").is_file()  # the table of what ran
    assert not (sweep_dir / "tune.md").exists()
    running = _study(sweep_dir).get_trials(states=(optuna.trial.TrialState.RUNNING,))
    assert len(running) == 1  # the interrupted candidate's trial, kept open for the resume

    again = run_cli(*args, cwd=tmp_path, timeout=600)  # the same command
    assert again.returncode == 0, again.stderr[-3000:]
    after = _records(sweep_dir)
    for job, finished in before.items():  # kept, not measured again
        assert after[job]["finished_at"] == finished
    # each run of a point measured once: a run kept in another dir (the repeats rung's run 1 is
    # the full rung's: bench.repeats is no part of the point) is a copy, the same finished_at
    measured: dict[tuple, set] = {}
    for path in sweep_dir.glob("*/run-*/result.json"):
        record = read_result(path)
        measured.setdefault((record["point_id"], path.parent.name), set()).add(
            record["finished_at"]
        )
    assert all(len(times) == 1 for times in measured.values()), "a run was measured twice"
    trials = _study(sweep_dir).get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert {_value(t, "perf.batch_size") for t in trials} == {"1", "2", "4"}
    assert (sweep_dir / "best.yaml").is_file() and (sweep_dir / "tune.png").is_file()
    # what run.main returns for Hydra's own sweepers: a kept point's recorded figures
    job, record = next((j, r) for j, r in after.items() if r["status"] == "ok")
    two = _spec("tune.objective=[tokens_per_s,peak_memory_gib]")
    assert objective_of(two, record) == (
        record["tokens_per_s"],
        record["mem_peak_rss_bytes"] / 2**30,
    )
    assert objective_of(_spec(), record) == record["tokens_per_s"]
    assert math.isnan(objective_of(_spec(), {}))
    _ctrl_c_prints_the_table_nanogpt_report_prints(sweep_dir, capsys)


def _ctrl_c_prints_the_table_nanogpt_report_prints(sweep_dir, capsys):
    """A search's Ctrl-C publishes as every entry point does (publish/sweep_outputs.py): with the
    search's settings (its multirun.yaml), its finalists alone, then its answer."""
    search = Search()
    search.config = OmegaConf.load(sweep_dir / "multirun.yaml")
    capsys.readouterr()
    with pytest.raises(SystemExit) as stopped:
        search._stop()
    assert stopped.value.code == 130
    on_ctrl_c = capsys.readouterr().out
    assert report.main([str(sweep_dir)]) == 0
    assert capsys.readouterr().out == on_ctrl_c
    assert "every rung's" in on_ctrl_c and "best (best.yaml): " in on_ctrl_c


@pytest.mark.slow
@needs_shared
def test_the_quality_guard_flags_a_candidate_that_trains_worse(sweep):
    # Two candidates as fast as each other; one trains at a learning rate 5000x the baseline's.
    # Both are finalists; the guard runs them and the baseline (two seeds) over the same
    # tokens: the high learning rate departs beyond the baseline's own spread and is refused.
    proc, sweep_dir = sweep(
        TUNE,
        "optimizer.lr=choice(0.0006,3.0)",
        "data=text",
        f"data.path={SHAKESPEARE}",
        "model.vocab_size=50304",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.leaders=2",
        "hydra.sweeper.finalists=2",
        "hydra.sweeper.repeats=1",
        "hydra.sweeper.quality.steps=12",
        "hydra.sweeper.quality.window=4",
        "hydra.sweeper.baseline=['optimizer.lr=0.0006']",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    guard = json.loads((sweep_dir / "tune.json").read_text())["quality"]
    assert guard["checked"]
    verdicts = guard["verdicts"]
    assert verdicts["optimizer.lr=3.0"]["flagged"]
    assert not verdicts["optimizer.lr=0.0006"]["flagged"]
    assert "optimizer.lr=0.0006" in (sweep_dir / "best.yaml").read_text()


@pytest.mark.slow
def test_bad_input_is_one_line_before_anything_runs(sweep, tmp_path):
    proc, sweep_dir = sweep(TUNE)  # no dimension at all
    assert proc.returncode != 0
    assert proc.stderr.strip().splitlines()[-1].startswith("error: hydra.sweeper.params:")
    assert not list(sweep_dir.rglob("result.json"))
    # nothing fits: every trial recorded (study, tune.md), one line naming the key, non-zero
    proc, sweep_dir = sweep(TUNE, "perf.batch_size=choice(1,2)", "bench.max_batch_memory_gib=1e-6")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("error: hydra.sweeper.params: no candidate of 2 fits"), proc.stderr
    trials = _study(sweep_dir).get_trials()
    assert {_value(t, "perf.batch_size") for t in trials} == {"1", "2"}
    assert all(t.constraints == {"fits": 1.0} for t in trials)
    assert "pruned before running" in (sweep_dir / "tune.md").read_text()
    proc, _ = sweep(TUNE, "perf.batch_size=choice(1,2)", "tune.objective=[speed]")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1 and "tune.objective" in last[0], proc.stderr
    # time_to_loss without a target: the search's scenario (of its config) is throughput's
    proc, _ = sweep(TUNE, "perf.batch_size=choice(1,2)", "tune.objective=[time_to_loss]")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1 and "bench.target_loss: time_to_loss needs" in last[0], proc.stderr
    # A setting outside the space that makes every candidate invalid: said before any trial.
    proc, _ = sweep(TUNE, "perf.batch_size=choice(1,2)", "bench.device=cuda")
    assert proc.returncode != 0
    last = proc.stderr.strip().splitlines()
    assert len(last) == 1, last
    assert last[0].startswith("error: bench.device: every candidate has it: "), last
