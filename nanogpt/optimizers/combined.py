"""Several optimizers stepped as one (no RECIPE: not an optimizer=NAME of its own)."""

from __future__ import annotations


class Combined:
    """Several optimizers stepped as one, as nanochat's MuonAdamW steps Muon and AdamW: one
    `step`, `zero_grad` and `state_dict`, and `param_groups` that are the parts' own groups
    (the same dicts), so GradScaler.unscale_ unscales every part's gradients and GradScaler.step
    steps all parts or, after an inf, none. Each part's step keeps its own profiler range
    (`Optimizer.step#Muon.step`), which the diagnosis counts as optimizer time."""

    def __init__(self, parts: list):
        self.parts = parts
        self.param_groups = [group for part in parts for group in part.param_groups]

    @property
    def state(self) -> dict:
        return {p: s for part in self.parts for p, s in part.state.items()}

    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for part in self.parts:
            part.step()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        return {"parts": [part.state_dict() for part in self.parts]}

    def load_state_dict(self, state: dict) -> None:
        for part, own in zip(self.parts, state["parts"], strict=True):
            part.load_state_dict(own)
