"""A scenario behind one interface: what a run measures and what its point says (issue 46 item 2).

A scenario is a folder of nanogpt/scenarios/ with one module a face. Each face sits at the layer
of what it does (the import contract in pyproject.toml names each), and defines the hooks of its
protocol below:

  checks.py  config     Checks  whether a spec is this scenario's, its own keys checked, a run's
                                spec (time to loss seeds each run), the keys a run count follows
  part.py    record     Part    whether a record is this scenario's, its console line, the
                                columns its comparison adds to the table (their places)
  pool.py    analysis   Pool    a point's runs pooled, what the point derives from its pooled
                                parts, its comparison in the sweep's table
  run.py     scenarios  Run     the parts a run measures
  guard.py   tune       Guard   its search objectives, each with its direction, the quality
                                guard of its finalists, a point's interval in the answer
  plot.py    publish    Plot    its PNGs

`of_spec` and `of_record` are the one place that picks the scenario of a run or a point: time to
loss where bench.target_loss is set, else throughput (DEFAULT). What a whole sweep holds (the
table's comparisons, the plots, the objectives) is asked of every scenario in ALL, in its order.
A face is imported when first asked for (importlib), so a caller imports no face above its own
layer, and nothing heavy at import: analysis/ asks a scenario's pool, never its plot. Parts pool
their own fields (analysis/repeats.py); the scenario decides the rest.

Adding a scenario: its folder with the six faces, its line in ALL, its test (ARCHITECTURE.md's
recipe).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable

# A sweep (analysis/table.Sweep) is typed Any here: the measured loop imports this module, and
# knows nothing of the table (the import contract)
Sweep = Any

if TYPE_CHECKING:  # types only: this module imports no layer's code
    from nanogpt.config.spec import RunSpec
    from nanogpt.record import Record


@runtime_checkable
class Checks(Protocol):
    """checks.py (config layer, no torch)."""

    # The config keys besides bench.repeats that set how many runs a point has (bench.repeats's
    # default follows them: conf/bench/default.yaml); a grid composes a point that sets one
    # (frontend/grid_sweeper.py)
    RUN_KEYS: tuple[str, ...]

    def asked(self, spec: RunSpec) -> bool:
        """Whether a run of `spec` is this scenario's."""

    def check(self, spec: RunSpec) -> None:
        """This scenario's keys checked before any point runs: one ConfigError line each."""

    def reads_held_out(self, spec: RunSpec) -> bool:
        """Whether its runs read the validation split (data's check then asks for one)."""

    def run_spec(self, spec: RunSpec, number: int) -> RunSpec:
        """The spec run `number` (1, 2, ...) of a point measures."""


@runtime_checkable
class Part(Protocol):
    """part.py (record layer)."""

    # The columns its comparison (Pool.compare) adds to the sweep's table, no record's fields:
    # name -> its place in summary.csv's headline (analysis/tidy.py), among the fields' own
    COMPARED: Mapping[str, int]
    # Those the console's table shows (analysis/display.py): name -> (place, header, format:
    # a display.FORMATS name), as a field marks its own (record/fields.py, SHOWN)
    COMPARED_SHOWN: Mapping[str, tuple[int, str, str]]

    def measured(self, record: Record) -> bool:
        """Whether a run's or a point's record is this scenario's."""

    def console_line(self, result: Mapping[str, Any], fmt: Callable[[str, str], str]) -> str:
        """A run's console line after its status and name; `fmt(field, spec)` formats a field
        of the flat record ("-" when null)."""


@runtime_checkable
class Pool(Protocol):
    """pool.py (analysis layer)."""

    def pool(self, records: list[Record]) -> Record:
        """A point's record from its runs' (two or more) raw parts."""

    def derive(self, record: Record, runs: list[Record], floor_s: float) -> Record:
        """The point's figures from its pooled record (`runs`: its runs' own records)."""

    def compare(self, sweep: Sweep, base: int | None, alpha: float | None) -> None:
        """Its columns of the sweep's table against the baseline row `base`, in place (nothing
        where no row is this scenario's); `alpha`: report.ttl_alpha, a verdict's threshold."""


@runtime_checkable
class Run(Protocol):
    """run.py (scenarios layer): called by the measured loop (scenarios/loop.py) with the
    trainer built."""

    def measure(self, spec: RunSpec, trainer: Any, record: Record, *, context: Measuring) -> None:
        """Fill the parts of `record` this scenario's run measures."""


@runtime_checkable
class Guard(Protocol):
    """guard.py (tune layer)."""

    OBJECTIVES: Mapping[str, str]  # tune.objective's names it answers -> maximize | minimize
    RECORD_FIELDS: Mapping[str, str]  # the search's names -> the flat record's fields it reads

    def value(
        self,
        record: Mapping[str, Any],
        name: str,
        usd_per_hour: float | None,
        usd_per_kwh: float | None,
    ) -> float | None:
        """Objective `name` of an ok record (flat); None where unknown."""

    def needs(
        self,
        name: str,
        usd_per_hour: float | None,
        usd_per_kwh: float | None,
        asked: bool,
    ) -> str | None:
        """Why objective `name` cannot be computed with these settings (the key to set);
        `asked`: whether the search's runs are this scenario's (of_spec of its config)."""

    def quality(self, finalists: list, search: Searching) -> dict:
        """The quality guard's answer for the search's finalists (entries with .key,
        .overrides and .record), when the search's runs are this scenario's: whether it
        checked, why not, each finalist's verdict (flagged or not, and a note: tune.md)."""

    def interval(self, record: Mapping[str, Any]) -> str | None:
        """A point's 95 % interval as the search's answer says it (publish/tune_answer.py),
        from the record the search keeps (tune/jobs.kept: RECORD_FIELDS' names); None where
        the record holds none of this scenario's (a point has one scenario's at most)."""


@runtime_checkable
class Plot(Protocol):
    """plot.py (publish layer)."""

    PLOTS: Mapping[str, Callable[[Sweep], Any]]  # file name -> its drawing, from the sweep


@dataclass
class Measuring:
    """What the measured loop hands a scenario's run besides the spec, the trainer and the
    record: the ceilings MFU divides by, the step log, the sinks (W&B), the job dir, and whether
    the allocator's history is being recorded (bench.memory_snapshot), and the clock of the
    time to first step."""

    ceilings: Any
    log: Any
    sinks: list
    out_dir: Any
    history: bool
    start: Any = None  # probes/startup.StartClock: the time to first step, timed from here


@dataclass
class Searching:
    """What the search (frontend/tune_sweeper.py) hands its scenario's quality guard: its
    composed config (read as attributes: data, bench, report), the guard's settings
    (hydra.sweeper.quality), the baseline's overrides, the runs a finalist was measured with
    (hydra.sweeper.repeats), and `launch([(overrides, key), ...])`: those points measured in
    one batch (the search's fixed overrides under each; a key keeps its job dir, a key given
    twice runs once), each point's record as the search keeps it (tune/jobs.kept), in order."""

    config: Any
    settings: Mapping[str, Any]
    baseline: list[str]
    repeats: int
    launch: Callable[[list[tuple[list[str], str]]], list[dict]]


FACES = {"checks": Checks, "part": Part, "pool": Pool, "run": Run, "guard": Guard, "plot": Plot}


@dataclass(frozen=True)
class Scenario:
    """A scenario by its folder's name; each property imports that face when asked."""

    name: str

    def face(self, face: str) -> Any:
        return importlib.import_module(f"{__package__}.{self.name}.{face}")

    @property
    def checks(self) -> Checks:
        return cast(Checks, self.face("checks"))

    @property
    def part(self) -> Part:
        return cast(Part, self.face("part"))

    @property
    def pool(self) -> Pool:
        return cast(Pool, self.face("pool"))

    @property
    def run(self) -> Run:
        return cast(Run, self.face("run"))

    @property
    def guard(self) -> Guard:
        return cast(Guard, self.face("guard"))

    @property
    def plot(self) -> Plot:
        return cast(Plot, self.face("plot"))


THROUGHPUT = Scenario("throughput")
TIME_TO_LOSS = Scenario("time_to_loss")
# Every scenario, in the order the table's comparisons add their columns and the plots are drawn
ALL = (THROUGHPUT, TIME_TO_LOSS)
DEFAULT = THROUGHPUT  # a run no other scenario asks for


def of_spec(spec: RunSpec) -> Scenario:
    """The scenario a run of `spec` is: the first other than DEFAULT that asks for it. `spec`
    may be a composed config too (the search's, whose candidates vary): its sections read as
    attributes alike."""
    return next((s for s in ALL if s is not DEFAULT and s.checks.asked(spec)), DEFAULT)


def of_record(record: Record) -> Scenario:
    """The scenario a run's or a point's record was measured by."""
    return next((s for s in ALL if s is not DEFAULT and s.part.measured(record)), DEFAULT)


def of_objective(name: str) -> Scenario:
    """The scenario whose search objective `name` is (tune.objective); KeyError for none."""
    for scenario in ALL:
        if name in scenario.guard.OBJECTIVES:
            return scenario
    raise KeyError(name)
