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

