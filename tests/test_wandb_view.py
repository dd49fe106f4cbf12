"""The sweep's W&B view (nanogpt/publish/wandb_view.py), without network.

The view spec names every key a panel reads; a real offline multirun is read back from its run
files (tests/wandb_reader.py) and every one of those keys must be among the keys the runs
logged, so that a renamed metric breaks a test here rather than a chart on W&B. The workspaces
built from the spec are checked to read exactly the spec's keys. Publishing needs a key and the
network: here it is refused offline, and without wandb-workspaces, in real processes.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nanogpt.dashboard import main as dashboard_main
from nanogpt.publish import wandb_view
from nanogpt.publish.wandb_view import VIEW_FILE, swept_keys, view_spec, write_view
from nanogpt.record.summary_keys import summary_key
from tests.conftest import run_without_a_key
from tests.wandb_reader import OfflineRun, read_run, run_file

# Two swept keys: a config path, and a nested preset group with no config path of its own.
SWEPT = [
    "perf.batch_size=1,2",
    "+sweep/accum_split=8x2,4x4",
    "logger=wandb",
    "logger.mode=offline",
    "bench.isolate=false",
]
SPLIT = "point.overrides.sweep/accum_split"
# Runs the entry point with wandb-workspaces made unimportable, as when it is not installed.
WITHOUT_WORKSPACES = (
    "import sys; sys.modules['wandb_workspaces'] = None; "
    "from nanogpt.dashboard import main; sys.exit(main())"
)
FAKE_KEY = {"WANDB_API_KEY": "k" * 40}  # `auto` goes online; nothing is sent before the import
# wandb-workspaces 0.4 still declares pydantic-v1-style validators: its warnings, not ours.
pytestmark = pytest.mark.filterwarnings("ignore::pydantic.warnings.PydanticDeprecatedSince20")


def run_dashboard(args: list[str], cwd: Path, env: dict | None = None, code: str | None = None):
    return run_without_a_key("nanogpt.dashboard", args, cwd, env, code)


def panels(view: dict) -> list[dict]:
    return [panel for section in view["sections"] for panel in section["panels"]]


def keys_of(spec: dict, source: str) -> set[str]:
    """Every key of one source (summary, history, config, table) that the spec's views read:
    panels, runs-table columns and filters."""
    keys = set()
    for view in spec["views"]:
        keys.update(*(panel.get(source, []) for panel in panels(view)))
        keys.update(view["columns"].get(source, []))
        keys.update(name for where, name, _, _ in view["filters"] if where == source)
    return keys


def config_value(config: dict, path: str):
    """A nested config key as W&B shows it (perf.batch_size), read from the nested run config."""
    value = config
    for part in path.split("."):
        assert isinstance(value, dict) and part in value, f"{path} is not in the run config"
        value = value[part]
    return value


def offline_runs(directory: Path) -> list[OfflineRun]:
    return [read_run(run_file(d)) for d in sorted(directory.glob("wandb/offline-run-*"))]


# --- fast: the spec and the workspaces built from it --------------------------------------


def test_swept_keys_are_the_config_paths_that_vary_and_none_is_left_out():
    points = [
        ["perf.dtype=fp32", "model=gpt2", "+sweep=compile_dtype", "perf.compile=true"],
        ["perf.dtype=bf16", "model=nano", "+sweep=compile_dtype", "perf.compile=true"],
    ]
    assert swept_keys(points) == ["perf.dtype", "model.name"]
    assert swept_keys([["bench.seed=1"], ["bench.seed=1", "perf.grad_accum=2"]]) == [
        "perf.grad_accum"  # set in one point only: it differs from the other's default
    ]
    # One point: every key it sets. Hydra's keys and nested preset groups have no config path:
    # the run config's point.overrides holds them (dots as '/'); a deleted key is in no config.
    one = [["optimizer=sgd", "+sweep/accum_split=8x2", "hydra.launcher.timeout_min=5", "~x.y"]]
    assert swept_keys(one) == [
        "optimizer.name",
        SPLIT,
        "point.overrides.hydra/launcher/timeout_min",
    ]
    assert swept_keys([]) == []


@pytest.mark.parametrize("cuda", [False, True])
def test_memory_panels_follow_the_device(cuda):
    spec = view_spec("p", "2026-01-01/10-00-00", ["perf.dtype"], cuda=cuda, points=3)
    assert json.loads(json.dumps(spec)) == spec  # plain JSON, no objects
    memory = {"train/mem_rss_bytes"} | ({"train/mem_allocated_bytes"} if cuda else set())
    assert keys_of(spec, "history") == {
        "train/step_ms",
        "train/tokens_per_s",
        "train/loss",
        *memory,
    }
    # the peak every "fits" is judged on (analysis/derive.peak_memory), whatever the device
    wanted = {"tokens_per_s", "mfu", "j_per_token", "peak_memory_bytes", "status"}
    assert {summary_key(name) for name in wanted} <= keys_of(spec, "summary")
    main, failures = spec["views"]
    assert [s["name"] for s in main["sections"]] == ["comparison", "steps", "failures"]
    assert main["name"] == "sweep 2026-01-01/10-00-00" and spec["max_runs"] == 10
    assert ["summary", "point/status", "!=", "ok"] in failures["filters"]


def workspace_keys(panel) -> dict[str, list[str]]:
    """The keys a wandb-workspaces panel reads, by source, from its public attributes."""
    import wandb_workspaces.reports.v2 as wr

    if isinstance(panel, wr.BarPlot):
        return {"summary": list(panel.metrics)}
    if isinstance(panel, wr.LinePlot):
        return {"history": list(panel.y)}
    if isinstance(panel, wr.ScatterPlot):
        return {"summary": [panel.x.name, panel.y.name]}
    if isinstance(panel, wr.WeavePanelSummaryTable):
        return {"table": [panel.table_name]}
    if isinstance(panel, wr.ParallelCoordinatesPlot):
        axes = [column.metric for column in panel.columns]
        return {
            "config": [a.name for a in axes if isinstance(a, wr.Config)],
            "summary": [a.name for a in axes if isinstance(a, wr.SummaryMetric)],
        }
    assert isinstance(panel, wr.RunComparer)
    return {}


def test_the_workspaces_read_exactly_the_spec_keys():
    pytest.importorskip("wandb_workspaces")
    group = "2026-01-01/10-00-00"
    spec = view_spec("proj", group, ["perf.batch_size", "model.name"], points=12)
    workspaces = wandb_view.build_views(spec, entity="someone")
    assert [w.name for w in workspaces] == [view["name"] for view in spec["views"]]
    for workspace, view in zip(workspaces, spec["views"], strict=True):
        assert (workspace.entity, workspace.project) == ("someone", "proj")
        assert [s.name for s in workspace.sections] == [s["name"] for s in view["sections"]]
        built = [workspace_keys(p) for s in workspace.sections for p in s.panels]
        wanted = [{k: v for k, v in p.items() if k not in ("kind", "title")} for p in panels(view)]
        assert built == wanted
        assert workspace.settings.max_runs == 13  # 12 points and the summary run
        runset = workspace.runset_settings
        assert f"Metric(\"Group\") == '{group}'" in runset.filters
        assert {"summary:point/status", "config:perf.value.batch_size"} <= set(
            runset.pinned_columns
        )
    assert "SummaryMetric(\"point/status\") != 'ok'" in workspaces[1].runset_settings.filters


def test_bad_sweep_dirs_are_one_line_errors(tmp_path, capsys):
    assert dashboard_main([str(tmp_path / "nosuch")]) == 2
    assert dashboard_main([str(tmp_path)]) == 2  # no view file, no records to write one from
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: sweep_dir: ") for line in lines)
    assert not (tmp_path / VIEW_FILE).exists()


# --- slow: a real offline multirun, read back -----------------------------------------------


def test_every_panel_key_is_a_key_the_runs_logged(sweep):
    proc, sweep_dir = sweep(*SWEPT)
    assert proc.returncode == 0, proc.stderr
    spec = json.loads(write_view(sweep_dir, "nanogpt-sweep").read_text())
    assert spec["swept_keys"] == ["perf.batch_size", SPLIT]

    jobs = [sweep_dir / job / "run-1" for job in ("0", "1", "2", "3")]  # a point's run: POINT/run-R
    points = [run for job in jobs for run in offline_runs(job)]
    (summary_run,) = offline_runs(sweep_dir)
    assert len(points) == 4 and summary_run.job_type == "sweep-summary"
    for run in [*points, summary_run]:  # the view's group filter keeps every run of the sweep
        assert run.group == spec["group"]
    for run in points:
        assert run.job_type == "point" and run.summary["point/status"] == "ok"
        logged = set().union(*(row.keys() for row in run.history))
        assert keys_of(spec, "history") <= logged, keys_of(spec, "history") - logged
        assert keys_of(spec, "summary") <= run.summary.keys()
        # Config paths as W&B shows them: nested keys joined with dots, no dot in any name.
        assert not [key for key in run.config if "." in key]
        for path in [*keys_of(spec, "config"), *wandb_view.GROUP_CHOICES.values()]:
            config_value(run.config, path)
    assert {config_value(run.config, "perf.batch_size") for run in points} == {1, 2}
    assert {config_value(run.config, SPLIT) for run in points} == {"8x2", "4x4"}
    (table,) = keys_of(spec, "table")
    (logged_table,) = summary_run.history
    assert logged_table[f"{table}._type"] == "table-file"

    # Offline, the entry point publishes nothing, says why in one line and keeps the file.
    saved = (sweep_dir / VIEW_FILE).read_bytes()
    offline = run_dashboard([str(sweep_dir)], sweep_dir.parent, env={"WANDB_MODE": "offline"})
    assert offline.returncode == 1, offline.stderr
    (line,) = offline.stderr.splitlines()
    assert line.startswith("warning: W&B view: not published (WANDB_MODE=offline)")
    assert (sweep_dir / VIEW_FILE).read_bytes() == saved
    assert not (sweep_dir / wandb_view.URL_FILE).exists()
    # --project rewrites the view from the records before trying.
    rewrite = run_dashboard([str(sweep_dir), "--project", "other"], sweep_dir.parent)
    assert rewrite.returncode == 1 and "written to" in rewrite.stdout
    assert json.loads((sweep_dir / VIEW_FILE).read_text())["project"] == "other"


@pytest.mark.slow
def test_without_a_key_the_view_waits_offline(tmp_path):
    path = write_view(tmp_path, "nanogpt-sweep")
    proc = run_dashboard([str(tmp_path)], tmp_path)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert "not published (no API key (WANDB_API_KEY or ~/.netrc))" in line
    assert f"python -m nanogpt.dashboard {tmp_path}" in line and path.is_file()


@pytest.mark.slow
def test_without_wandb_workspaces_one_line_says_how_to_install_it(tmp_path):
    write_view(tmp_path, "nanogpt-sweep")
    proc = run_dashboard([str(tmp_path)], tmp_path, env=FAKE_KEY, code=WITHOUT_WORKSPACES)
    assert proc.returncode == 1, proc.stderr
    (line,) = proc.stderr.splitlines()
    assert line.startswith("warning: W&B view: wandb-workspaces is not installed")
    assert "pip install -e '.[dashboard]'" in line and "Traceback" not in proc.stderr
