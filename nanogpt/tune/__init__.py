"""The search for the fastest configuration that fits (hydra/sweeper=tune, docs/tune.md): one
room for the whole feature.

The search itself: `sweeper` (Hydra's sweeper, driving Optuna's ask-and-tell) and `space`
(Hydra's override grammar to Optuna's distributions) — the only modules here that know Hydra
and Optuna (import-linter contracts, pyproject.toml). Its plain logic below them: what each
objective reads from a record (`objectives`), which candidates fit before they run (`fit`),
which advance from one rung to the next and which one wins (`ladder`), whether a leader trains
as well as the baseline (`quality`), a job dir per candidate (`jobs`), and the answer's files
and console lines (`answer`, `plot`). Hydra discovers the sweeper through
hydra_plugins/nanogpt_tune/plugin.py.
"""
