"""The compiled memory estimate away from the depth it was fitted at (issue 56): its terms apart,
benchmarks/memory_refit.py on a GPU check's records, the note a point away from the fit gets,
and the margin the search's fit check keeps for its error.

No GPU here: the refit's records are built as a CUDA point's job writes them (results/record/,
through the schema), their peaks from known coefficients, so the refit must find those again.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import re
import sys

import pytest
import torch

from nanogpt.analysis.store import write_record
from nanogpt.config.spec import Dtype, RunSpec
from nanogpt.record import Record
from nanogpt.record.identity import measured_config
from nanogpt.train.gpt import COMPILED_FIT, GPT, away_from_fit
from nanogpt.train.memory_estimate import estimate_of
from nanogpt.train.trainer import gpt_config
from nanogpt.tune import fit

from .conftest import REPO

GIB = 2**30
# What a 2026-11-28-shaped check's compiled default-mode points would hold, by the desk
# solution of the 12-layer (9.08 GiB) and 2-layer H200 peaks: about 27 bytes a token x channel x
# layer and 7.5 a logit in all (5.5 beyond bf16's 2). The GPU's own figures are unrun.
TRUE_PER_LAYER, TRUE_PER_LOGIT = 27.0, 5.5


def gpt2(n_layer: int, **perf) -> RunSpec:
    """gpu_check.sh's compiled GPT-2 points (model=gpt2, bf16, CUDA's batch 12), `n_layer` deep."""
    spec = RunSpec()
    model = dataclasses.replace(
        spec.model, name="gpt2", n_layer=n_layer, n_head=12, n_embd=768, block_size=1024
    )
    perf = dataclasses.replace(spec.perf, batch_size=12, dtype=Dtype.bf16, compile=True, **perf)
    bench = dataclasses.replace(spec.bench, device="cuda")
    return dataclasses.replace(spec, model=model, perf=perf, bench=bench)


def estimate(spec: RunSpec) -> dict:
    with torch.device("meta"):
        model = GPT(gpt_config(spec))
    return estimate_of(spec, model, 1, "ddp")


def cuda_record(spec: RunSpec, peak: int) -> Record:
    """A record as an ok compiled CUDA point's job writes it, its allocator peak `peak`."""
    r = Record(status="ok")
    a = r.asked
    a.model, a.dtype, a.compile, a.compile_mode = "gpt2", "bf16", True, spec.perf.compile_mode
    a.attention, a.activation_checkpointing, a.fp8, a.loss_kind = "auto", False, "none", "full"
    a.batch_size, a.block_size, a.grad_accum = 12, 1024, 1
    a.measured_config = measured_config(spec)
    r.setup.device, r.setup.device_name, r.setup.world_size = "cuda:0", "NVIDIA H200", 1
    r.setup.mem_estimate = estimate(spec)
    r.setup.mem_estimate_bytes = r.setup.mem_estimate["total"]
    r.memory.mem_peak_allocated_bytes = peak
    return r


def true_peak(spec: RunSpec) -> int:
    """The peak the known coefficients give: the runner's parts + the terms."""
    parts = estimate(spec)
    runner = parts["total"] - parts["activations"] - parts["logits"]
    tokens = 12 * 1024
    layers = tokens * 768 * spec.model.n_layer
    return round(runner + TRUE_PER_LAYER * layers + (2 + TRUE_PER_LOGIT) * tokens * 50304)


def memory_refit():
    """benchmarks/memory_refit.py as a module (benchmarks/ is no package): its main is the
    command, run here in-process."""
    path = REPO / "benchmarks" / "memory_refit.py"
    spec = importlib.util.spec_from_file_location("memory_refit", path)
    module = sys.modules["memory_refit"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_refit_finds_the_coefficients_the_peaks_hold_and_each_depths_error(tmp_path, capsys):
    # gpu_check's layout: the memory_fit sweep (2 and 12 layers) and reduce_overhead's
    # default-mode twin (4 layers) beside its CUDA-graph point, which the refit leaves out
    for name, layers, mode in (
        ("memory_fit/0", 2, "default"),
        ("memory_fit/1/run-1", 12, "default"),  # a point of two runs: each is read,
        ("memory_fit/1/run-2", 12, "default"),
        ("memory_fit/1", 12, "default"),  # not their pooled record (its peak here is wrong)
        ("reduce_overhead/0", 4, "reduce-overhead"),
        ("reduce_overhead/1", 4, "default"),
    ):
        spec = gpt2(layers, compile_mode=mode)
        (tmp_path / name).mkdir(parents=True, exist_ok=True)
        peak = true_peak(spec) if "run" in name or name != "memory_fit/1" else 1
        write_record(tmp_path / name, cuda_record(spec, peak))
    assert (
        memory_refit().main([str(tmp_path / "memory_fit"), str(tmp_path / "reduce_overhead")]) == 0
    )
    out = capsys.readouterr().out
    assert "4 records" in out and "depths 2, 4, 12" in out
    assert "1 left out" in out  # the CUDA-graph point
    per_layer = float(re.search(r"per layer: +([\d.]+) B", out)[1])
    per_logit = float(re.search(r"per logit: +([\d.]+) B", out)[1])
    assert per_layer == pytest.approx(TRUE_PER_LAYER, abs=0.01)
    assert per_logit == pytest.approx(TRUE_PER_LOGIT, abs=0.01)
    assert f"was {COMPILED_FIT.per_layer} (assumed eager's" in out  # each term's old source
    assert "the constant and the logits cannot be told apart" in out  # one tokens x vocab
    rows = re.findall(
        r"^ +(\d+) +([\d.]+) +([\d.]+) +([+-][\d.]+)% +([\d.]+) +([+-][\d.]+)%", out, re.M
    )
    by_depth = {int(r[0]): (float(r[3]), float(r[5])) for r in rows}
    assert sorted(by_depth) == [2, 4, 12] and len(rows) == 4
    old_2, new_2 = by_depth[2]
    assert old_2 < -10 and abs(new_2) < 0.1  # the old fit reads a shallow model low
    assert abs(by_depth[12][0]) < 2  # where it was fitted it held


def test_the_refit_refuses_records_of_one_depth_in_one_line(tmp_path, capsys):
    spec = gpt2(12)
    (tmp_path / "0").mkdir()
    write_record(tmp_path / "0", cuda_record(spec, true_peak(spec)))
    assert memory_refit().main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "depth(s) [12]" in err and len(err.strip().splitlines()) == 1
    assert memory_refit().main([str(tmp_path / "nowhere")]) == 2


def test_a_compiled_estimate_away_from_its_fitted_depth_says_so_and_the_search_keeps_its_margin():
    at_fit, shallow, graphs = gpt2(12), gpt2(2), gpt2(4, compile_mode="reduce-overhead")
    assert "note" not in estimate(at_fit)
    note = estimate(shallow)["note"]
    assert "fitted at 12 layers, here 2" in note and "-14.3%" in note
    assert "-19.5%" in estimate(graphs)["note"]  # the CUDA-graph point's own error
    eager = dataclasses.replace(shallow, perf=dataclasses.replace(shallow.perf, compile=False))
    assert "note" not in estimate(eager)  # eager's per-layer term was fitted in depth
    assert away_from_fit(2, False, False) is None
    # The search: a candidate whose estimate fits the budget but not the budget less the
    # error's margin is pruned, and says why; at the fitted depth the same bytes fit
    total = estimate(shallow)["total"]
    budget = fit.Budget(int(total / 0.9), "test")  # 10 % free: less than 14.3 %
    margin = fit.error_margin(shallow)
    assert margin[0] == pytest.approx(0.143)
    why = fit.misfit(total, budget, margin)
    assert "less 14.3% for the estimate's error" in why
    assert fit.misfit(total, budget, fit.error_margin(at_fit)) is None
    assert fit.error_margin(graphs)[0] == pytest.approx(0.195)
