"""Which compile caches a compiled point's measuring process starts with (perf.compile_cache),
set up by the job process before it starts that process.

torch.compile keeps its work on disk: Inductor's FX graph cache, AOTAutograd's cache and the
compiled kernels (TORCHINDUCTOR_CACHE_DIR, by default a per-user dir under /tmp) and Triton's
kernels (TRITON_CACHE_DIR, by default under Inductor's). A process that finds them filled skips
code generation; one that finds them empty compiles everything. What a point's first step
costs therefore depends on what ran before it, and this module makes that a setting:

  user       the user's own caches, whatever they hold (the default; the record's
             inductor_cache says whether they held anything)
  cold       the run's own empty dirs (JOB_DIR/inductor_cache, emptied first): everything is
             compiled (bench.cold_compile_cache=true is this setting's earlier spelling)
  warm       the sweep's own dirs for the point (SWEEP_DIR/compile_cache/KEY/caches), filled
             by an earlier run of the same point; the first run finds them unprimed (no
             KEY/primed beside them) and fills them first with a run of its own (the priming
             run, below), so every warm run starts warm
  artifacts  the run's own empty dirs, then torch.compiler.load_cache_artifacts of the bytes
             that torch.compiler.save_cache_artifacts wrote after another process compiled the
             point (SWEEP_DIR/compile_cache/KEY/artifacts.bin): the portable "mega-cache" a job
             carries to a fresh machine

KEY is the point's identity with perf.compile_cache left out (record/identity.py): the runs of
a warm point share one priming run, and so do those of an artifacts point. The priming run is the
point's trainer built and stepped once in a child process of its own (runner/worker.py, task
`compile-cache`); it is outside every measured figure. Nothing here touches the user's caches:
every dir set is under the sweep's or the run's own dir.
"""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

from nanogpt.config.spec import CompileCache, RunSpec
from nanogpt.probes.startup import ARTIFACTS_LOAD_ENV, ARTIFACTS_SAVE_ENV
from nanogpt.record.identity import point_id_of
from nanogpt.runner.handoff import Handoff

ARTIFACTS_FILE = "artifacts.bin"
TASK = "compile-cache"


def policy(spec: RunSpec) -> CompileCache | None:
    """The caches the point asks for; None for an eager point (nothing compiles)."""
    if not spec.perf.compile:
        return None
    if spec.bench.cold_compile_cache:  # the earlier spelling of perf.compile_cache=cold
        return CompileCache.cold
    return spec.perf.compile_cache


def cache_env(cache_dir: Path) -> dict[str, str]:
    """Inductor's and Triton's caches, both under `cache_dir`."""
    return {
        "TORCHINDUCTOR_CACHE_DIR": str(cache_dir),
        "TRITON_CACHE_DIR": str(cache_dir / "triton"),
    }


def shared_dir(handoff: Handoff) -> Path:
    """SWEEP_DIR/compile_cache/KEY: the warm caches and the saved artifacts of this point."""
    spec, job = handoff.spec, handoff.job
    perf = dataclasses.replace(spec.perf, compile_cache=CompileCache.user)
    bench = dataclasses.replace(spec.bench, cold_compile_cache=False)
    key = point_id_of(dataclasses.replace(spec, perf=perf, bench=bench))
    root = job.sweep_dir if job.sweep_dir is not None else job.job_dir
    return Path(root) / "compile_cache" / key


def prepare(handoff: Handoff, run_prime) -> tuple[dict[str, str], dict]:
    """The measuring process's environment for the point's caches, and what the record says
    of them (Setup's compile_cache, compile_cache_dir, compile_artifacts_bytes). `run_prime(
    handoff, env)` runs the priming run in a child and returns whether it succeeded."""
    kind = policy(handoff.spec)
    if kind is None:
        return {}, {}
    if kind is CompileCache.user:
        return {}, {"compile_cache": kind.value}
    own = handoff.job.job_dir / "inductor_cache"
    shared = shared_dir(handoff)
    said = {"compile_cache": kind.value}
    if kind is CompileCache.cold:
        shutil.rmtree(own, ignore_errors=True)  # a rerun's dir held the last run's kernels
        return cache_env(own), {**said, "compile_cache_dir": str(own)}
    prime = Handoff(TASK, handoff.spec, handoff.job)
    if kind is CompileCache.warm:
        warm, primed = shared / "caches", shared / "primed"
        if not primed.is_file():  # never primed, or a priming run that did not finish
            shutil.rmtree(warm, ignore_errors=True)
            _prime(run_prime, prime, cache_env(warm))
            primed.parent.mkdir(parents=True, exist_ok=True)
            primed.touch()
        return cache_env(warm), {**said, "compile_cache_dir": str(warm)}
    artifacts = shared / ARTIFACTS_FILE
    if not artifacts.is_file():  # compiled from empty caches of its own, then saved
        saving = shared / "saving"
        shutil.rmtree(saving, ignore_errors=True)
        env = {**cache_env(saving), ARTIFACTS_SAVE_ENV: str(artifacts)}
        _prime(run_prime, prime, env)
        shutil.rmtree(saving, ignore_errors=True)  # only the artifacts travel
    shutil.rmtree(own, ignore_errors=True)
    env = {**cache_env(own), ARTIFACTS_LOAD_ENV: str(artifacts)}
    said |= {
        "compile_cache_dir": str(artifacts),
        "compile_artifacts_bytes": artifacts.stat().st_size,
    }
    return env, said


def _prime(run_prime, prime: Handoff, env: dict[str, str]) -> None:
    if not run_prime(prime, env):
        raise RuntimeError(
            f"the priming run of perf.compile_cache={prime.spec.perf.compile_cache.value} "
            f"failed (its output: {prime.job.job_dir})"
        )
