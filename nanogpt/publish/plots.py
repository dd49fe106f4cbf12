"""Plots of a sweep: PNGs written into the sweep dir, beside summary.csv.

`python -m nanogpt.report DIR --plots` (or report.plots=true in a multirun) draws, from the sweep
(analysis/table.Sweep: its table's rows, its steps table and its points' records; no file is read
again):
- throughput.png      tokens/s per point (failed points are named, with their status, barless)
- mfu.png             MFU per point, against the peak named in the title
- batch_scaling.png   tokens/s and peak memory against perf.batch_size, one line per setting of
                      the other overrides; batch sizes that ran out of memory are marked
- step_times.png      the distribution of each point's measured step times (its steps' rows)
- memory_anatomy.png  the analytic memory estimate by component (the record's mem_estimate)
                      beside the measured peak
- bottleneck.png      each point's step split into device, communication, data and host time,
                      and its device time by kind (the diagnosis, analysis/bottleneck.py)
- memory_time.png     a step's memory against tokens/s, a marker a checkpointing policy
                      (perf.ac, perf.offload), the frontier joined (+sweep=memory_time)
- val_loss.png        validation loss against training time, a line per run (a sweep with
                      bench.target_loss: scenarios/time_to_loss/plot.py)
A plot that has nothing to show (batch size does not vary, no MFU without a peak) is skipped
with a message. Points are labelled by the overrides that differ between them.

Drawn with matplotlib's object API on the Agg canvas: no pyplot state, no display needed.
"""

from __future__ import annotations

import io
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.figure import Figure

from nanogpt.analysis.compare import measured_peak
from nanogpt.analysis.labels import parse_overrides, point_labels
from nanogpt.analysis.memory_time import step_memory
from nanogpt.publish.plot_parts import NoData, new_figure, tagged_labels
from nanogpt.record.files import write_atomic
from nanogpt.scenarios import base as scenarios

if TYPE_CHECKING:
    from nanogpt.analysis.table import Sweep

MIB, GIB = 2**20, 2**30
# The parts of the memory estimate (train/memory_estimate.estimate_memory), stacked in this order;
# DDP's buckets exist with two ranks or more, the last two under FSDP2 only (the parameters
# gathered for compute; gradients kept unsharded while accumulating). A part no shown point has
# gets no bar and no legend entry.
MEMORY_PARTS = (
    "weights",
    "gradients",
    "optimizer_state",
    "activations",
    "logits",
    "ddp_buckets",
    "gathered_params",
    "unsharded_gradients",
    "fit_constant",  # the built-in GPT's fitted constant, where a refit gives one (train/gpt.py)
)


def _bars(table: pd.DataFrame, column: str, scale: float, xlabel: str, title: str) -> Figure:
    """One horizontal bar per row that has `column`; every row is named on the y axis."""
    values = pd.to_numeric(table[column], errors="coerce") * scale
    if values.isna().all():
        raise NoData(f"no point has {column}")
    fig = new_figure(len(table))
    ax = fig.add_subplot()
    rows = list(range(len(table)))[::-1]  # first point on top
    has = values.notna().to_list()
    ax.barh([r for r, ok in zip(rows, has, strict=True) if ok], values[values.notna()])
    ax.set_yticks(rows, tagged_labels(table))
    ax.set_xlabel(xlabel)
    ax.set_title(title)
    return fig


def throughput(table: pd.DataFrame) -> Figure:
    return _bars(table, "tokens_per_s", 1.0, "tokens/s (median step)", "Throughput per point")


def mfu(table: pd.DataFrame) -> Figure:
    if pd.to_numeric(table["mfu"], errors="coerce").isna().all():
        raise NoData("MFU is null for every point (no peak known: set hardware.peak_tflops)")
    sources = table.loc[table["mfu"].notna(), "peak_source"].dropna().unique()
    title = f"Model FLOPs utilisation (peak: {', '.join(map(str, sources))})"
    return _bars(table, "mfu", 100.0, "MFU (%)", title)


def batch_scaling(table: pd.DataFrame) -> Figure:
    batch = pd.to_numeric(table["batch_size"], errors="coerce")
    if batch.nunique() < 2:
        raise NoData("perf.batch_size does not vary across the points")
    tokens = pd.to_numeric(table["tokens_per_s"], errors="coerce")
    peak, peak_name = measured_peak(table)
    data = pd.DataFrame(
        {
            "series": point_labels(table, drop=_keys_that_set(batch, table)),
            "batch": batch,
            "tokens": tokens,
            "peak": peak / MIB,
        }
    )
    fig = new_figure(0, width=11.0)
    speed_ax, memory_ax = fig.subplots(1, 2)
    for series, rows in data[data["tokens"].notna()].groupby("series", sort=False):
        rows = rows.sort_values("batch")
        speed_ax.plot(rows["batch"], rows["tokens"], marker="o", label=series or "all points")
        memory_ax.plot(rows["batch"], rows["peak"], marker="o", label=series or "all points")
    for size in sorted(batch[table["status"] == "oom"].unique()):
        for ax in (speed_ax, memory_ax):
            ax.axvline(size, color="red", linestyle=":", label=f"oom at {size}")
    found = pd.to_numeric(table["max_batch_size"], errors="coerce").dropna()
    for size in sorted(found.unique()):
        memory_ax.axvline(size, color="green", linestyle="--", label=f"max batch found: {size}")
    for ax, ylabel in ((speed_ax, "tokens/s"), (memory_ax, f"{peak_name} (MiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("perf.batch_size (sequences per micro-batch)")
        ax.set_ylabel(ylabel)
        ax.legend(fontsize="small")
    speed_ax.set_title("Throughput against batch size")
    memory_ax.set_title("Memory against batch size")
    return fig


def _keys_that_set(column: pd.Series, table: pd.DataFrame) -> tuple[str, ...]:
    """Override keys whose value alone fixes `column` (perf.batch_size itself, or a preset file
    that sets it, such as +sweep/accum_split): they are the x axis, not a series of their own."""
    overrides = pd.DataFrame(
        [parse_overrides(text) for text in table["overrides"]], index=table.index
    )
    return tuple(
        key
        for key in overrides.columns
        if column.groupby(overrides[key], dropna=False).nunique().max() == 1
    )


def measured_step_ms(sweep: Sweep, job_dir: str | Path) -> list[float]:
    """A point's measured step times (ms) from the sweep's steps table (rank 0's under torchrun,
    where the table's step_ms_* take the slowest rank per step); [] when there are none."""
    steps = sweep.steps
    mine = steps[(steps["job_dir"] == str(job_dir)) & (steps["phase"] == "measure")]
    return mine["step_ms"].dropna().astype(float).to_list()


def step_times(sweep: Sweep) -> Figure:
    table = sweep.table
    labels = tagged_labels(table)
    jobs = table["job_dir"]
    series = [
        (label, measured_step_ms(sweep, job)) for label, job in zip(labels, jobs, strict=True)
    ]
    series = [(label, ms) for label, ms in series if ms]
    if not series:
        raise NoData("no point has measured steps")
    fig = new_figure(len(series))
    ax = fig.add_subplot()
    series.reverse()  # first point on top
    ax.boxplot(
        [ms for _, ms in series],
        orientation="horizontal",
        tick_labels=[label for label, _ in series],
        medianprops={"gid": "median"},  # names the median lines among the box's artists
    )
    ax.set_xlabel("step time (ms), measured steps only")
    ax.set_title("Step-time distribution per point")
    return fig


def memory_estimate(sweep: Sweep, job_dir: str | Path) -> dict | None:
    """The analytic memory estimate of the point at `job_dir` (its record's), or None."""
    return sweep.point(job_dir).get("mem_estimate")


def memory_anatomy(sweep: Sweep) -> Figure:
    table = sweep.table
    estimates = [memory_estimate(sweep, job) for job in table["job_dir"]]
    keep = [estimate is not None for estimate in estimates]
    if not any(keep):
        raise NoData("no point's record has a mem_estimate")
    shown = table[keep]
    estimates = [e for e in estimates if e is not None]
    peak, peak_name = measured_peak(shown)
    largest = max(peak.max(skipna=True), *(e.get("total", 0) for e in estimates))
    unit, scale = ("GiB", GIB) if largest >= GIB else ("MiB", MIB)
    fig = new_figure(2 * len(shown))
    ax = fig.add_subplot()
    rows = list(range(len(shown)))[::-1]
    left = [0.0] * len(shown)
    for part in [p for p in MEMORY_PARTS if any(p in e for e in estimates)]:
        widths = [e.get(part, 0) / scale for e in estimates]
        ax.barh([r + 0.2 for r in rows], widths, 0.4, left=left, label=f"estimate: {part}")
        left = [a + b for a, b in zip(left, widths, strict=True)]
    ax.barh(
        [r - 0.2 for r in rows], peak / scale, 0.4, color="black", label=f"measured: {peak_name}"
    )
    labels = [label for label, kept in zip(tagged_labels(table), keep, strict=True) if kept]
    ax.set_yticks(rows, labels)
    ax.set_xlabel(unit)
    ax.set_title("Memory: estimate by part (upper bar), measured peak (lower)")
    fig.legend(loc="outside lower center", ncols=3, fontsize="small")
    return fig


def speedup(table: pd.DataFrame) -> Figure:
    """Speedup over the baseline with its 95 % interval as error bars; "~" marks a point whose
    difference is not significant (analysis/stats.py)."""
    fig = _bars(table, "speedup", 1.0, "tokens/s over the baseline (95 % interval)", "speedup")
    ax = fig.axes[0]
    rows = list(range(len(table)))[::-1]
    for row, (_, point) in zip(rows, table.iterrows(), strict=True):
        if pd.notna(point["speedup_ci_low"]):
            low, high = (
                point["speedup"] - point["speedup_ci_low"],
                point["speedup_ci_high"] - point["speedup"],
            )
            ax.errorbar(point["speedup"], row, xerr=[[low], [high]], color="black", capsize=3)
        if point["speedup_verdict"] == "~":
            ax.annotate(" ~", (point["speedup_ci_high"], row), va="center")
    ax.axvline(1.0, color="grey", linewidth=1)
    return fig


def pareto(table: pd.DataFrame) -> Figure:
    """tokens/s against peak memory; the Pareto front (no other point is both faster and
    smaller) is joined by a line."""
    peak, source = measured_peak(table)
    ok = _ok_with(table, peak / GIB, "peak")
    fig = new_figure(8, width=7.0)
    ax = fig.add_subplot()
    ax.scatter(ok["peak"], ok["tokens_per_s"])
    for label, (_, point) in zip(point_labels(ok), ok.iterrows(), strict=True):
        ax.annotate(label or "defaults", (point["peak"], point["tokens_per_s"]), fontsize=7)
    front = pareto_front(ok, "peak")
    ax.plot(front["peak"], front["tokens_per_s"], color="tab:orange", label="Pareto front")
    ax.set_xlabel(f"peak memory, GiB ({source})")
    ax.set_ylabel("tokens/s")
    ax.set_title("throughput against memory")
    ax.legend()
    return fig


def _ok_with(table: pd.DataFrame, memory: pd.Series, name: str) -> pd.DataFrame:
    """The ok rows that have `memory`, with it as column `name`."""
    ok = table.assign(**{name: memory})[(table["status"] == "ok") & memory.notna()]
    if ok.empty:
        raise NoData(f"no ok point with a memory {name}")
    return ok


def pareto_front(ok: pd.DataFrame, memory: str) -> pd.DataFrame:
    """The rows no other row is both faster (tokens_per_s) and smaller (`memory`) than, from the
    smallest up: each faster than every smaller one."""
    front, best = [], -math.inf
    for _, point in ok.sort_values([memory, "tokens_per_s"], ascending=[True, False]).iterrows():
        if point["tokens_per_s"] > best:  # faster than every smaller point
            front.append(point)
            best = point["tokens_per_s"]
    return pd.DataFrame(front)


def memory_time(table: pd.DataFrame) -> Figure:
    """Each point's step memory (analysis/memory_time.step_memory) against its tokens/s, a
    marker a checkpointing or offload policy; the frontier (no other point both faster and
    holding less) joined by a line: what each policy's memory costs in speed."""
    if table[["ac", "offload"]].astype(str).drop_duplicates().shape[0] < 2:
        raise NoData("perf.ac and perf.offload do not vary across the points")
    memory, source = step_memory(table)
    ok = _ok_with(table, memory / MIB, "memory")
    fig = new_figure(8, width=7.5)
    ax = fig.add_subplot()
    policy = [_policy_name(row) for _, row in ok.iterrows()]
    for name in dict.fromkeys(policy):
        mine = ok[[p == name for p in policy]]
        ax.scatter(mine["tokens_per_s"], mine["memory"], label=name)
    for label, (_, point) in zip(point_labels(ok), ok.iterrows(), strict=True):
        ax.annotate(label or "defaults", (point["tokens_per_s"], point["memory"]), fontsize=7)
    front = pareto_front(ok, "memory")
    ax.plot(front["tokens_per_s"], front["memory"], color="black", linewidth=1, label="frontier")
    ax.set_xlabel("tokens/s")
    ax.set_ylabel(f"memory, MiB ({source})")
    ax.set_title("memory against speed, by checkpointing policy")
    ax.legend(fontsize="small")
    return fig


def _policy_name(row: pd.Series) -> str:
    """A point's policy as the legend names it: perf.ac (its key), + offload."""
    name = str(row.get("ac"))
    for key in ("ac_every", "ac_policy", "ac_budget"):
        value = row.get(key)
        if pd.notna(value):  # a float column where other rows are null: 2.0 is every 2
            name += f" {int(value) if key == 'ac_every' else value}"
    return name + (" + offload" if row.get("offload") == "cpu" else "")


def of_table(draw: Callable[[pd.DataFrame], Figure]) -> Callable[[Sweep], Figure]:
    """A plot of the table's rows alone, drawn from the sweep."""
    return lambda sweep: draw(sweep.table)


def every_plot() -> dict[str, Callable[[Sweep], Figure]]:
    """Every scenario's plots by file name (its plot face's PLOTS: scenarios/base.py), in the
    scenarios' order: throughput's (scenarios/throughput/plot.py, drawn here), then time to
    loss's val_loss.png."""
    return {name: draw for s in scenarios.ALL for name, draw in s.plot.PLOTS.items()}


def figures(sweep: Sweep) -> dict[str, Figure]:
    """Every plot that has data, by file name; the others are skipped with a message."""
    drawn = {}
    for name, draw in every_plot().items():
        try:
            drawn[name] = draw(sweep)
        except NoData as why:
            print(f"plot skipped: {name}: {why}", file=sys.stderr)
    return drawn


def write_plots(sweep_dir: Path, sweep: Sweep) -> list[Path]:
    """Draw the plots of a sweep and write each PNG atomically into the sweep dir."""
    written = []
    for name, fig in figures(sweep).items():
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", dpi=110)
        write_atomic(sweep_dir / name, buffer.getvalue())
        written.append(sweep_dir / name)
    return written
