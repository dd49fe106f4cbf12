"""Time to a target validation loss (docs/time_to_loss.md): the held-out split, the char
tokenizer, the target run's clock, a point's runs pooled, the verdict against the baseline and
the bad inputs. The runs are in-process on micro models, but for one real micro sweep."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pandas as pd
import pytest
import torch

from nanogpt.analysis import store
from nanogpt.analysis.derive import Ceilings, Peak
from nanogpt.analysis.labels import point_labels
from nanogpt.analysis.store import read_result
from nanogpt.analysis.table import build_table
from nanogpt.config.errors import ConfigError
from nanogpt.config.spec import DataConfig, LoggerConfig, LoggerMode
from nanogpt.publish.plot_parts import NoData
from nanogpt.publish.wandb_sink import WandbSink, start_run
from nanogpt.record import Record, TimeToLoss
from nanogpt.scenarios.loop import measure
from nanogpt.scenarios.time_to_loss import pool as ttl
from nanogpt.scenarios.time_to_loss.plot import validation_loss
from nanogpt.scenarios.time_to_loss.run import train_to_target
from nanogpt.train.data import check_data, open_source
from nanogpt.train.distributed import World
from nanogpt.train.tokenize import char_vocab, tokenize_text
from nanogpt.train.trainer import build_trainer

from .conftest import SHAKESPEARE, TINY_TEXT, needs_shared, sweep_refusal, with_micro
from .signalling import wait_until
from .wandb_reader import read_run, run_file

CPU = torch.device("cpu")
TEXT = TINY_TEXT  # what conftest's text_file holds
UNKNOWN_PEAK = Ceilings(Peak(None, "unknown"))  # MFU has no peak here: no figure needs one


def _spec(*overrides: str):
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR

    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        return to_spec(compose(config_name="config", overrides=with_micro(list(overrides))))


def _char_data(path, val_fraction=0.1):
    return DataConfig(kind="text", path=str(path), tokenizer="char", val_fraction=val_fraction)


# --- the split and the tokenizer --------------------------------------------------------------


def test_char_tokenizer_is_the_sorted_set_of_characters(text_file, tmp_path):
    ids = np.fromfile(tokenize_text(text_file, tmp_path / "c", "char"), dtype="<u2")
    vocab = char_vocab(TEXT)
    assert vocab == sorted(set(TEXT)) and len(vocab) == 14
    assert "".join(vocab[i] for i in ids) == TEXT  # one id per character, decodes back


def test_text_holds_out_its_last_share_and_training_never_reads_it(text_file):
    data = _char_data(text_file, val_fraction=0.25)
    args = dict(vocab_size=14, block_size=8, batch_size=64, device=CPU, seed=0)
    cut = int(len(TEXT) * 0.75)
    ids = np.asarray([char_vocab(TEXT).index(c) for c in TEXT])
    train, val = open_source(data, **args), open_source(data, **args, split="val")
    windows = np.lib.stride_tricks.sliding_window_view(ids, 8)
    starts = {"train": set(), "val": set()}
    for name, source in (("train", train), ("val", val)):
        for _ in range(20):
            x, _ = source.next_batch()
            for row in x.numpy():
                starts[name] |= {int(i) for i in np.flatnonzero((windows == row).all(axis=1))}
    # The text repeats every 27 characters, so a window matches at many offsets: what counts is
    # that some of them lie in the split's own range, and a training window never needs the tail.
    assert min(starts["val"]) >= 0 and max(starts["val"]) >= cut
    assert val._tokens.shape[0] == len(TEXT) - cut and train._tokens.shape[0] == cut


def test_tokens_reads_val_bin_beside_train_bin(tmp_path):
    np.arange(100, dtype="<u2").tofile(tmp_path / "train.bin")
    data = DataConfig(kind="tokens", path=str(tmp_path / "train.bin"))
    check_data(data, vocab_size=200, block_size=8)  # no target: no val.bin needed
    with pytest.raises(ConfigError) as err:
        check_data(data, vocab_size=200, block_size=8, val=True)
    assert str(err.value).startswith("data.path") and "val.bin" in str(err.value)
    np.arange(150, 190, dtype="<u2").tofile(tmp_path / "val.bin")
    val = open_source(
        data, vocab_size=200, block_size=8, batch_size=4, device=CPU, seed=0, split="val"
    )
    assert val.next_batch()[0].min() >= 150  # val.bin's ids, never train.bin's


# --- the target run's clock ----------------------------------------------------------------


def _trainer_spec(text_file, *overrides):
    return _spec(
        "data=text",
        f"data.path={text_file}",
        "data.tokenizer=char",
        "model.vocab_size=14",
        "model.block_size=8",
        "bench.diagnose=false",
        *overrides,
    )


def _trainer(text_file, *overrides):
    spec = _trainer_spec(text_file, *overrides)
    return spec, build_trainer(spec, CPU, World.from_env())


def test_a_point_that_cannot_reach_its_target_says_so_with_its_best_loss(text_file):
    spec, trainer = _trainer(
        text_file, "bench.target_loss=0.001", "bench.max_steps=6", "bench.eval_every=3"
    )
    record = Record()
    record.setup.tokens_per_step = trainer.tokens_per_step
    train_to_target(spec, trainer, record)
    part = record.time_to_loss
    assert part.ttl_reached is False and part.time_to_loss_s is None
    assert [e["step"] for e in part.ttl_evals] == [0, 3, 6]  # 0: before any step
    best = min(e["val_loss"] for e in part.ttl_evals)
    assert part.ttl_best_loss == best and f"best {best:.4f}" in part.ttl_note
    assert part.ttl_note.startswith("not reached") and "6 steps" in part.ttl_note


@pytest.mark.slow  # wandb starts its service process
def test_wandb_gets_every_evaluation_against_steps_and_training_time(text_file, tmp_path):
    """A real offline W&B run under the target run: one history row per evaluation, at its
    optimizer step, with the loss and the training clock the record keeps."""
    spec, trainer = _trainer(
        text_file, "bench.target_loss=0.001", "bench.max_steps=4", "bench.eval_every=2"
    )
    logger = LoggerConfig(backend="wandb", mode=LoggerMode.offline, project="p")
    run = start_run(logger, job_type="point", name="n", group="g", config={}, run_dir=tmp_path)
    record = Record()
    record.setup.tokens_per_step = trainer.tokens_per_step
    train_to_target(spec, trainer, record, sinks=[WandbSink(run)])
    run.close(exit_code=0)
    (run_dir,) = (tmp_path / "wandb").glob("offline-run-*")
    # finish can return before wandb-core's writer has flushed the run file (seen under load:
    # no history yet, all of it a moment later): read it once its exit record, written last,
    # is there
    wait_until(
        lambda: read_run(run_file(run_dir)).exit_code is not None,
        "the run's exit record",
        timeout=60,
    )
    rows = [row for row in read_run(run_file(run_dir)).history if "val/loss" in row]
    evals = record.time_to_loss.ttl_evals
    assert [row["_step"] for row in rows] == [e["step"] for e in evals] == [0, 2, 4]
    assert [row["val/loss"] for row in rows] == [e["val_loss"] for e in evals]
    assert [row["val/train_s"] for row in rows] == [e["train_s"] for e in evals]


def test_a_slow_evaluation_does_not_change_time_to_target(text_file):
    """An evaluation that sleeps 0.3 s, read 5 times (before the first step, then every 4
    steps; the 5th reads the target). Step times on a shared machine stall unpredictably, so
    the test does not compare two runs: it checks that the run's training clock plus the
    evaluations' is its wall time, i.e. that no second of the 1.5 s spent evaluating is in
    time to target (a clock that ran through them would read 1.2 s more at the 5th)."""
    spec, trainer = _trainer(text_file, "bench.target_loss=2.0", "bench.eval_every=4")
    losses = iter([6.0, 5.0, 4.0, 3.0, 1.5])

    def evaluate() -> float:
        time.sleep(0.3)  # a real, slow evaluation
        return next(losses)

    record = Record()
    record.setup.tokens_per_step = trainer.tokens_per_step
    started = time.perf_counter()
    train_to_target(spec, trainer, record, evaluate)
    wall = time.perf_counter() - started
    part = record.time_to_loss
    assert part.ttl_steps == 16 and part.ttl_eval_s >= 1.5
    train_s = part.ttl_evals[-1]["train_s"]
    assert train_s <= wall - 1.5  # none of the evaluations' 1.5 s
    assert part.time_to_loss_s == pytest.approx(train_s - part.ttl_compile_s)


def test_a_target_the_untrained_model_already_reads_fails_the_point_in_one_line(text_file):
    """The first evaluation, before any step, reads about ln(14) = 2.6: a target of 3 times
    nothing. The run stops there (no step taken) and the measured loop records the point
    failed with the line (status error), as any point that raises."""
    spec, trainer = _trainer(text_file, "bench.target_loss=3.0")
    with pytest.raises(ConfigError) as err:
        train_to_target(spec, trainer, Record())
    line = str(err.value)
    assert line.startswith("bench.target_loss: is 3, but the first evaluation, before any step")
    assert "set a target below 2." in line and "\n" not in line
    assert trainer.steps_done == 0
    record = measure(spec, CPU, World.from_env(), UNKNOWN_PEAK, text_file.parent, [])
    assert record.status == "error" and record.error == f"ConfigError: {line}"


class Collected:
    """A sink as the measured loop takes one (anything with `window(stats)`), keeping them."""

    def __init__(self):
        self.windows = []

    def window(self, stats: dict) -> None:
        self.windows.append(stats)


def test_the_measured_loop_hands_every_evaluation_to_its_sinks(text_file):
    spec = _trainer_spec(
        text_file, "bench.target_loss=0.001", "bench.max_steps=4", "bench.eval_every=2"
    )
    sink = Collected()
    record = measure(spec, CPU, World.from_env(), UNKNOWN_PEAK, text_file.parent, [sink])
    assert record.status == "ok", record.error
    evals = record.time_to_loss.ttl_evals
    assert sink.windows == [
        {"phase": "eval", "step": e["step"], "loss": e["val_loss"], "train_s": e["train_s"]}
        for e in evals
    ]
    assert [w["step"] for w in sink.windows] == [0, 2, 4]
    # a target run's record lists its optimizer's roles, as a throughput run's does
    roles = record.optimizer.optimizer_roles
    assert record.optimizer.optimizer_stepped and roles and roles["matrices"]["n_params"] > 0


# --- a point's runs, and a point against the baseline --------------------------------------


def _run(seconds, best=1.0):
    part = TimeToLoss(
        ttl_target_loss=1.5,
        ttl_s_per_run=[seconds],
        ttl_best_loss=best,
        ttl_compile_s=0.1,
        ttl_eval_s=0.2,
        ttl_steps=None if seconds is None else 40,
    )
    record = Record(status="ok")
    record.time_to_loss = part
    return record


def test_a_point_is_the_olympic_mean_when_every_run_reached_else_k_of_n():
    pooled = ttl.pool([_run(s) for s in (10.0, 11.0, 12.0, 13.0, 30.0)]).time_to_loss
    assert pooled.time_to_loss_s == pytest.approx(12.0)  # 10 and 30 dropped
    # the bootstrap interval of the olympic mean, within the runs' own times
    assert 10.0 <= pooled.ttl_ci_low < 12.0 < pooled.ttl_ci_high <= 30.0
    assert pooled.ttl_note == "5 of 5 reached" and pooled.ttl_s_per_run[-1] == 30.0
    missed = ttl.pool([_run(10.0), _run(None, best=1.7), _run(12.0)]).time_to_loss
    assert missed.time_to_loss_s is None and missed.ttl_reached is False
    assert missed.ttl_note == "2 of 3 reached; best loss 1.0000"


def test_an_interval_from_three_runs_is_positive_by_its_method_and_none_from_two():
    """Times [7.0, 8.4, 7.5]: a t-interval of their mean would reach down to 5.5 s; with two of
    them it reached -60.3 s for a 7.7 s mean. The bootstrap's resamples are means of the runs'
    own times: its low end is at least the fastest run's."""
    low, high = ttl.olympic_interval([7.0, 8.4, 7.5])
    assert 7.0 <= low < ttl.olympic_mean([7.0, 8.4, 7.5]) < high <= 8.4
    pooled = ttl.pool([_run(s) for s in (7.0, 8.4, 7.5)]).time_to_loss
    assert (pooled.ttl_ci_low, pooled.ttl_ci_high) == (low, high)
    assert pooled.ttl_ci_method.startswith("percentile bootstrap of the olympic mean")
    two = ttl.pool([_run(7.0), _run(8.4)]).time_to_loss
    assert two.time_to_loss_s == pytest.approx(7.7)
    assert two.ttl_ci_low is None and two.ttl_ci_high is None
    assert two.ttl_ci_method == "no interval: 2 runs (an interval needs 3 or more)"
    assert two.ttl_note == "2 of 2 reached; no interval: 2 runs (an interval needs 3 or more)"


def _table(base_runs, other_runs) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "status": ["ok", "ok"],
            "ttl_target_loss": [1.5, 1.5],
            "ttl_s_per_run": [base_runs, other_runs],
        }
    )


def _spans(starts) -> list:
    """ttl_run_times of runs started at `starts` (epoch s), each 0.5 s long."""
    return [[t, t + 0.5] for t in starts]


ALTERNATED = [_spans([0, 2, 4, 6, 8]), _spans([1, 3, 5, 7, 9])]  # run r of both before r + 1


NOISY = [20.3, 19.6, 20.9, 19.9, 20.5]  # a few % apart, as runs with their own seeds are


def test_identical_run_times_on_both_sides_are_not_significant():
    table = _table(NOISY, list(NOISY))
    ttl.add_comparison(table, 0, 0.01, ALTERNATED)
    assert table["ttl_verdict"].tolist() == ["baseline", "~"]
    assert table["ttl_p_value"].iloc[1] == pytest.approx(0.5)
    assert table["ttl_ratio"].iloc[1] == pytest.approx(1.0)


def test_run_times_20_percent_shorter_over_5_runs_are_faster_to_target():
    table = _table(NOISY, [0.8 * t for t in reversed(NOISY)])
    ttl.add_comparison(table, 0, 0.01, ALTERNATED)
    assert table["ttl_verdict"].iloc[1] == "faster to target"
    assert table["ttl_p_value"].iloc[1] < 0.001
    assert table["ttl_ratio_ci_low"].iloc[1] < 0.8 < table["ttl_ratio_ci_high"].iloc[1]
    fewer = _table(NOISY, [16.0, 16.1, None, None, None])  # 2 reached: a p-value, no verdict
    ttl.add_comparison(fewer, 0, 0.01, ALTERNATED)
    assert pd.isna(fewer["ttl_verdict"].iloc[1]) and fewer["ttl_p_value"].iloc[1] < 0.01


def test_interleaved_runs_read_as_alternated_and_back_to_back_ones_as_blocked():
    """Judged from the runs' wall-clock spans, never a flag: run r of both points before run
    r + 1 is alternated (side by side too, as parallel slots run them); a point's runs back to
    back, or only partly interleaved, are blocked, and the verdict says so."""
    assert ttl.alternated(*ALTERNATED) is True
    side_by_side = [_spans([0, 10, 20]), _spans([0.1, 10.2, 20.1])]
    assert ttl.alternated(*side_by_side) is True
    back_to_back = [_spans([0, 1, 2, 3, 4]), _spans([5, 6, 7, 8, 9])]  # the basic launcher
    assert ttl.alternated(*back_to_back) is False
    assert ttl.alternated(_spans([0, 1, 3]), _spans([2, 4, 5])) is False  # runs 1, 2 of A first
    assert ttl.alternated(None, _spans([0, 1])) is None  # a record before ttl_run_times
    faster = [0.8 * t for t in reversed(NOISY)]
    for times, order, verdict in (
        (ALTERNATED, "alternated", "faster to target"),
        (back_to_back, ttl.BLOCKED, f"faster to target; {ttl.BLOCKED}"),
        (None, ttl.UNKNOWN_ORDER, f"faster to target; {ttl.UNKNOWN_ORDER}"),
    ):
        table = _table(NOISY, faster)
        ttl.add_comparison(table, 0, 0.01, times)
        assert pd.isna(table["ttl_run_order"].iloc[0]) and table["ttl_run_order"].iloc[1] == order
        assert table["ttl_verdict"].tolist() == ["baseline", verdict]


def test_a_points_runs_pool_into_its_row_and_a_resume_finds_each_ok_run(tmp_path):
    """analysis/store.py: a point's runs (POINT/run-R) pool into its result.json (the time to
    loss over the runs); a run that was not ok is the point's record; the resume's index finds
    an ok run by point and run number, and an old pooled record (no run dirs) as all runs."""
    point = tmp_path / "0"
    for number, seconds in ((1, 10.0), (2, 12.0)):
        record = _run(seconds)
        record.asked.point_id = "p1"
        store.write_record(store.run_dir(point, number), record)
    pooled = store.pool_runs(point)
    assert pooled.time_to_loss.ttl_s_per_run == [10.0, 12.0] and pooled.status == "ok"
    assert read_result(point / "result.json")["ttl_note"].startswith("2 of 2 reached; no interval")
    old = _run(9.0)
    old.asked.point_id = "p2"
    store.write_record(tmp_path / "1", old)  # a point written before runs were jobs
    index = store.Index(tmp_path)
    assert index.find(["p1"], 2)[:2] == (store.run_dir(point, 2), False)
    assert index.find(["p1"], 3) is None and index.find(["p3"], 1) is None
    assert index.find(["p2"], 4)[:2] == (tmp_path / "1", True)  # all its runs
    store.write_record(store.run_dir(point, 3), Record(status="error", error="boom"))
    assert store.pool_runs(point).status == "error"  # a failed run is the point's record


# --- bad input -----------------------------------------------------------------------------


def test_a_target_on_synthetic_data_is_refused_in_one_line():
    line = sweep_refusal("bench.target_loss=2.0")
    assert "): bench.target_loss: is set but data=synthetic" in line and "\n" not in line


@needs_shared
def test_a_target_with_one_run_is_refused_in_one_line():
    line = sweep_refusal(
        "bench.target_loss=2.0",
        "bench.repeats=1",
        "data=text",
        f"data.path={SHAKESPEARE}",
        "data.tokenizer=char",
        "model.vocab_size=65",
    )
    assert "): bench.repeats: is 1" in line and "p-value" in line and "\n" not in line


# --- one real sweep ------------------------------------------------------------------------


@needs_shared
def test_a_target_sweep_records_runs_seeds_and_the_verdict(sweep, monkeypatch):
    """Two points, two runs each: a target the second evaluation reads (the first, before any
    step, reads about 4.17 = ln 65; after 2 steps at lr 1e-2 both seeds read below 3.92), and
    one no micro run reaches; each run its own seed, the table's figures from the runs. On
    hydra/launcher=parallel (one slot) the runs are alternated: the grid sweeper launches one
    round at a time (nanogpt/frontend/grid_sweeper.py), each run a job of its own, POINT/run-R."""
    proc, sweep_dir = sweep(
        "hydra/launcher=parallel",
        "hydra.launcher.slots=1",
        "data=text",
        f"data.path={SHAKESPEARE}",
        "data.tokenizer=char",
        "model.vocab_size=65",
        "optimizer.lr=1e-2",
        "bench.target_loss=4.0,0.01",
        "bench.repeats=2",
        "bench.eval_every=2",
        "bench.max_steps=4",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    reached = read_result(sweep_dir / "0" / "result.json")
    assert reached["ttl_note"].startswith("2 of 2 reached; no interval")
    assert reached["ttl_steps_per_run"] == [2, 2]
    assert reached["time_to_loss_s"] > 0 and reached["ttl_tokens"] == 2 * 2 * 16
    first, second = reached["ttl_evals"]
    assert [e["step"] for e in first] == [0, 2] and first[0]["val_loss"] > 4.0
    assert first[0]["val_loss"] != second[0]["val_loss"]  # own seed each: another init
    missed = read_result(sweep_dir / "1" / "result.json")
    assert missed["time_to_loss_s"] is None and missed["ttl_note"].startswith("0 of 2 reached")
    # Run r of both points before run r + 1, as each run's recorded span says
    (a1, a2), (b1, b2) = reached["ttl_run_times"], missed["ttl_run_times"]
    assert a1[0] < a1[1] < b1[0] < b1[1] < a2[0] < a2[1] < b2[0] < b2[1]
    assert ttl.alternated(reached["ttl_run_times"], missed["ttl_run_times"]) is True
    assert "grid: 2 point(s) × up to 2 runs" in proc.stdout
    assert (sweep_dir / "1" / "run-2" / "result.json").is_file()
    assert reached["co_running"] == missed["co_running"] == []  # one slot: none side by side
    # The console's table shows what a target sweep has: no steps (steady), no tokens/s
    # (speedup) and nobody beside a point get no column of dashes
    header = (sweep_dir / "summary.md").read_text().splitlines()[2]
    assert "to_target_s" in header and "runs" in header
    assert not {"steady", "speedup", "beside", "step_ms"} & {c.strip() for c in header.split("|")}
    table = pd.read_csv(sweep_dir / "summary.csv")
    assert table["ttl_verdict"].iloc[0] == "baseline" and pd.isna(table["ttl_verdict"].iloc[1])
    _the_loss_plot_draws_every_run(build_table(sweep_dir), [reached, missed])
    _the_notebook_shows_time_to_loss(sweep_dir, monkeypatch)


def _the_notebook_shows_time_to_loss(sweep_dir, monkeypatch):
    """notebooks/sweep_analysis.ipynb on this target sweep (nbclient, as the README runs it):
    its time-to-loss section prints each point's figure, interval, runs reached and p-value
    from the package's table, and draws val_loss.png's curves (scenarios/time_to_loss/plot.py)."""
    from .test_analysis import run_notebook

    monkeypatch.setenv("NANOGPT_SUMMARY", str(sweep_dir))
    notebook, text = run_notebook()
    table = build_table(sweep_dir).table
    labels = point_labels(table)

    def fig(value):
        return "-" if pd.isna(value) else f"{value:.3g}"

    for label, row in zip(labels, table.itertuples(), strict=True):
        assert (
            f"{label}: time to loss {row.ttl_target_loss:g}: {fig(row.time_to_loss_s)} s "
            f"[{fig(row.ttl_ci_low)}, {fig(row.ttl_ci_high)}], reached "
            f"{row.ttl_reached_runs}/{row.ttl_runs}, p={fig(row.ttl_p_value)}, "
        ) in text, text
    assert "reached 2/2" in text and "reached 0/2" in text
    assert f"{sweep_dir}: validation loss against training time" in text
    assert "no point measured tokens/s" in text  # the throughput sections say why they are empty
    section = next(i for i, c in enumerate(notebook.cells) if "validation_loss(" in c.source)
    outputs = notebook.cells[section].outputs
    assert any("image/png" in o.get("data", {}) for o in outputs)


def _the_loss_plot_draws_every_run(sweep, records):
    """val_loss.png, drawn from the sweep (its table and its points' records, no file read
    again): a line per run through its evaluations, a colour per point, a dashed line per
    target."""
    fig = validation_loss(sweep)
    ax = fig.axes[0]
    runs = [(n, run) for n, record in enumerate(records) for run in record["ttl_evals"]]
    lines = [line for line in ax.get_lines() if line.get_linestyle() != "--"]
    assert len(lines) == len(runs) == 4
    for line, (n, run) in zip(lines, runs, strict=True):
        assert list(line.get_xdata()) == [e["train_s"] for e in run]
        assert list(line.get_ydata()) == [e["val_loss"] for e in run]
        assert line.get_color() == f"C{n}"
    targets = [line.get_ydata()[0] for line in ax.get_lines() if line.get_linestyle() == "--"]
    assert sorted(targets) == [0.01, 4.0]
    with pytest.raises(NoData, match="bench.target_loss"):  # a throughput sweep: none drawn
        validation_loss(dataclasses.replace(sweep, table=sweep.table.assign(ttl_target_loss=None)))
