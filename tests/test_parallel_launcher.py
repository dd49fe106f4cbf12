"""hydra/launcher=parallel: a sweep's points side by side, one per slot (cores here; GPUs where
there are some), in real `python -m nanogpt.run -m` processes and real signals."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import psutil
import pytest

from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.config.errors import ConfigError
from nanogpt.frontend import compose as _registers  # noqa: F401 - the schema conf/ composes on (base_config)
from nanogpt.frontend.presets import CONF_DIR, expose_checkout_plugins
from nanogpt.hardware.slots import Slot, gpus_for, plan, visible_gpus
from nanogpt.record.faults import CONFIG_EXIT
from tests.conftest import run_patched, with_micro
from tests.signalling import in_terminal, interrupt, wait_until

PARALLEL = "hydra/launcher=parallel"
linux_only = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="sched_setaffinity and the fork server: Linux"
)


def test_slots_are_one_per_gpu_else_sets_of_cores():
    assert plan(4, [0, 1], []) == [Slot((0,)), Slot((1,))]
    assert plan(1, [0, 1], []) == [Slot((0,))]  # never more slots than points
    assert plan(4, [0, 1, 2, 3], [], slots=2) == [Slot((0, 1)), Slot((2, 3))]
    assert plan(4, list(range(8)), ["0", "1"]) == [Slot((0, 1, 2, 3), "0"), Slot((4, 5, 6, 7), "1")]
    with pytest.raises(ConfigError, match="hydra.launcher.slots"):
        plan(4, [0, 1], [], slots=2, cores_per_slot=2)
    with pytest.raises(ConfigError, match="hydra.launcher.slots: is 0"):
        plan(4, [0, 1], [], slots=0)  # was 2 slots, as for null
    with pytest.raises(ConfigError, match="hydra.launcher.cores_per_slot: is -1"):
        plan(4, [0, 1], [], cores_per_slot=-1)


def test_a_count_below_one_is_refused_in_one_line_when_hydra_builds_the_launcher(capsys):
    # Hydra composes the launcher's config (its plugin's typed config and the override)
    # and builds the class it names, as the sweeper does before the sweep writes anything: the
    # refusal comes from there, so no point runs and no sweep dir is made. (The run's own
    # launch-time refusals print the same way: frontend/launchers/parallel.py _refuse.)
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    expose_checkout_plugins()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        for key, value in (("slots", "0"), ("cores_per_slot", "-2")):
            overrides = ["hydra/launcher=parallel", f"hydra.launcher.{key}={value}"]
            config = compose("config", overrides=overrides, return_hydra_config=True)
            with pytest.raises(SystemExit) as stop:
                instantiate(config.hydra.launcher)
            assert stop.value.code == CONFIG_EXIT
            lines = capsys.readouterr().err.strip().splitlines()
            assert len(lines) == 1, lines
            assert lines[0].startswith(f"error: hydra.launcher.{key}: is {value}, ")
            assert "give a positive whole number, or null" in lines[0]


# `nvidia-smi -L` on a machine with one whole card and one split by MIG into two instances.
MIG_LISTING = """\
GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-0c8b1b0a-6d5c-4b4e-9b0e-0e6f3c2a1d11)
  MIG 3g.20gb     Device  0: (UUID: MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f)
  MIG 3g.20gb     Device  1: (UUID: MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb)
"""


def test_the_points_device_decides_the_slots(monkeypatch):
    # A machine with two GPUs (as CUDA_VISIBLE_DEVICES names them): CUDA points get one each,
    # a CPU sweep gets core sets, and `auto` gets GPUs where torch finds CUDA, as its points do
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    assert gpus_for(["cuda", "cuda"]) == gpus_for(["cpu", "cuda:0"]) == ["0", "1"]
    assert gpus_for(["cpu", "cpu"]) == gpus_for(["mps"]) == []
    import torch

    assert gpus_for(["auto"]) == (["0", "1"] if torch.cuda.is_available() else [])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # none visible
    assert gpus_for(["cuda"]) == []


def test_each_points_device_is_read_where_the_point_sets_it():
    # The sweep's own device, unless a point's overrides set it or choose a config group that
    # may (a preset's bench.device: cpu): Hydra's loader composes such a point to read it.
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import HydraContext

    from nanogpt.frontend.launchers.parallel import ParallelLauncher

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        master = compose("config", overrides=["perf.batch_size=2"], return_hydra_config=True)
        launcher = ParallelLauncher()
        loader = GlobalHydra.instance().config_loader()
        context = HydraContext(config_loader=loader, callbacks=None)
        launcher.setup(hydra_context=context, task_function=None, config=master)
        points = [
            ["perf.batch_size=2", "optimizer.lr=0.1"],  # given once, and a key of no device
            ["perf.batch_size=2", "bench.device=cuda:1"],
            ["perf.batch_size=2", "+sweep=chunked_loss_cpu"],
        ]
        values = launcher._values(points)
        assert values == ["auto", "cuda:1", "cpu"]


@pytest.mark.slow
def test_a_card_split_by_mig_is_its_instances_by_uuid(tmp_path, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", MIG_LISTING)["PATH"])
    mig = ["MIG-c6d4f1ef-42e4-5de3-91c7-45d71c87eb3f", "MIG-cba663e8-9bed-5b25-b243-5985ef7c9beb"]
    assert visible_gpus() == ["0", *mig]  # not 2 cards: the A100 runs nothing itself
    assert plan(3, list(range(6)), gpus_for(["cuda"])) == [
        Slot((0, 1), "0"),
        Slot((2, 3), mig[0]),
        Slot((4, 5), mig[1]),
    ]


# A host of mixed GPUs, as nvidia-smi lists it (PCI order): the slower card on the lower bus.
MIXED_LISTING = """\
GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-0c8b1b0a-6d5c-4b4e-9b0e-0e6f3c2a1d11)
GPU 1: NVIDIA H100 80GB HBM3 (UUID: GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77)
"""
FASTEST_FIRST = [
    "GPU-5d5ba0d6-d33d-2b2c-524d-9e3d8d2b8a77",
    "GPU-0c8b1b0a-6d5c-4b4e-9b0e-0e6f3c2a1d11",
]


def listed_card(label: str) -> str:
    """The card nvidia-smi's listing names by `label` (its index, or a UUID): by UUID."""
    cards = [line.split("UUID: ")[1].rstrip(")") for line in MIXED_LISTING.splitlines()]
    return label if label.startswith("GPU-") else cards[int(label)]


def card_cuda_opens(env: dict) -> str:
    """The card CUDA would open as device 0 under `env` on that host (hardware this machine
    lacks, so CUDA's documented rule, written out): CUDA_VISIBLE_DEVICES's first entry, a UUID
    as it is, an index counted in CUDA_DEVICE_ORDER's order: PCI_BUS_ID, nvidia-smi's, else
    (unset or FASTEST_FIRST) the fastest card first."""
    first = env["CUDA_VISIBLE_DEVICES"].split(",")[0]
    if first.startswith("GPU-"):
        return first
    order = env.get("CUDA_DEVICE_ORDER", "FASTEST_FIRST")
    return listed_card(first) if order == "PCI_BUS_ID" else FASTEST_FIRST[int(first)]


ENTER_AND_RECORD = """
import json, os, sys
from nanogpt.hardware.slots import Slot, enter
from nanogpt.record.measured import Setup
from nanogpt.runner import placement
enter(Slot(tuple(json.loads(sys.argv[1])), sys.argv[2], sys.argv[3]))
setup = Setup()
placement.fill(setup)  # what the slot's points record
keys = ("CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER")
print(json.dumps({"gpu_set": setup.gpu_set, "env": {k: os.environ.get(k) for k in keys}}))
"""


@pytest.mark.slow
@linux_only
def test_a_slots_gpu_set_and_its_cuda_visible_devices_name_the_same_card(tmp_path, monkeypatch):
    """On a host of mixed GPUs, CUDA counts an index fastest first unless CUDA_DEVICE_ORDER says
    PCI_BUS_ID, nvidia-smi's order: each GPU slot's environment sets the order beside the card,
    so the card its record's gpu_set names (in nvidia-smi's listing) is the one CUDA opens. Each
    slot is entered in a process of its own, as the launcher's are."""
    import json

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("CUDA_DEVICE_ORDER", raising=False)
    monkeypatch.setenv("PATH", fake_nvidia_smi(tmp_path / "bin", MIXED_LISTING)["PATH"])
    monkeypatch.setenv("NANOGPT_CORUN_DIR", str(tmp_path))  # placement's: a parallel launch
    cores = sorted(os.sched_getaffinity(0))[:1]
    slots = plan(2, cores * 2, gpus_for(["cuda"]))
    assert [slot.gpu for slot in slots] == ["0", "1"]  # nvidia-smi's indices
    for slot in slots:
        args = [json.dumps(list(slot.cores)), slot.gpu, slot.order]
        done = subprocess.run(
            [sys.executable, "-c", ENTER_AND_RECORD, *args], capture_output=True, text=True
        )
        assert done.returncode == 0, done.stderr[-2000:]
        seen = json.loads(done.stdout.strip().splitlines()[-1])
        assert seen["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
        assert seen["gpu_set"] == seen["env"]["CUDA_VISIBLE_DEVICES"] == slot.gpu
        assert card_cuda_opens(seen["env"]) == listed_card(seen["gpu_set"]), slot
    # Indices the sweep's own CUDA_VISIBLE_DEVICES gave count in its order (CUDA's default here):
    # a slot keeps that meaning rather than reading them in nvidia-smi's
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1,0")
    assert [(s.gpu, s.order) for s in plan(2, cores * 2, gpus_for(["cuda"]))] == [
        ("1", "FASTEST_FIRST"),
        ("0", "FASTEST_FIRST"),
    ]


def fake_nvidia_smi(folder, listing: str) -> dict:
    """An `nvidia-smi` that lists GPUs this machine lacks: the environment that puts it first
    on PATH (a test also takes CUDA_VISIBLE_DEVICES away, which would answer in its place)."""
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text(f"#!/bin/sh\ncat <<'EOF'\n{listing}EOF\n")
    script.chmod(0o755)
    return {"PATH": f"{folder}{os.pathsep}{os.environ['PATH']}"}


def records(sweep_dir) -> dict[str, dict]:
    found = {}
    for path in sorted(sweep_dir.glob("*/result.json")):
        record = read_result(path)
        found[record["overrides_str"]] = record
    return found


@pytest.mark.slow
@linux_only
def test_points_run_side_by_side_pinned_and_name_their_neighbours(sweep, tmp_path, monkeypatch):
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs two cores")
    # On a machine with GPUs (faked: nvidia-smi lists two), a CPU sweep still gets core sets
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gpus = fake_nvidia_smi(tmp_path / "bin", MIG_LISTING)
    args = (PARALLEL, "hydra.launcher.slots=2", "perf.batch_size=1,2,3,4")
    proc, sweep_dir = sweep(*args, env=gpus)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "parallel: 2 slot(s): cores 0; cores 1" in proc.stdout
    found = records(sweep_dir)
    assert len(found) == 4 and {r["status"] for r in found.values()} == {"ok"}
    assert {r["gpu_set"] for r in found.values()} == {None}  # no GPU slot for a CPU point
    assert {len(r["cpu_set"]) for r in found.values()} == {1}  # one core each ...
    assert len({tuple(r["cpu_set"]) for r in found.values()}) == 2  # ... two sets
    # Neighbours: points ran side by side, and each pair agrees on it (the last point of the
    # slower slot may run alone once the other slot has finished: [] is its honest answer)
    assert sum(bool(r["co_running"]) for r in found.values()) >= 2
    for name, record in found.items():
        for other in record["co_running"]:
            assert name in found[other]["co_running"]
    assert "beside" in proc.stdout  # the printed table counts them
    table = read_summary(sweep_dir)
    assert table["co_running"].notna().all()
    # The same command again: every point kept, none measured again
    again, _ = sweep(*args, env=gpus)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resume: kept 4 run(s) of 4 point(s)" in again.stdout
    assert records(sweep_dir) == found


# A sweep process that has asked CUDA, on a CPU machine. torch records a CUDA query with a fork
# handler (pthread_atfork, registered at the first query) that marks every child forked after
# it: torch.cuda._is_in_bad_fork() says True there, and torch.cuda._lazy_init, which every call
# that needs the device runs first, refuses with "Cannot re-initialize CUDA in forked
# subprocess". The same flag, set the same way; and a GPU's answers to the questions the sweep's
# check asks (what this machine lacks), each a query that marks later forks.
TOUCH_CUDA = """
import os, torch
bad_fork, asked = [], []
torch.cuda._is_in_bad_fork = lambda: bool(bad_fork)
def answer(value):
    def query(*args, **kwargs):
        if not asked:
            asked.append(os.register_at_fork(after_in_child=lambda: bad_fork.append(True)))
        if bad_fork:
            torch.cuda._lazy_init()  # torch's own refusal
        return value
    return query
torch.cuda.is_available = answer(True)
torch.cuda.device_count = answer(1)
torch.cuda.get_device_capability = answer((9, 0))
torch.cuda.get_device_name = answer("NVIDIA H100 80GB HBM3")
"""


@pytest.mark.slow
@linux_only
def test_slots_started_after_the_sweep_asked_cuda_run_their_points_a_failed_one_only_itself(
    tmp_path,
):
    # bench.device=auto: the sweep's check asks CUDA here and finds the faked GPU. Each slot is
    # a process of its own that must not inherit that state: a fork would be in a bad fork, and
    # its own check of the point (auto, then the GPU's capability) would fail every point. A
    # fresh one asks this machine's torch, which finds the CPU. Of the points it runs, the two
    # with a fault fail and cost no other.
    sweep_dir = tmp_path / "sweep"
    points = ["bench.device=auto", "bench.inject_fault=null,raise@2", "perf.batch_size=1,2"]
    args = ["-m", PARALLEL, *with_micro(points), f"hydra.sweep.dir={sweep_dir}"]
    proc = run_patched(f"exec({TOUCH_CUDA!r})", *args, cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr[-3000:]
    statuses = sorted(r["status"] for r in records(sweep_dir).values())
    assert statuses == ["error", "error", "ok", "ok"], proc.stderr[-3000:]
    assert "2 point(s) failed" in proc.stderr
    assert len(read_summary(sweep_dir)) == 4


@pytest.mark.slow
@linux_only
def test_ctrl_c_records_the_running_points_starts_no_other_and_builds_the_table(tmp_path):
    sweep_dir = tmp_path / "sweep"
    long = ["bench.measure_steps=100000", "bench.time_budget_s=600", "perf.batch_size=1,2,3,4"]
    args = ["-m", PARALLEL, "hydra.launcher.slots=2", *with_micro(long)]
    command = [sys.executable, "-m", "nanogpt.run", *args, f"hydra.sweep.dir={sweep_dir}"]
    with (
        open(tmp_path / "stderr.txt", "wb") as stderr,
        in_terminal(command, tmp_path, stdout=subprocess.DEVNULL, stderr=stderr) as proc,
    ):
        logs = [sweep_dir / "0" / "run-1" / "run.log", sweep_dir / "1" / "run-1" / "run.log"]
        wait_until(
            lambda: all(p.is_file() and b"measure step" in p.read_bytes() for p in logs),
            "the two points never measured",
        )
        processes = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        # as a terminal's Ctrl-C
        interrupt(proc)
    err = (tmp_path / "stderr.txt").read_text()
    assert proc.returncode == 130, err[-3000:]
    assert "interrupted at" in err and f"hydra.sweep.dir={sweep_dir}" in err
    found = records(sweep_dir)
    started = sorted(name.split()[-1] for name in found)
    assert started == ["perf.batch_size=1", "perf.batch_size=2"]  # no other started
    assert {r["status"] for r in found.values()} == {"interrupted"}
    assert all(r["measured_steps"] >= 1 for r in found.values())
    assert sorted(read_summary(sweep_dir)["status"]) == ["interrupted"] * 2
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive  # no slot, fork server or measuring process left behind


# GPU slots on this CPU machine: the launcher's plan is given two GPUs (its own module's
# gpus_for, in the sweep's process only); the points train on the CPU, each slot's
# CUDA_VISIBLE_DEVICES set all the same
TWO_GPUS = (
    "from nanogpt.frontend.launchers import parallel; "
    "parallel.gpus_for = lambda devices: ['0', '1']"
)


@pytest.mark.slow
@linux_only
def test_a_gpu_slot_measures_its_points_in_children_of_a_fork_server_of_its_own(tmp_path):
    """A GPU slot, a child of the sweep's fork server, must not fork its points itself (its
    jobs' checks may have asked CUDA, which a fork cannot carry): it starts a server of its own
    once its device is set, and its points are that server's children. Run with GPU slots faked
    by the plan, CPU points."""
    sweep_dir = tmp_path / "sweep"
    timed = ["bench.measure_steps=100000", "bench.time_budget_s=3", "perf.batch_size=1,2"]
    args = ["-m", PARALLEL, *with_micro(timed), f"hydra.sweep.dir={sweep_dir}"]
    code = (
        f"import runpy, sys; {TWO_GPUS}; "
        "sys.argv[0] = 'nanogpt.run'; runpy.run_module('nanogpt.run', run_name='__main__')"
    )
    command = [sys.executable, "-c", code, *args]
    with in_terminal(command, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) as proc:
        logs = [sweep_dir / "0" / "run-1" / "run.log", sweep_dir / "1" / "run-1" / "run.log"]
        wait_until(
            lambda: all(p.is_file() and b"measure step" in p.read_bytes() for p in logs),
            "the two points never measured",
        )
        (server,) = [
            p for p in psutil.Process(proc.pid).children() if "forkserver" in " ".join(p.cmdline())
        ]
        slots = server.children()
        own = [[c for c in s.children() if "forkserver" in " ".join(c.cmdline())] for s in slots]
        points = [c for servers in own for server in servers for c in server.children()]
        _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err[-3000:]
    assert len(slots) == 2 and [len(servers) for servers in own] == [1, 1]
    assert len(points) == 2  # each slot's point, a child of that slot's own server
    assert sorted(r["gpu_set"] for r in records(sweep_dir).values()) == ["0", "1"]


@pytest.mark.slow
@linux_only
def test_a_kill_9_of_the_sweeps_process_alone_leaves_no_slot_server_or_point_behind(tmp_path):
    """The slots are children of the sweep's fork server, not of the sweep's process, so its
    death does not show in their parent; each slot's link to it does. Points of 1, 10 and 1 s
    on 2 slots: one slot runs the first and third and waits idle, the other the long one, when
    the sweep's process alone is killed. The idle slot sees its link closed and ends, the busy
    one ends when its point does (its answer has no one to go to), the server with the last."""
    sweep_dir = tmp_path / "sweep"
    timed = ["bench.measure_steps=100000", "bench.time_budget_s=1,10,1"]
    args = ["-m", PARALLEL, "hydra.launcher.slots=2", *with_micro(timed)]
    command = [sys.executable, "-m", "nanogpt.run", *args, f"hydra.sweep.dir={sweep_dir}"]
    with in_terminal(
        command, tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    ) as proc:
        wait_until(
            lambda: (sweep_dir / "2" / "run-1" / "result.json").is_file(),
            "the third point never ended",
        )
        assert not (sweep_dir / "1" / "run-1" / "result.json").exists()  # the long one runs
        left = psutil.Process(proc.pid).children(recursive=True)
        interrupt(proc, signal.SIGKILL, group=False, timeout=30)  # the sweep's process alone
        _, alive = psutil.wait_procs(left, timeout=60)
    assert not alive, [(p.pid, " ".join(p.cmdline())[-80:]) for p in alive]


@pytest.mark.slow
@linux_only
def test_a_point_stopped_by_sigterm_to_its_slot_stops_the_sweep(tmp_path):
    """SIGTERM to one slot alone (an OOM killer's or an operator's): its point is recorded
    `interrupted` and no slot starts another point, as after Ctrl-C. (Before, the slot went on
    to the next point: the check read the job's return value, which is the objective.)"""
    sweep_dir = tmp_path / "sweep"
    timed = ["bench.measure_steps=100000", "bench.time_budget_s=20", "perf.batch_size=1,2"]
    args = ["-m", PARALLEL, "hydra.launcher.slots=1", *with_micro(timed)]
    command = [sys.executable, "-m", "nanogpt.run", *args, f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.Popen(
        command, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        log = sweep_dir / "0" / "run-1" / "run.log"
        wait_until(
            lambda: log.is_file() and b"measure step" in log.read_bytes(),
            "the first point never measured",
            timeout=120,
        )
        # the slot: a child of the sweep's fork server (the sweep's child running
        # multiprocessing's forkserver), the parent of the measuring point
        (server,) = [
            p for p in psutil.Process(proc.pid).children() if "forkserver" in " ".join(p.cmdline())
        ]
        (slot,) = server.children()
        slot.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode != 0, err[-2000:]
    found = records(sweep_dir)
    assert [r["status"] for r in found.values()] == ["interrupted"]  # point 1 never started
    assert not (sweep_dir / "1").exists()
