"""The versions a run's figures rest on, as its record's `env` part names them, and what a sweep
and a comparison of two sweeps say about them.

A step time is a fact of torch's kernels, Dynamo's graphs and Inductor's code as much as of the
model: the same point measured on torch 2.11 and 2.13 differs because torch did. So each record
names (hardware/env.py writes them) the interpreter, torch and the libraries under it (CUDA,
cuDNN, NCCL: null on a build without them), the packages that compute for the point where the
run used them (triton, torchao, transformers: null when the measuring process never imported
them, e.g. transformers for the built-in GPT), and the project's own commit. The table's footer
prints them once; `report NEW --compare OLD` says in one line when two sweeps differ in any
(a comparison across versions is a comparison of versions too).
"""

from __future__ import annotations

# the record's env keys, in the order the footer prints them
VERSION_KEYS = (
    "python",
    "torch",
    "cuda",
    "cudnn",
    "nccl",
    "triton",
    "torchao",
    "transformers",
    "git_commit",
)
# imported-when-used packages: the record's version of each, where the run imported it
USED_PACKAGES = ("triton", "torchao", "transformers")
# how the footer and the compare line name each key
SHOWN = {"git_commit": "nanogpt"}


def of_points(points: list[dict]) -> dict[str, list[str]]:
    """Each version key -> the distinct values its points' records hold (in the points' order),
    keys no record has a value for left out. A point without an env (an old or unreadable
    record) adds nothing."""
    seen: dict[str, list[str]] = {}
    for point in points:
        env = point.get("env") or {}
        for key in VERSION_KEYS:
            value = _shown_value(key, env)
            if value is not None and value not in seen.setdefault(key, []):
                seen[key].append(value)
    return {key: seen[key] for key in VERSION_KEYS if seen.get(key)}


def footer(points: list[dict]) -> str | None:
    """The table's footer line: "versions: python 3.11.2, torch 2.13.0+cpu, ..., nanogpt
    de910ba"; a key whose points differ lists each value ("torch 2.11.0 | 2.13.0")."""
    found = of_points(points)
    if not found:
        return None
    return "versions: " + ", ".join(
        f"{SHOWN.get(key, key)} {' | '.join(values)}" for key, values in found.items()
    )


def difference(old_points: list[dict], new_points: list[dict]) -> str | None:
    """One line naming every version two sweeps differ in (old -> new), None when none does."""
    old, new = of_points(old_points), of_points(new_points)
    changed = [
        f"{SHOWN.get(key, key)} {' | '.join(old.get(key, ['-']))} -> "
        f"{' | '.join(new.get(key, ['-']))}"
        for key in VERSION_KEYS
        if old.get(key) != new.get(key)
    ]
    if not changed:
        return None
    return (
        "versions differ: "
        + ", ".join(changed)
        + " (a comparison across versions is a comparison of versions)"
    )


def _shown_value(key: str, env: dict) -> str | None:
    value = env.get(key)
    if value is None:
        return None
    if key == "git_commit":  # the short commit, marked when the checkout had changes
        return str(value)[:7] + ("-dirty" if env.get("git_dirty") else "")
    return str(value)
