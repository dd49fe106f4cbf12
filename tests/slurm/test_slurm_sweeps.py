"""Sweeps through `python -m nanogpt.run -m hydra/launcher=slurm` on a real one-node SLURM
cluster (tests/slurm/conftest.py): every point a SLURM job, records that say where they ran."""

from __future__ import annotations

import json
import socket

import pandas as pd

from tests.conftest import run_cli, with_micro


def records(sweep_dir):
    return {
        p.parent.name: json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/result.json"))
    }


def test_the_readme_sweep_runs_every_point_as_a_slurm_job(slurm_sweep, tmp_path):
    axes = ["perf.compile=true,false", "perf.dtype=bf16,fp16"]
    proc, sweep_dir = slurm_sweep(*axes)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = records(sweep_dir)
    assert len(found) == 4 and {r["status"] for r in found.values()} == {"ok"}
    node = socket.gethostname().split(".")[0]
    ids = {r["slurm_job_id"] for r in found.values()}
    assert len(ids) == 4 and all("_" in i for i in ids)  # four tasks of one job array
    assert {r["slurm_node"] for r in found.values()} == {node}
    assert {r["slurm_restarts"] for r in found.values()} == {0}
    # The same table as a local sweep of the same points: same rows, same columns
    table = pd.read_csv(sweep_dir / "summary.csv")
    local = run_cli("-m", *with_micro(axes), f"hydra.sweep.dir={tmp_path / 'local'}", cwd=tmp_path)
    assert local.returncode == 0, local.stderr[-2000:]
    local_table = pd.read_csv(tmp_path / "local" / "summary.csv")
    assert list(table.columns) == list(local_table.columns)
    assert sorted(table["overrides"]) == sorted(local_table["overrides"])
    assert table["slurm_job_id"].notna().all() and local_table["slurm_job_id"].isna().all()
    assert len(list(sweep_dir.glob(".submitit/*/*_submitted.pkl"))) == 4  # real submitit jobs
