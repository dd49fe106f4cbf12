"""Every private API of another library, and every patch of another's object, that the package
uses is listed in ARCHITECTURE.md ("Private APIs and patches"), with why: a new use fails here
until it is listed, and a listed one the code no longer makes fails too. Comments and
docstrings are not uses; a string is (`sys.modules.get("torch._dynamo")`)."""

from __future__ import annotations

import ast
import fnmatch
import io
import re
import tokenize
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "nanogpt"
LIBRARIES = ("torch", "aten", "hydra", "omegaconf", "submitit", "wandb", "optuna", "pandas")
USES = [  # (pattern, the name it is listed by; None: the match itself)
    (re.compile(rf"\b(?:{'|'.join(LIBRARIES)})(?:\.[A-Za-z]\w*)*\._[A-Za-z]\w*"), None),
    (re.compile(r"\._return_value\b"), "JobReturn._return_value"),
    (re.compile(r"\bhydra_plugins\.__path__"), "hydra_plugins.__path__"),
    (re.compile(r"\bwarnings\.formatwarning\s*="), "warnings.formatwarning"),
    (re.compile(r"\bos\.dup2\([^)]*,\s*2\)"), "fd 2"),
    (re.compile(r"\bscaler\._[a-z]\w*"), "GradScaler._scale"),
    (re.compile(r"\bsetattr\(event\b"), "FunctionEvent attributes"),
    (re.compile(r"\batexit\._\w+"), None),
]


def code_of(path: Path) -> str:
    """The file's text with its comments and docstrings blanked (positions kept)."""
    text = path.read_text()
    lines = text.splitlines(keepends=True)
    spans = []
    for node in ast.walk(ast.parse(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                spans.append(
                    ((value.lineno, value.col_offset), (value.end_lineno, value.end_col_offset))
                )
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            spans.append((tok.start, tok.end))
    chars = [list(line) for line in lines]
    for (l0, c0), (l1, c1) in spans:
        for n in range(l0, l1 + 1):
            row = chars[n - 1]
            start, end = (c0 if n == l0 else 0), (c1 if n == l1 else len(row))
            for i in range(start, min(end, len(row))):
                if row[i] != "\n":
                    row[i] = " "
    return "".join("".join(row) for row in chars)


def uses_in_code() -> set[tuple[str, str]]:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        code = code_of(path)
        for pattern, name in USES:
            for m in pattern.finditer(code):
                found.add((str(path.relative_to(PACKAGE)), name or m[0]))
    return found


def listed() -> set[tuple[str, str]]:
    text = (REPO / "ARCHITECTURE.md").read_text()
    section = text[text.index("\n## Private APIs and patches\n") :]
    section = section[: section.find("\n## ", 1)] if "\n## " in section[1:] else section
    pairs = set()
    for row in re.findall(r"(?m)^\| `.*$", section):
        cells = row.split("|")
        apis, paths = re.findall(r"`([^`]+)`", cells[1]), re.findall(r"`([^`]+)`", cells[2])
        pairs |= {(path, api) for api in apis for path in paths}
    return pairs


def test_every_private_api_and_patch_in_use_is_listed_with_why():
    found, said = uses_in_code(), listed()
    unlisted = sorted(
        (path, api)
        for path, api in found
        if not any(p == path and fnmatch.fnmatchcase(api, a) for p, a in said)
    )
    assert unlisted == []  # list it in ARCHITECTURE.md, with why, or stop using it
    gone = sorted(
        (path, api)
        for path, api in said
        if not any(p == path and fnmatch.fnmatchcase(f, api) for p, f in found)
    )
    assert gone == []  # no longer used there: take it off the list


def test_the_finder_sees_a_use_and_not_a_comment(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text(
        '"""torch._dynamo in a docstring is no use."""\n'
        "import torch._dynamo  # torch._inductor in a comment is none either\n"
        "x = job_return._return_value\n"
    )
    code = code_of(sample)
    assert "torch._dynamo" in code and "_inductor" not in code and code.count("_dynamo") == 1
    assert USES[1][0].search(code)
