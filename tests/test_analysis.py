"""Analysis: sweep presets, profiler traces, the max batch search, plots and the notebook.

Real parts throughout: Hydra's compose API and real `python -m nanogpt.run -m` processes, real
torch.profiler traces, real OOMs under a real memory limit, matplotlib figures inspected
artist by artist, and the committed notebook executed by a real Jupyter kernel.
"""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import pandas as pd
import pytest
import torch
from hydra import compose, initialize_config_dir
from hydra.core.config_store import ConfigStore
from hydra.core.global_hydra import GlobalHydra
from omegaconf import OmegaConf, open_dict

from nanogpt.analysis import display
from nanogpt.analysis import table as report
from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.config.errors import ConfigError
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.point_configs import PointConfigs
from nanogpt.frontend.presets import CONF_DIR, expand
from nanogpt.probes import max_batch as maxbatch
from nanogpt.publish import plots

from .conftest import REPO, run_cli, with_micro

SWEEPS = REPO / "sweeps"
PRESETS = sorted(path.stem for path in SWEEPS.glob("*.yaml"))
NOTEBOOK = REPO / "notebooks" / "sweep_analysis.ipynb"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


# ------------------------------------------------------------------------------------------
# Presets
# ------------------------------------------------------------------------------------------


def preset_points(name: str, extra: list[str] = (), cfg=None) -> list[list[str]]:
    """The overrides of every point `-m +sweep=NAME EXTRA...` runs, expanded as Hydra's
    basic sweeper expands them (compose alone cannot expand a sweep; test_conventions
    checks `expand` against Hydra's own sweeper). `cfg`: the preset's composition, hydra node
    and all, where the caller has it."""
    if cfg is None:
        cfg = compose("config", overrides=[f"+sweep={name}"], return_hydra_config=True)
    params = [f"{key}={value}" for key, value in cfg.hydra.sweeper.params.items()]
    if str(cfg.hydra.sweeper.get("_target_", "")).endswith("TuneSweeper"):
        # A search's space is sampled, not run as a grid (3,840 points for `tune`): points
        # that together take every value of every key, point i the i-th value of each (an
        # invalid combination is the search's infeasible "invalid" entry: test_tune.py
        # test_an_infeasible_candidate_is_a_constraint_not_a_failed_search).
        axes = [expand([param]) for param in [*params, *extra]]
        width = max(len(axis) for axis in axes)
        return [[axis[i % len(axis)][0] for axis in axes] for i in range(width)]
    return expand([*params, *extra])


@pytest.fixture(scope="module")
def hydra_conf():
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        yield


def test_sweep_group_is_the_sweeps_dir(hydra_conf):
    # No symlink, no copy: the `sweep` group is registered from sweeps/ itself
    # (frontend/presets.py).
    assert not (REPO / "conf" / "sweep").exists()
    group = ConfigStore.instance().repo["sweep"]
    assert {name.removesuffix(".yaml") for name in group if name.endswith(".yaml")} == set(PRESETS)
    nested = {path.stem for path in (SWEEPS / "accum_split").glob("*.yaml")}
    assert {n.removesuffix(".yaml") for n in group["accum_split"]} == nested
    assert {
        "compile_dtype",
        "attention",
        "batch_scaling",
        "model_scaling",
        "log_interval",
        "activation_checkpointing",
        "optimizer_impl",
        "grad_accum",
    } <= set(PRESETS)


@pytest.mark.slow
@pytest.mark.parametrize("name", PRESETS)
def test_every_preset_composes_and_each_point_validates_where_it_can_run(hydra_conf, name):
    master = compose("config", overrides=[f"+sweep={name}"], return_hydra_config=True)
    points = preset_points(name, cfg=master)
    assert len(points) >= 2
    table = (SWEEPS.parent / "docs" / "presets.md").read_text()  # the one table of presets
    assert re.search(rf"(?m)^\| `{name}` \|", table)  # documented
    # each point as the sweep's check composes it (PointConfigs: Hydra's composition of the
    # job, its config groups once; tests/test_config.py holds it equal to Hydra's whole one)
    configs = PointConfigs.of(GlobalHydra.instance().config_loader())
    for point in points:
        cfg = configs.load_sweep_config(master, [f"+sweep={name}", *point])
        with open_dict(cfg):
            del cfg["hydra"]  # the job's settings: no part of the spec
        spec = OmegaConf.to_object(cfg)
        assert spec.report.plots is True
        if spec.bench.device == "cuda" and not torch.cuda.is_available():
            # CUDA presets stop at their first point, with the key named, before any work.
            with pytest.raises(ConfigError) as err:
                to_spec(cfg)
            assert err.value.key == "bench.device"
        elif spec.data.path is None and spec.data.kind.value != "synthetic":
            # A preset over the user's text or tokens names the key to give them.
            with pytest.raises(ConfigError) as err:
                to_spec(cfg)
            assert err.value.key == "data.path"
        else:
            to_spec(cfg)


def test_a_search_preset_runs_the_search_and_a_grid_preset_the_grid(hydra_conf):
    # Hydra keeps the first override of a group it meets, the primary config's first: the grid
    # default is chosen through conf/sweeper/, so that a preset's `override /sweeper: tune`
    # holds (it once fell to the grid, 1,920 points for `tune`), and the command line's wins.
    for overrides, sweeper in (
        (["+sweep=tune"], "TuneSweeper"),
        (["+sweep=tune_cpu"], "TuneSweeper"),
        (["+sweep=compile_dtype_cpu"], "GridSweeper"),
        ([], "GridSweeper"),
        (["+sweep=tune", "hydra/sweeper=grid"], "GridSweeper"),
    ):
        hydra_cfg = compose("config", overrides=overrides, return_hydra_config=True).hydra
        assert hydra_cfg.sweeper._target_.endswith(f".{sweeper}"), overrides
        assert sweeper.lower().startswith(hydra_cfg.runtime.choices["hydra/sweeper"]), overrides


def test_grad_accum_preset_keeps_tokens_per_step_and_batch_scaling_passes_what_fits(hydra_conf):
    splits = []
    for point in preset_points("grad_accum"):
        perf = compose("config", overrides=["+sweep=grad_accum", *point]).perf
        splits.append((perf.batch_size, perf.grad_accum))
    assert {b * a for b, a in splits} == {16} and len(set(splits)) == 5
    sizes = [int(p[1].split("=")[1]) for p in preset_points("batch_scaling")]
    # gpt2 at bf16 needs ~0.6 GiB a sequence: the top sizes are past any single GPU.
    assert max(sizes) * 0.6 > 192 and min(sizes) == 1


def test_command_line_replaces_a_preset_list(hydra_conf):
    points = preset_points("compile_dtype_cpu", ["perf.dtype=fp32"])
    assert sorted(" ".join(point).lower() for point in points) == [
        "perf.compile=false perf.dtype=fp32",
        "perf.compile=true perf.dtype=fp32",
    ]


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the behaviour without CUDA")
def test_cuda_preset_without_cuda_stops_at_once_with_one_line(tmp_path):
    no_device = [o for o in with_micro([]) if not o.startswith("bench.device=")]
    proc = run_cli(
        "-m",
        "+sweep=attention",
        *no_device,
        f"hydra.sweep.dir={tmp_path / 'sweep'}",
        cwd=tmp_path,
    )
    assert proc.returncode != 0
    assert "bench.device: cuda was asked for" in proc.stderr and "Traceback" not in proc.stderr
    assert not list(tmp_path.rglob("result.json"))


# ------------------------------------------------------------------------------------------
# A preset end to end, and the plots drawn from its table
# ------------------------------------------------------------------------------------------


# the plots the preset sweep below has no data for: no target loss, no compiled point
WITHOUT_DATA = ("val_loss.png", "compile_payoff.png")


@pytest.fixture(scope="module")
def preset_sweep(tmp_path_factory):
    """`+sweep=activation_checkpointing` run for real, with batch and dtype axes added: 8 micro
    points (in-process measuring keeps it quick)."""
    root = tmp_path_factory.mktemp("preset")
    sweep_dir = root / "sweep"
    overrides = [
        "perf.batch_size=1,2",
        "perf.dtype=fp32,bf16",
        "hardware.peak_tflops=0.5",
        "bench.isolate=false",
    ]
    proc = run_cli(
        "-m",
        "+sweep=activation_checkpointing",
        *with_micro(overrides),
        f"hydra.sweep.dir={sweep_dir}",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, sweep_dir


@pytest.fixture(scope="module")
def oom_sweep(tmp_path_factory):
    """A one-point sweep whose point runs out of memory at its first measured step."""
    root = tmp_path_factory.mktemp("oom")
    sweep_dir = root / "sweep"
    proc = run_cli(
        "-m",
        *with_micro(["bench.inject_fault=oom@2", "bench.isolate=false"]),
        f"hydra.sweep.dir={sweep_dir}",
        cwd=root,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]  # oom is a result, not a failure
    return proc, sweep_dir


def test_preset_runs_end_to_end_and_writes_valid_pngs(preset_sweep):
    proc, sweep_dir = preset_sweep
    table = read_summary(sweep_dir)
    assert len(table) == 8 and set(table["status"]) == {"ok"}
    assert set(table["ac"]) == {"none", "full"}
    assert table["overrides"].str.contains("+sweep=activation_checkpointing", regex=False).all()
    # The preset turns report.plots on; val_loss.png is a target run's (time to loss) and
    # compile_payoff.png a compiled point's with its eager twin: both skipped, saying why.
    assert "plot skipped: val_loss.png: no point has a target" in proc.stderr
    assert "plot skipped: compile_payoff.png: no compiled point" in proc.stderr
    for name in [name for name in plots.every_plot() if name not in WITHOUT_DATA]:
        path = sweep_dir / name
        assert path.read_bytes()[:8] == PNG_SIGNATURE, name
        height, width, _ = matplotlib.image.imread(path).shape
        assert height > 100 and width > 100
        assert f"plot: {path}" in proc.stdout
    assert not list(sweep_dir.glob(".*.tmp"))


def measured_in_file(job_dir) -> list[float]:
    """A point's measured step times as its steps.csv holds them (rank 0's)."""
    steps = pd.read_csv(Path(job_dir) / "steps.csv")
    return steps.loc[steps["phase"] == "measure", "step_ms"].astype(float).to_list()


def bar_widths(container) -> list[float]:
    return [bar.get_width() for bar in container]


def test_plots_are_drawn_from_the_rows_of_the_table(preset_sweep):
    _, sweep_dir = preset_sweep
    sweep = report.build_table(sweep_dir)
    table = sweep.table
    figures = plots.figures(sweep)
    labels = plots.point_labels(table)
    assert all("perf.batch_size=" in label and "perf.dtype=" in label for label in labels)

    (ax,) = figures["throughput.png"].axes
    assert len(ax.patches) == len(table)
    # One bar per row, in the table's order (the first row drawn on top).
    assert bar_widths(ax.patches) == pytest.approx(table["tokens_per_s"].to_list())
    assert ax.patches[0].get_y() > ax.patches[-1].get_y()
    (ax,) = figures["mfu.png"].axes
    assert bar_widths(ax.patches) == pytest.approx((table["mfu"] * 100).to_list())

    speed_ax, memory_ax = figures["batch_scaling.png"].axes
    drawn = {
        (x, y)
        for line in speed_ax.lines
        if line.get_marker() == "o"
        for x, y in zip(line.get_xdata(), line.get_ydata(), strict=True)
    }
    assert drawn == set(zip(table["batch_size"], table["tokens_per_s"], strict=True))
    assert len([line for line in memory_ax.lines if line.get_marker() == "o"]) == 4

    (ax,) = figures["step_times.png"].axes
    medians = [line.get_xdata()[0] for line in ax.lines if line.get_gid() == "median"]
    expected = [statistics.median(measured_in_file(job)) for job in table["job_dir"]]
    assert [plots.measured_step_ms(sweep, job) for job in table["job_dir"]] == [
        pytest.approx(measured_in_file(job)) for job in table["job_dir"]
    ]
    assert medians[::-1] == pytest.approx(expected)
    assert expected == pytest.approx(table["step_ms_median"].to_list())

    (ax,) = figures["memory_anatomy.png"].axes
    stacks = {container.get_label(): bar_widths(container) for container in ax.containers}
    estimates = [read_result(Path(job) / "result.json")["mem_estimate"] for job in table["job_dir"]]
    assert [plots.memory_estimate(sweep, job) for job in table["job_dir"]] == estimates
    scale = plots.MIB if max(e["total"] for e in estimates) < plots.GIB else plots.GIB
    for part in plots.MEMORY_PARTS:
        if any(part in e for e in estimates):
            widths = [e.get(part, 0) / scale for e in estimates]
            assert stacks[f"estimate: {part}"] == pytest.approx(widths)
        else:  # FSDP2's parts, on these one-rank points
            assert f"estimate: {part}" not in stacks
    measured = stacks["measured: peak RSS"]
    # what each point needs: the larger of warmup's and the measured steps' peaks
    needed = table[["mem_peak_rss_bytes", "mem_warmup_peak_rss_bytes"]].max(axis=1)
    assert measured == pytest.approx((needed / scale).to_list())


def test_failed_points_are_named_and_marked_but_get_no_bar(preset_sweep, oom_sweep):
    tables = [report.build_table(sweep_dir).table for _, sweep_dir in (preset_sweep, oom_sweep)]
    table = pd.concat(tables, ignore_index=True)  # 8 ok points, then one oom at batch 2
    (ax,) = plots.throughput(table).axes
    assert len(ax.patches) == 8
    ticks = dict(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels()), strict=True))
    assert len(ticks) == 9 and ticks[0].endswith("[oom]")  # the last row, at the bottom
    speed_ax, _ = plots.batch_scaling(table).axes
    assert "oom at 2" in [line.get_label() for line in speed_ax.lines]


def test_a_plot_without_data_is_skipped_with_a_message(oom_sweep, capsys):
    _, sweep_dir = oom_sweep
    sweep = report.build_table(sweep_dir)
    assert sweep.table["status"].to_list() == ["oom"]
    written = plots.write_plots(sweep_dir, sweep)
    # The estimate exists before the first step; nothing else was measured.
    assert [path.name for path in written] == ["memory_anatomy.png"]
    skipped = capsys.readouterr().err
    for name in ("throughput.png", "mfu.png", "batch_scaling.png", "step_times.png"):
        assert f"plot skipped: {name}" in skipped
    assert not (sweep_dir / "throughput.png").exists()


# ------------------------------------------------------------------------------------------
# The notebook
# ------------------------------------------------------------------------------------------


def read_notebook():
    """The committed notebook; the Jupyter packages are a CI dependency a bare GPU machine
    lacks, so only the notebook's tests need them."""
    nbformat = pytest.importorskip("nbformat")
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(notebook)
    return notebook


def test_notebook_is_committed_without_outputs():
    notebook = read_notebook()
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None


def outputs_text(notebook) -> str:
    return "\n".join(
        output.get("text", "") + str(output.get("data", {}).get("text/plain", ""))
        for cell in notebook.cells
        if cell.cell_type == "code"
        for output in cell.outputs
    )


def run_notebook():
    """Execute the notebook as `jupyter execute` does (in notebooks/); its cells and text."""
    notebook = read_notebook()
    client = pytest.importorskip("nbclient").NotebookClient(
        notebook,
        timeout=180,
        kernel_name="python3",  # jupyter_client starts it with this interpreter (the venv's)
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()  # raises CellExecutionError if any cell fails
    return notebook, outputs_text(notebook)


def run_papermill(tmp_path, **parameters):
    """Execute the notebook with papermill, as the README says; the executed notebook's text."""
    papermill = pytest.importorskip("papermill")
    out = tmp_path / f"analysis-{len(list(tmp_path.glob('analysis-*')))}.ipynb"
    papermill.execute_notebook(
        str(NOTEBOOK), str(out), parameters=parameters, cwd=str(NOTEBOOK.parent), progress_bar=False
    )
    nbformat = pytest.importorskip("nbformat")
    return outputs_text(nbformat.read(out, as_version=4))


def test_the_notebook_has_a_parameters_cell_and_its_extra_has_papermill():
    notebook = read_notebook()
    tagged = [c for c in notebook.cells if "parameters" in c.metadata.get("tags", [])]
    assert len(tagged) == 1 and "BASELINE" in tagged[0].source and "SUMMARIES" in tagged[0].source
    toml = pytest.importorskip("tomllib")  # Python 3.11+
    extras = toml.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    for extra in ("notebook", "dev"):
        names = {re.split(r"[<>=\[ ]", spec)[0] for spec in extras[extra]}
        assert {"papermill", "ipykernel", "nbclient"} <= names, extra


def speedup_texts(sweep_dir: Path, baseline: str | None = None) -> list[str]:
    """The speedup, interval and verdict of each point as the notebook shows them: the
    package's, against `baseline` (None: the sweep's own settings)."""
    table = report.build_table(sweep_dir, baseline).table
    return [display.speedup_text(row) for _, row in table.iterrows()]


def test_the_notebooks_baseline_changes_the_numbers_as_the_table_does(preset_sweep, tmp_path):
    """papermill with BASELINE: the speedups, intervals and verdicts shown are the package's
    for that baseline, not the sweep's own (the notebook without BASELINE shows those:
    test_notebook_runs_headless_on_real_sweeps; each run of the notebook is a kernel's start,
    4 CPU-s)."""
    _, sweep_dir = preset_sweep
    own = report.build_table(sweep_dir).table  # the sweep's own settings: what it wrote
    summary = read_summary(sweep_dir)
    assert own["speedup"].tolist() == pytest.approx(summary["speedup"].tolist())
    (base,) = own.index[own["speedup_verdict"] == "baseline"]
    assert "perf.dtype=fp32" in own["overrides"][base]
    bf16 = "perf.ac=none perf.batch_size=1 perf.dtype=bf16"  # one point
    text = run_papermill(tmp_path, SUMMARIES=str(sweep_dir), BASELINE=bf16)
    expected = report.build_table(sweep_dir, bf16).table
    texts = speedup_texts(sweep_dir, bf16)
    assert all(t in text for t in texts), (texts, text)
    (base,) = expected.index[expected["speedup_verdict"] == "baseline"]
    assert "perf.dtype=bf16" in expected["overrides"][base]
    # The axes are the swept keys, not a fixed compile x dtype grid.
    assert "swept keys: perf.ac, perf.batch_size, perf.dtype" in text
    assert "one sweep: nothing to compare" in text
    assert texts != speedup_texts(sweep_dir)


def test_notebook_runs_headless_on_real_sweeps(preset_sweep, oom_sweep, monkeypatch):
    """As the README runs it (nbclient, from notebooks/), on two sweeps: the first named as a
    user writes it, relative to the shell's current dir (PWD), the other by its summary.csv."""
    _, sweep_dir = preset_sweep
    _, oom_dir = oom_sweep
    monkeypatch.setenv("PWD", str(sweep_dir.parent))
    monkeypatch.setenv("NANOGPT_SUMMARY", f"{sweep_dir.name}:{oom_dir / report.SUMMARY_CSV}")
    notebook, text = run_notebook()
    table = read_summary(sweep_dir)
    fastest_label = plots.point_labels(table)[table["tokens_per_s"].idxmax()]
    assert "9 points from 2 sweep(s)" in text
    sweep_id = f"{sweep_dir.parent.name}/sweep"
    assert f"fastest: {sweep_id}: {fastest_label}" in text
    assert "1 point(s) did not finish ok" in text
    # A one-point sweep's swept keys are every key it sets (record/swept.py): its label too.
    oom_label = plots.point_labels(read_summary(oom_dir))[0]
    assert "bench.inject_fault=oom@2" in oom_label
    assert f"{oom_dir.parent.name}/sweep: {oom_label} [oom]: RuntimeError: " in text
    assert f"{sweep_dir}: baseline: " in text and f"{oom_dir}: baseline: none" in text
    # no BASELINE: each point's speedup, interval and verdict against the sweep's own baseline
    texts = speedup_texts(sweep_dir)
    assert all(t in text for t in texts), (texts, text)
    assert "only_in" in text  # the sweep-against-sweep section: these two share no point
    # the time-to-loss section runs on throughput sweeps and says why it is empty (on a target
    # sweep: test_time_to_loss.py)
    assert "no point has a target loss (bench.target_loss)" in text
    verdicts = table["bottleneck"].dropna()  # the diagnosis section: each verdict and its hint
    assert len(verdicts) == 8 and all(f": {v}: " in text for v in verdicts)
    images = [
        o for c in notebook.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})
    ]
    # grid, speedups, and the sweep's own plots (but those it has no data for)
    assert len(images) >= 2 + len(plots.every_plot()) - len(WITHOUT_DATA)


# ------------------------------------------------------------------------------------------
# Profiling
# ------------------------------------------------------------------------------------------


def test_profiled_run_writes_a_trace_and_keeps_profiled_steps_out_of_the_stats(single):
    proc, run_dir = single("bench.profile=true", "bench.profile_steps=2", "bench.measure_steps=5")
    assert proc.returncode == 0, proc.stderr[-3000:]
    trace = json.loads((run_dir / "trace.json").read_text())
    events = trace["traceEvents"]
    assert any(e.get("ph") == "X" and e.get("name", "").startswith("aten::") for e in events)
    record = read_result(run_dir / "result.json")
    assert record["profile_trace"] == "trace.json"
    top = record["profile_top_ops"]
    assert top and {"name", "self_ms", "calls"} <= set(top[0])
    assert [op["self_ms"] for op in top] == sorted((op["self_ms"] for op in top), reverse=True)
    steps = pd.read_csv(run_dir / "steps.csv")
    # The profiler runs after the measured steps: nothing measured follows it (Kineto can leave
    # CUPTI attached), and the record says nothing ran beside the measured steps. The diagnosis
    # comes last (one step the profiler warms up on, one recorded).
    phases = ["warmup"] + ["measure"] * 5 + ["profile"] * 2 + ["diagnose"] * 2
    assert steps["phase"].to_list() == phases
    assert record["diagnostics_active"] == []
    measured = steps.loc[steps["phase"] == "measure", "step_ms"]
    assert record["measured_steps"] == 5
    assert record["step_ms_mean"] == pytest.approx(measured.mean())
    assert record["step_ms_median"] == pytest.approx(measured.median())


# ------------------------------------------------------------------------------------------
# Max batch search
# ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "limit,start,probed",
    [
        (37, 8, [8, 16, 32, 64, 48, 40, 36, 38, 37]),
        (5, 8, [8, 4, 6, 5]),
        (0, 2, [2, 1]),
    ],
)
def test_search_grows_then_bisects(limit, start, probed):
    tried = []

    def fits(size):
        tried.append(size)
        return size <= limit

    assert maxbatch.search(fits, start) == limit
    assert tried == probed


# In a new interpreter, as the search's process is: the trainer built after load_code, printing
# the modules the build imported that are not the project's.
BUILD_IMPORTS = """
import json, sys
from hydra import compose, initialize_config_dir
import torch
from nanogpt.frontend.compose import to_spec
from nanogpt.frontend.presets import CONF_DIR
from nanogpt.probes.max_batch import load_code
from nanogpt.train.distributed import World
from nanogpt.train.trainer import Trainer
with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
    spec = to_spec(compose("config", overrides=json.loads(sys.argv[1])))
load_code(spec)
before = set(sys.modules)
Trainer(spec, torch.device("cpu"), World())
print(json.dumps(sorted(m for m in set(sys.modules) - before if m.split(".")[0] != "nanogpt")))
"""


@pytest.mark.slow
def test_the_search_imports_the_code_a_build_needs_before_its_budget_counts():
    """On CPU the budget is address space: what the build imports under it would be counted as
    a step's memory (torch._dynamo's 800 modules: 75 MiB of a 100 MiB budget, the policies
    test's model)."""
    # (without load_code the same build imports torch._dynamo and 814 more: checked by hand)
    argv = [sys.executable, "-c", BUILD_IMPORTS, json.dumps(with_micro([]))]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    imported = json.loads(proc.stdout.strip().splitlines()[-1])
    assert imported == [], imported[:20]


@pytest.mark.slow
def test_max_batch_search_finds_a_bigger_batch_in_a_bigger_budget(tmp_path):
    sweep_dir = tmp_path / "sweep"
    overrides = [
        "model.vocab_size=4096",
        "model.block_size=32",
        "bench.isolate=false",
        "bench.find_max_batch=true",
        "perf.batch_size=4",
        "bench.max_batch_memory_gib=0.08,0.12",
    ]
    proc = run_cli("-m", *with_micro(overrides), f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = {}
    for path in sorted(sweep_dir.glob("*/result.json")):
        record = read_result(path)
        search = record["max_batch_search"]
        size = record["max_batch_size"]
        verdicts = {probe["batch_size"]: probe["fits"] for probe in search["probes"]}
        # Grown from the configured batch, then bisected to a size that fits next to one
        # that does not: a real OOM each time, caught.
        assert search["start"] == 4 and search["limit"] == "RLIMIT_AS"
        assert verdicts[size] is True and verdicts[size + 1] is False
        # (which allocation is refused varies: a tensor's storage, or a small one in torch's C++)
        refused = [p["error"] for p in search["probes"] if not p["fits"]]
        assert all("can't allocate memory" in e or "std::bad_alloc" in e for e in refused), refused
        # The point itself is measured at its configured batch.
        assert record["status"] == "ok" and record["batch_size"] == 4
        assert record["tokens_per_step"] == 4 * 32
        found[search["budget_bytes"]] = size
        assert not (path.parent / "max_batch.json").exists()
    small, large = sorted(found)
    assert (small, large) == (int(0.08 * 2**30), int(0.12 * 2**30))
    assert 4 < found[small] < found[large]
    table = read_summary(sweep_dir)
    assert sorted(table["max_batch_size"]) == sorted(found.values())


# A model whose training step raises an error of torch's C++ from `fails_from` sequences up, as
# oneDNN's "could not create a primitive" does when the search's address-space limit refuses its
# allocation (seen once in 12 runs of the policies test): here torch's own shape check raises it,
# every time, so the search's rule can be seen whole.
FAILING_MODEL = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class FailsFrom(nn.Module):
    def __init__(self, vocab_size, fails_from):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, 8)
        self.layers = nn.ModuleList([nn.Linear(8, 8)])
        self.head = nn.Linear(8, vocab_size)
        self.fails_from = fails_from

    def forward(self, idx, targets):
        if idx.shape[0] >= self.fails_from:
            torch.ones(2, 3) @ torch.ones(4, 5)  # RuntimeError: ... cannot be multiplied
        logits = self.head(self.layers[0](self.wte(idx)))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())
"""


@pytest.mark.slow
def test_an_error_under_the_cpu_limit_is_a_batch_that_did_not_fit_only_if_a_smaller_one_ran(
    tmp_path,
):
    (tmp_path / "failing.py").write_text(FAILING_MODEL)
    sweep_dir = tmp_path / "sweep"
    overrides = [
        "model.build._target_=failing.FailsFrom",
        "model.build.vocab_size=${model.vocab_size}",
        "model.build.fails_from=6,1",
        f"model.code_dir={tmp_path}",
        "bench.isolate=false",  # the point in the sweep's process; the search in a child of its own
        "bench.find_max_batch=true",
        "bench.max_batch_memory_gib=0.5",
    ]
    proc = run_cli("-m", *with_micro(overrides), f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    searches = {}
    for path in sweep_dir.glob("*/result.json"):
        record = read_result(path)
        searches[record["max_batch_search"]["start"], record["status"]] = record
    # 2 ran, 4 ran, 8 and 6 raised, 5 ran: the largest batch that runs a step under the limit
    ran = searches[2, "ok"]
    assert ran["max_batch_size"] == 5 and ran["max_batch_search"]["error"] is None
    probes = {p["batch_size"]: p for p in ran["max_batch_search"]["probes"]}
    assert [b for b, p in probes.items() if p["fits"]] == [2, 4, 5]
    assert (
        "cannot be multiplied" in probes[8]["error"]
        and "cannot be multiplied" in probes[6]["error"]
    )
    # no batch ran: not "nothing fits" (0) but the error, the answer null
    failed = searches[2, "error"]
    assert failed["max_batch_size"] is None
    assert "cannot be multiplied" in failed["max_batch_search"]["error"]
    assert proc.returncode != 0  # the failed point's run is an error row
