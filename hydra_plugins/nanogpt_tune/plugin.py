"""hydra/sweeper=tune (conf/hydra/sweeper/tune.yaml) and hydra/sweeper=grid (the default,
conf/hydra/sweeper/grid.yaml): Hydra finds sweeper plugins in the `hydra_plugins` namespace
package and instantiates only classes defined there. These classes are the plugins' faces; the
search is nanogpt/frontend/tune_sweeper.py and the grid nanogpt/frontend/grid_sweeper.py, imported
when a sweep
starts, so that Hydra's scan of its plugins at every start stays cheap (no Optuna import)."""

from typing import Any

from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper


class TuneSweeper(Sweeper):
    """nanogpt's search (docs/tune.md): Optuna's ask-and-tell over a Hydra-grammar space."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def setup(self, *, hydra_context, task_function, config) -> None:
        # The launcher first: what it starts (the parallel launcher's fork server: torch's
        # imports) then runs beside the search's own imports (Optuna, torch), not after them
        from nanogpt.frontend.point_configs import with_point_configs

        hydra_context = with_point_configs(hydra_context)  # each job composed as Hydra does, faster
        launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        from nanogpt.frontend.tune_sweeper import Search

        self.search = Search(**self.settings)
        self.search.setup(hydra_context=hydra_context, config=config, launcher=launcher)

    def sweep(self, arguments: list[str]) -> Any:
        return self.search.sweep(arguments)


class GridSweeper(Sweeper):
    """nanogpt's grid sweeper, the default (conf/config.yaml): the points' runs as jobs, round by
    round (nanogpt/frontend/grid_sweeper.py)."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def setup(self, *, hydra_context, task_function, config) -> None:
        from nanogpt.frontend.grid_sweeper import Grid

        self.grid = Grid(**self.settings)
        self.grid.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.grid.sweep(arguments)
