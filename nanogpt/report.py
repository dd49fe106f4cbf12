"""Entry point: `python -m nanogpt.report DIR [--baseline TEXT] [--plots]`, and
`python -m nanogpt.report NEW --compare OLD [--fail-if-slower PCT] [--markdown]`.

(Re)builds the table of any sweep dir, finished or not: summary.csv, summary.parquet,
steps.parquet and summary.md in DIR (analysis/table.py), printed, and the plots with --plots
(publish/plots.py).
Its settings (report.baseline, report.plots, report.memory_budget_gib, cost.*) default to the
ones the sweep ran with, which Hydra saved in DIR/multirun.yaml (else a job's .hydra/config.yaml);
a flag given here wins (`--baseline ''`: the baseline rule, whatever the sweep was given).

With --compare, sets the sweep against an earlier one, point by point (analysis/compare.py):
tokens/s old and new, the change with its 95 % interval and a verdict ("~": not significant).
--fail-if-slower PCT exits 1 when any point is significantly slower by more than PCT %: a
performance gate for a training repository's CI. Its verdict rests on the noise between
processes: a point either sweep measured in one process only (bench.repeats < 2) gives no verdict
(exit 5, naming the fix).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pandas as pd
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from nanogpt import logs
from nanogpt.analysis import compare, sweep_lock, versions
from nanogpt.analysis.display import to_markdown
from nanogpt.analysis.labels import point_labels
from nanogpt.analysis.table import ReportError, build_table
from nanogpt.publish import sweep_outputs as publish

# The saved config's keys this entry point takes its defaults from, (section, key) -> its
# flag: the settings every entry point publishes a table with (publish/sweep_outputs.py)
SETTINGS = publish.SETTINGS
SAVED_CONFIGS = (
    "multirun.yaml",
    ".hydra/config.yaml",
    "*/run-*/.hydra/config.yaml",  # a run's (POINT/run-R)
    "*/.hydra/config.yaml",  # a point's, in a sweep written before runs were jobs
)

# Sweep against sweep, each point's interval must cover the noise between processes: on the 2-core
# VM, the same point in two single-repeat sweeps differed by up to 21 % (benchmarks/
# compare_significance.py), which one process's steps cannot show.
MIN_REPEATS = 3
GATE_REPEATS = 2  # --fail-if-slower gives a verdict only on points measured in 2+ processes
NO_VERDICT_EXIT = 5  # --fail-if-slower could not judge: neither passed (0) nor failed (1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nanogpt.report", description=__doc__)
    parser.add_argument("sweep_dir", type=Path, help="a sweep dir, e.g. multirun/DATE/TIME")
    parser.add_argument(
        "--baseline",
        help="text of the overrides of the speedup baseline row ('': the baseline rule); "
        "default: the sweep's report.baseline",
    )
    parser.add_argument(
        "--plots",
        action=argparse.BooleanOptionalAction,
        help="also write PNG plots (default: the sweep's report.plots)",
    )
    parser.add_argument("--memory-budget-gib", type=float, help="recommend the fastest that fits")
    parser.add_argument(
        "--ttl-alpha", type=float, help="time to loss: 'faster to target' below this p-value"
    )
    parser.add_argument("--usd-per-hour", type=float, help="the machine's price: $ per 1M tokens")
    parser.add_argument("--usd-per-kwh", type=float, help="energy's price, where energy is known")
    parser.add_argument("--compare", type=Path, metavar="OLD", help="an earlier sweep dir")
    parser.add_argument(
        "--fail-if-slower",
        type=float,
        metavar="PCT",
        help="with --compare: exit 1 when a point is significantly slower by more than PCT %%",
    )
    parser.add_argument("--markdown", action="store_true", help="with --compare: a markdown table")
    args = parser.parse_args(argv)
    logs.console()
    for name, path in (("sweep_dir", args.sweep_dir), ("--compare", args.compare)):
        if path is not None and not path.is_dir():
            print(
                f"error: {name}: {path} is not a directory; give a sweep dir "
                "such as multirun/DATE/TIME.",
                file=sys.stderr,
            )
            return 2
    if args.fail_if_slower is not None and (args.compare is None or args.fail_if_slower < 0):
        print("error: --fail-if-slower: needs --compare OLD and PCT >= 0.", file=sys.stderr)
        return 2
    try:
        if args.compare is None:
            settings = saved_settings(args.sweep_dir)
            given = {flag: getattr(args, flag) for flag in SETTINGS.values()}
            settings.update({k: v for k, v in given.items() if v is not None})
            publish.publish(args.sweep_dir, settings)  # as the multirun's end publishes it
            writer = sweep_lock.holder(args.sweep_dir)  # read without the lock: a table so far
            if writer:
                print(
                    f"note: a sweep is still writing {args.sweep_dir} ({writer}): this table "
                    "is of the records written so far; the sweep writes its own at its end",
                    file=sys.stderr,
                )
            return 0
        return _compare(args.compare, args.sweep_dir, args.fail_if_slower, args.markdown)
    except ReportError as err:
        print(f"error: {err}.", file=sys.stderr)
        return 2


def saved_settings(sweep_dir: Path) -> dict:
    """The report settings a sweep ran with, as plain values by publish's argument names:
    from DIR/multirun.yaml, else the first job's .hydra/config.yaml; None where neither says
    (plots: False). Raises ReportError for a saved config that cannot be read."""
    settings = dict.fromkeys(SETTINGS.values())
    settings["plots"] = False
    path = next((p for pattern in SAVED_CONFIGS for p in sorted(sweep_dir.glob(pattern))), None)
    if path is None:
        return settings
    try:
        saved = OmegaConf.load(path)
        for (section, key), name in SETTINGS.items():
            value = OmegaConf.select(saved, f"{section}.{key}", default=None)
            settings[name] = settings[name] if value is None else value
    except (OSError, ValueError, yaml.YAMLError, OmegaConfBaseException) as err:
        raise ReportError(
            f"{path}: cannot be read ({str(err).splitlines()[0]}); give the settings as flags "
            "or remove the file"
        ) from None
    return settings


def _compare(old_dir: Path, new_dir: Path, fail_pct: float | None, markdown: bool) -> int:
    old_sweep, new_sweep = build_table(old_dir), build_table(new_dir)
    old, new = old_sweep.table, new_sweep.table
    comparison = compare.compare_sweeps(old, old_sweep.series(), new, new_sweep.series())
    shown = comparison.copy()
    labels = point_labels(comparison.rename(columns={"point": "overrides"}))
    shown["point"] = [label or "defaults" for label in labels]  # what differs between points
    print(
        to_markdown(shown)
        if markdown
        else shown.to_string(index=False, float_format="{:.4g}".format)
    )
    print(f"old: {old_dir}  new: {new_dir}  (~: the change is not significant, p >= 0.05)")
    differ = versions.difference(old_sweep.points, new_sweep.points)
    if differ:
        print(differ)
    if (pd.concat([old["repeats"], new["repeats"]]).fillna(1) < MIN_REPEATS).any():
        print(
            f"note: points measured once have intervals of one process's noise only; between "
            f"sweeps, processes differ more: measure both with bench.repeats={MIN_REPEATS} or "
            "more before trusting a verdict",
            file=sys.stderr,
        )
    if fail_pct is None:
        return 0
    if comparison["only_in"].notna().all():
        # Nothing joined: a gate that compared nothing must not pass.
        print(
            "error: --fail-if-slower: no verdict: no point is in both sweeps (points join by "
            "point_id, every measured key: record/identity.py, bench.repeats included); "
            "measure both sweeps with the same settings.",
            file=sys.stderr,
        )
        return NO_VERDICT_EXIT
    once = _measured_once(comparison, old, new)
    if once:
        # One process's interval misses the noise between processes (an A/A comparison of two
        # identical sweeps measured once read a point 25 % slower, "significant"): no verdict.
        print(
            f"error: --fail-if-slower: no verdict: {len(once)} compared point(s) were measured "
            f"in fewer than {GATE_REPEATS} processes (e.g. {once[0]}); rerun both sweeps with "
            f"bench.repeats={MIN_REPEATS} so the verdict rests on the noise between processes.",
            file=sys.stderr,
        )
        return NO_VERDICT_EXIT
    slower = compare.significantly_slower(shown, fail_pct)
    for row in slower.itertuples():
        print(
            f"slower: {row.point}: {row.change_pct:+.1f} % "
            f"[{row.change_ci_low:+.1f}, {row.change_ci_high:+.1f}]",
            file=sys.stderr,
        )
    return 1 if len(slower) else 0


def _measured_once(comparison: pd.DataFrame, old: pd.DataFrame, new: pd.DataFrame) -> list[str]:
    """The compared points (in both sweeps, joined as compare_sweeps joins them) that either
    sweep measured in fewer than GATE_REPEATS processes, named by their overrides."""
    counts: dict[str, int] = {}
    for table in (old, new):
        for key, repeats in zip(compare.point_keys(table), table["repeats"], strict=True):
            n = 1 if pd.isna(repeats) else int(repeats)
            counts[key] = min(counts.get(key, n), n)
    both = comparison[comparison["only_in"].isna()]
    return [
        point
        for key, point in zip(both["point_id"], both["point"], strict=True)
        if counts.get(key, 1) < GATE_REPEATS
    ]


if __name__ == "__main__":
    sys.exit(main())
