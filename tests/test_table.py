"""The sweep table as pandas users expect it: one typed column per swept key, a baseline that
answers the sweep's question, summary.parquet and the long steps.parquet, and
`python -m nanogpt.report DIR` rebuilding it with the settings the sweep ran with.

Fast tests on tables built by hand (the rule, the override grammar); slow ones on real
`python -m nanogpt.run -m` sweeps read back with pandas and pyarrow.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pandas as pd
import pytest

from nanogpt.analysis import baseline, compare, display, tidy
from nanogpt.analysis import table as report
from nanogpt.analysis.labels import point_labels
from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import STEPS_PARQUET, SUMMARY_PARQUET, read_summary
from nanogpt.record import columns as columns_of_record
from nanogpt.record import swept

from .conftest import report_cli, run_cli, with_micro

# --- the override grammar's values --------------------------------------------------------


@pytest.mark.parametrize(
    "text,value",
    [
        ("true", True),
        ("False", False),
        ("null", None),
        ("12", 12),
        ("-3", -3),
        ("1e-3", 0.001),
        ("0.5", 0.5),
        ("bf16", "bf16"),
        ("8x2", "8x2"),
        ("'8'", "8"),
        ("[0.9,0.95]", [0.9, 0.95]),
        ("[a, 'b c', [1,2]]", ["a", "b c", [1, 2]]),
        ("{a:1,b:[x,y]}", {"a": 1, "b": ["x", "y"]}),
        ("http://127.0.0.1:8080/x", "http://127.0.0.1:8080/x"),
        ("${now:%H}", "${now:%H}"),
    ],
)
def test_override_values_are_typed_as_hydra_types_them(text, value):
    assert swept.parse_value(text) == value
    assert type(swept.parse_value(text)) is type(value)


def test_special_floats_and_keys():
    assert math.isinf(swept.parse_value("inf")) and math.isnan(swept.parse_value("nan"))
    assert swept.parse_override("++perf.dtype=bf16") == ("perf.dtype", "bf16")
    assert swept.parse_override("~perf.dtype") is None


def test_swept_keys_are_those_that_vary():
    points = [
        ["perf.dtype=bf16", "+sweep/accum_split=8x2", "bench.seed=1", "logger.log_interval=1"],
        ["perf.dtype=bf16", "+sweep/accum_split=4x4", "bench.seed=1"],
    ]
    # log_interval is set in one point only: the other has its default, so it varies too.
    assert swept.swept_keys(points) == ["sweep/accum_split", "logger.log_interval"]
    assert swept.swept_keys([["perf.dtype=bf16"]]) == ["perf.dtype"]


# --- the baseline rule --------------------------------------------------------------------


def points(*rows: dict) -> pd.DataFrame:
    """A table with the columns the rule reads; each row's overrides written from its values."""
    defaults = {"status": "ok", "compile": False, "dtype": "fp32", "attention": "auto"}
    table = pd.DataFrame([{**defaults, **row} for row in rows])
    table["overrides"] = [
        " ".join(f"{k}={v}" for k, v in row.items() if k != "status") for row in rows
    ]
    return table


def chosen(table: pd.DataFrame, text: str | None = None) -> dict:
    choice = baseline.choose(table, text)
    return table.iloc[choice.position][["compile", "dtype", "attention"]].to_dict()


def test_compile_by_16_bit_dtypes_is_measured_against_eager_bf16():
    """The README's sweep, compile x {bf16, fp16}, in Hydra's order (compiled first)."""
    table = points(
        *(
            {"compile": c, "dtype": d}
            for c in (True, False)
            for d in ("bf16", "fp16")  # no fp32 point
        )
    )
    assert chosen(table) == {"compile": False, "dtype": "bf16", "attention": "auto"}
    reason = baseline.choose(table).reason
    assert "perf.compile=false" in reason and "perf.dtype=bf16" in reason


def test_the_widest_dtype_and_eager_whatever_the_order():
    dtypes = ("fp16", "bf16", "tf32", "fp32")
    table = points(*({"compile": c, "dtype": d} for d in dtypes for c in (True, False)))
    assert chosen(table) == {"compile": False, "dtype": "fp32", "attention": "auto"}
    # A failed eager fp32 point: the reference among the points that are ok.
    table.loc[(~table["compile"]) & (table["dtype"] == "fp32"), "status"] = "oom"
    assert chosen(table) == {"compile": False, "dtype": "tf32", "attention": "auto"}


def test_attention_is_measured_against_the_materialised_path():
    table = points(*({"attention": a} for a in ("auto", "flash", "math", "manual")))
    assert chosen(table)["attention"] == "manual"
    assert chosen(table.iloc[:3].reset_index(drop=True))["attention"] == "math"


def test_sizes_take_the_smallest_and_other_keys_the_first_listed():
    table = points(*({"batch_size": b, "grad_accum": 16 // b} for b in (16, 8, 4)))
    assert table.iloc[baseline.choose(table).position]["grad_accum"] == 1
    table = points({"log_interval": 10}, {"log_interval": 1})  # not a record column
    assert baseline.choose(table).position == 0


def test_a_given_baseline_wins_and_one_that_names_no_ok_point_is_an_error():
    table = points({"dtype": "fp32"}, {"dtype": "bf16"})
    assert chosen(table, "dtype=bf16")["dtype"] == "bf16"
    with pytest.raises(baseline.BaselineError, match="baseline: 'dtype=fp8' matches no ok"):
        baseline.choose(table, "dtype=fp8")


def test_a_given_baseline_matches_whole_overrides_never_a_substring():
    # batch 16 comes first and its text contains "perf.batch_size=1": a substring rule took it.
    table = points({"perf.batch_size": 16}, {"perf.batch_size": 1})
    position = baseline.choose(table, "perf.batch_size=1").position
    assert table.iloc[position]["overrides"].split()[-1] == "perf.batch_size=1"
    # Values are typed as Hydra types them: false is False; a bare word is a whole value.
    table = points({"compile": True}, {"compile": False})
    assert chosen(table, "compile=false")["compile"] is False
    assert baseline.names_baseline("+sweep/accum_split=4x4 perf.dtype=bf16", "4x4")
    assert not baseline.names_baseline("+sweep/accum_split=4x4", "4x")


def test_a_given_baseline_that_names_several_points_is_refused_naming_them():
    table = points(*({"compile": c, "dtype": d} for c in (True, False) for d in ("bf16", "fp16")))
    with pytest.raises(baseline.BaselineError) as err:
        baseline.choose(table, "dtype=bf16")
    line = str(err.value)
    assert "names 2 points" in line and "compile=True dtype=bf16" in line
    assert "compile=False dtype=bf16" in line and "\n" not in line
    assert chosen(table, "dtype=bf16 compile=false") == {
        "compile": False,
        "dtype": "bf16",
        "attention": "auto",
    }


def test_a_verdict_says_when_it_rests_on_one_process_a_point():
    table = points({"perf.batch_size": 1}, {"perf.batch_size": 2})
    table["tokens_per_step"], table["tokens_per_s"] = [64, 64], [640.0, 1280.0]
    table["steady"], table["step_ms_median"] = [True, True], [100.0, 50.0]
    slow, fast = [100.0 + i % 3 for i in range(12)], [50.0 + i % 3 for i in range(12)]
    compare.add_speedups(table, [[slow], [fast]], 0)  # one process each
    assert table["speedup_verdict"].tolist() == ["baseline", "faster, within one process"]
    text = display.console(table)
    assert "2.0" in text and "]*" in text and "bench.repeats=3" in text.splitlines()[-1]
    compare.add_speedups(table, [[slow, slow], [fast, fast]], 0)  # pooled over two each
    assert table["speedup_verdict"].tolist() == ["baseline", "faster"]
    assert "]*" not in display.console(table) and "bench.repeats" not in display.console(table)


def test_the_console_shows_numbers_for_people():
    assert [display.number(v) for v in (30822.4, 16.61, 0.000123, 4632.0)] == [
        "30,822",
        "16.6",
        "0.000123",
        "4,632",
    ]
    assert display.percent(0.0822) == "8.2 %" and display.mebibytes(501.5 * 2**20) == "502"


def test_a_part_says_where_its_fields_are_shown(monkeypatch):
    """Issue 46, a record part owns its rules: summary.csv's headline and the console's columns
    are the fields their parts mark (record/fields.py: HEADLINE, SHOWN), in the places the
    marks give, with the table's own figures among them; two figures in one place are refused,
    naming both. How runs pool a field and which fields are peaks of memory are its marks."""
    from dataclasses import fields

    from nanogpt.record import Record, Timing, flat_fields
    from nanogpt.record.fields import HEADLINE, SHOWN, marked

    places = {f.name: f.metadata[HEADLINE] for _, _, f in flat_fields() if HEADLINE in f.metadata}
    assert [c for c in tidy.HEADLINE if c in places] == sorted(places, key=places.__getitem__)
    # the figures that compare points: each scenario's (its part's COMPARED), the table's own
    from nanogpt.scenarios import base as scenarios

    compared = {n: p for s in scenarios.ALL for n, p in s.part.COMPARED.items()}
    assert "speedup" in compared and "ttl_verdict" in compared
    own = {**compared, **tidy.TABLE_PLACES}
    assert [c for c in tidy.HEADLINE if c not in places] == sorted(own, key=own.__getitem__)
    median = next(f for f in fields(Timing) if f.name == "step_ms_median")
    assert median.metadata[SHOWN][1:] == ("step_ms", "number")
    assert display.SHOWN[1][:2] == ("step_ms_median", "step_ms")  # the second place, the label
    assert fields(Record)[0].metadata[HEADLINE] == min(places.values())  # status comes first
    # a field added to a part with a mark is a headline column; a place taken twice, an error
    monkeypatch.setitem(tidy.TABLE_PLACES, "new_figure", 999)
    assert tidy._headline()[-1] == "new_figure"
    monkeypatch.setitem(tidy.TABLE_PLACES, "new_figure", median.metadata[HEADLINE])
    with pytest.raises(ValueError, match="new_figure.*step_ms_median"):
        tidy._headline()
    assert marked(headline=5).metadata == {HEADLINE: 5}
    # how a point's runs pool a field, and which peaks peak_memory weighs, are marks too
    from nanogpt.analysis import derive, repeats

    runs = [Record(), Record(), Record()]
    for run, rss, recompiles in zip(runs, (5, 9, 7), (1, 2, 0), strict=True):
        run.memory.mem_peak_rss_bytes, run.compile.recompiles_in_window = rss, recompiles
        run.memory.mem_peak_rss_method = f"first {rss}"  # unmarked: the first run's
    pooled = repeats.pool(runs)
    assert pooled.memory.mem_peak_rss_bytes == 9 and pooled.compile.recompiles_in_window == 3
    assert pooled.memory.mem_peak_rss_method == "first 5"
    runs[1].compile.recompiles_in_window = None  # a run that could not count: no total
    assert repeats.pool(runs).compile.recompiles_in_window is None
    assert [kind for kind, _, _ in derive.PEAK_FIELDS] == ["cuda", "rss"]
    assert derive.PEAK_FIELDS[1][1:] == ("mem_peak_rss_bytes", "mem_warmup_peak_rss_bytes")


# --- real sweeps --------------------------------------------------------------------------

# Swept: a nested preset group (no config path of its own) and a list-valued key.
TIDY = [
    "+sweep/accum_split=8x2,4x4",
    "optimizer.betas=[0.9,0.95],[0.8,0.9]",
    "cost.usd_per_hour=3.6",
    "bench.isolate=false",
]
SWEPT = ("+sweep/accum_split", "optimizer.betas")  # the keys TIDY varies


@pytest.fixture(scope="module")
def tidy_sweep(tmp_path_factory):
    root = tmp_path_factory.mktemp("tidy")
    sweep_dir = root / "sweep"
    proc = run_cli("-m", *with_micro(TIDY), f"hydra.sweep.dir={sweep_dir}", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, sweep_dir


@pytest.fixture(scope="module")
def attention_sweep(tmp_path_factory):
    """The attention_cpu preset, which sets report.baseline=perf.attention=manual and
    report.plots=true in its file, not on the command line."""
    root = tmp_path_factory.mktemp("attention")
    sweep_dir = root / "sweep"
    args = ["-m", "+sweep=attention_cpu", *with_micro(["bench.isolate=false"])]
    proc = run_cli(*args, f"hydra.sweep.dir={sweep_dir}", cwd=root)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, sweep_dir


def test_summary_has_a_typed_column_per_swept_key(tidy_sweep):
    _, sweep_dir = tidy_sweep
    table = read_summary(sweep_dir / report.SUMMARY_CSV)
    columns = list(table.columns)
    # The swept keys by config path, then the headline; no record copy of a swept key (the
    # record's grad_accum beside perf.grad_accum) and no column empty in every row.
    assert columns[:2] == ["sweep/accum_split", "optimizer.betas"] and len(columns) <= 30
    assert columns[2:] == [c for c in tidy.HEADLINE if c in columns]
    assert "grad_accum" not in columns and table.notna().any().all()
    assert sorted(set(table["sweep/accum_split"])) == ["4x4", "8x2"]
    assert sorted(map(tuple, table["optimizer.betas"])) == [(0.8, 0.9)] * 2 + [(0.9, 0.95)] * 2
    assert table["tokens_per_step"].dtype.kind == "i" and table["steady"].dtype == bool
    # The Parquet copy keeps every field of every record, with its types.
    parquet = read_summary(sweep_dir)
    assert set(columns) < set(parquet.columns) and set(columns_of_record()) <= set(parquet)
    assert all(isinstance(v, list) for v in parquet["step_ms_median_per_repeat"])
    assert parquet["grad_accum"].dtype.kind == "i" and parquet["compile"].dtype == bool
    assert parquet["optimizer.betas"].tolist() == table["optimizer.betas"].tolist()
    assert parquet["tokens_per_s"].tolist() == pytest.approx(table["tokens_per_s"].tolist())
    # On disk, a column says where its figure lives: a record field as part.field, what was
    # asked by its config path, a swept key by its own; read_summary gave the flat names back.
    stored = pd.read_parquet(sweep_dir / SUMMARY_PARQUET)
    assert {"point.status", "timing.step_ms_median", "rates.tokens_per_s"} <= set(stored)
    assert {"perf.grad_accum", "perf.dtype", "optimizer.betas", "job_dir"} <= set(stored)
    assert not {"status", "step_ms_median", "grad_accum", "dtype"} & set(stored)
    assert stored["perf.grad_accum"].tolist() == parquet["grad_accum"].tolist()


def _at(data: dict, path: str):
    """The value at a dotted path of nested dicts (`timing.step_ms_median`), or KeyError."""
    for key in path.split("."):
        data = data[key]
    return data


def _same(a, b) -> bool:
    if pd.isna(a) if not isinstance(a, list | dict) else False:
        return b is None or (not isinstance(b, list | dict) and pd.isna(b))
    if isinstance(a, float) or isinstance(b, float):
        return a == pytest.approx(b)
    return a == b


def test_a_field_has_one_name_in_result_json_summary_parquet_and_summary_csv(tidy_sweep):
    """Issue 46, one name a field: each of summary.csv's columns, as written on disk, is the
    same string in summary.parquet with the same values, and names a record field by where
    result.json keeps it: `part.field` is result.json's part and field (`point.`: the record's
    own fields, at result.json's top), what was asked by its config path, its place in what the
    point measured (asked.measured_config). A bare name is a figure that compares points (in
    no result.json) or one of the asked fields no config key holds (point_id, job_dir)."""
    _, sweep_dir = tidy_sweep
    csv = tidy.read_stored(sweep_dir / report.SUMMARY_CSV)  # the files' own names
    parquet = tidy.read_stored(sweep_dir / SUMMARY_PARQUET)
    assert "timing.step_ms_median" in csv and "step_ms_median" not in csv
    assert set(csv.columns) <= set(parquet.columns)
    assert parquet["job_dir"].tolist() == csv["job_dir"].tolist()  # the same rows, in order
    for column in csv.columns:
        pairs = zip(csv[column], parquet[column], strict=True)
        assert all(_same(a, b) for a, b in pairs), column
    results = [json.loads((Path(d) / "result.json").read_text()) for d in csv["job_dir"]]
    parts = {key for key, value in results[0].items() if isinstance(value, dict)}
    in_a_part = {field for part in parts - {"asked"} for field in results[0][part]}
    swept_columns = [key.lstrip("+") for key in SWEPT]  # the sweep's keys: no record's fields
    for column in [c for c in csv.columns if c not in swept_columns]:
        head, dot, rest = column.partition(".")
        for row, result in zip(csv[column], results, strict=True):
            if head == "point":  # the record's own: status, error
                assert dot and _same(row, result[rest]), column
            elif dot and head in parts:
                assert _same(row, result[head][rest]), column
            elif dot:  # asked, by its config path
                assert _same(row, _at(result["asked"]["measured_config"], column)), column
            elif column in results[0]["asked"]:  # the point's identity, no config key's
                expected = result["asked"][column]
                if column == "overrides":  # a list, the CSV's cell its text
                    expected = " ".join(expected) or "defaults"
                if column == "job_dir":  # the table's: the dir it read the record from (the
                    expected = row  # point's; the pooled record's names its first run)
                assert _same(row, expected), column
            else:  # a figure that compares points: no field of any part
                assert column not in in_a_part and column not in result, column


def test_a_sweep_dir_written_before_one_name_a_field_is_read_reported_and_compared(
    tidy_sweep, tmp_path
):
    """A sweep dir from before summary.csv took the stored names (its headline under the flat
    names, `status`, `step_ms_median`): read_summary reads it as it reads today's, and
    `python -m nanogpt.report` and `--compare` work against it; the report writes it anew
    under today's names."""
    _, sweep_dir = tidy_sweep
    old = tmp_path / "old"
    shutil.copytree(sweep_dir, old)
    today = read_summary(old / report.SUMMARY_CSV)
    written = pd.read_csv(old / report.SUMMARY_CSV)
    flat = {stored: name for name, stored in tidy.stored_names(tidy.HEADLINE).items()}
    written.rename(columns=flat).to_csv(old / report.SUMMARY_CSV, index=False)  # as before
    header = (old / report.SUMMARY_CSV).read_text().splitlines()[0].split(",")
    assert {"status", "step_ms_median", "tokens_per_s"} <= set(header)
    assert not {"point.status", "timing.step_ms_median"} & set(header)
    pd.testing.assert_frame_equal(read_summary(old / report.SUMMARY_CSV), today)

    proc = report_cli(sweep_dir, "--compare", old)
    assert proc.returncode == 0, proc.stderr
    for label in point_labels(today):  # every point, matched to itself
        assert label in proc.stdout
    proc = report_cli(old)
    assert proc.returncode == 0, proc.stderr
    header = (old / report.SUMMARY_CSV).read_text().splitlines()[0].split(",")
    assert {"point.status", "timing.step_ms_median", "rates.tokens_per_s"} <= set(header)
    assert read_summary(old / report.SUMMARY_CSV)["point_id"].tolist() == today["point_id"].tolist()


def test_point_id_is_a_column_and_labels_are_the_swept_keys(tidy_sweep):
    """One identity: each row's point_id is its record's, in summary.csv and summary.parquet;
    a point's label is its overrides of the swept keys."""
    _, sweep_dir = tidy_sweep
    table = read_summary(sweep_dir / report.SUMMARY_CSV)
    parquet = read_summary(sweep_dir / SUMMARY_PARQUET)
    ids = [read_result(Path(d) / "result.json")["point_id"] for d in table["job_dir"]]
    assert table["point_id"].tolist() == parquet["point_id"].tolist() == ids
    assert len(set(ids)) == len(ids)
    for label, row in zip(point_labels(table), table.itertuples(), strict=True):
        assert label.split() == [o for o in row.overrides.split() if o.split("=")[0] in SWEPT]


def test_the_steps_table_is_long_and_keyed_by_point(tidy_sweep):
    _, sweep_dir = tidy_sweep
    summary = pd.read_parquet(sweep_dir / SUMMARY_PARQUET)
    steps = pd.read_parquet(sweep_dir / STEPS_PARQUET)
    assert not steps.duplicated(["job_dir", "repeat", "step"]).any()
    assert set(steps["job_dir"]) == set(summary["job_dir"])
    measured = steps[steps["phase"] == "measure"].groupby("job_dir")["step_ms_job"].median()
    by_point = summary.set_index("job_dir")["timing.step_ms_median"]  # the file's own names
    assert measured.sort_index().tolist() == pytest.approx(by_point.sort_index().tolist())
    # Each point's own steps: reading its steps.csv gives the same rows.
    for job_dir in summary["job_dir"]:
        own = pd.read_csv(f"{job_dir}/steps.csv")
        mine = steps[steps["job_dir"] == job_dir]
        assert mine["step"].tolist() == own["step"].tolist()
        assert mine["step_ms"].tolist() == pytest.approx(own["step_ms"].tolist())


def test_the_baseline_rule_is_stated_in_the_table(tidy_sweep):
    proc, sweep_dir = tidy_sweep
    table = read_summary(sweep_dir)
    base = table[table["speedup_verdict"] == "baseline"]
    assert len(base) == 1 and base["grad_accum"].item() == 2  # the fewest accumulation steps
    first_line = (sweep_dir / report.SUMMARY_MD).read_text().splitlines()[0]
    assert first_line.startswith("baseline: ") and "perf.grad_accum=2" in first_line
    assert first_line in proc.stdout
    sweep = report.build_table(sweep_dir)
    assert sweep.baseline == first_line
    assert sweep.unreadable == []


def test_report_rebuilds_with_the_sweeps_settings_and_a_new_baseline_changes_the_numbers(
    tidy_sweep,
):
    _, sweep_dir = tidy_sweep
    built = read_summary(sweep_dir / report.SUMMARY_CSV)
    proc = report_cli(sweep_dir)
    assert proc.returncode == 0, proc.stderr
    again = read_summary(sweep_dir / report.SUMMARY_CSV)
    pd.testing.assert_frame_equal(again, built)
    assert again["usd_per_1m_tokens"].notna().all()  # cost.usd_per_hour from the sweep

    # "4x4" names two points (the betas differ): refused in one line naming them, both whole.
    proc = report_cli(sweep_dir, "--baseline", "4x4")
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "names 2 points (+sweep/accum_split=4x4 optimizer.betas=[0.9,0.95]; " in proc.stderr
    named = "4x4 optimizer.betas=[0.8,0.9]"  # a bare value and a list, typed as Hydra types them
    proc = report_cli(sweep_dir, "--baseline", named)
    assert proc.returncode == 0, proc.stderr
    moved = read_summary(sweep_dir / report.SUMMARY_CSV)
    new_base = moved.index[moved["speedup_verdict"] == "baseline"].item()
    assert "4x4 optimizer.betas=[0.8,0.9]" in moved.loc[new_base, "overrides"]
    # Every speedup is recomputed against the new baseline, intervals and verdicts with it.
    expected = built["speedup"] / built.loc[new_base, "speedup"]
    assert moved["speedup"].tolist() == pytest.approx(expected.tolist())
    assert moved["speedup_ci_low"].tolist() != built["speedup_ci_low"].tolist()
    first_line = (sweep_dir / report.SUMMARY_MD).read_text().splitlines()[0]
    assert first_line.startswith("baseline: ") and f"given: report.baseline='{named}'" in first_line


def test_a_presets_baseline_and_plots_are_kept_by_the_report(attention_sweep):
    proc, sweep_dir = attention_sweep
    built = read_summary(sweep_dir)
    # a swept key that is also a field of what was asked: one column on disk, by its config
    # path; read back, the swept column and the field's flat name both
    stored = pd.read_parquet(sweep_dir / SUMMARY_PARQUET)
    assert "perf.attention" in stored and "attention" not in stored
    assert built["perf.attention"].tolist() == built["attention"].tolist()
    assert sorted(built["attention"]) == sorted(set(built["attention"]))  # one point a value
    base = built.loc[built["speedup_verdict"] == "baseline", "overrides"].item()
    assert "perf.attention=manual" in base
    for png in sweep_dir.glob("*.png"):
        png.unlink()
    again = report_cli(sweep_dir)
    assert again.returncode == 0, again.stderr
    rebuilt = read_summary(sweep_dir)
    assert rebuilt["speedup"].tolist() == pytest.approx(built["speedup"].tolist())
    assert (sweep_dir / "speedup.png").is_file()  # report.plots=true, from the preset
    # `--baseline ''` asks for the rule, which also picks manual; `--no-plots` draws none.
    for png in sweep_dir.glob("*.png"):
        png.unlink()
    rule = report_cli(sweep_dir, "--baseline", "", "--no-plots")
    assert rule.returncode == 0 and "perf.attention=manual (the unfused" in rule.stdout
    assert not list(sweep_dir.glob("*.png"))


def test_saved_settings_come_from_the_sweeps_config_and_a_bad_one_is_one_line(tmp_path):
    from nanogpt.report import saved_settings

    assert saved_settings(tmp_path) == {
        "baseline": None,
        "plots": False,
        "memory_budget_gib": None,
        "usd_per_hour": None,
        "usd_per_kwh": None,
        "ttl_alpha": None,
    }
    job = tmp_path / "0" / ".hydra"
    job.mkdir(parents=True)
    (job / "config.yaml").write_text("report: {baseline: perf.grad_accum=2, plots: true}\n")
    settings = saved_settings(tmp_path)
    assert settings["baseline"] == "perf.grad_accum=2" and settings["plots"] is True
    # multirun.yaml, the sweep's own, comes first.
    (tmp_path / "multirun.yaml").write_text(
        "cost: {usd_per_hour: 2.5}\nreport: {plots: false, ttl_alpha: 0.05}\n"
    )
    settings = saved_settings(tmp_path)
    assert settings["usd_per_hour"] == 2.5 and settings["plots"] is False
    assert settings["ttl_alpha"] == 0.05
    assert settings["baseline"] is None
    (tmp_path / "multirun.yaml").write_text("report: [unclosed\n")
    with pytest.raises(report.ReportError, match="multirun.yaml: cannot be read"):
        saved_settings(tmp_path)
    (tmp_path / "multirun.yaml").write_text("report: [1, 2]\n")  # YAML, but not a config
    with pytest.raises(report.ReportError, match="multirun.yaml: cannot be read"):
        saved_settings(tmp_path)


def test_records_moved_aside_are_not_rows(tmp_path):
    """A record under SWEEP_DIR/moved/ (its job dir went to another point when a resumed sweep
    changed) stays for a later resume, but is no row of the table."""
    from nanogpt.analysis.store import MOVED_DIR, write_record
    from nanogpt.record import Record

    def point(where: Path, batch: int) -> None:
        record = Record(status="ok")
        record.asked.overrides, record.asked.point_id = [f"perf.batch_size={batch}"], f"id{batch}"
        record.asked.compile, record.asked.dtype = False, "fp32"
        record.setup.tokens_per_step, record.setup.world_size = 64, 1
        record.timing.step_ms_median = 10.0
        record.steps = [{"phase": "measure", "step_ms_job": 10.0 + i / 10} for i in range(8)]
        write_record(where, record)

    point(tmp_path / "0", 2)
    point(tmp_path / "1", 4)
    point(tmp_path / MOVED_DIR / "id3", 3)
    table = report.build_table(tmp_path).table
    assert table["point_id"].tolist() == ["id2", "id4"]
