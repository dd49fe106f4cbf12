"""Hydra's face: the schema and presets composed, a config to a RunSpec, every point
checked, the multirun's callback, the launchers and the search's sweeper. The only library
code that knows Hydra (and, in tune_sweeper and tune_space, Optuna)."""
