"""Time to loss is a scenario (issue 46 item 2): its code sits in nanogpt/scenarios/time_to_loss/,
and no module outside nanogpt/scenarios/ reads `target_loss` or a time-to-loss field. Everyone
else asks the scenario's own functions (checks.asked, part.measured, part.console_line, pool,
guard, plot), so "is there a target loss" is answered in one folder.

Read from the source's syntax tree, not its text: a comment or a docstring naming the key is
fine; an attribute, a name, an argument or a string naming it is a read. Declaring the key is
not (the spec's field in config/groups.py, the Record's part in record/__init__.py)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "nanogpt"
SCENARIOS = PACKAGE / "scenarios"
KEY = "target_loss"  # bench.target_loss, as an attribute, a name or an argument
PART = "time_to_loss"  # the record's part, as an attribute
FIELD = re.compile(r"ttl_\w+|time_to_loss_s")  # its fields and the table's comparison columns
SETTING = "ttl_alpha"  # report.ttl_alpha: a setting of the report, handed to pool as a value


def reads(tree: ast.AST) -> list[tuple[int, str]]:
    """Each (line, what) of `tree` that reads the key, the part or a time-to-loss field."""
    declared = {  # a field declared in a class body: `target_loss: float | None = None`
        id(node.target)
        for cls in ast.walk(tree)
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.AnnAssign)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in declared:
            continue
        if isinstance(node, ast.Attribute) and node.attr in (KEY, PART):
            found.append((node.lineno, f".{node.attr}"))
        elif isinstance(node, ast.Name) and node.id == KEY:
            found.append((node.lineno, node.id))
        elif isinstance(node, (ast.arg, ast.keyword)) and node.arg == KEY:
            found.append((node.lineno, f"{node.arg}="))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and FIELD.fullmatch(node.value)
            and node.value != SETTING
        ):
            found.append((node.lineno, repr(node.value)))
    return found


def test_no_module_outside_the_scenarios_reads_the_target_or_a_time_to_loss_field():
    found = [
        f"{path.relative_to(PACKAGE.parent)}:{line}: {what}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if SCENARIOS not in path.parents
        for line, what in reads(ast.parse(path.read_text(encoding="utf-8")))
    ]
    assert not found, "ask nanogpt/scenarios/time_to_loss/ instead:\n" + "\n".join(found)


def test_the_check_finds_each_kind_of_read():
    """The test above can fail: each kind of read, and a declaration that is none."""
    source = """
class Bench:
    target_loss: float | None = None
def f(spec, record, row, target_loss=None):
    a = spec.bench.target_loss
    b = record.time_to_loss
    c = row["ttl_note"], row.get("time_to_loss_s")
    return g(target_loss=target_loss)
"""
    found = sorted(what for _, what in reads(ast.parse(source)))
    assert found == sorted(
        [".target_loss", ".time_to_loss", "'ttl_note'", "'time_to_loss_s'"]
        + ["target_loss=", "target_loss=", "target_loss"]
    )


def test_time_to_loss_sits_in_one_folder():
    """No module of the package outside the folder is named for it (the old paths are gone)."""
    named = [
        str(path.relative_to(PACKAGE.parent))
        for path in PACKAGE.rglob("*.py")
        if SCENARIOS / "time_to_loss" not in path.parents
        and re.search(r"(^|_)(time_to_loss|target_loss|loss_plot|ttl)(_|$)", path.stem)
    ]
    assert not named
