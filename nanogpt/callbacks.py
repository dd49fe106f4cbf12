"""The multirun's Hydra callback at the path a config may name
(`hydra.callbacks.<name>._target_: nanogpt.callbacks.SweepReport`); it lives in
nanogpt/frontend/callback.py."""

from nanogpt.frontend.callback import SweepReport

__all__ = ["SweepReport"]
