"""Data-parallel runs and cluster launchers, for real: torchrun with 2 gloo ranks on CPU, sweeps
whose points start torchrun, and Hydra's submitit launcher (local executor) in real processes."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import socket
import statistics

import pandas as pd
import pytest
import torch
import torch.multiprocessing as mp
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.config.spec import ModelConfig, PerfConfig, RunSpec
from nanogpt.train.distributed import World
from nanogpt.train.trainer import Trainer

from .conftest import REPO, case_sweep, run_cli, run_patched, with_micro

# torchrun gives each rank one thread; submitit does not, so its tests ask for the same.
ONE_THREAD = {"OMP_NUM_THREADS": "1"}


def installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # nor is its parent package
        return False


# The `cluster` extra (CI installs it; a bare GPU machine may not have it).
needs_submitit = pytest.mark.skipif(
    not installed("hydra_plugins.hydra_submitit_launcher"),
    reason="needs hydra-submitit-launcher (the cluster extra)",
)
TORCHRUN_2 = ["--standalone", "--nproc_per_node=2", "-m", "nanogpt.run"]


def torchrun(*overrides: str, cwd, **kwargs):
    """`python -m torch.distributed.run --standalone --nproc_per_node=2 -m nanogpt.run ...`."""
    args = [*TORCHRUN_2, *with_micro(overrides)]
    return run_cli(*args, cwd=cwd, module="torch.distributed.run", **kwargs)


def measured_step_ms(job_dir) -> list[float]:
    with open(job_dir / "steps.csv") as f:
        return [float(r["step_ms"]) for r in csv.DictReader(f) if r["phase"] == "measure"]


def _train_two_steps(rank: int, port: int, out_dir) -> None:
    """One of 2 gloo ranks: 2 optimizer steps of 3 micro-steps each, counting DDP's all-reduces."""
    os.environ.update(
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        WORLD_SIZE="2",
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
    )
    world = World.from_env()
    world.init()
    spec = RunSpec(
        model=ModelConfig(n_layer=1, n_head=2, n_embd=32, block_size=16, vocab_size=256),
        perf=PerfConfig(batch_size=2, grad_accum=3),
    )
    trainer = Trainer(spec, torch.device("cpu"), world)
    reduced_at = []

    def counting_allreduce(group, bucket):
        reduced_at.append(trainer.steps_done)
        return default_hooks.allreduce_hook(group, bucket)

    trainer.model.register_comm_hook(None, counting_allreduce)
    first_batch = trainer.source.next_batch()[0].tolist()
    for _ in range(2):
        trainer.step()
    params = torch.cat([p.detach().flatten() for p in trainer.raw_model.parameters()])
    result = {
        "reduced_at": reduced_at,
        "params": params.tolist(),
        "first_batch": first_batch,
        "broadcast_buffers": trainer.ddp.broadcast_buffers,
        "model_wrapping": trainer.model_wrapping,
    }
    (out_dir / f"rank{rank}.json").write_text(json.dumps(result))
    world.exit(0)  # as the package's ranks end (World.exit)


@pytest.mark.slow
@pytest.mark.compat  # DDP on gloo: torch.distributed's behaviour, by version
def test_ddp_all_reduces_once_per_optimizer_step_and_keeps_ranks_identical(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_train_two_steps, args=(port, tmp_path), nprocs=2)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    # The micro model's gradients fit one DDP bucket: one all-reduce per optimizer step, on the
    # last of its 3 micro-steps (no_sync on the others), not one per micro-step.
    assert [r["reduced_at"] for r in ranks] == [[1, 2], [1, 2]]
    assert ranks[0]["first_batch"] != ranks[1]["first_batch"]  # per-rank data seeds
    assert ranks[0]["params"] == ranks[1]["params"]  # averaged gradients: one model
    # Every rank builds the same buffers: no broadcast of them at each forward.
    assert [r["broadcast_buffers"] for r in ranks] == [False, False]
    assert ranks[0]["model_wrapping"] == "ddp(model)"


@pytest.mark.slow
@pytest.mark.compat  # DDP on gloo: torch.distributed's behaviour, by version
def test_torchrun_by_hand_writes_one_record_of_the_slowest_rank(tmp_path):
    # Default run dir (named by the clock), a time budget that stops the ranks mid-run, and
    # gradient accumulation: the ranks must agree on the dir and on the step they stop after.
    proc = torchrun(
        "perf.grad_accum=2",
        "bench.measure_steps=100000",
        "bench.time_budget_s=0.3",
        "logger.log_interval=3",
        "hardware.peak_tflops=0.5",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (run_dir,) = tmp_path.glob("outputs/*/*")  # one run dir, not one per rank
    assert [p.parent for p in tmp_path.rglob("result.json")] == [run_dir]
    assert [p.parent for p in tmp_path.rglob(".hydra")] == [run_dir]
    names = {p.name for p in run_dir.iterdir()}
    assert names == {".hydra", "result.json", "steps.csv", "run.log", "rank1"}
    assert not list((run_dir / "rank1").iterdir())  # rank 1 wrote nothing
    assert proc.stdout.count("[ok]") == 1  # rank 0 alone reports

    record = read_result(run_dir / "result.json")
    assert record["status"] == "ok" and record["world_size"] == 2
    steps = record["measured_steps"]
    assert record["stopped_by_budget"] and steps % 3 == 0  # stopped together, at a window end
    per_rank = record["step_ms_per_rank"]
    assert [len(times) for times in per_rank] == [steps, steps]
    assert per_rank[0] == pytest.approx(measured_step_ms(run_dir))  # steps.csv is rank 0's
    medians = [statistics.median(times) for times in per_rank]
    assert record["step_ms_median_per_rank"] == pytest.approx(medians)
    slowest = statistics.median(max(pair) for pair in zip(*per_rank, strict=True))
    assert record["step_ms_median"] == pytest.approx(slowest)
    # the statistics' step times are steps.csv's, stored once there: each the slowest rank's
    steps_csv = pd.read_csv(run_dir / "steps.csv")
    job = steps_csv.loc[steps_csv["phase"] == "measure", "step_ms_job"].tolist()
    assert job == pytest.approx([max(pair) for pair in zip(*per_rank, strict=True)])
    assert "step_ms_measured" not in record

    tokens_per_step = 2 * 16 * 2 * 2  # batch x block x grad_accum x world_size
    assert record["tokens_per_step"] == tokens_per_step
    assert record["tokens_per_s"] == pytest.approx(tokens_per_step / (slowest / 1e3))
    per_device = record["flops_per_token"] * tokens_per_step / 2 / (slowest / 1e3)
    assert record["achieved_tflops"] == pytest.approx(per_device / 1e12)
    assert record["mfu"] == pytest.approx(per_device / 0.5e12)  # per-GPU MFU


@pytest.mark.slow
def test_bad_config_under_torchrun_stops_every_rank_and_writes_no_record(tmp_path):
    proc = torchrun("dist.nproc=2", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path, timeout=120)
    assert proc.returncode != 0
    assert "error: dist.nproc:" in proc.stderr
    assert not list(tmp_path.rglob("result.json"))


# A fork of it with nanoGPT's configure_optimizers (decay on the 2-D weights only), which the
# byo case trains with (optimizer=from_model).
FORK_GPT = """import inspect, torch, modern_gpt
Config = modern_gpt.Config
class GPT(modern_gpt.GPT):
    def configure_optimizers(self, weight_decay, learning_rate, betas, device_type):
        decay = [p for p in self.parameters() if p.dim() >= 2]
        rest = [p for p in self.parameters() if p.dim() < 2]
        groups = [{"params": decay, "weight_decay": weight_decay},
                  {"params": rest, "weight_decay": 0.0}]
        fused = "fused" in inspect.signature(torch.optim.AdamW).parameters
        extra = dict(fused=True) if fused and device_type == "cuda" else dict()
        return torch.optim.AdamW(groups, lr=learning_rate, betas=betas, **extra)
"""
USER_MODEL = [
    "optimizer=from_model",
    "model.build._target_=fork_gpt.GPT",
    "model.build.config._target_=fork_gpt.Config",
    "model.build.config.vocab_size=${model.vocab_size}",
    "model.build.config.block_size=${model.block_size}",
    "model.build.config.n_layer=1",
    "model.build.config.n_embd=32",
]


@pytest.fixture(scope="module")
def torchrun_points(tmp_path_factory) -> dict[str, dict]:
    """One real sweep (case_sweep) of a one-process point and two points that each start
    torchrun with 2 ranks, DDP's and FSDP2's (without resharding: the knob is recorded for
    FSDP2's point only, though both set it), and DDP's on a user's model (benchmarks/
    modern_gpt.py's, kept beside the command as a user keeps it: each rank finds it there),
    trained with its own configure_optimizers.
    Case name -> its record, with its job dir."""
    root = tmp_path_factory.mktemp("torchrun_points")
    (root / "modern_gpt.py").write_text((REPO / "benchmarks" / "modern_gpt.py").read_text())
    (root / "fork_gpt.py").write_text(FORK_GPT)
    no_reshard = "dist.reshard_after_forward=false"
    jobs = case_sweep(
        root,
        {
            "one": ["dist.nproc=1"],
            "ddp": ["dist.nproc=2", "dist.strategy=ddp", no_reshard],
            "fsdp2": ["dist.nproc=2", "dist.strategy=fsdp2", no_reshard],
            "byo": ["dist.nproc=2", "dist.strategy=ddp", *USER_MODEL],
        },
    )
    assert not list(root.rglob("measurement.json"))  # every child's answer was taken
    points = {name: read_result(job / "result.json") for name, job in jobs.items()}
    table = read_summary(root / "sweep")
    markdown = (root / "sweep" / "summary.md").read_text()
    for name, job in jobs.items():
        assert f"+case={name}" in markdown
        (row,) = table.index[table["job_dir"] == str(job.resolve())]
        points[name]["row"] = table.loc[row]
    return points


def test_sweep_points_launch_torchrun_where_they_ask_for_ranks(torchrun_points):
    one, ddp = torchrun_points["one"], torchrun_points["ddp"]
    assert [p["world_size"] for p in (one, ddp)] == [1, 2]
    assert [len(p["step_ms_per_rank"]) for p in (one, ddp)] == [1, 2]
    assert ddp["tokens_per_step"] == 2 * one["tokens_per_step"]
    for point in torchrun_points.values():
        assert point["status"] == "ok" and point["row"]["status"] == "ok"
        assert point["row"]["world_size"] == point["world_size"]


def test_a_sweep_point_under_torchrun_with_fsdp2_records_per_rank_memory_and_global_tokens(
    torchrun_points,
):
    ddp, fsdp = torchrun_points["ddp"], torchrun_points["fsdp2"]
    assert fsdp["status"] == "ok" and fsdp["world_size"] == 2
    assert fsdp["model_wrapping"].startswith("fsdp2(") and ddp["model_wrapping"] == "ddp(model)"
    assert fsdp["tokens_per_step"] == ddp["tokens_per_step"] == 2 * 16 * 2
    est_d, est_f = ddp["mem_estimate"], fsdp["mem_estimate"]
    assert est_f["weights"] == est_d["weights"] // 2  # per rank: half of the fp32 weights
    assert est_f["optimizer_state"] == est_d["optimizer_state"] // 2
    assert est_f["gathered_params"] == 4 * fsdp["n_params"]  # no reshard: all, fp32
    assert [ddp["row"]["dist_strategy"], fsdp["row"]["dist_strategy"]] == ["ddp", "fsdp2"]
    # The knob is fsdp2's: recorded for its point, empty for DDP's.
    assert pd.isna(ddp["row"]["reshard_after_forward"])
    assert not fsdp["row"]["reshard_after_forward"]


def test_a_sweep_point_under_torchrun_trains_a_users_model_with_its_own_optimizer(torchrun_points):
    byo, ddp = torchrun_points["byo"], torchrun_points["ddp"]
    assert byo["status"] == "ok" and byo["model"] == "fork_gpt.GPT"
    assert byo["world_size"] == 2 and len(byo["step_ms_per_rank"]) == 2
    assert byo["model_wrapping"] == "ddp(model)"
    assert byo["tokens_per_step"] == ddp["tokens_per_step"]  # both ranks' batches count
    assert byo["flops_source"].startswith("counted: FlopCounterMode")
    assert byo["n_params"] != ddp["n_params"]  # the user's model, not the built-in GPT
    # optimizer=from_model: its own configure_optimizers stepped, told the device type
    assert byo["optimizer_stepped"] == "AdamW" and byo["row"]["optimizer"] == "from_model"
    assert byo["optimizer_note"].startswith("the model's own configure_optimizers(")
    assert byo["optimizer_state_bytes"] >= byo["mem_estimate"]["optimizer_state"] > 0


@needs_submitit
def test_submitit_local_launcher_runs_each_point_as_a_job_then_builds_the_table(sweep):
    proc, sweep_dir = sweep("hydra/launcher=local", "perf.batch_size=1,2", env=ONE_THREAD)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert len(list((sweep_dir / ".submitit").glob("*/*_submitted.pkl"))) == 2  # real submitit
    records = [read_result(p) for p in sorted(sweep_dir.glob("*/result.json"))]
    assert [r["batch_size"] for r in records] == [1, 2]
    table = read_summary(sweep_dir)
    assert len(table) == 2 and set(table["status"]) == {"ok"}


@needs_submitit
def test_submitit_tasks_of_one_job_are_the_ranks_of_one_point(sweep):
    proc, sweep_dir = sweep(
        "hydra/launcher=local",
        "hydra.launcher.tasks_per_node=2",
        "logger.log_interval=2",
        env=ONE_THREAD,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (result,) = sweep_dir.glob("*/result.json")  # the point's (its run's: POINT/run-1)
    record = read_result(result)
    assert record["status"] == "ok" and record["world_size"] == 2
    assert len(record["step_ms_median_per_rank"]) == 2
    assert record["tokens_per_step"] == 2 * 16 * 2
    logs = {p.name.split("_")[1]: p.read_text() for p in sweep_dir.glob(".submitit/*/*_log.out")}
    assert set(logs) == {"0", "1"}
    assert "[ok]" in logs["0"] and "[ok]" not in logs["1"]  # task 1 followed rank 0
    assert len(read_summary(sweep_dir)) == 1


@pytest.mark.slow
def test_a_cluster_launcher_without_its_plugin_is_one_line(tmp_path):
    # As on a machine without the cluster extra: the plugin made unimportable.
    setup = "sys.modules['hydra_plugins.hydra_submitit_launcher'] = None"
    args = ["-m", "hydra/launcher=slurm", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    proc = run_patched(setup, *args, cwd=tmp_path)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith("error: hydra/launcher:") and "pip install -e '.[cluster]'" in line
    assert not (tmp_path / "sweep").exists()
