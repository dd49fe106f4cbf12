"""The search's space, from Hydra's override grammar to Optuna's distributions (with the
sweeper, the part of the search that knows Hydra and Optuna; frontend/tune_sweeper.py drives it).

hydra.sweeper.params, then the command line (a later key wins), parsed by Hydra's public
override parser: a key with one value is fixed; `choice(...)`, a comma list or `range(...)` is
a dimension over its values (as Hydra spells them, so they go back into overrides unchanged);
`interval(low, high)` a continuous one (`tag(log, ...)`: on a log scale, `tag(int, ...)`:
integers).

A choice of three or more numbers (micro-batch 1, 2, 4, 8) is ordered: Optuna searches the
position of the value in ascending order as an integer, so TPE can learn that "larger was
better" and try the next size up, which an unordered (categorical) choice cannot tell it.
`values_of` turns a trial's params back into the values. Other choices are categorical.

A new search's first candidates are `initial_design`'s: every value of every choice tried at
least once, no candidate twice, before the sampler models anything. TPE's own start is random
draws, which with a few trials leave values untried (seed 0 over micro-batch x attention x loss
x optimizer implementation drew one point twice and `for_loop` never), and TPE models each
dimension from the values it has seen.
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import optuna
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from nanogpt.config.errors import ConfigError


def merged(*lists: list[str]) -> list[str]:
    """Overrides with each key once, the last list's value winning (Hydra refuses a key twice)."""
    out: dict[str, str] = {}
    for overrides in lists:
        for override in overrides:
            out[override.split("=", 1)[0].lstrip("+~")] = override
    return list(out.values())


def as_overrides(settings: Any) -> list[str]:
    """The sweeper's list of overrides (a ListConfig from Hydra) as plain strings."""
    if not settings:
        return []
    plain = settings if isinstance(settings, list) else OmegaConf.to_container(settings)
    return [str(o) for o in plain]


def parse(parser: OverridesParser, params: dict, arguments: list[str]):
    """(fixed overrides, dimensions: key -> values or None for an interval, Optuna's
    distributions); an empty space is refused, naming the key."""
    texts = [f"{k}={v}" for k, v in params.items()] + list(arguments)
    parsed = {o.get_key_element(): o for o in parser.parse_overrides(texts)}
    fixed, dims, distributions = [], {}, {}
    for key, override in parsed.items():
        if not override.is_sweep_override():
            fixed.append(f"{key}={override.get_value_element_as_str()}")
        elif override.is_discrete_sweep():
            values = list(override.sweep_string_iterator())
            if len(values) >= 3 and all(_number(v) is not None for v in values):
                values = sorted(values, key=_number)
                distributions[key] = optuna.distributions.IntDistribution(0, len(values) - 1)
            else:
                distributions[key] = optuna.distributions.CategoricalDistribution(values)
            dims[key] = values
        else:
            interval = override.value()
            log_scale = "log" in interval.tags
            dims[key] = None
            if "int" in interval.tags:
                distributions[key] = optuna.distributions.IntDistribution(
                    int(interval.start), int(interval.end), log=log_scale
                )
            else:
                distributions[key] = optuna.distributions.FloatDistribution(
                    float(interval.start), float(interval.end), log=log_scale
                )
    if not distributions:
        raise ConfigError(
            "hydra.sweeper.params",
            "the space is empty: nothing to search",
            "give at least one dimension, e.g. 'perf.batch_size=choice(4,8,16)' or +sweep=tune",
        )
    return fixed, dims, distributions


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def values_of(params: dict, dims: dict) -> dict[str, Any]:
    """A trial's params as values: an ordered choice's position becomes its value."""
    return {
        key: dims[key][value] if dims.get(key) is not None and isinstance(value, int) else value
        for key, value in params.items()
    }


def initial_design(dims: dict, distributions: dict, seed: int) -> list[dict]:
    """The first candidates of a search, as Optuna params (an ordered choice by its position):
    as many as the largest choice has values, every choice's values each in ceil(n / k) or
    floor(n / k) of them (a Latin square over the choices: each column its values repeated to
    length n, shuffled with `seed`), so that no value goes untried and no candidate repeats.
    Continuous dimensions (an interval) are left to the sampler."""
    rng = random.Random(seed)
    choices = {}
    for key, values in dims.items():
        if values is None:
            continue
        distribution = distributions[key]
        if isinstance(distribution, optuna.distributions.CategoricalDistribution):
            choices[key] = list(distribution.choices)
        else:  # an ordered choice: its positions
            choices[key] = list(range(len(values)))
    if not choices:
        return []
    n = max(len(values) for values in choices.values())
    columns = {}
    for key, values in choices.items():
        rng.shuffle(values)  # which values get the extra places when k does not divide n
        column = (values * -(-n // len(values)))[:n]
        rng.shuffle(column)
        columns[key] = column
    return [{key: column[i] for key, column in columns.items()} for i in range(n)]


def every_point(dims: dict, distributions: dict, seed: int) -> list[dict]:
    """Every candidate of a space of choices only, as Optuna params: the initial design's
    first, then the others in a seeded shuffle. For a search whose n_trials covers the whole
    space: each candidate probed once, none asked of the sampler (which, told a few, asks
    again for the best it has seen, and would spend its asks on repeats)."""
    first = initial_design(dims, distributions, seed)
    keys = [key for key in dims if dims[key] is not None]
    options = [_encoded(distributions[key], dims[key]) for key in keys]
    rest = [dict(zip(keys, point, strict=True)) for point in itertools.product(*options)]
    rest = [params for params in rest if params not in first]
    random.Random(seed).shuffle(rest)
    return [*first, *rest]


def _encoded(distribution, values: list) -> list:
    """A choice's values as Optuna's params hold them (an ordered choice: its positions)."""
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return list(distribution.choices)
    return list(range(len(values)))
