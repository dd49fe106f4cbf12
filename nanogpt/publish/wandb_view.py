"""A ready W&B view of one sweep: saved workspaces, filtered to the sweep's group.

The view is first plain JSON, the *view spec* (`view_spec`): every panel with the keys it reads,
by where W&B keeps them (`summary`: the run summary, i.e. the record's field names namespaced
by part, "rates/tokens_per_s" (record/summary_keys.py);
`history`: the keys logged at each window; `config`: the run config; `table`: a logged
wandb.Table). `write_view` writes it to SWEEP_DIR/wandb_view.json at the end of a multirun,
from the sweep the table was built as (analysis/table.Sweep: no record read again);
`publish` builds wandb-workspaces objects from it (`build_views`) and saves them, which needs an
API key and the network (offline: `wandb sync`, then `python -m nanogpt.dashboard SWEEP_DIR`).
The file holds the spec, not wandb-workspaces' wire form (private, with random panel ids): the
spec is what the tests check against the keys the runs logged.

Two views, named after the sweep:
  sweep DATE/TIME           comparison (bars per point, the sweep table, swept keys -> tokens/s,
                            tokens/s against peak memory), steps (a line per point over the
                            optimizer steps), failures (the points side by side)
  sweep DATE/TIME failures  the points whose status is not ok: failures, then steps

Swept keys are config paths. The run config is the resolved nested config, which W&B keeps nested
({"perf": {"dtype": ...}}) and shows with dots ("perf.dtype"); panels address it as
`Config("perf.dtype")` (config:perf.value.dtype on the wire), so group-by and parallel
coordinates need no flat copy (W&B's advice against dots is about key *names*: none of ours).
A swept key with no config path of its own (+sweep/accum_split) is read from the run config's
`point.overrides`, where every override of the point is kept typed: every swept key is an axis.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from nanogpt.analysis.store import iter_records, sweep_id
from nanogpt.config.spec import LoggerConfig, LoggerMode
from nanogpt.publish.wandb_mode import resolve_mode, warn
from nanogpt.record import swept
from nanogpt.record.faults import describe
from nanogpt.record.files import read_json, write_atomic, write_json
from nanogpt.record.summary_keys import summary_key

if TYPE_CHECKING:
    from nanogpt.analysis.table import Sweep

VIEW_FILE = "wandb_view.json"
URL_FILE = "wandb_view_url.txt"
SPEC_FORMAT = 1
INSTALL_HINT = "pip install -e '.[dashboard]'"
SUMMARY_TABLE = "sweep_table"  # the summary run's wandb.Table (wandb_sink.log_sweep_table)
# An override that picks a config group (model=gpt2) shows in the run config as the field that
# names the choice.
GROUP_CHOICES = {
    "model": "model.name",
    "optimizer": "optimizer.name",
    "data": "data.kind",
    "logger": "logger.backend",
}
# Override keys that are no run-config key: Hydra's own, sweep presets (+sweep=NAME) and nested
# groups (+sweep/accum_split=8x2, which set other keys): the view reads them from point.overrides.
NOT_IN_CONFIG = ("hydra", "sweep")


def swept_keys(points: list[list[str]]) -> list[str]:
    """The W&B config paths of the keys a sweep varies (record/swept.py), in first-seen order.

    A key of the config is its own path (a group choice such as model=gpt2: the field that
    names it, model.name); any other key (a nested preset group such as +sweep/accum_split, a
    preset, Hydra's own keys) is the point's typed override, point.overrides.<key with dots as
    '/'> (publish/wandb_point.py).
    """

    def path(key: str) -> str:
        if "/" in key or key.split(".")[0] in NOT_IN_CONFIG:
            return f"point.overrides.{key.replace('.', '/')}"
        return GROUP_CHOICES.get(key, key)

    return list(dict.fromkeys(path(key) for key in swept.swept_keys(points)))


def view_spec(
    project: str,
    group: str,
    swept: list[str],
    *,
    entity: str | None = None,
    cuda: bool = False,
    points: int = 0,
) -> dict:
    """The views of one sweep as plain JSON (see the module docstring for its keys).

    cuda: the memory per window is the CUDA allocator's too (allocated), not only the
    process's resident memory, which is all a CPU run has. The peak panels show what each
    point needs (peak_memory_bytes: CUDA allocated where measured, else RSS).
    """
    key = summary_key  # the record's fields, namespaced by part in the run summary
    # what the point needs, as every "fits" is judged (analysis/derive.peak_memory): the larger
    # of warmup's and the measured steps' peaks, CUDA allocated, else the process's RSS
    peak_memory = key("peak_memory_bytes")
    tokens_per_s = key("tokens_per_s")
    memory_lines = ["train/mem_rss_bytes"] + (["train/mem_allocated_bytes"] if cuda else [])
    comparison = [
        _panel("bar", "tokens/s", summary=[tokens_per_s]),
        _panel("bar", "MFU", summary=[key("mfu")]),
        _panel("bar", "peak memory (bytes)", summary=[peak_memory]),
        _panel("bar", "energy (J/token)", summary=[key("j_per_token")]),
        _panel("table", "sweep table", table=[SUMMARY_TABLE]),
        _panel("parallel", "swept keys -> tokens/s", config=swept, summary=[tokens_per_s]),
        _panel("scatter", "tokens/s vs peak memory", summary=[peak_memory, tokens_per_s]),
    ]
    steps = [
        _panel("line", "step time (ms)", history=["train/step_ms"]),
        _panel("line", "tokens/s", history=["train/tokens_per_s"]),
        _panel("line", "loss", history=["train/loss"]),
        _panel("line", "memory (bytes)", history=memory_lines),
    ]
    # Every point's config and summary side by side: status and error first of all.
    failures = [_panel("runs", "points side by side")]
    # The runs table beside the panels: each point's status, error, throughput and swept keys.
    status = key("status")
    columns = {"summary": [status, key("error"), tokens_per_s], "config": list(swept)}
    in_group = ["run", "Group", "==", group]
    failed = [in_group, ["run", "JobType", "==", "point"], ["summary", status, "!=", "ok"]]
    main = {"comparison": comparison, "steps": steps, "failures": failures}
    return {
        "format": SPEC_FORMAT,
        "entity": entity,
        "project": project,
        "group": group,
        "swept_keys": list(swept),
        "max_runs": max(10, points + 1),  # every point and the summary run
        "views": [
            _view(f"sweep {group}", [in_group], columns, main),
            _view(
                f"sweep {group} failures", failed, columns, {"failures": failures, "steps": steps}
            ),
        ],
    }


def _panel(kind: str, title: str, **keys: list[str]) -> dict:
    """A panel of the spec: its kind, title, and the keys it reads by source (a scatter's
    summary keys are x, then y)."""
    return {"kind": kind, "title": title, **{source: list(k) for source, k in keys.items()}}


def _view(name: str, filters: list, columns: dict, sections: dict[str, list]) -> dict:
    """A view of the spec: runs matching every filter [source, name, op, value]; sections in
    order, each open."""
    sections_list = [{"name": title, "panels": panels} for title, panels in sections.items()]
    return {"name": name, "filters": filters, "columns": columns, "sections": sections_list}


def write_view(
    sweep_dir: Path,
    project: str,
    entity: str | None = None,
    group: str | None = None,
    sweep: Sweep | None = None,
) -> Path:
    """Write SWEEP_DIR/wandb_view.json (atomically) from the sweep's points; its path. `sweep`:
    the sweep this process built (its points' records); None: the records read from the dir
    (`python -m nanogpt.dashboard`, a process of its own)."""
    if sweep is not None:
        records = sweep.points
    else:
        records = [record for _, record in iter_records(sweep_dir, moved=False) if record]
    spec = view_spec(
        project,
        group or sweep_id(sweep_dir),
        swept_keys([record.get("overrides") or [] for record in records]),
        entity=entity,
        cuda=any(str(record.get("device") or "").startswith("cuda") for record in records),
        points=len(records),
    )
    path = Path(sweep_dir) / VIEW_FILE
    write_json(path, spec)
    return path


def build_views(spec: dict, entity: str) -> list:
    """The spec's views as wandb-workspaces Workspaces (ImportError when it is not installed)."""
    import wandb_workspaces.workspaces as ws

    terms = {"run": ws.Metric, "summary": ws.Summary, "config": ws.Config}
    views = []
    for view in spec["views"]:
        filters = ws.And(
            *(
                terms[source](name) == value if op == "==" else terms[source](name) != value
                for source, name, op, value in view["filters"]
            )
        )
        columns = [f"summary:{key}" for key in view["columns"]["summary"]]
        columns += [config_column(key) for key in view["columns"]["config"]]
        sections = [
            ws.Section(
                name=section["name"],
                panels=[_workspace_panel(panel, spec["max_runs"]) for panel in section["panels"]],
                is_open=True,
            )
            for section in view["sections"]
        ]
        views.append(
            ws.Workspace(
                entity=entity,
                project=spec["project"],
                name=view["name"],
                sections=sections,
                settings=ws.WorkspaceSettings(max_runs=spec["max_runs"]),
                runset_settings=ws.RunsetSettings(filters=filters, pinned_columns=columns),
            )
        )
    return views


def config_column(path: str) -> str:
    """A runs-table column of a nested config key: perf.dtype -> config:perf.value.dtype."""
    top, *rest = path.split(".")
    return ".".join([f"config:{top}", "value", *rest])


def _workspace_panel(panel: dict, max_runs: int):
    """One wandb-workspaces panel from its spec."""
    import wandb_workspaces.reports.v2 as wr

    kind, title = panel["kind"], panel["title"]
    if kind == "bar":
        return wr.BarPlot(title=title, metrics=panel["summary"], max_runs_to_show=max_runs)
    if kind == "table":
        return wr.WeavePanelSummaryTable(table_name=panel["table"][0])
    if kind == "parallel":
        axes = [wr.Config(key) for key in panel["config"]]
        axes += [wr.SummaryMetric(key) for key in panel["summary"]]
        columns = [wr.ParallelCoordinatesPlotColumn(metric=axis) for axis in axes]
        return wr.ParallelCoordinatesPlot(title=title, columns=columns)
    if kind == "scatter":
        x, y = (wr.SummaryMetric(key) for key in panel["summary"])
        return wr.ScatterPlot(title=title, x=x, y=y)
    if kind == "line":
        return wr.LinePlot(title=title, x="Step", y=panel["history"], max_runs_to_show=max_runs)
    if kind == "runs":
        return wr.RunComparer()
    raise ValueError(f"unknown panel kind {kind!r} in the W&B view spec")


def publish(
    sweep_dir: Path, mode: LoggerMode = LoggerMode.auto, unreachable: str | None = None
) -> str | None:
    """Save the sweep's views to W&B; the main view's URL (also in SWEEP_DIR/wandb_view_url.txt),
    or None after one warning line saying why not. The view file is never touched.
    `unreachable` says why W&B's server was out of reach moments ago (the sweep's summary run
    could not go online): the view is not tried, which would only wait on the same server."""
    path = Path(sweep_dir) / VIEW_FILE
    later = f"`python -m nanogpt.dashboard {sweep_dir}` publishes it"
    spec = read_json(path)
    if not isinstance(spec, dict) or spec.get("format") != SPEC_FORMAT:
        _warn_view(f"{path} is missing or is no view file; {later} (and writes it first)")
        return None
    resolved, reason = resolve_mode(mode)
    if unreachable and resolved == "online":
        resolved, reason = "offline", f"the sweep's summary run: {unreachable}"
    if resolved != "online":
        why = reason or f"logger.mode={resolved}"
        _warn_view(
            f"not published ({why}); it is saved in {path}: once the runs are synced "
            f"(`wandb sync`), with an API key, {later}"
        )
        return None
    try:
        import wandb_workspaces  # noqa: F401
    except ImportError:
        _warn_view(
            f"wandb-workspaces is not installed, so {path} is not published; "
            f"`{INSTALL_HINT}`, then {later}"
        )
        return None
    try:
        import wandb

        entity = spec["entity"] or wandb.Api().default_entity
        urls = [view.save().url for view in build_views(spec, entity)]
    except Exception as exc:  # no network, a refused key, a W&B error: the file stays
        _warn_view(f"saving the view failed ({describe(exc)}); it stays in {path}, {later}")
        return None
    write_atomic(Path(sweep_dir) / URL_FILE, "\n".join(urls) + "\n")
    print(f"W&B view: {urls[0]} (failures: {urls[1]})")
    return urls[0]


def save_and_publish(
    logger: LoggerConfig, sweep_dir: Path, sweep: Sweep, unreachable: str | None = None
) -> str | None:
    """At the end of a multirun with W&B on: write the view file from the sweep's table, then
    publish it (not tried where the summary run found the server `unreachable`)."""
    if logger.backend != "wandb" or resolve_mode(logger.mode)[0] == "disabled":
        return None
    write_view(sweep_dir, logger.project, entity=logger.entity, group=logger.group, sweep=sweep)
    return publish(sweep_dir, logger.mode, unreachable)


def _warn_view(message: str) -> None:
    warn(message, about="W&B view")
