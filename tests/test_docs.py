"""The documentation: a README read in two minutes, and the reference in docs/ complete.

Every key of the schema (nanogpt/config/), every field of the record and every column of a
real sweep table is named in docs/; every preset too. A key or a column added without its line
fails here.
"""

from __future__ import annotations

import dataclasses
import re

import pytest

from nanogpt.analysis import table, tidy
from nanogpt.analysis.store import write_record
from nanogpt.config.spec import RunSpec
from nanogpt.record import Record, columns

from .conftest import REPO

DOCS = REPO / "docs"
README = REPO / "README.md"


def documented(text: str, name: str) -> bool:
    return f"`{name}`" in text


def schema_keys() -> list[str]:
    return [
        f"{group.name}.{key.name}"
        for group in dataclasses.fields(RunSpec)
        for key in dataclasses.fields(group.default_factory)
    ]


def test_every_config_key_is_documented():
    text = (DOCS / "config.md").read_text()
    assert [key for key in schema_keys() if not documented(text, key)] == []


def test_every_record_field_is_documented():
    text = (DOCS / "record.md").read_text()
    fields = [*Record().to_dict(), *columns()]
    assert [name for name in fields if not documented(text, name)] == []


def test_the_json_marks_of_record_md_are_the_schemas():
    """A field docs/record.md marks "json" is json_only() in its dataclass, and no other: the
    page says which fields are columns of summary.csv as the schema does."""
    fields, cols = set(Record().to_dict()), set(columns())
    wrong = []
    for line in (DOCS / "record.md").read_text().splitlines():
        if line.startswith("| `"):
            marked = "| json:" in line or " | json" in line
            names = re.findall(r"`(\w+)`", line.split(" | ")[0])
            wrong += [n for n in names if n in fields and marked == (n in cols)]
    assert wrong == []


def test_every_column_of_a_real_table_is_documented(tmp_path):
    # Two ok records written as a sweep writes them, then the table the report builds.
    for number, step_ms in enumerate((100.0, 80.0)):
        record = Record(status="ok")
        record.asked.overrides = [f"perf.batch_size={number + 1}"]
        record.asked.compile, record.asked.dtype = False, "fp32"
        record.setup.tokens_per_step, record.setup.world_size = 64, 1
        record.timing.step_ms_median = step_ms
        record.steps = [
            {"step": i + 1, "phase": "measure", "step_ms_job": step_ms * (1 + i / 100)}
            for i in range(8)
        ]
        record.rates.tokens_per_s = 64 / (step_ms / 1e3)
        write_record(tmp_path / str(number), record)
    built = table.build_table(tmp_path).table
    text = (DOCS / "record.md").read_text()
    config = (DOCS / "config.md").read_text()
    # a swept key's column is named after the key: documented with the keys, in config.md
    swept = [c for c in built.columns if c in schema_keys()]
    assert swept == ["perf.batch_size"] and all(documented(config, c) for c in swept)
    assert [c for c in built.columns if c not in swept and not documented(text, c)] == []


def documented_modules(text: str) -> set[str]:
    """The module paths (relative to nanogpt/) ARCHITECTURE.md's layout names: a folder opens at
    the start of a line (`  train/`, nested by indent: `    optim/`) or inline before a
    parenthesis (`record/ (...)`), and holds the `*.py` named after it; a name with a slash is
    a path from nanogpt/ (`hardware/slots.py`)."""
    block = text[text.index("\n## Layout\n") :]
    block = block[block.index("```") + 3 :]
    block = block[: block.index("```")]
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("nanogpt/"))
    found, stack = set(), []
    inline, paren = [], 0  # inline folders: (name, the paren depth they hold)
    for line in lines[start + 1 :]:
        if line and not line.startswith(" "):
            break  # notebooks/, benchmarks/, tests/: past the package
        indent = len(line) - len(line.lstrip())
        first = line.split()[0] if line.split() else ""
        depth = (indent - 2) // 2
        if indent < 10 and re.fullmatch(r"\w+/", first):  # a folder's own line
            stack, inline, paren = [*stack[:depth], first[:-1]], [], 0
        elif indent < 10 and re.fullmatch(r"\w+\.py", first):  # modules at a folder's level
            stack, inline, paren = stack[:depth], [], 0
        for token in re.finditer(r"((?<![\w/.-])[\w/]*\w\.py|(?<![\w/.-])\w+/(?= \()|[()])", line):
            word = token[1]
            if word == "(":
                paren += 1
            elif word == ")":
                paren -= 1
                inline = [(n, d) for n, d in inline if d <= paren]
            elif word.endswith("/"):
                inline.append((word[:-1], paren + 1))
            elif word.endswith("__init__.py"):
                continue
            elif "/" in word:
                found.add(word)
            else:
                found.add("/".join([*stack, *(n for n, _ in inline), word]))
    return found


def test_architecture_names_every_package_and_module():
    """ARCHITECTURE.md's layout is the one map of the code: every module by its path (a
    `plot.py` of tune/ is not named by publish/'s `loss_plot.py`, nor analysis/time_to_loss.py
    by record/'s), and nothing it names is gone."""
    text = (REPO / "ARCHITECTURE.md").read_text()
    package = REPO / "nanogpt"
    modules = {
        str(path.relative_to(package))
        for path in package.rglob("*.py")
        if path.name != "__init__.py" and "__pycache__" not in path.parts
    }
    named = documented_modules(text)
    assert sorted(modules - named) == []  # a module without its line
    assert sorted(name for name in named - modules if name.endswith(".py")) == []  # gone
    missing = [
        f"{path.name}/"
        for path in sorted(package.iterdir())
        if (path / "__init__.py").exists()
        if f"{path.name}/" not in text
    ]
    assert missing == []


def test_the_layout_reader_tells_paths_apart():
    """documented_modules, on a layout where a basename stands in another folder: it must not
    count tune/plot.py as named."""
    text = (
        "\n## Layout\n\n```\nnanogpt/\n  run.py · logs.py\n"
        "  publish/      loss_plot.py · plots.py\n"
        "                (hardware/slots.py)\n  record/       store.py (results: x.py)\n"
        "    nested/     deep.py\n  tune/         fit.py\n"
        "  results/      a.py · record/ (b.py) · c.py\nnotebooks/\n```\n"
    )
    assert documented_modules(text) == {
        "run.py",
        "logs.py",
        "publish/loss_plot.py",
        "publish/plots.py",
        "hardware/slots.py",
        "record/store.py",
        "record/x.py",
        "record/nested/deep.py",
        "tune/fit.py",
        "results/a.py",
        "results/record/b.py",
        "results/c.py",
    }
    assert "tune/plot.py" not in documented_modules(text)


def test_record_md_lists_summary_csvs_headline_in_its_order():
    text = (DOCS / "record.md").read_text()
    paragraph = text[text.index("The headline columns, in order") :].split("A column empty")[0]
    stored = tidy.stored_names(tidy.HEADLINE)  # each under the name the file gives it
    listed = [stored[name] for name in tidy.HEADLINE]
    named = [n for n in re.findall(r"`([\w.]+)`", paragraph) if n in listed]
    assert named == listed


def test_every_preset_is_documented():
    text = (DOCS / "presets.md").read_text()
    presets = [path.stem for path in (REPO / "sweeps").glob("*.yaml")]
    assert presets and [name for name in presets if not documented(text, name)] == []


def test_the_readme_is_short_and_keeps_the_two_commands():
    text = README.read_text()
    assert len(text) < 8000  # a two-minute read; the reference lives in docs/
    assert "make sweep" in text and "make test" in text
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"(?m)^sweep:", makefile) and re.search(r"(?m)^test:", makefile)
    assert "make test" in (REPO / ".ci" / "run").read_text()


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")))
def test_every_docs_page_is_linked_from_the_readme(page):
    assert f"](docs/{page})" in README.read_text()


def test_every_link_resolves():
    for page in [README, *DOCS.glob("*.md")]:
        for target in re.findall(r"\]\(([^)#:]+)\)", page.read_text()):
            assert (page.parent / target).exists(), f"{page.name}: {target}"


# What conf/, sweeps/ and the notebook cite: a file (nanogpt/config/protocol.py, docs/record.md), a
# name in a file (config/protocol.py's CPU_BENCH), a section of a page (README "Quick start",
# (docs/measurement.md: Diagnosis)).
CITING = [
    *sorted((REPO / "conf").rglob("*.yaml")),
    *sorted((REPO / "sweeps").glob("*.yaml")),
    *sorted((REPO / "notebooks").glob("*.ipynb")),
]
FILE_REF = re.compile(r"(?<![\w.])((?:[\w-]+/)*[\w-]+\.(?:py|md|yaml|ipynb))\b")
NAME_REF = re.compile(r"((?:[\w-]+/)*[\w-]+\.py)'s ([A-Za-z_]\w*)")
PAGE = r"((?:[\w-]+/)*(?:README|[\w-]+\.md))"
SECTION_REF = re.compile(PAGE + r"(?::| ) ?\"([^\"\\]+)\"|\(" + PAGE + r": ([^)]+)\)")


# Files cited that are not this checkout's: nanoGPT's own (its figures are quoted), and the
# notebook a papermill command writes.
NOT_OURS = {"bench.py", "train.py", "analysis.ipynb"}


def cited_file(name: str, near=None):
    """The file a citation names: a path from the checkout's top or the package's, else (a bare
    module name such as frontend/compose.py) the one file of that name in the package."""
    places = [REPO / name, REPO / "nanogpt" / name]  # scenarios/loop.py: in the package
    places += [near / name] if near is not None else []  # nano.yaml beside gpt2.yaml
    for place in places:
        if place.exists():
            return place
    found = [*(REPO / "nanogpt").rglob(name)] if "/" not in name else []
    return found[0] if len(found) == 1 else None


@pytest.mark.parametrize("path", CITING, ids=lambda p: str(p.relative_to(REPO)))
def test_what_configs_presets_and_the_notebook_cite_exists(path):
    text = path.read_text()
    files = [name for name in FILE_REF.findall(text) if name not in NOT_OURS]
    missing = [name for name in files if cited_file(name, path.parent) is None]
    for module, name in NAME_REF.findall(text):
        source = cited_file(module)
        if source is None or not re.search(rf"(?m)^(def |class )?{name}\b", source.read_text()):
            missing.append(f"{module}'s {name}")
    for page, section, page2, section2 in SECTION_REF.findall(text):
        page, section = page or page2, section or section2
        target = cited_file(page if page.endswith(".md") else f"{page}.md")
        headings = [] if target is None else re.findall(r"(?m)^#+ (.+)$", target.read_text())
        if not any(section.strip().lower() in heading.lower() for heading in headings):
            missing.append(f'{page} "{section}"')
    assert missing == []


# How the docs once disagreed on fp8's MFU (issue 56): frontier.md and the fp8 preset's row said
# it divides by the bf16 peak, measurement.md, record.md and the code say null. The first
# family of phrases must be gone from every page and preset; the code's answer must be there.
FP8_MFU_AGAINST_BF16 = re.compile(
    r"MFU (with fp8 )?(divides|is divided) by the bf16|fp8[^.\n]{0,80}divides? by the bf16 "
    r"(dense )?peak|divides float8 runs by the bf16",
    re.IGNORECASE,
)


def test_the_docs_say_one_thing_of_mfu_under_fp8():
    from nanogpt.analysis.derive import FP8_NO_MFU

    pages = [
        *DOCS.glob("*.md"),
        README,
        REPO / "sweeps" / "fp8.yaml",
        REPO / "nanogpt" / "train" / "float8.py",
    ]
    said = {p.name: FP8_MFU_AGAINST_BF16.findall(p.read_text()) for p in pages}
    assert {name: found for name, found in said.items() if found} == {}
    assert "no MFU" in FP8_NO_MFU  # what the code records: null, with this note
    frontier = (DOCS / "frontier.md").read_text()
    assert "**MFU with fp8 is null**" in frontier
    (row,) = [
        line
        for line in (DOCS / "presets.md").read_text().splitlines()
        if line.startswith("| `fp8` |")
    ]
    assert "MFU is null under fp8" in row
