"""A point's identity: what it measures, not how it was asked for.

Two runs measure the same point when their resolved specs agree on every key that can change a
figure of the record: the model, the optimizer, perf, data, bench, dist, the ceilings MFU is
divided by (hardware) and how often the loop reads the device (logger.log_interval: a sync per
window). Keys that only say where the figures go or how they are shown never make a point
another one, so a resume with one more of them skips the points already recorded ok:

  logger.* (but log_interval)   where the figures go (W&B or none, online or offline)
  report.*, cost.*              how the table is built, priced and plotted
  hydra.*                       where the files go, the launcher (not part of the spec at all)
  bench.rerun                   whether to measure again, not what
  bench.exclusive               what to do when another process shared the device, not what
  data.cache_dir                where the tokenized text is cached
  model.chosen_by               model=auto's explanation, not a setting
  model.code_dir                where model.build's and optimizer.build's modules were found
                                (their source is in: model.build_source and
                                optimizer.build_source, the sha256 of each target's file)

`hardware` stays in: a record's mfu and mfu_achievable are divided by the peak and the
calibration resolved when it was measured, and resolving them again for a kept record would
take the calibration cache (or a calibration) in the job process, which must not touch CUDA
before a fork (runner/forkserver.py). `hardware.recalibrate` counts as `hardware.calibrate`.
`bench.repeats` is out: it says how many runs the point has, not what one run measures, so a
resume with more runs keeps the ok ones and measures the rest. A record written while it was in
(one pooled result.json a point) is found by `legacy_point_id_of`.

Whether a key is in is said on its field in config/groups.py (`key(..., point=NOT_A_POINT)`, or
`point=LATER` for a key added after sweeps were recorded: in only when set off its default).

The resolved keys are recorded in result.json as `measured_config`, their digest as `point_id`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json

from nanogpt import optimizers
from nanogpt.config.choices import AC_KEYS
from nanogpt.config.groups import LATER, NOT_A_POINT, POINT
from nanogpt.config.spec import RunSpec, spec_to_dict
from nanogpt.config.target_nodes import source_digest

MEASURED_GROUPS = ("model", "optimizer", "perf", "data", "bench", "dist", "hardware")
ALSO_MEASURED = {"logger": ("log_interval",)}


def keys_marked(group: str, point: str) -> tuple[str, ...]:
    """The keys of a config group whose field says `point` (config/groups.py: NOT_A_POINT, a key
    that never changes a figure; LATER, one added after sweeps were recorded)."""
    fields = dataclasses.fields(getattr(RunSpec(), group))
    return tuple(f.name for f in fields if f.metadata.get(POINT) == point)


def measured_config(spec: RunSpec) -> dict:
    """The resolved keys that make up the point: every key that can change a figure."""
    plain = spec_to_dict(spec)
    measured = {}
    for group in MEASURED_GROUPS:
        skip = keys_marked(group, NOT_A_POINT)
        measured[group] = {k: v for k, v in plain[group].items() if k not in skip}
    for group, keys in ALSO_MEASURED.items():
        measured[group] = {k: plain[group][k] for k in keys}
    measured["hardware"]["calibrate"] = spec.hardware.calibrate or spec.hardware.recalibrate
    # a key added later is left out while at its default: a point measured before it keeps
    # its point_id (and a resume finds it)
    defaults = spec_to_dict(RunSpec())
    for group in MEASURED_GROUPS:
        for key in keys_marked(group, LATER):
            if measured[group].get(key) == defaults[group][key]:
                del measured[group][key]
    # perf.ac=full is what the old switch perf.activation_checkpointing=true said, which mirrors
    # it (train/checkpoint_rules.normalized): the switch alone names the point, as before perf.ac
    perf = measured["perf"]
    if perf.get("ac") == "full" and perf.get("activation_checkpointing"):
        del perf["ac"]
    for key, policy in AC_KEYS.items():  # a policy's own key, under another policy: unread
        if spec.perf.ac is not policy:
            perf.pop(key, None)
    # optimizer.* keys the optimizer never receives (from_model's method gets its args alone)
    recipe = optimizers.registry().get(spec.optimizer.name)
    for key in recipe.unused_keys if recipe else ():
        measured["optimizer"].pop(key, None)
    # A user's model or optimizer is its code too: a changed source file is another point.
    for group, build in (("model", spec.model.build), ("optimizer", spec.optimizer.build)):
        if (build or {}).get("_target_"):
            target = str(build["_target_"])
            measured[group]["build_source"] = source_digest(target, spec.model.code_dir)
    return measured


def point_id(measured: dict) -> str:
    """A short digest of the measured config: equal exactly when the configs are."""
    text = json.dumps(measured, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def point_id_of(spec: RunSpec) -> str:
    return point_id(measured_config(spec))


def legacy_point_id_of(spec: RunSpec) -> str:
    """The point_id a pooled record written before runs were jobs has: bench.repeats in."""
    measured = measured_config(spec)
    measured["bench"]["repeats"] = spec.bench.repeats
    return point_id(measured)
