"""What the entry points share about Hydra: the schema it composes against (with the presets of
frontend/presets.py), the plain validated RunSpec a composed config becomes, and one line for
Hydra's own
errors.

Hydra is known here and in the entry points (run, calibrate, report, callbacks) only: from
`to_spec` on, the library sees plain dataclasses.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Callable
from pathlib import Path

from hydra import compose
from hydra.core.config_store import ConfigStore
from hydra.errors import CompactHydraException, MissingConfigException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from nanogpt.analysis.baseline import BaselineError, named_point
from nanogpt.config.errors import ConfigError
from nanogpt.config.protocol import CPU_BENCH, CUDA_BENCH
from nanogpt.config.spec import RunSpec
from nanogpt.frontend.presets import CONF_DIR, register_presets
from nanogpt.hardware.device_support import parse_device
from nanogpt.hardware.slots import visible_gpus
from nanogpt.train.checkpoint_rules import normalized
from nanogpt.validate import check, check_nodes

log = logging.getLogger(__name__)

OVERRIDE_GRAMMAR = "https://hydra.cc/docs/advanced/override_grammar/basic/"

# conf/config.yaml's defaults list starts with this schema: a wrong type or an unknown key
# fails at composition, naming the key.
# optimizer.build is a Hydra target node ({_target_: CLASS, its arguments}): the schema declares
# it, and its own keys are open, so `optimizer.build._target_=torch.optim.Adagrad` and
# `optimizer.build.lr_decay=0.01` work as typed, without `+` (optim_rules.check_build checks
# them against the class). Everywhere else a key the schema lacks is refused.
BASE_CONFIG = OmegaConf.structured(RunSpec)
OmegaConf.set_struct(BASE_CONFIG.optimizer.build, False)
OmegaConf.set_struct(BASE_CONFIG.model.build, False)  # model.build._target_=mymod.GPT, no +
OmegaConf.set_struct(BASE_CONFIG.optimizer.args, False)  # from_model's: optimizer.args.eps=1e-8
ConfigStore.instance().store(name="base_config", node=BASE_CONFIG)
register_presets()  # sweeps/ as the `sweep` group: +sweep=NAME
PRINT_CONFIG = "`python -m nanogpt.run --cfg job --resolve ...` prints every key and its value"

# Defaults by device (conf/model/auto.yaml, conf/perf/default.yaml): on CUDA what GPU users
# measure, nanoGPT bench.py's GPT-2 124M at block 1024 and batch 12; elsewhere nano-1k, a small
# model whose FLOPs split between blocks and head as a GPT's do (conf/model/nano-1k.yaml).
DEVICE_DEFAULTS = {
    True: (
        "gpt2",
        12,
        "nanoGPT bench.py's configuration: GPT-2 124M without biases, block 1024, batch 12",
    ),
    False: (
        "nano-1k",
        8,
        "a small model (GPT-2 takes seconds a step on a CPU) with a 1,024-token vocabulary, "
        "most of its FLOPs in the blocks as in a GPT",
    ),
}


def _on_cuda(device: str) -> bool:
    """Whether bench.device means a CUDA GPU (auto: one is available)."""
    if device != "auto":
        return device.startswith("cuda")
    import torch  # here only: a sweep on a named device starts without torch (validate/)

    return torch.cuda.is_available()


@functools.cache
def _model_preset(name: str) -> DictConfig:
    return OmegaConf.load(Path(CONF_DIR) / "model" / f"{name}.yaml")


def _device_model(key: str, device: str):
    name, _, why = DEVICE_DEFAULTS[_on_cuda(device)]
    if key == "chosen_by":
        return f"model=auto on {'cuda' if _on_cuda(device) else device}: {name}, {why}"
    return _model_preset(name)[key]


OmegaConf.register_new_resolver("device_model", _device_model, replace=True)
OmegaConf.register_new_resolver(
    "device_batch_size", lambda device: DEVICE_DEFAULTS[_on_cuda(device)][1], replace=True
)
# The measurement protocol's time-based keys (nanogpt/config/protocol.py says why these numbers).
OmegaConf.register_new_resolver(
    "device_bench",
    lambda key, device: (CUDA_BENCH if _on_cuda(device) else CPU_BENCH)[key],
    replace=True,
)


# bench.repeats: one run a point, or five with a target loss (a time to loss is a distribution
# over seeds: docs/time_to_loss.md).
OmegaConf.register_new_resolver(
    "target_repeats", lambda target: 1 if target is None else 5, replace=True
)


def to_spec(cfg: DictConfig, here: bool = True, say: bool = True) -> RunSpec:
    """The plain, validated spec of a composed config (raises ConfigError). here=False: it runs
    on another machine, so this one's devices are not asked (validate.check). say=False: a
    multirun's job, whose sweep said at its start what composing says (`with_ac_policy`)."""
    spec = with_code_dir(fixed_global_batch(with_ac_policy(OmegaConf.to_object(cfg), say)))
    check(spec, here)
    return spec


def with_ac_policy(spec: RunSpec, say: bool = True) -> RunSpec:
    """perf.ac as the keys ask for it, the old switch read (checkpoint_rules.normalized): one
    line names the new key, once a process (a sweep's: at its start, as its points are checked;
    its jobs, say=False, say nothing)."""
    perf, note = normalized(spec.perf)
    if note is not None and say and note not in _SAID:
        _SAID.add(note)
        log.warning(note)
    return dataclasses.replace(spec, perf=perf)


_SAID: set[str] = set()  # the lines with_ac_policy has said in this process


def with_code_dir(spec: RunSpec) -> RunSpec:
    """model.build's and optimizer.build's modules are found where the command runs (`python
    -m` puts that directory first on sys.path): the directory travels in the spec to every
    process that builds them (a forked child, a fresh interpreter, a parallel slot, a cluster
    node)."""
    model = spec.model
    if not model.build and not spec.optimizer.build:
        return spec
    if not model.code_dir:
        model = dataclasses.replace(model, code_dir=os.getcwd())
    if model.build and model.chosen_by:  # model=auto chose a built-in GPT's shape, replaced
        target = str(model.build.get("_target_"))
        model = dataclasses.replace(model, name=target, chosen_by=None)
    return dataclasses.replace(spec, model=model)


def fixed_global_batch(spec: RunSpec) -> RunSpec:
    """With tune.tokens_per_step=N, perf.grad_accum is what makes N tokens per optimizer step
    at this micro-batch (x model.block_size x dist.nproc); a micro-batch that does not divide N
    is refused, naming the key."""
    n = spec.tune.tokens_per_step
    if n is None:
        return spec
    per_micro = spec.perf.batch_size * spec.model.block_size * spec.dist.nproc
    if n <= 0 or n % per_micro:
        raise ConfigError(
            "tune.tokens_per_step",
            f"is {n}, not a positive multiple of perf.batch_size x model.block_size x "
            f"dist.nproc = {spec.perf.batch_size} x {spec.model.block_size} x "
            f"{spec.dist.nproc} = {per_micro}",
            f"use a multiple of {per_micro}, or another perf.batch_size",
        )
    perf = dataclasses.replace(spec.perf, grad_accum=n // per_micro)
    return dataclasses.replace(spec, perf=perf)


def in_place(spec: RunSpec) -> RunSpec:
    """The spec of a point measured by ranks already running (run.as_rank): in rank 0's
    process, with no child to isolate it in. The SLURM launcher records such a point's job the
    same way."""
    return dataclasses.replace(spec, bench=dataclasses.replace(spec.bench, isolate=False))


def launcher_name(cfg: DictConfig) -> str:
    """The class name of the point's Hydra launcher (SlurmLauncher, BasicLauncher, ...)."""
    launcher = cfg.get("hydra", {}).get("launcher", {})
    return str(launcher.get("_target_", "")).rpartition(".")[2]


def check_launcher_nodes(nodes: int, launcher: str) -> None:
    """dist.nodes > 1 needs a launcher that starts ranks on several machines: SLURM's."""
    if nodes > 1 and launcher != "SlurmLauncher":
        raise ConfigError(
            "dist.nodes",
            f"is {nodes}, but {launcher or 'this launcher'} runs a point's ranks on this one "
            "machine",
            "use hydra/launcher=slurm for a point across nodes, or set dist.nodes=1",
        )


def job_shape(cfg: DictConfig) -> tuple[int, int]:
    """A point's cluster job (hydra/launcher=slurm): (nodes, tasks a node), from dist.nodes and
    dist.nproc, the point's ranks on all its nodes, every task a rank. hydra.launcher.nodes and
    tasks_per_node left at 1 (conf/hydra/launcher/slurm.yaml) are set from them; set by hand to
    anything else they must agree, or the point is refused naming both keys."""
    nodes, nproc = int(cfg.dist.nodes), int(cfg.dist.nproc)
    check_nodes(nproc, nodes)
    per_node = nproc // nodes
    launcher = cfg.get("hydra", {}).get("launcher", {})
    for key, wanted, source in (
        ("nodes", nodes, f"dist.nodes={nodes}"),
        ("tasks_per_node", per_node, f"dist.nproc={nproc} over dist.nodes={nodes}"),
    ):
        asked = launcher.get(key, 1)
        if asked not in (1, wanted):
            raise ConfigError(
                f"hydra.launcher.{key}",
                f"is {asked}, but {source} makes it {wanted}",
                f"drop hydra.launcher.{key} (dist.nproc and dist.nodes set it) or set it to "
                f"{wanted}",
            )
    return nodes, per_node


def job_gpus(cfg: DictConfig) -> int | None:
    """The GPUs a point's cluster job asks for on each of its nodes (hydra/launcher=slurm),
    from the point's composed config, hydra node and all.

    hydra.launcher.gpus_per_node left null (conf/hydra/launcher/slurm.yaml): a GPU per rank on
    the node (dist.nproc / dist.nodes) for a point on CUDA (bench.device cuda, cuda:N or auto),
    none asked for one on the CPU. Set, it is kept; but fewer GPUs than a CUDA point's ranks on
    a node is refused, naming the key: each job would otherwise queue, start, and be refused by
    its own device check (validate.check_gpus_per_point), point after point. GPUs asked another
    way (gres, gpus_per_task), or a launcher without the key, are left alone."""
    launcher = cfg.get("hydra", {}).get("launcher", {})
    if "gpus_per_node" not in launcher or launcher.get("gres") or launcher.get("gpus_per_task"):
        return launcher.get("gpus_per_node")
    asked, device = launcher.gpus_per_node, str(cfg.bench.device)
    nodes, per_node = job_shape(cfg)
    # the point measures on a GPU: a CUDA device, or auto unless no GPU is asked for (auto then
    # measures on the node's CPU, with no GPU to match)
    on_gpu = device.startswith("cuda") or (device == "auto" and asked != 0)
    if asked is None:
        return per_node if on_gpu else None
    if on_gpu and asked < per_node:
        key = "hydra.launcher.gpus_per_node"
        ranks = f"dist.nproc={per_node} ranks"
        if nodes > 1:
            ranks = f"dist.nproc={cfg.dist.nproc} over dist.nodes={nodes}, {per_node} ranks a node,"
        raise ConfigError(
            key,
            f"is {asked}, but {ranks} on {device} need a GPU each",
            f"set {key}={per_node}, or leave it unset (null: a GPU per rank)",
        )
    return asked


def check_parallel_ranks(cfg: DictConfig) -> None:
    """hydra/launcher=parallel gives a CUDA point one GPU, its slot's (CUDA_VISIBLE_DEVICES):
    a point of dist.nproc > 1 ranks there would pass the sweep's check, which sees every GPU,
    and be refused by each slot's own device check after the sweep began. Refused here, before
    anything runs, naming both keys. Whether the point trains on CUDA is answered as the
    launcher plans its slots but without CUDA (slots.visible_gpus: CUDA_VISIBLE_DEVICES, else
    nvidia-smi, for `auto`): torch.cuda.is_available() would start CUDA in the sweep's
    process, which a fork then inherits broken. With hydra.launcher.gpus=false a point's slot
    is a core set that sees every GPU, and its ranks each find one."""
    launcher = cfg.get("hydra", {}).get("launcher", {})
    parallel = str(launcher.get("_target_", "")).endswith(".ParallelLauncher")
    nproc, device = int(cfg.dist.nproc), str(cfg.bench.device)
    if not parallel or not launcher.get("gpus", True) or nproc < 2:
        return
    place = parse_device(device)
    if (place is None or place.type != "cuda") and not (device == "auto" and visible_gpus()):
        return
    raise ConfigError(
        "dist.nproc",
        f"is {nproc}, but hydra/launcher=parallel gives each point on {device} one GPU (its "
        "slot's), and its ranks need one each",
        "run multi-rank points without hydra/launcher=parallel, or set dist.nproc=1",
    )


def check_points(
    points: list[list[str]],
    baseline: str | None,
    here: bool,
    compose_point: Callable[[list[str]], DictConfig] | None = None,
) -> None:
    """Compose and validate every point before the first is measured: a bad point stops the
    sweep at once, naming the point and the key (ConfigError). report.baseline must name one.
    here=False: the points run elsewhere, so this machine's devices are not asked.
    `compose_point(overrides)`: the point's config as its job will get it (the multirun's own
    config loader, hydra node and all); by default Hydra's compose API."""
    for number, point in enumerate(points, 1):
        try:
            if compose_point is None:
                to_spec(compose(config_name="config", overrides=point), here)
            else:
                cfg = compose_point(point)
                check_launcher_nodes(int(cfg.dist.nodes), launcher_name(cfg))
                if not here:  # a cluster's job: it asks for a GPU per rank, checked at submit
                    job_gpus(cfg)
                check_parallel_ranks(cfg)
                with open_dict(cfg):
                    cfg.pop("hydra", None)  # the job's settings: no part of the spec
                to_spec(cfg, here)
        except ConfigError as err:
            raise ConfigError(_point(number, points), str(err)) from None
        except (CompactHydraException, OmegaConfBaseException) as err:
            raise ConfigError(_point(number, points), hydra_error_line(err)) from None
    if not baseline:
        return
    try:
        found = named_point(baseline, points, points)
    except BaselineError as err:
        raise ConfigError("report.baseline", err.problem, err.fix) from None
    if found is None:
        raise ConfigError(
            "report.baseline",
            f"'{baseline}' is in none of the sweep's {len(points)} points",
            "use one point's overrides, e.g. perf.dtype=fp32",
        )


def _point(number: int, points: list[list[str]]) -> str:
    return f"point {number} of {len(points)} ({' '.join(points[number - 1]) or 'defaults'})"


def hydra_error_line(err: Exception) -> str:
    """One sentence for Hydra's own config errors: the override or key, the problem, the fix."""
    missing = getattr(err, "missing_cfg_file", None) or ""
    if isinstance(err, MissingConfigException) and "submitit" in missing:
        # conf/hydra/launcher/{local,slurm}.yaml build on the plugin's own configs
        return (
            "hydra/launcher: the local and slurm launchers need Hydra's submitit plugin; "
            "install it with `pip install -e '.[cluster]'` (hydra-submitit-launcher)."
        )
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options:
        group, _, option = err.missing_cfg_file.rpartition("/")
        return f"{group}={option}: no such option; use one of {', '.join(err.options)}."
    if isinstance(err, OverrideParseException):
        lines = str(err).splitlines()
        problem = next((x for x in lines if x and not x.startswith(("Error parsing", "See "))), "")
        return f"{err.override}: cannot be parsed ({problem}); see {OVERRIDE_GRAMMAR}"
    cause = err.__cause__
    if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
        problem = str(cause.msg).splitlines()[0]
        return f"{cause.full_key}: {problem}; {PRINT_CONFIG}."
    # Hydra's own sentences, its fix included ("To append to your default list use +sweep=...")
    return " ".join(line.strip() for line in str(err).strip().splitlines() if line.strip())
