"""What ties a point's W&B runs together: its repeats, and the runs a re-measure supersedes.

Every run of a point carries the `point` section in its config (`point_config`): the point's
id (its record's `point_id`, what it measures: record/identity.py; the same id is a column of
summary.csv and the join of `report --compare`), which repeat of how many the run is,
its overrides typed (record/swept.py) under keys without dots, and the ids of the runs it
supersedes. Earlier runs are found in the point's own dir (`earlier_runs`: JOB_DIR/wandb holds
every run of the point, online or offline) before it is measured again. Offline, a run file
cannot be changed once written, so the new run's `point.supersedes` is the mark; online, the
earlier runs W&B knows are also tagged `superseded` (`tag_superseded`).
"""

from __future__ import annotations

import re
from pathlib import Path

from nanogpt.publish.wandb_mode import warn
from nanogpt.record.faults import describe
from nanogpt.record.swept import point_values

SUPERSEDED_TAG = "superseded"
RUN_DIR = re.compile(r"(?:offline-)?run-\d{8}_\d{6}-(?P<id>[a-z0-9]+)$")


def point_config(
    point_id: str, overrides: list[str], repeat: str | None, supersedes: list[str]
) -> dict:
    """The run config's `point` section: what ties a point's runs together (repeats, resumes)
    and every override typed, keyed without dots (W&B shows nested keys joined by dots)."""
    number, _, count = (repeat or "1/1").partition("/")
    return {
        "id": point_id,
        "repeat": int(number),
        "repeats": int(count),
        "overrides": {
            key.replace(".", "/"): value for key, value in point_values(list(overrides)).items()
        },
        "supersedes": list(supersedes),
    }


def earlier_runs(run_dir: Path) -> list[str]:
    """The ids of the W&B runs already in run_dir/wandb (online or offline), oldest first."""
    found = []
    for path in sorted(Path(run_dir, "wandb").glob("*run-*")):
        match = RUN_DIR.match(path.name)
        if match and path.is_dir() and not path.is_symlink():
            found.append(match["id"])
    return list(dict.fromkeys(found))


def tag_superseded(run, run_ids: list[str], timeout_s: float) -> None:
    """Online: tag the earlier runs of this point `superseded` (those W&B knows)."""
    import wandb

    try:
        api = wandb.Api(timeout=timeout_s)
        for run_id in run_ids:
            old = api.run(f"{run.entity}/{run.project}/{run_id}")
            if SUPERSEDED_TAG not in old.tags:
                old.tags = [*old.tags, SUPERSEDED_TAG]
                old.update()
    except Exception as exc:  # an unsynced offline run, no network: the config still says
        warn(f"tagging superseded runs failed ({describe(exc)}); point.supersedes lists them")
