"""A run's name on the console (analysis/labels.run_name): what its sweep varies, as written, and
which run of the point it is; the sweep's command line read from Hydra's multirun.yaml."""

from __future__ import annotations

import yaml

from nanogpt.analysis.labels import run_name, varied_keys

FIXED = [
    "model.build._target_=modern_gpt.GPT",
    "model.build.config._target_=modern_gpt.Config",
    "model.build.config.vocab_size=${model.vocab_size}",
    "model.build.config.block_size=${model.block_size}",
    "model.build.config.n_layer=1",
    "model.build.config.n_embd=32",
]


def _sweep(tmp_path, task: list[str], params: dict | None = None):
    saved = {"hydra": {"overrides": {"task": task}, "sweeper": {"params": params}}}
    (tmp_path / "multirun.yaml").write_text(yaml.safe_dump(saved))
    varied_keys.cache_clear()
    return tmp_path


def test_a_run_is_named_by_the_keys_its_sweep_varies_and_its_run(tmp_path):
    sweep = _sweep(tmp_path, [*FIXED, "perf.dtype=fp32,bf16", "optimizer.betas=[0.9,0.95]"])
    point = [*FIXED, "perf.dtype=bf16", "optimizer.betas=[0.9,0.95]"]
    assert run_name(point, sweep) == "perf.dtype=bf16"
    assert run_name(point, sweep, "2/3") == "perf.dtype=bf16 (run 2/3)"
    # outside a multirun (or before Hydra wrote its file): every override, as written
    assert run_name(point, None) == " ".join(point)
    assert "${model.vocab_size}" in run_name(point, tmp_path / "nowhere")


def test_a_presets_and_a_sweep_functions_keys_are_varied(tmp_path):
    sweep = _sweep(
        tmp_path,
        ["+sweep=attention", "perf.batch_size=range(1,3)", 'data.name="a,b"'],
        {"perf.attention": "flash,math"},
    )
    assert varied_keys(str(sweep)) == frozenset({"perf.batch_size", "perf.attention"})
    assert run_name(["+sweep=attention", "perf.batch_size=1"], sweep) == "perf.batch_size=1"
    # a sweep of one point varies nothing: the run is what it sets
    assert run_name(["+sweep=attention"], sweep) == "+sweep=attention"
    assert run_name([], sweep) == "defaults"
