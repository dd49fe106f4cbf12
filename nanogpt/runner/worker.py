"""The measuring process: `python -m nanogpt.runner.worker DIR TASK` (or under torchrun).

It reads the Handoff in DIR, runs its task and writes the answer beside it for the job process
(nanogpt/runner/handoff.py). The `point` task is measured here: the peak and the calibration
are resolved once, before measuring, and handed to the loop as plain values; the max-batch
search and a calibration the point asks for run first, each in a child process of its own, so
their high-water marks never reach the point's figures.

In a data-parallel world rank 0 leads and the other ranks `follow`. Rank 0 alone reads the
hand-off (or runs Hydra, under torchrun by hand); it sends each point it measures to the others
(the same Handoff dict), records it, and sends None when it is done (`release_followers`).
After a failed measurement no rank sends or waits for anything more, as a peer may still be stuck
in a collective: each exits, non-zero, and torchrun stops the rest.
"""

from __future__ import annotations

import datetime
import os
import signal
import sys
import warnings
from pathlib import Path

from nanogpt.runner.process import FORK_UNSAFE, collector_paused, die_with_parent, run_child

# A fresh worker's start is mostly these imports (torch's): made with the collector paused
# (process.collector_paused), as the fork server makes them
with collector_paused():
    import torch

    from nanogpt import logs
    from nanogpt.analysis.figures import derive_point
    from nanogpt.hardware import calibration
    from nanogpt.hardware.devices import resolve_device, synchronize
    from nanogpt.hardware.env import device_name, environment
    from nanogpt.probes import max_batch as maxbatch
    from nanogpt.probes import observe
    from nanogpt.probes.startup import save_artifacts
    from nanogpt.publish import wandb_sink
    from nanogpt.record import MaxBatch, Record
    from nanogpt.record.asked import Asked
    from nanogpt.record.faults import IO_EXIT, handle_sigterm
    from nanogpt.runner import compile_cache, placement
    from nanogpt.runner.handoff import Handoff, write_answer
    from nanogpt.scenarios.loop import measure
    from nanogpt.train.distributed import World
    from nanogpt.train.trainer import build_trainer


def finish_record(record: Record, handoff: Handoff) -> Record:
    """Complete a record with what was asked, when it finished and the environment."""
    job = handoff.job
    record.asked = Asked.of(handoff.spec, job.overrides, str(job.job_dir), job.point_id)
    record.finished_at = datetime.datetime.now(datetime.timezone.utc).isoformat()
    record.env = environment()
    placement.fill(record.setup)
    return record


def measure_point(handoff: Handoff) -> Record:
    """Measure here (in this process) and return the record. In a data-parallel world this is
    rank 0: it first sends the point to the other ranks, which wait for it in `follow`."""
    world = World.from_env()
    world.init()
    world.share(handoff.to_dict())
    return _measure_here(handoff, world)


def follow() -> int:
    """A rank > 0: measure each point rank 0 sends, in lockstep, until it sends None (a skipped
    point or a bad config: none at all). Returns the exit code."""
    world = World.from_env()
    world.init()
    while (point := world.share(None)) is not None:
        if _measure_here(Handoff.from_dict(point), world).status != "ok":
            return 1
    world.shutdown()
    return 0


def release_followers(world: World) -> None:
    """Rank 0 is done (it may have measured nothing): the ranks waiting in `follow` exit."""
    world.init()
    world.share(None)
    world.shutdown()


def own_dir(job_dir: Path, world: World) -> Path:
    """Where this rank's own files go (profiler trace, memory snapshot, the max-batch search):
    the job dir for rank 0, JOB_DIR/rank<N> for the others, so that no two ranks write one file."""
    if world.is_main:
        return job_dir
    path = job_dir / f"rank{world.rank}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def _measure_here(handoff: Handoff, world: World) -> Record:
    spec, job = handoff.spec, handoff.job
    device = world.device(resolve_device(spec.bench.device))
    folder = own_dir(job.job_dir, world)
    searched = MaxBatch()
    if spec.bench.find_max_batch:  # before anything else holds memory
        searched = _child_max_batch(handoff, device, folder)
    hw = spec.hardware
    if world.is_main and (hw.calibrate or hw.recalibrate):  # before the run holds memory
        if calibration.needs_calibration(device, spec.perf.dtype, force=hw.recalibrate):
            _child_calibration(handoff, device, folder)
    # a user's model may cast itself: the peak is the dtype its matmuls run in (measure/observe)
    seen = observe.first_step(spec) if spec.model.build else None
    dtype = seen.peak_dtype(spec.perf.dtype) if seen else spec.perf.dtype
    ceilings = calibration.ceilings_for_run(device, dtype, hw.peak_tflops)
    sinks = []
    if world.is_main:
        sinks = wandb_sink.open_sinks(
            spec.logger,
            name=job.name,
            group=job.group,
            config=job.config,
            run_dir=job.job_dir,
            point_id=job.point_id,
            overrides=job.overrides,
            repeat=job.repeat,
            supersedes=job.supersedes,
        )
    record = measure(spec, device, world, ceilings, folder, sinks)
    record.setup.device_name = device_name(device)
    if seen is not None:
        observe.fill(record.setup, seen, world.is_main)
    record.max_batch = searched
    if not world.is_main:
        return record  # the record is rank 0's
    finish_record(record, handoff)
    if record.status == "ok":  # one run's figures, here: its W&B run is given them
        record = derive_point([record], spec.bench.measure_s)
    for sink in sinks:
        sink.finish(record.to_dict())
    return record


def _child_max_batch(handoff: Handoff, device, folder: Path) -> MaxBatch:
    env = maxbatch.GLIBC_MALLOC_ENV if device.type == "cpu" else None
    outcome = run_child(handoff.for_task("max-batch", device), folder, env=env)
    if outcome.interrupted:
        raise KeyboardInterrupt
    if outcome.answer is None:
        error = f"the search process {outcome.ended()} before its answer"
        return MaxBatch(max_batch_search={"error": error})
    return MaxBatch(**outcome.answer)


def _child_calibration(handoff: Handoff, device, folder: Path) -> None:
    """Calibration runs in a process of its own: its large matrices must not raise the run's
    peak RSS (a process-lifetime figure) or stay cached in the run's CUDA allocator."""
    outcome = run_child(handoff.for_task("calibrate", device), folder)
    if outcome.interrupted:
        raise KeyboardInterrupt
    if outcome.returncode != 0:
        dtype = handoff.spec.perf.dtype.value
        warnings.warn(
            f"calibrating {dtype} failed (exit code {outcome.returncode}), so "
            "achievable_tflops and mfu_achievable will be null",
            stacklevel=2,
        )


def _prime_compile_cache(spec) -> dict:
    """The priming run of perf.compile_cache=warm|artifacts (runner/compile_cache.py): the
    point's trainer built and stepped once, which fills the caches its environment names, and
    the artifacts saved where asked. Nothing of it is measured."""
    world = World()  # one process (validate/ refuses warm and artifacts with more ranks)
    device = resolve_device(spec.bench.device)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    trainer = build_trainer(spec, device, world)
    trainer.step()
    synchronize(device)
    save_artifacts(os.environ)
    return {"primed": True}


def forked_main(folder: str, task: str, env: dict) -> None:
    """The entry of a child of the fork server (runner/forkserver.py): as `main`, in a fork."""
    die_with_parent()  # the server: it ends with the sweep's process
    # CUDA does not survive a fork: the launcher starts afresh. torch marks the child of a
    # process that initialised CUDA, or only counted devices (is_available), as in a bad fork;
    # is_initialized() reads False there, and the first CUDA call would raise.
    if torch.cuda._is_in_bad_fork():
        os._exit(FORK_UNSAFE)
    os.environ.update(env)
    sys.exit(main_or_disk_error([folder, task]))


def main_or_disk_error(argv: list[str]) -> int:
    """main, with a file it cannot write (a full disk) as one line instead of a traceback: the
    job process, which writes the record, reports it to the user."""
    try:
        return main(argv)
    except OSError as err:
        print(f"error: {err.filename or 'the answer'}: {err.strerror or err}", file=sys.stderr)
        return IO_EXIT


def main(argv: list[str]) -> int:
    """Run TASK of the handoff in DIR; exit code 1 when a measured point failed (the job process
    reads the answer either way)."""
    handle_sigterm()  # SIGTERM records the point as interrupted, as Ctrl-C does
    # SLURM's time-limit warning (submitit's SIGUSR2) is the job process's to handle
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    folder, task = Path(argv[0]), argv[1]
    if task == "point" and not World.from_env().is_main:
        return follow()
    handoff = Handoff.read(folder, task)
    logs.configure(handoff.job.logging, handoff.job.sweep_dir)  # run.log, as the job process's
    spec = handoff.spec
    if task == compile_cache.TASK:
        write_answer(folder, task, _prime_compile_cache(spec))
        return 0
    if task in ("max-batch", "calibrate"):
        device = torch.device(spec.bench.device)  # the exact device (Handoff.for_task)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # cuda:N: no context on GPU 0, another rank's
        if task == "max-batch":
            write_answer(folder, task, maxbatch.run_search(spec, device))
        else:
            calibration.calibrate(device, (spec.perf.dtype,), force=spec.hardware.recalibrate)
            write_answer(folder, task, {})
        return 0
    record = measure_point(handoff)
    write_answer(folder, task, record.to_dict(steps=True))
    if record.status == "ok":
        release_followers(World.from_env())
    return 0 if record.status == "ok" else 1


if __name__ == "__main__":
    # a rank of a data-parallel world ends by World.exit: no interpreter teardown to abort it
    World.from_env().exit(main_or_disk_error(sys.argv[1:]))
