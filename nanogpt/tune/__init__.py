"""The search for the fastest configuration that fits (hydra/sweeper=tune, docs/tune.md).

Plain logic only: what each objective reads from a record (`objectives`), which candidates fit
before they run (`fit`), which advance from one rung to the next and which one wins
(`ladder`), whether a leader trains as well as the baseline (`quality`), and the answer's files
(`answer`). Hydra and Optuna stay in the plugin layer (nanogpt/tune_sweeper.py).
"""
