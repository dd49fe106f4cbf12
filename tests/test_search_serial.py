"""The search's serial part: what no slot shares, cut or overlapped (issue 44; the wall time of
2 slots against 1 is benchmarks/search_slots.py's). Each change keeps the search's answers and
records; these tests hold what each change does, with real parts."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import pytest

from nanogpt.config import choices
from nanogpt.config.spec import RunSpec
from nanogpt.train.gpt import GPT
from nanogpt.train.memory_estimate import estimate_of
from nanogpt.train.trainer import gpt_config
from tests.conftest import run_patched
from tests.test_runs_stop import two_slot_search

# Every attention and loss of a small GPT: each builds its own layers (the manual attention a
# causal mask), so each meta build takes its own path through torch
MODEL = {"n_layer": 2, "n_head": 2, "n_embd": 32, "block_size": 16, "vocab_size": 256}
SHAPES = [(a.value, loss.value) for a in choices.Attention for loss in choices.Loss]

ESTIMATES = """
import dataclasses, json, sys
from nanogpt.config import choices
from nanogpt.config.spec import RunSpec
from nanogpt.tune import fit

base = RunSpec()
model = dataclasses.replace(base.model, **json.loads(sys.argv[1]))
found = {}
for attention, loss in json.loads(sys.argv[2]):
    perf = dataclasses.replace(
        base.perf, attention=choices.Attention(attention), loss=choices.Loss(loss)
    )
    spec = dataclasses.replace(base, model=model, perf=perf)
    found[f"{attention} {loss}"] = fit.estimate_bytes(spec)
print(json.dumps({"estimates": found, "dynamo": "torch._dynamo" in sys.modules}))
"""


def _spec(attention: str, loss: str) -> RunSpec:
    base = RunSpec()
    perf = dataclasses.replace(
        base.perf, attention=choices.Attention(attention), loss=choices.Loss(loss)
    )
    return dataclasses.replace(base, model=dataclasses.replace(base.model, **MODEL), perf=perf)


@pytest.mark.slow  # a fresh interpreter: the search's process, which has not built a model
def test_the_estimate_builds_shapes_only_the_same_figure_without_torchs_compiler():
    """fit.estimate_bytes builds the GPT on the meta device without computing values (the
    initial fills, the causal mask): in a fresh interpreter, as the search's process is, no
    candidate's estimate imports torch._dynamo (a second of the search's serial start, or
    between two batches, on the 2-core machine), and each figure is the one a real model, its
    values computed, gives."""
    done = subprocess.run(
        [sys.executable, "-c", ESTIMATES, json.dumps(MODEL), json.dumps(SHAPES)],
        capture_output=True,
        text=True,
        check=True,
    )
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert answer["dynamo"] is False
    for attention, loss in SHAPES:
        spec = _spec(attention, loss)
        real = estimate_of(spec, GPT(gpt_config(spec)), 1, spec.dist.strategy.value)["total"]
        assert answer["estimates"][f"{attention} {loss}"] == real, (attention, loss)


# The search's process, watched from inside (run_patched: this runs before nanogpt.run): when
# the launcher's slots start, when the search composes its first candidate, how often Hydra
# composes a config here, whether each slot is a child of the sweep's fork server at each launch,
# and whether the exit leaves the process's objects to itself
WATCH = """
import atexit, gc, os
from pathlib import Path
import psutil
from hydra._internal.config_loader_impl import ConfigLoaderImpl
from nanogpt.frontend import tune_sweeper
from nanogpt.frontend.launchers import parallel

LOG = Path(os.environ["WATCH_LOG"])
def note(line):
    with LOG.open("a") as f:
        f.write(line + chr(10))

start, probe = parallel._Pool.start, tune_sweeper.Search._probe
launch, start_slots = parallel.ParallelLauncher.launch, parallel.ParallelLauncher.start_slots
by_hydra = ConfigLoaderImpl.load_sweep_config
def served(pool):
    # each slot is a child of the sweep's fork server (multiprocessing's forkserver: torch
    # imported before the search began), and a CPU slot starts no server of its own: its points
    # are its own forks
    slots = [psutil.Process(w.pid) for w in pool.workers]
    return sum(
        "forkserver" in " ".join(s.parent().cmdline())
        and not any("forkserver" in " ".join(c.cmdline()) for c in s.children())
        for s in slots
    )
def starting(self, jobs):
    note("slots start")
    return start_slots(self, jobs)
def started(*args, **kwargs):
    note("pool starts")  # in start_slots' thread
    return start(*args, **kwargs)
def probed(self, *args, **kwargs):
    note("compose")
    return probe(self, *args, **kwargs)
def composed(self, master, overrides):
    note("hydra composes")
    return by_hydra(self, master, overrides)
def launched(self, jobs, first):
    pool = self._ready()
    note(f"launch: pool {id(pool)}, served slots {served(pool)}" if pool else "launch: no pool")
    return launch(self, jobs, first)
parallel._Pool.start = staticmethod(started)
parallel.ParallelLauncher.start_slots = starting
tune_sweeper.Search._probe = probed
parallel.ParallelLauncher.launch = launched
ConfigLoaderImpl.load_sweep_config = composed
atexit.register(lambda: note(f"exit: {gc.get_freeze_count()} objects frozen"))
"""


@pytest.mark.slow
def test_a_two_slot_search_starts_its_slots_from_the_fork_server_before_its_first_batch(
    tmp_path,
):
    """The sweep's fork server (torch's imports) and the slots, its children, start as the
    search begins, while it builds its study and composes its first batch, not at its first
    launch; a CPU slot's points are its own forks, no server of its own; every
    launch keeps them; Hydra composes the candidates' config groups once, their values set on
    copies (callback.compose_point: 20 ms a candidate, not 100); and the process's exit does
    not walk what it made (gc.freeze, left to the exit: the last thing a user waits for)."""
    sweep_dir, log = tmp_path / "sweep", tmp_path / "watch.log"
    proc = run_patched(
        f"exec({WATCH!r})",
        *two_slot_search(sweep_dir),
        cwd=tmp_path,
        env={"WATCH_LOG": str(log)},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = log.read_text().splitlines()
    # Hydra's composition of the groups every candidate shares, for the search's own check
    assert lines.count("hydra composes") == 1, lines
    lines = [line for line in lines if line != "hydra composes"]
    assert [line for line in lines if line != "pool starts"][:2] == ["slots start", "compose"]
    assert lines.count("pool starts") == 1, lines  # started once: no launch starts its own
    launches = [line for line in lines if line.startswith("launch")]
    assert len(launches) >= 2 and len(set(launches)) == 1, launches  # one pool throughout
    assert launches[0].endswith("served slots 2"), launches  # forks of the warm server
    exit_line = lines[-1]  # the watch's exit handler, registered before nanogpt.run's
    assert exit_line.startswith("exit: ") and int(exit_line.split()[1]) > 0, lines
