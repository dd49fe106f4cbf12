"""The user's own model (model.build, docs/models.md): a modern GPT written outside the package,
swept for real from its directory; its identity follows its source; a target that is not there
stops the sweep before anything runs. The contract's one-line errors: test_byo_contract.py."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from nanogpt.analysis.store import read_result
from nanogpt.config.spec import RunSpec
from nanogpt.record.identity import measured_config, point_id_of

from .conftest import REPO, with_micro

# make test-compat runs this file on the oldest supported torch: its answers depend on torch's
# version (Dynamo's graphs and counters, FlopCounterMode, the profiler's events, torch.distributed)
pytestmark = pytest.mark.compat

# A modern GPT as a user keeps it beside their command: benchmarks/modern_gpt.py's (RoPE,
# RMSNorm, grouped-query attention, an untied head), copied out of the checkout with first lines
# that note each process importing it (the sweep's own process must not) and that ask CUDA at
# import, as nanochat's common.py does. The question leaves torch's trace (what this machine
# lacks, faked as tests/test_parallel_launcher.py's TOUCH_CUDA fakes it): every later fork of the
# importing process is in a bad fork, so a fork server or sweep process that imported it would
# send every point it forks to a fresh interpreter, or fail them.
ASKS_CUDA_AT_IMPORT = """import os, torch
with open(__file__ + ".imported", "a") as marker:
    marker.write(f"{os.getpid()}\\n")
_bad_fork = []
torch.cuda._is_in_bad_fork = lambda: bool(_bad_fork)
os.register_at_fork(after_in_child=lambda: _bad_fork.append(True))
"""
MODERN_GPT = ASKS_CUDA_AT_IMPORT + (REPO / "benchmarks" / "modern_gpt.py").read_text()
BUILD = [
    "model.build._target_=modern_gpt.GPT",
    "model.build.config._target_=modern_gpt.Config",
    "model.build.config.vocab_size=${model.vocab_size}",
    "model.build.config.block_size=${model.block_size}",
    "model.build.config.n_layer=1",
    "model.build.config.n_embd=32",
]


@pytest.fixture(scope="module")
def byo_sweep(tmp_path_factory):
    """BUILD swept over two dtypes by a real `python -m nanogpt.run -m`, run from the directory
    that holds modern_gpt.py: (the sweep process's pid, the user's dir, the sweep dir, its
    stderr)."""
    root = tmp_path_factory.mktemp("byo")
    (root / "modern_gpt.py").write_text(MODERN_GPT)
    sweep_dir = root / "sweep"
    args = [*with_micro([*BUILD, "perf.dtype=fp32,bf16"]), f"hydra.sweep.dir={sweep_dir}"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "nanogpt.run", "-m", *args],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    stdout, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 0, stderr[-3000:]
    return proc.pid, root, sweep_dir, stdout + stderr


@pytest.mark.slow
def test_a_users_modern_gpt_is_swept_with_honest_figures(byo_sweep):
    sweep_pid, root, sweep_dir, stderr = byo_sweep
    records = [read_result(sweep_dir / str(i) / "result.json") for i in (0, 1)]
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert {r["dtype"] for r in records} == {"fp32", "bf16"}
    for r in records:
        assert r["model"] == "modern_gpt.GPT"  # not model=auto's nano-1k
        assert r["flops_source"].startswith("counted: FlopCounterMode")
        assert r["flops_per_token"] == round(r["flops_per_token_counted"]) > 0
        assert r["flops_per_token"] != 6 * r["n_params"]  # counted, attention included
        estimate = r["mem_estimate"]
        assert estimate["weights"] == estimate["gradients"] == 4 * r["n_params"]
        assert estimate["optimizer_state"] == 8 * r["n_params"]  # AdamW's two fp32 moments
        assert estimate["activations"] is None and "not estimated" in estimate["note"]
        assert r["mem_estimate_bytes"] is None  # never the built-in GPT's formula
        assert r["tokens_per_s"] > 0 and r["mfu"] is not None
    # User code ran only where points were measured, never in the sweep's process.
    importers = {int(p) for p in (root / "modern_gpt.py.imported").read_text().split()}
    assert importers and sweep_pid not in importers
    # A module that asks CUDA at import poisoned only the children that imported it: each point
    # was its own fork of the clean server (none fell back to a fresh interpreter), both measured.
    assert len(importers) == 2
    assert "points now start fresh interpreters" not in stderr, stderr[-2000:]
    # the console names each run by the one key swept, not by BUILD's 6 fixed overrides
    named = sorted(line.split(":")[0] for line in stderr.splitlines() if line.startswith("[ok]"))
    assert named == ["[ok] perf.dtype=bf16", "[ok] perf.dtype=fp32"], named
    # its first step observed: the matmuls in the asked dtype, its attention through SDPA
    assert [r["matmul_dtype"] for r in records] == [r["dtype"] for r in records]
    assert all(r["sdpa_called"] is True and r["observed_note"] is None for r in records)


def _compose(overrides: list[str]):
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_spec(compose(config_name="config", overrides=overrides))


@pytest.mark.slow
def test_the_point_follows_the_models_source(byo_sweep, tmp_path):
    _, root, sweep_dir, _ = byo_sweep
    record = read_result(sweep_dir / "0" / "result.json")
    user = tmp_path / "user"
    user.mkdir()
    (user / "modern_gpt.py").write_text(MODERN_GPT)
    overrides = [*with_micro([*BUILD, "perf.dtype=fp32"]), f"model.code_dir={user}"]
    spec = _compose(overrides)
    assert spec.model.build["config"]["block_size"] == 16  # interpolated, plain values
    assert point_id_of(spec) == record["point_id"]  # the same code: a resume skips it
    (user / "modern_gpt.py").write_text(MODERN_GPT + "\n# one more line\n")
    assert point_id_of(spec) != record["point_id"]  # changed: measured again


def test_without_build_the_builtin_gpts_point_is_unchanged():
    """model.build and model.code_dir are left out of a built-in point's identity, so the
    points recorded before them keep their point_id (a resume finds them)."""
    measured = measured_config(RunSpec())["model"]
    assert not {"build", "code_dir", "build_source"} & set(measured)


@pytest.mark.slow
def test_a_target_that_is_not_there_stops_the_sweep_before_anything(tmp_path):
    sweep_dir = tmp_path / "sweep"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nanogpt.run",
            "-m",
            "model.build._target_=nosuch.GPT",
            *with_micro(["perf.dtype=fp32,bf16"]),
            f"hydra.sweep.dir={sweep_dir}",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == 2, done.stderr[-2000:]
    assert (
        len(lines) == 1 and "model.build._target_: 'nosuch.GPT': no module nosuch in " in (lines[0])
    ), lines
    assert not sweep_dir.exists()


@pytest.mark.slow
def test_a_search_over_the_users_own_argument(sweep, tmp_path):
    """hydra/sweeper=tune over an argument of the user's constructor (docs/tune.md's rungs, each
    with one candidate after the probe, and test_tune.py's short probe): the answer names a
    value of it, every record is the user's model, built at the depth its candidate asked, and
    identified by its source."""
    (tmp_path / "modern_gpt.py").write_text(MODERN_GPT)
    build = [o for o in BUILD if not o.startswith("model.build.config.n_layer=")]
    proc, sweep_dir = sweep(
        "hydra/sweeper=tune",
        *build,
        "model.build.config.n_layer=choice(1,2)",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.leaders=1",
        "hydra.sweeper.finalists=1",
        "hydra.sweeper.repeats=1",
        "hydra.sweeper.probe=['bench.measure_steps=2','bench.min_measure_steps=1','bench.diagnose=false']",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    (best,) = [
        line for line in (sweep_dir / "best.yaml").read_text().splitlines() if "n_layer" in line
    ]
    assert best.split("=")[-1].strip(" '\"") in ("1", "2"), best
    records = [read_result(p) for p in sorted(sweep_dir.rglob("result.json"))]
    assert records and all(r["status"] == "ok" for r in records)
    depths = set()
    for r in records:
        model = r["measured_config"]["model"]
        assert r["model"] == "modern_gpt.GPT" and model["build"]["_target_"] == "modern_gpt.GPT"
        assert model["build_source"] == records[0]["measured_config"]["model"]["build_source"]
        assert r["flops_source"].startswith("counted: FlopCounterMode")
        depths.add(model["build"]["config"]["n_layer"])
    assert depths == {1, 2}  # both candidates probed, each built at its own depth
