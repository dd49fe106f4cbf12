"""Which of the given paths' code differs from a commit's: python benchmarks/code_changed.py
COMMIT PATH... prints each path (a file, or a folder: every .py file below it) whose code is
not the commit's, one a line; nothing when all are the same. Exit 2 with one line when git
cannot read the commit (no repository here, or an unknown commit).

Code, not text: a Python file is compared as its syntax tree with the docstrings dropped (the
`ast` module drops comments itself), so a comment or docstring made true changes nothing a GPU
runs; any other file byte for byte. benchmarks/gpu_check.sh uses it to put last the parts whose
GPU code is unchanged since the loan that last ran them ok.
"""

from __future__ import annotations

import ast
import subprocess
import sys


def git(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["git", *args], capture_output=True, text=True)


def code_of(path: str, text: str | None) -> str | None:
    """What a file runs: its syntax tree less docstrings (a .py file), else its text."""
    if text is None or not path.endswith(".py"):
        return text
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return text
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            if isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


def files_at(commit: str | None, path: str) -> list[str]:
    """The files under `path` at `commit` (None: the working tree's, as git tracks them)."""
    listed = git("ls-tree", "-r", "--name-only", commit, "--", path) if commit else None
    if commit is None:
        listed = git("ls-files", "--", path)
    return [line for line in listed.stdout.splitlines() if line]


def text_at(commit: str | None, path: str) -> str | None:
    if commit is None:
        try:
            with open(path, encoding="utf-8") as f:
                return f.read()
        except OSError:
            return None
    shown = git("show", f"{commit}:{path}")
    return shown.stdout if shown.returncode == 0 else None


def changed(commit: str, path: str) -> bool:
    files = sorted(set(files_at(commit, path)) | set(files_at(None, path)))
    return not files or any(
        code_of(f, text_at(commit, f)) != code_of(f, text_at(None, f)) for f in files
    )


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(
            "code_changed: COMMIT PATH...: give a commit and the paths to compare", file=sys.stderr
        )
        return 2
    commit, paths = argv[0], argv[1:]
    if git("cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        print(f"code_changed: git cannot read commit {commit} here", file=sys.stderr)
        return 2
    for path in paths:
        if changed(commit, path):
            print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
