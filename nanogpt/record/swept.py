"""What a sweep varies: its swept keys, and each point's typed value for them.

A point is its Hydra overrides (`perf.dtype=bf16 +sweep/accum_split=8x2`). A key is *swept*
when the points do not all set it to one value; with one point, every key it sets is. The
table has one column per swept key (analysis/table.py), the W&B view one axis per swept key
(publish/wandb_view.py), the notebook one grid axis per swept key.

Values are typed as Hydra's override grammar types them (https://hydra.cc/docs/advanced/
override_grammar/basic/): null, true/false (any case), integers, floats (1e-3, inf, nan),
quoted strings, [lists] and {dicts}; anything else is a string (`bf16`, `8x2`). This is a small
reader of the grammar's values, so that the results layer needs no Hydra.
"""

from __future__ import annotations

import math
import re

_INT = re.compile(r"[+-]?\d+$")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?$")
_SPECIAL_FLOATS = {"inf": math.inf, "+inf": math.inf, "-inf": -math.inf, "nan": math.nan}


def parse_override(text: str) -> tuple[str, object] | None:
    """(key, typed value) of one override `key=value`; None for a deletion (~key) or text
    without '='. The key keeps its path and loses Hydra's `+`/`++` prefix."""
    if text.startswith("~") or "=" not in text:
        return None
    key, _, value = text.partition("=")
    return key.lstrip("+"), parse_value(value)


SWEEP_FUNCTIONS = ("range(", "choice(", "glob(", "interval(", "shuffle(", "sort(", "tag(")


def several_values(value: str) -> bool:
    """Whether an override's value text gives a sweep several values: a comma list (`a,b`,
    not `[a,b]` or `"a,b"`) or one of Hydra's sweep functions (`range(1,3)`)."""
    text = value.strip()
    if text.startswith(SWEEP_FUNCTIONS):
        return True
    _, end = _value(text, 0)
    return end < len(text) and text[end] == ","


def override_key(text: str) -> str | None:
    """The key one override sets (without `+`), None for a deletion or text without '='."""
    parsed = parse_override(text)
    return parsed[0] if parsed else None


def parse_value(text: str):
    """A value of Hydra's override grammar, typed (see the module docstring)."""
    value, rest = _value(text.strip(), 0)
    if rest != len(text.strip()):  # not one whole value: keep the text as it was written
        return text
    return value


def _value(text: str, pos: int):
    """The value that starts at text[pos], and the position after it."""
    pos = _skip_space(text, pos)
    if pos < len(text) and text[pos] in "[{":
        return _container(text, pos)
    if pos < len(text) and text[pos] in "'\"":
        end = text.find(text[pos], pos + 1)
        if end == -1:
            return text[pos:], len(text)
        return text[pos + 1 : end], end + 1
    end = pos
    depth = 0
    while end < len(text) and (depth or text[end] not in ",]}:"):
        depth += {"(": 1, ")": -1}.get(text[end], 0)
        end += 1
    return _primitive(text[pos:end].strip()), end


def _container(text: str, pos: int):
    closing = "]" if text[pos] == "[" else "}"
    items: list = []
    pairs: dict = {}
    pos = _skip_space(text, pos + 1)
    while pos < len(text) and text[pos] != closing:
        if closing == "}":
            key_end = text.index(":", pos)
            key = text[pos:key_end].strip().strip("'\"")
            value, pos = _value(text, key_end + 1)
            pairs[key] = value
        else:
            value, pos = _value(text, pos)
            items.append(value)
        pos = _skip_space(text, pos)
        if pos < len(text) and text[pos] == ",":
            pos = _skip_space(text, pos + 1)
    return (items if closing == "]" else pairs), pos + 1


def _skip_space(text: str, pos: int) -> int:
    while pos < len(text) and text[pos] == " ":
        pos += 1
    return pos


def _primitive(word: str):
    lower = word.lower()
    if lower == "null":
        return None
    if lower in ("true", "false"):
        return lower == "true"
    if _INT.match(word):
        return int(word)
    if _FLOAT.match(word):
        return float(word)
    if lower in _SPECIAL_FLOATS:
        return _SPECIAL_FLOATS[lower]
    return word


def split_overrides(text) -> list[str]:
    """A table's overrides cell (the overrides joined by spaces; "defaults" for none) as the
    list it was joined from. A space inside brackets or quotes (`model.sizes=[1, 2]`) belongs
    to its value."""
    if text in (None, "", "defaults"):
        return []
    items, current, depth, quote = [], "", 0, ""
    for char in str(text):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char in "[{(":
            depth += 1
        elif char in "]})":
            depth -= 1
        elif char == " " and depth <= 0:
            items += [current] if current else []
            current = ""
            continue
        current += char
    return items + ([current] if current else [])


def point_key(overrides) -> str:
    """The overrides that name a point, order-free: sorted and joined by spaces. `overrides` is
    a list, or a table's overrides cell (split by `split_overrides`, so a value with a space in
    brackets, `model.sizes=[1, 2]`, stays one override). The one rule by which a record without
    a point_id (analysis/store.py), a sweep-vs-sweep row (analysis/compare.py) and a search's
    candidate (frontend/tune_space.py) are matched."""
    items = overrides if isinstance(overrides, list) else split_overrides(overrides)
    return " ".join(sorted(items))


def point_values(overrides: list[str]) -> dict[str, object]:
    """A point's typed values by key, in the order its overrides give them."""
    parsed = (parse_override(text) for text in overrides)
    return dict(pair for pair in parsed if pair is not None)


def swept_keys(points: list[list[str]]) -> list[str]:
    """The keys (without `+`) whose value is not the same in every point, in first-seen
    order; with one point, every key it sets. A key set by some points only is swept (the
    others have its default)."""
    values = [point_values(point) for point in points]
    keys = list(dict.fromkeys(key for point in values for key in point))
    if len(points) == 1:
        return keys

    def varies(key: str) -> bool:
        seen = [repr(point[key]) for point in values if key in point]
        return len(seen) < len(points) or len(set(seen)) > 1

    return [key for key in keys if varies(key)]
