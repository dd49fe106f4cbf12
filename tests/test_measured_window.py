"""What the measured window's figures are made of: its own memory peaks (warmup's apart), and
whether another process shared the device while it ran (`contended`, bench.exclusive).

Real parts: the kernel's peak-RSS counter, real processes spinning on this CPU, real sweeps of
`python -m nanogpt.run -m` with W&B offline. The machine is shared with other people's
processes, so a quiet case is only claimed where the test controls every process it counts (a
neighbour process it starts itself); a busy neighbour only ever adds to what others use.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest
import torch

from nanogpt.analysis import derive
from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.config.spec import ModelConfig, PerfConfig, RunSpec
from nanogpt.probes import contention, memory
from nanogpt.probes.contention import OTHERS_SHARE, ContentionProbe, judge_cpu, tree_cpu_s
from nanogpt.record.summary_keys import summary_key
from nanogpt.train.distributed import World
from nanogpt.train.trainer import Trainer

from .conftest import run_cli, with_micro

# ------------------------------------------------------------------------------------------
# Memory: the measured steps' peak, and warmup's apart
# ------------------------------------------------------------------------------------------


def test_warmup_peak_is_kept_apart_from_the_measured_steps_peak():
    probe = memory.MemoryProbe(torch.device("cpu"))
    probe.start()
    if probe.rss_method != "vmhwm":
        pytest.skip("the peak RSS cannot be reset here (no writable /proc/self/clear_refs)")
    transient = torch.ones(64 * 2**20)  # 256 MiB, as a first step's compile buffers would be
    del transient
    memory._trim_c_heap()
    probe.split()
    kept = torch.ones(2**20)  # 4 MiB: what the measured steps hold
    figures = probe.result()
    del kept
    warmup, measured = figures["mem_warmup_peak_rss_bytes"], figures["mem_peak_rss_bytes"]
    assert warmup - measured > 200 * 2**20, (warmup, measured)
    assert figures["mem_peak_rss_method"] == "vmhwm"


class CudaAllocatorCounters:
    """The CUDA caching allocator's counters as torch.cuda reports them (this machine has no
    GPU, so they are the one thing faked): bytes in tensors now, and the peak since the last
    reset_peak_memory_stats."""

    def __init__(self, monkeypatch):
        self.now = self.peak = 0
        monkeypatch.setattr(torch.cuda, "empty_cache", lambda: None)
        monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", self.reset)
        for name in ("memory_allocated", "memory_reserved"):
            monkeypatch.setattr(torch.cuda, name, lambda device=None: self.now)
        for name in ("max_memory_allocated", "max_memory_reserved"):
            monkeypatch.setattr(torch.cuda, name, lambda device=None: self.peak)
        # its counters of trouble since the process started, as torch.cuda.memory_stats names
        # them (the names are checked against torch's own documentation below)
        self.retries = self.ooms = 0
        monkeypatch.setattr(
            torch.cuda,
            "memory_stats",
            lambda device=None: {"num_alloc_retries": self.retries, "num_ooms": self.ooms},
        )

        # the allocator's segments as torch.cuda.memory_snapshot returns them (the fields of
        # torch.cuda.memory._snapshot's Segment): the default pool's, then a CUDA graph's
        self.pool_reserved = self.pool_live = 0
        monkeypatch.setattr(torch.cuda, "memory_snapshot", self.snapshot)

    def step(self, transient: int) -> None:
        """A step that allocates `transient` bytes (activations, logits) and frees them."""
        self.now += transient
        self.peak = max(self.peak, self.now)
        self.now -= transient

    def record_graph(self, transient: int, outputs: int) -> None:
        """A CUDA graph recorded: its step's transients taken into a private pool, which keeps
        them reserved once freed, and its static outputs live there for good."""
        self.step(transient)
        self.pool_reserved, self.pool_live = transient + outputs, outputs
        self.now += outputs
        self.peak = max(self.peak, self.now)

    def snapshot(self) -> list[dict]:
        def segment(pool_id, total, allocated):
            return {
                "device": 0,
                "address": 0,
                "total_size": total,
                "allocated_size": allocated,
                "active_size": allocated,
                "stream": 0,
                "segment_type": "large",
                "segment_pool_id": pool_id,
                "blocks": [],
            }

        default = segment((0, 0), self.now - self.pool_live, self.now - self.pool_live)
        graphs = [segment((1, 0), self.pool_reserved, self.pool_live)] if self.pool_reserved else []
        return [default, *graphs]

    def reset(self, device=None) -> None:
        self.peak = self.now


@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_a_cuda_graph_points_peak_is_its_replays_and_pool_not_warmups_one_time_bytes(
    monkeypatch, cuda_graphs
):
    gib = 2**30
    cuda = CudaAllocatorCounters(monkeypatch)
    cuda.now = 2 * gib  # weights, gradients and optimizer state
    probe = memory.MemoryProbe(torch.device("cuda", 0), cuda_graphs=cuda_graphs)
    probe.start()
    cuda.step(10 * gib)  # the first step: compilation's one-time transients on the activations
    if cuda_graphs:  # the graphs recorded: the activations, into their pool; 1 GiB of outputs
        cuda.record_graph(7 * gib, outputs=gib)
    else:
        cuda.step(7 * gib)
    probe.split()  # peaks reset after the graphs are recorded
    for _ in range(3):  # measured steps: eager ones allocate again, graph replays nothing
        cuda.step(0 if cuda_graphs else 7 * gib)
    figures = probe.result()
    assert figures["mem_warmup_peak_allocated_bytes"] == 12 * gib  # kept, its own field
    peak, window = figures["mem_peak_allocated_bytes"], figures["mem_peak_allocated_from"]
    # Under CUDA graphs the measured window alone would read 3 GiB (weights, states and the
    # graphs' outputs); the pool's 7 GiB free between replays are what each replay writes
    # again. Warmup's 12 GiB (the old rule) held compilation's one-time bytes.
    if cuda_graphs:
        assert (peak, window) == (10 * gib, "measured+graph pool")
        assert figures["mem_graph_pool_bytes"] == 8 * gib
    else:
        assert (peak, window) == (9 * gib, "measured")
        assert figures.get("mem_graph_pool_bytes") is None
    # What the point needs to fit, every step of it, is still the larger of the two peaks
    assert derive.peak_memory(figures) == (12 * gib, "cuda warmup")


def test_the_graph_pool_is_read_with_the_fields_torch_documents_for_its_snapshot():
    # torch.cuda.memory._snapshot's docstring lists a Segment's fields; a renamed one would
    # read a KeyError or nothing, on a GPU only
    documented = torch.cuda.memory._snapshot.__doc__
    for key in ("total_size", "allocated_size", "segment_pool_id"):
        assert f"{key}:" in documented, key
    segments = [
        {"device": 0, "total_size": 8, "allocated_size": 8, "segment_pool_id": (0, 0)},
        {"device": 0, "total_size": 6, "allocated_size": 1, "segment_pool_id": (1, 0)},
        {"device": 1, "total_size": 5, "allocated_size": 0, "segment_pool_id": (2, 0)},
        {"device": 0, "total_size": 4, "allocated_size": 2, "segment_pool_id": (3, 1)},
    ]
    # the private pools of this device only (a second graph's too), not the default pool's
    assert memory.graph_pool_bytes(segments, torch.device("cuda", 0)) == (10, 3)
    assert memory.graph_aware_peak(5, (10, 3)) == (12, "measured+graph pool")
    assert memory.graph_aware_peak(5, (0, 0)) == (5, "measured")  # no graph recorded
    assert memory.graph_aware_peak(None, (10, 3)) == (None, None)


def test_the_allocator_counters_are_the_ones_torch_documents():
    # torch.cuda.memory_stats' docstring lists its keys; a renamed counter would read 0 forever
    for key in memory.ALLOC_COUNTERS.values():
        assert f'"{key}"' in torch.cuda.memory_stats.__doc__, key


def test_allocator_retries_and_ooms_are_counted_over_the_measured_steps(monkeypatch):
    cuda = CudaAllocatorCounters(monkeypatch)
    cuda.retries = 4  # before the point: another point of the process, or warmup's below
    probe = memory.MemoryProbe(torch.device("cuda", 0))
    probe.start()
    cuda.retries += 3  # warmup's (autotuning's clones at the memory limit)
    probe.split()
    cuda.retries += 2  # the measured steps'
    probe.window_end()
    cuda.retries, cuda.ooms = cuda.retries + 5, 1  # the profiled steps' after them
    figures = probe.result()
    assert (figures["mem_alloc_retries"], figures["mem_ooms"]) == (2, 0)
    assert figures["mem_alloc_note"] is None


def test_a_window_that_failed_counts_up_to_the_failure(monkeypatch):
    cuda = CudaAllocatorCounters(monkeypatch)
    probe = memory.MemoryProbe(torch.device("cuda", 0))
    probe.start()
    probe.split()
    cuda.retries, cuda.ooms = 1, 1  # the step that raised torch.OutOfMemoryError
    figures = probe.result()  # scenarios/loop.py reads it in a finally: window_end never ran
    assert (figures["mem_alloc_retries"], figures["mem_ooms"]) == (1, 1)
    unstarted = memory.MemoryProbe(torch.device("cuda", 0))
    unstarted.start()  # warmup failed: no measured steps to count over
    assert unstarted.result()["mem_alloc_note"] == "the measured steps did not start"


def test_a_cpu_point_has_no_allocator_counters_and_says_why():
    probe = memory.MemoryProbe(torch.device("cpu"))
    probe.start()
    probe.split()
    probe.window_end()
    figures = probe.result()
    assert figures["mem_alloc_retries"] is None and figures["mem_ooms"] is None
    assert figures["mem_alloc_note"].startswith("cpu: no CUDA caching allocator")


def test_a_cpu_points_record_has_the_allocator_fields_null_with_the_reason(micro_sweep):
    _, sweep_dir = micro_sweep
    record = read_result(sweep_dir / "0" / "result.json")
    assert record["status"] == "ok"
    assert record["mem_alloc_retries"] is None and record["mem_ooms"] is None
    assert record["mem_alloc_note"].startswith("cpu: no CUDA caching allocator")
    table = read_summary(sweep_dir)  # columns of summary.csv, empty for a CPU point
    assert table["mem_alloc_retries"].isna().all() and table["mem_ooms"].isna().all()


def test_the_allocator_counts_of_repeats_are_summed():
    from nanogpt.analysis import repeats
    from nanogpt.record import Memory, Record

    def run(retries):
        return Record(memory=Memory(mem_alloc_retries=retries, mem_ooms=0 if retries else None))

    assert repeats.pool([run(2), run(3)]).memory.mem_alloc_retries == 5
    assert repeats.pool([run(2), run(None)]).memory.mem_alloc_retries is None


# ------------------------------------------------------------------------------------------
# Contention: the rule, then a window with a neighbour the test controls
# ------------------------------------------------------------------------------------------


def test_the_rule_compares_others_with_the_points_own_cpu_time():
    assert not judge_cpu(0.0, 2.0)
    assert not judge_cpu(OTHERS_SHARE * 2.0 * 0.9, 2.0)
    assert judge_cpu(OTHERS_SHARE * 2.0 * 1.1, 2.0)


SPIN = "import time\nend = time.time() + 120\nwhile time.time() < end: pass\n"
IDLE = "import time\ntime.sleep(120)\n"
# Busy while a point of the sweep in argv[1] runs (its job dir is there, its result.json not
# yet), idle around them: the sweep's start and its table cost the suite no spinning core.
SPIN_WHILE_A_POINT_RUNS = """
import sys, time
from pathlib import Path
jobs = [Path(sys.argv[1]) / str(job) for job in range(int(sys.argv[2]))]
end = time.time() + 120
while time.time() < end:
    if not any(job.is_dir() and not (job / "result.json").exists() for job in jobs):
        time.sleep(0.02)
        continue
    tick = time.time() + 0.05
    while time.time() < tick:
        pass
"""


def neighbour(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", code, *args])


def stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait(timeout=30)


def neighbour_apart(code: str) -> psutil.Process:
    """A neighbour that is no descendant of this process (a shell starts it and exits), as
    another user's process is: the probe counts this process's descendants as the point's."""
    shell = subprocess.run(
        ["sh", "-c", '"$0" -c "$1" >/dev/null 2>&1 & echo $!', sys.executable, code],
        capture_output=True,
        text=True,
        check=True,
    )
    return psutil.Process(int(shell.stdout))


def stop_apart(proc: psutil.Process) -> None:
    """Kill a neighbour_apart; its new parent reaps it (or it stays a zombie, using no CPU)."""
    proc.kill()
    for _ in range(300):
        if not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE:
            return
        time.sleep(0.01)


def probed_steps(
    monkeypatch, neighbour: psutil.Process, cpu_s: float = 0.75, max_wall_s: float = 30.0
) -> dict:
    """A real trainer's steps until this process has spent `cpu_s` of CPU time on them (at most
    `max_wall_s` of wall time), probed on a machine of two processes: this one (the point) and
    the neighbour. The real machine is shared with processes the test does not control, so its
    busy CPU time (contention.busy_cpu_s) is made the CPU time of these two trees alone; the
    point's own is counted as in any run. The window ends on the point's CPU clock, not the wall
    clock: on a loaded machine a fixed wall-clock window left the point too little CPU time of
    its own (0.44 s in 1.5 s) for the check on it to mean anything."""
    point = psutil.Process()

    def busy_cpu_s() -> float:
        return sum(tree_cpu_s(point).values()) + sum(tree_cpu_s(neighbour).values())

    monkeypatch.setattr(contention, "busy_cpu_s", busy_cpu_s)
    spec = RunSpec(
        model=ModelConfig(n_layer=1, n_head=2, n_embd=64, block_size=32, vocab_size=256),
        perf=PerfConfig(batch_size=4),
    )
    trainer = Trainer(spec, torch.device("cpu"), World.from_env())
    trainer.step()
    probe = ContentionProbe(torch.device("cpu"), "warn")
    probe.start()
    cpu_end = time.process_time() + cpu_s
    wall_end = time.perf_counter() + max_wall_s
    while time.process_time() < cpu_end and time.perf_counter() < wall_end:
        trainer.step()
    return probe.stop()


@pytest.mark.slow  # it starts its neighbours
def test_a_quiet_neighbour_is_not_contention_and_a_busy_one_is(monkeypatch):
    quiet = neighbour_apart(IDLE)
    try:
        fields = probed_steps(monkeypatch, quiet)
    finally:
        stop_apart(quiet)
    # not flagged: false, or null ("too short to judge") where a loaded machine left the point
    # too little CPU time of its own for the counters' ticks to tell
    assert fields["contended"] is not True, fields["contention"]
    assert fields["own_cpu_s"] > 0.5  # the point's 0.75 CPU-s of steps, on its clock
    busy = neighbour_apart(SPIN)
    try:
        time.sleep(0.2)  # the interpreter is up and spinning
        fields = probed_steps(monkeypatch, busy)
    finally:
        stop_apart(busy)
    assert fields["contended"] is True, fields["contention"]
    assert fields["others_cpu_s"] > OTHERS_SHARE * fields["own_cpu_s"]
    assert "x the point's own" in fields["contention"]


def test_off_probes_nothing():
    probe = ContentionProbe(torch.device("cpu"), "off")
    probe.start()
    assert probe.stop() == {"contended": None, "contention": "off (bench.exclusive=off)"}


# ------------------------------------------------------------------------------------------
# A real sweep beside a busy process: result.json, the table, the recommendation, W&B
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def crowded_sweep(tmp_path_factory):
    """bench.exclusive=warn,fail, each point measured for a second while another process
    spins a core for as long as the point runs."""
    root = tmp_path_factory.mktemp("contended")
    sweep_dir = root / "sweep"
    busy = neighbour(SPIN_WHILE_A_POINT_RUNS, str(sweep_dir), "2")
    try:
        overrides = [
            "bench.exclusive=warn,fail",
            "bench.rerun=true",  # the two are one point (exclusive is a policy): measure both
            "bench.measure_s=1.0",
            "bench.diagnose=false",
            "logger=wandb",
            "logger.mode=offline",
        ]
        proc = run_cli("-m", *with_micro(overrides), f"hydra.sweep.dir={sweep_dir}", cwd=root)
    finally:
        stop(busy)
    records = {}
    for path in sorted(sweep_dir.glob("*/result.json")):
        record = read_result(path)
        mode = next(o.split("=")[1] for o in record["overrides"] if "exclusive" in o)
        records[mode] = (path.parent, record)
    return proc, sweep_dir, records


def test_a_point_measured_beside_a_busy_process_is_flagged(crowded_sweep):
    proc, sweep_dir, records = crowded_sweep
    job_dir, warn = records["warn"]
    assert warn["status"] == "ok" and warn["contended"] is True, warn["contention"]
    assert warn["others_cpu_s"] > OTHERS_SHARE * warn["own_cpu_s"]
    summary = read_summary(sweep_dir)
    row = summary[summary["job_dir"] == str(job_dir.resolve())].iloc[0]
    assert bool(row["contended"]) and row["contention"] == warn["contention"]
    assert ",contended" in proc.stdout  # the printed table's steady column
    assert "[contended: another process used the device" in proc.stdout  # the recommendation
    from tests.wandb_reader import read_run, run_file

    (run_dir,) = sorted((job_dir / "run-1" / "wandb").glob("offline-run-*"))
    assert read_run(run_file(run_dir)).summary[summary_key("contended")] is True


def test_exclusive_fail_fails_the_point_and_keeps_its_figures(crowded_sweep):
    proc, _, records = crowded_sweep
    _, failed = records["fail"]
    assert failed["status"] == "error" and "bench.exclusive=fail" in failed["error"]
    assert failed["contended"] is True and failed["step_ms_median"] is not None
    # exclusive is a policy, not part of what a point measures (record/identity.py): the two
    # are one point, and the table keeps its ok record (a sweep of fail alone exits 1).
    assert proc.returncode == 0


def test_a_point_is_contended_when_any_of_its_repeats_was():
    from nanogpt.analysis import repeats
    from nanogpt.record import Rates, Record, Setup, Timing

    def measured(contended: bool | None, text: str) -> Record:
        timing = Timing(measured_steps=3)
        timing.step_ms_median, timing.contended, timing.contention = 11.0, contended, text
        rates = Rates(peak_source="unknown")
        setup = Setup(
            world_size=1, tokens_per_step=64, flops_per_token=1000, flops_per_token_hw=1000
        )
        return Record(setup=setup, timing=timing, rates=rates)

    quiet = repeats.pool([measured(False, "calm"), measured(False, "calm")])
    assert quiet.timing.contended is False
    mixed = [measured(False, "calm"), measured(True, "busy")]
    pooled = repeats.pool(mixed)
    assert pooled.timing.contended is True and pooled.timing.contention == "repeat 2 of 2: busy"
