"""Time to loss is a scenario (issue 46 item 2): its code sits in nanogpt/scenarios/time_to_loss/,
and no module outside nanogpt/scenarios/ reads `target_loss` or a time-to-loss field. Everyone
else asks the picker (scenarios/base.py: of_spec, of_record, of_objective, ALL) and a face's
hooks (checks, part, pool, run, guard, plot), so "is there a target loss" is answered in one
folder.

Read from the source's syntax tree, not its text: a comment or a docstring naming the key is
fine; an import, an attribute, a name, an argument or a string naming it is a read. Declaring a
field is not (`target_loss: float | None = ...` in a class body: the spec's key in
config/groups.py, the Record's part in record/__init__.py)."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from nanogpt.record import TimeToLoss  # the part, through the record that composes it
from nanogpt.scenarios import base

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = (ROOT / "nanogpt", ROOT / "hydra_plugins")
SCENARIOS = ROOT / "nanogpt" / "scenarios"
FOLDER = "nanogpt.scenarios.time_to_loss"
KEY = "target_loss"  # bench.target_loss, as an attribute, a name or an argument
PART = "time_to_loss"  # the Record's part, as an attribute (record.time_to_loss)
# A time-to-loss field: the part's own (read from its dataclass), and the columns its comparison
# adds to the sweep's table (read from its part face: ttl_ratio, ttl_p_value, ttl_verdict)
FIELDS = frozenset(f.name for f in dataclasses.fields(TimeToLoss)) | frozenset(
    base.TIME_TO_LOSS.part.COMPARED
)
# The key as a string: a config path (OmegaConf.select) or an override ("bench.target_loss=2");
# an error message naming it mid-sentence as the fix is prose, not a read
OVERRIDE = re.compile(r"bench\.target_loss(=.*)?", re.DOTALL)
# The reads that are the scenario's definition, not a use: (file, what) -> why
ALLOWED = {
    ("nanogpt/record/__init__.py", f"import {FOLDER}.part"): (
        "the Record composes its parts: TimeToLoss is one (the record's recipe)"
    ),
}


def reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Each (line, what) of `tree` that imports the folder, or reads the key, the part or a
    time-to-loss field."""
    skipped = set()  # the nodes that are no read
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):  # a field declared: `target_loss: float | None = None`
            skipped |= {id(s.target) for s in node.body if isinstance(s, ast.AnnAssign)}
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skipped.add(id(node.value))  # a docstring (or any bare string statement)
    found = []
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, f"import {a.name}")
                for a in node.names
                if a.name == FOLDER or a.name.startswith(f"{FOLDER}.")
            ]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names]
            if node.module == FOLDER or node.module.startswith(f"{FOLDER}."):
                found.append((node.lineno, f"import {node.module}"))
            elif any(n == FOLDER for n in names):  # from nanogpt.scenarios import time_to_loss
                found.append((node.lineno, f"import {FOLDER}"))
        elif isinstance(node, ast.Attribute) and node.attr in {KEY, PART} | FIELDS:
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Name) and node.id in {KEY} | FIELDS:
            found.append((node.lineno, node.id))
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg in {KEY} | FIELDS:
            found.append((node.lineno, f"{node.arg}="))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            if node.value in FIELDS or OVERRIDE.fullmatch(node.value):
                found.append((node.lineno, repr(node.value)))
    return found


def _modules():
    for package in PACKAGES:
        for path in sorted(package.rglob("*.py")):
            if SCENARIOS not in path.parents:
                yield path.relative_to(ROOT).as_posix(), path


def test_no_module_outside_the_scenarios_reads_the_target_or_a_time_to_loss_field():
    found = [
        f"{name}:{line}: {what}"
        for name, path in _modules()
        for line, what in reads(ast.parse(path.read_text(encoding="utf-8")))
        if (name, what) not in ALLOWED
    ]
    assert not found, "ask the scenario (nanogpt/scenarios/base.py) instead:\n" + "\n".join(found)


def test_every_allowed_read_is_still_there():
    """An exception the code no longer needs is taken off the list, not kept as a hole."""
    present = {
        (name, what)
        for name, path in _modules()
        for _, what in reads(ast.parse(path.read_text(encoding="utf-8")))
    }
    assert set(ALLOWED) <= present


def test_the_check_finds_each_kind_of_read():
    """The test above can fail: each kind of read, and a declaration, a docstring and a message
    that are none."""
    source = '''
"""A docstring naming bench.target_loss and ttl_note."""
import nanogpt.scenarios.time_to_loss.guard
from nanogpt.scenarios import time_to_loss
from nanogpt.scenarios.time_to_loss.part import interval
class Bench:
    target_loss: float | None = None
def f(spec, record, row, target_loss=None):
    """bench.target_loss"""
    a = spec.bench.target_loss
    b = record.time_to_loss
    c = row["ttl_note"], row.get("time_to_loss_s"), row["ttl_verdict"], part.ttl_evals
    d = select(config, "bench.target_loss"), ["bench.target_loss=2.5"]
    e = ConfigError("data.path", "no split", "or unset bench.target_loss")
    return g(target_loss=target_loss)
'''
    found = sorted(what for _, what in reads(ast.parse(source)))
    assert found == sorted(
        [f"import {FOLDER}.guard", f"import {FOLDER}", f"import {FOLDER}.part"]
        + [".target_loss", ".time_to_loss", ".ttl_evals"]
        + ["'ttl_note'", "'time_to_loss_s'", "'ttl_verdict'"]
        + ["'bench.target_loss'", "'bench.target_loss=2.5'"]
        + ["target_loss=", "target_loss=", "target_loss"]
    )


def test_time_to_loss_sits_in_one_folder():
    """No module of the package outside the folder is named for it (the old paths are gone)."""
    named = [
        name
        for name, path in _modules()
        if re.search(r"(^|_)(time_to_loss|target_loss|loss_plot|ttl)(_|$)", path.stem)
    ]
    assert not named
