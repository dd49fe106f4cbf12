"""The point as the user asked for it: the record's first part (results/record/), filled by the
worker before anything is measured (runner/worker.py)."""

from __future__ import annotations

from dataclasses import dataclass, field

from nanogpt.config.choices import AC_KEYS
from nanogpt.config.spec import RunSpec
from nanogpt.record.fields import JSON_ONLY, config_key, json_only, marked
from nanogpt.record.identity import measured_config


@dataclass
class Asked:
    """The point as asked: its Hydra overrides and the spec's main choices, as plain values."""

    # the point's identity: a digest of measured_config
    point_id: str | None = marked(headline=97)
    # summary.csv: as text, space-separated
    overrides: list[str] = marked(default_factory=list, headline=96)
    overrides_str: str = field(default="defaults", metadata={JSON_ONLY: True})
    model: str | None = config_key("model.name", headline=91)
    model_chosen_by: str | None = None  # model=auto: which model the device got, and why
    dtype: str | None = config_key("perf.dtype")
    compile: bool | None = config_key("perf.compile")
    compile_mode: str | None = config_key("perf.compile_mode")
    attention: str | None = config_key("perf.attention")
    # activation checkpointing's policy (train/checkpoint_rules.py) and its keys where it
    # reads them; activation_checkpointing: ac=full (a record of before: the switch alone)
    ac: str | None = config_key("perf.ac")
    ac_every: int | None = config_key("perf.ac_every")
    ac_policy: str | None = config_key("perf.ac_policy")
    ac_budget: float | None = config_key("perf.ac_budget")
    offload: str | None = config_key("perf.offload")
    activation_checkpointing: bool | None = config_key("perf.activation_checkpointing")
    fp8: str | None = config_key("perf.fp8")  # torchao float8 recipe, or none
    # full | chunked (perf.loss); loss_first/loss_last: values
    loss_kind: str | None = config_key("perf.loss")
    loss_chunk: int | None = config_key("perf.loss_chunk")  # tokens per chunk (loss=chunked only)
    dist_strategy: str | None = config_key("dist.strategy")  # ddp | fsdp2 (with more than one rank)
    reshard_after_forward: bool | None = config_key("dist.reshard_after_forward")  # fsdp2 only
    optimizer: str | None = None  # adamw | sgd | muon, or optimizer.build's class
    optimizer_impl: str | None = config_key("optimizer.impl")
    batch_size: int | None = config_key("perf.batch_size")
    block_size: int | None = config_key("model.block_size")
    grad_accum: int | None = config_key("perf.grad_accum")
    warmup_steps: int | None = config_key("bench.warmup_steps")
    job_dir: str | None = marked(headline=98)
    measured_config: dict | None = json_only()  # the resolved keys it measures (record/identity.py)

    @classmethod
    def of(
        cls, spec: RunSpec, overrides: list[str], job_dir: str, point_id: str | None = None
    ) -> Asked:
        """What was asked, as plain values; `point_id` is the one the job process computed for
        the point and carried (runner/handoff.py Job), never computed again here."""
        perf = spec.perf
        measured = measured_config(spec)
        return cls(
            overrides=list(overrides),
            overrides_str=" ".join(overrides) or "defaults",
            model=spec.model.name,
            model_chosen_by=spec.model.chosen_by,
            dtype=perf.dtype.value,
            compile=perf.compile,
            compile_mode=perf.compile_mode,
            attention=perf.attention.value,
            ac=perf.ac.value,
            **{  # a policy's own key where the policy reads it (AC_KEYS), else null
                key: _plain(getattr(perf, key)) if perf.ac is policy else None
                for key, policy in AC_KEYS.items()
            },
            offload=perf.offload.value,
            activation_checkpointing=perf.activation_checkpointing,
            fp8=perf.fp8.value,
            loss_kind=perf.loss.value,
            loss_chunk=perf.loss_chunk if perf.loss.value == "chunked" else None,
            dist_strategy=spec.dist.strategy.value,
            reshard_after_forward=(
                spec.dist.reshard_after_forward if spec.dist.strategy.value == "fsdp2" else None
            ),
            optimizer=(spec.optimizer.build or {}).get("_target_") or spec.optimizer.name,
            # from_model: the model's method picks its flags, impl is none of its
            optimizer_impl=None
            if spec.optimizer.name == "from_model"
            else spec.optimizer.impl.value,
            batch_size=perf.batch_size,
            block_size=spec.model.block_size,
            grad_accum=perf.grad_accum,
            warmup_steps=spec.bench.warmup_steps,
            job_dir=job_dir,
            point_id=point_id,
            measured_config=measured,
        )


def _plain(value):
    """An Enum's value, any other value as it is."""
    return getattr(value, "value", value)
