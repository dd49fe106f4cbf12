"""hydra/sweeper=tune (conf/hydra/sweeper/tune.yaml): Hydra finds sweeper plugins in the
`hydra_plugins` namespace package and instantiates only classes defined there. This class is
the plugin's face; the search is nanogpt/tune/sweeper.py, imported when a search starts, so
that Hydra's scan of its plugins at every start stays cheap (no Optuna import)."""

from typing import Any

from hydra.plugins.sweeper import Sweeper


class TuneSweeper(Sweeper):
    """nanogpt's search (docs/tune.md): Optuna's ask-and-tell over a Hydra-grammar space."""

    def __init__(self, **settings: Any) -> None:
        self.settings = settings

    def setup(self, *, hydra_context, task_function, config) -> None:
        from nanogpt.tune.sweeper import Search

        self.search = Search(**self.settings)
        self.search.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def sweep(self, arguments: list[str]) -> Any:
        return self.search.sweep(arguments)
