"""Activation checkpointing as a policy (perf.ac, perf.offload; nanogpt/train/checkpoint_rules.py,
nanogpt/train/checkpointing.py): every policy trains the built-in GPT and a nanoGPT-style user
model to the same losses as none; what each keeps orders the peaks none >= selective >= every >=
full, in the allocator (exact: the profiler's memory events) and in a real sweep's peak RSS; the
estimate's activation term is within its stated error of the allocator's peak; and the keys'
refusals are one line each, exit 2."""

from __future__ import annotations

import pandas as pd
import pytest
import torch

from nanogpt.analysis.store import read_result
from nanogpt.config.spec import Ac, AcPolicy, ModelConfig, Offload, PerfConfig, RunSpec
from nanogpt.train.checkpoint_rules import ESTIMATE_ERROR_CPU
from nanogpt.train.distributed import World
from nanogpt.train.memory_estimate import estimate_of
from nanogpt.train.trainer import build_model, build_trainer

from .conftest import run_cli, with_micro
from .test_memory_estimate import allocator_peak

# nanoGPT's model.py as a user keeps it (Karpathy's: transformer.h, SDPA, GELU MLP, tied head),
# trimmed to what a training step runs; no hooks of the runner's.
NANOGPT = """
import math
import torch
import torch.nn as nn
import torch.nn.functional as F
from dataclasses import dataclass


@dataclass
class GPTConfig:  # the sizes the runner passes (model.build.config)
    block_size: int; vocab_size: int; n_layer: int; n_head: int; n_embd: int


class CausalSelfAttention(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_attn = nn.Linear(config.n_embd, 3 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(config.n_embd, config.n_embd, bias=False)
        self.n_head, self.n_embd = config.n_head, config.n_embd

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class MLP(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.c_fc = nn.Linear(config.n_embd, 4 * config.n_embd, bias=False)
        self.c_proj = nn.Linear(4 * config.n_embd, config.n_embd, bias=False)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x)))


class Block(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.attn = CausalSelfAttention(config)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = MLP(config)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(config.vocab_size, config.n_embd),
            wpe=nn.Embedding(config.block_size, config.n_embd),
            h=nn.ModuleList([Block(config) for _ in range(config.n_layer)]),
            ln_f=nn.LayerNorm(config.n_embd),
        ))
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.transformer.wte.weight = self.lm_head.weight

    def forward(self, idx, targets=None):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


class HookedGPT(GPT):
    # The same model with the runner's activation_memory hook (docs/models.md), as a user who
    # keeps a GPT-2 block may write it: the built-in GPT's formula for its shape.
    def activation_memory(self, batch_size, seq_len, dtype, activation_checkpointing, compiled):
        from nanogpt.train.gpt import activation_memory_of

        c = self.config
        return activation_memory_of(
            n_layer=c.n_layer, n_head=c.n_head, n_embd=c.n_embd, vocab_size=c.vocab_size,
            batch_size=batch_size, seq_len=seq_len, act_bytes=dtype.itemsize, attention="auto",
            activation_checkpointing=activation_checkpointing, compiled=compiled,
        )
"""
BUILD = [
    "model.build._target_=nanogpt_user.GPT",
    "model.build.config._target_=nanogpt_user.GPTConfig",
    "model.build.config.vocab_size=${model.vocab_size}",
    "model.build.config.block_size=${model.block_size}",
    "model.build.config.n_layer=${model.n_layer}",
    "model.build.config.n_head=${model.n_head}",
    "model.build.config.n_embd=${model.n_embd}",
]
# Wide enough that the blocks' activations, not the logits or the process, make the peak.
SHAPE = dict(n_layer=4, n_head=4, n_embd=128, block_size=128, vocab_size=256)
BATCH = 8
POLICIES = {  # label: perf keys; in the order their peaks must fall
    "none": {"ac": Ac.none},
    "selective": {"ac": Ac.selective},
    "every": {"ac": Ac.every},
    "full": {"ac": Ac.full},
}


@pytest.fixture(scope="module")
def user_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("nanogpt_user")
    (root / "nanogpt_user.py").write_text(NANOGPT)
    return root


def _spec(user_dir, model: str, **perf) -> RunSpec:
    build = {}
    if model != "gpt":  # user: nanoGPT's GPT; hooked: the same with activation_memory
        build = {
            "_target_": "nanogpt_user.HookedGPT" if model == "hooked" else "nanogpt_user.GPT",
            "config": {"_target_": "nanogpt_user.GPTConfig", **SHAPE},
        }
    return RunSpec(
        model=ModelConfig(**SHAPE, build=build, code_dir=str(user_dir)),
        perf=PerfConfig(batch_size=BATCH, **perf),
    )


def _step_peak_and_losses(spec: RunSpec) -> tuple[int, list[float], int]:
    """The allocator's peak over one forward+backward (above the model's own tensors), the
    losses of three optimizer steps, and the estimate's activations + logits."""
    trainer = build_trainer(spec, torch.device("cpu"), World())
    x, y = trainer.source.next_batch()

    def forward_backward():
        _, loss = trainer.model(x, y)
        loss.backward()

    peak = allocator_peak(forward_backward)
    trainer.optimizer.zero_grad(set_to_none=True)
    losses = [trainer.step().item() for _ in range(3)]
    estimate = estimate_of(spec, trainer.raw_model, 1, "ddp")
    return peak, losses, estimate


@pytest.mark.parametrize("model", ["gpt", "user", "hooked"])
def test_each_policy_trains_alike_and_keeps_less_in_order(user_dir, model):
    torch.set_num_threads(1)
    seen = {}
    for label, keys in POLICIES.items():
        seen[label] = _step_peak_and_losses(_spec(user_dir, model, **keys))
    none_losses = seen["none"][1]
    for label, (_, losses, _) in seen.items():  # recompute is the same arithmetic again
        assert losses == pytest.approx(none_losses, rel=1e-5), label
    peaks = [seen[label][0] for label in POLICIES]
    assert peaks == sorted(peaks, reverse=True), dict(zip(POLICIES, peaks, strict=True))
    assert peaks[-1] < 0.6 * peaks[0]  # full keeps each block's input alone: far less
    if model == "user":  # no activation_memory hook: no term, the reason said
        assert all(seen[label][2]["activations"] is None for label in POLICIES)
        assert "no hook" in seen["none"][2]["note"]
        return
    for label, (peak, _, estimate) in seen.items():
        # the activation term and the logits: what a forward+backward holds beyond the model
        term = estimate["activations"] + estimate["logits"]
        assert abs(term / peak - 1) <= ESTIMATE_ERROR_CPU, (label, term, peak)
        assert estimate["activations_rule"]


def test_selective_keeps_what_its_policy_names(user_dir):
    """attention's policy keeps attention's outputs alone, so it holds less than matmuls'
    (which keeps every matmul's too), and more than full (its block inputs alone)."""
    torch.set_num_threads(1)
    peaks = {
        policy: _step_peak_and_losses(_spec(user_dir, "gpt", ac=Ac.selective, ac_policy=policy))[0]
        for policy in AcPolicy
    }
    full = _step_peak_and_losses(_spec(user_dir, "gpt", ac=Ac.full))[0]
    assert peaks[AcPolicy.matmuls] > peaks[AcPolicy.attention] > full


def test_every_nth_block_is_wrapped_in_a_users_model(user_dir):
    spec = _spec(user_dir, "user", ac=Ac.every, ac_every=3)
    model = build_model(spec)
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

    wrapped = [isinstance(b, CheckpointWrapper) for b in model.blocks]
    assert wrapped == [True, False, False, True]


def test_the_old_switch_is_read_as_full_with_one_line_and_one_point(tmp_path):
    from nanogpt.record.identity import point_id_of
    from nanogpt.train.checkpoint_rules import normalized

    perf, note = normalized(PerfConfig(activation_checkpointing=True))
    assert perf.ac is Ac.full and "perf.ac" in note and "\n" not in note
    named, quiet = normalized(PerfConfig(ac=Ac.full))
    assert quiet is None and named == perf
    # one point, named either way, with the id the switch gave it before perf.ac
    assert point_id_of(RunSpec(perf=perf)) == point_id_of(RunSpec(perf=named))
    assert point_id_of(RunSpec(perf=PerfConfig(ac=Ac.selective))) != point_id_of(RunSpec())


@pytest.mark.slow
@pytest.mark.parametrize(
    ("overrides", "line"),
    [
        (["perf.ac=budget"], "error: perf.ac: budget is Inductor's min-cut"),
        (["perf.offload=cpu"], "error: perf.offload: cpu copies kept tensors from a GPU"),
        (["perf.ac=every", "perf.ac_every=0"], "error: perf.ac_every: is 0"),
    ],
)
def test_a_policy_that_cannot_run_is_refused_in_one_line(tmp_path, overrides, line):
    proc = run_cli(*with_micro(overrides), f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    said = [ln for ln in (proc.stdout + proc.stderr).splitlines() if ln.startswith("error:")]
    assert len(said) == 1 and said[0].startswith(line), proc.stderr[-2000:]
    assert not (tmp_path / "run" / "result.json").exists()


def _counted(config) -> tuple[float, dict]:
    """One forward+backward of a sequence, FLOPs a token, counted by torch on a meta copy
    (attention is counted on meta: on a CPU the counter reads it 0), checkpointing as set."""
    from torch.utils.flop_counter import FlopCounterMode

    from nanogpt.train.gpt import GPT

    with torch.device("meta"):
        model = GPT(config)
        idx = torch.zeros(1, config.block_size, dtype=torch.long)
    with FlopCounterMode(display=False) as counter:
        model(idx, idx)[1].backward()
    return counter.get_total_flops() / config.block_size, model.flops_per_token(config.block_size)


@pytest.mark.parametrize(
    ("ac", "ac_policy"),
    [("full", "matmuls"), ("every", "matmuls"), ("selective", "matmuls")],
)
def test_hfus_recompute_is_what_torch_runs_again(ac, ac_policy):
    """The GPT's hardware FLOPs add what the policy runs again in backward, as torch's counter
    counts it: full and every the blocks' forward but the MLP's output projection (torch's
    checkpoint stops early: no backward reads that output), selective's matmuls policy none of
    the matmuls. (attention's policy is left out: on meta SDPA is decomposed into bmm, which
    its policy does not keep, so the count there recomputes attention that a CPU or GPU keeps.)"""
    from nanogpt.train.gpt import GPTConfig

    shape = dict(block_size=32, vocab_size=64, n_layer=4, n_head=2, n_embd=32, bias=False)
    plain, _ = _counted(GPTConfig(**shape))
    counted, hook = _counted(GPTConfig(**shape, ac=ac, ac_policy=ac_policy))
    recompute = hook["hardware"] - hook["model"]
    assert recompute == pytest.approx(counted - plain, rel=0.01, abs=1)
    assert (recompute > 0) == (ac != "selective")


def test_budget_has_no_recompute_count_and_hfu_stays_null():
    from nanogpt.train.gpt import GPT, GPTConfig

    with torch.device("meta"):
        figures = GPT(GPTConfig(n_layer=2, ac="budget")).flops_per_token(1024)
    assert figures["hardware"] is None and figures["model"] > 0


def test_each_policys_term_is_made_of_the_models_two():
    """The runner asks a model's activation_memory hook twice (off, on: the GPT's or a user's)
    and makes each policy's term of the two, its source said."""
    from nanogpt.train.checkpoint_rules import activations

    none, full = 4000, 1300  # L=4: a block 1000, its input 75
    rules = {}
    for label, keys in POLICIES.items():
        kept, rule = activations(4, none, full, PerfConfig(**keys))
        rules[label] = kept
        assert rule
    assert rules["none"] == none and rules["full"] == full
    # every(2): blocks 0 and 2 keep their inputs, 1 and 3 all; block 2 recomputed on top of 0-1
    assert rules["every"] == 75 + 1000 + 75 + 1000
    assert rules["none"] > rules["selective"] > rules["every"] > rules["full"]
    offloaded, rule = activations(4, none, full, PerfConfig(offload=Offload.cpu))
    assert offloaded == 1000 and "host memory" in rule


@pytest.mark.slow
def test_the_search_chooses_the_policy_that_fits_and_best_yaml_holds_it(tmp_path):
    """hydra/sweeper=tune over perf.ac: with a budget between full's estimate and none's, the
    estimate prunes none before it runs (the fit follows the policy), and the answer, in
    best.yaml, is the policy that fits."""
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend.compose import to_spec
    from nanogpt.frontend.presets import CONF_DIR
    from nanogpt.tune import fit

    shape = ["model.n_layer=2", "model.n_embd=64", "model.block_size=64", "perf.batch_size=8"]
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        estimates = {
            ac: fit.estimate_bytes(
                to_spec(
                    compose(config_name="config", overrides=with_micro([*shape, f"perf.ac={ac}"]))
                )
            )
            for ac in ("none", "full")
        }
    assert estimates["full"] < estimates["none"]
    budget = (estimates["full"] + estimates["none"]) / 2 / 2**30
    sweep_dir = tmp_path / "sweep"
    proc = run_cli(
        "-m",
        "hydra/sweeper=tune",
        *with_micro([*shape, "perf.ac=choice(none,full)"]),
        f"bench.max_batch_memory_gib={budget}",
        "hydra.sweeper.n_trials=2",
        "hydra.sweeper.leaders=1",
        "hydra.sweeper.finalists=1",
        "hydra.sweeper.repeats=1",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    best = (sweep_dir / "best.yaml").read_text()
    assert "perf.ac=full" in best, best
    assert "pruned before running" in (sweep_dir / "tune.md").read_text()


@pytest.fixture(scope="module")
def policy_sweep(tmp_path_factory):
    """+sweep=memory_time_cpu for real, once for the module, at SHAPE and one batch (4 points,
    each its own process), with the largest batch each policy fits in 0.04 GiB: glibc returns a
    freed block to the OS only above its mmap threshold, which it raises as blocks are freed, so
    a step's transient activations would stay resident; fixed at 64 KiB (the environment's
    MALLOC_MMAP_THRESHOLD_), every activation is its own mapping and the RSS a step holds is
    what it held at once."""
    root = tmp_path_factory.mktemp("policies")
    sweep_dir = root / "sweep"
    shape = [f"model.{k}={v}" for k, v in SHAPE.items()]
    proc = run_cli(
        "-m",
        "+sweep=memory_time_cpu",
        *with_micro([*shape, f"perf.batch_size={BATCH}", "logger.log_interval=1"]),
        "bench.measure_steps=3",
        "bench.find_max_batch=true",
        "bench.max_batch_memory_gib=0.04",
        f"hydra.sweep.dir={sweep_dir}",
        cwd=root,
        env={"MALLOC_MMAP_THRESHOLD_": "65536", "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = {}
    for result in sweep_dir.glob("*/result.json"):
        record = read_result(result)
        records[record["ac"]] = record
    return proc, sweep_dir, records


@pytest.mark.slow
def test_a_sweep_of_the_policies_holds_less_a_step_in_their_order(policy_sweep):
    _, _, records = policy_sweep
    assert sorted(records) == sorted(POLICIES)
    assert all(r["status"] == "ok" for r in records.values())
    held = [records[label]["mem_step_rss_bytes"] for label in POLICIES]
    assert held == sorted(held, reverse=True), dict(zip(POLICIES, held, strict=True))
    losses = [records[label]["loss_first"] for label in POLICIES]
    assert losses == pytest.approx([losses[0]] * len(losses), rel=1e-5)
    # find_max_batch probes the model the point asks for, its policy too: in one budget, a
    # policy that keeps less fits more sequences (real out-of-memory errors under RLIMIT_AS)
    found = [records[label]["max_batch_size"] for label in POLICIES]
    searches = {label: records[label]["max_batch_search"] for label in POLICIES}
    assert None not in found, searches  # each search ended with an answer, or says why not
    assert found == sorted(found) and found[0] < found[-1], dict(zip(POLICIES, found, strict=True))


@pytest.mark.slow
def test_the_cpu_preset_tables_plots_and_names_the_policy_buying_most_memory(policy_sweep):
    """Each policy beside its twin that keeps everything: the table's columns and the console's
    "memory saved ÷ time paid", memory_time.png drawn, one line naming the policy."""
    proc, sweep_dir, _ = policy_sweep
    table = pd.read_csv(sweep_dir / "summary.csv")
    assert set(table["perf.ac"]) == set(POLICIES)
    none = table["perf.ac"] == "none"
    assert table.loc[none, "ac_memory_saved_bytes"].isna().all()  # the twin has no twin
    policies = table[~none]
    assert policies["ac_memory_saved_bytes"].gt(0).all()  # each held less than none
    assert policies["ac_time_paid_pct"].notna().all()
    # the ratio is saved MiB over paid percent, where time was paid
    # (summary.csv leaves out a column empty in every row: where no policy paid any time)
    paid = policies[policies["ac_time_paid_pct"] > 0]
    ratio = paid["ac_memory_saved_bytes"] / 2**20 / paid["ac_time_paid_pct"]
    per_pct = paid.get("ac_mib_per_pct", pd.Series(dtype="float64"))
    assert ratio.to_list() == pytest.approx(per_pct.to_list())
    assert "memory saved ÷ time paid" in proc.stdout
    (line,) = [ln for ln in proc.stdout.splitlines() if ln.startswith("most memory a percent")]
    named, against = line.split("; ", 1)  # the policy, what it saved; then against its twin
    assert "perf.ac=" in named and "saves" in named and "perf.ac=none" not in named
    assert "the tokens/s of perf.ac=none [" in against
    assert (sweep_dir / "memory_time.png").stat().st_size > 10_000


def test_the_old_switchs_line_is_said_once_a_process_and_not_by_a_sweeps_jobs(caplog):
    from hydra import compose, initialize_config_dir

    from nanogpt.frontend import compose as composing
    from nanogpt.frontend.presets import CONF_DIR

    composing._SAID.clear()
    with initialize_config_dir(config_dir=CONF_DIR, version_base="1.3"):
        cfg = compose(
            config_name="config", overrides=with_micro(["perf.activation_checkpointing=true"])
        )
        job = composing.to_spec(cfg, say=False)  # a multirun's job: its sweep said it
        assert job.perf.ac is Ac.full and not caplog.records
        specs = [composing.to_spec(cfg) for _ in range(3)]  # the sweep's points, checked
    said = [
        r.getMessage() for r in caplog.records if "perf.activation_checkpointing" in r.getMessage()
    ]
    assert len(said) == 1 and said[0].startswith("perf.activation_checkpointing=true is read as")
    assert all(spec.perf.ac is Ac.full for spec in specs)


def test_a_policys_own_key_under_another_policy_is_no_part_of_the_point():
    from nanogpt.record.identity import point_id_of

    full = point_id_of(RunSpec(perf=PerfConfig(ac=Ac.full, activation_checkpointing=True)))
    unread = PerfConfig(ac=Ac.full, activation_checkpointing=True, ac_every=3, ac_budget=0.1)
    assert point_id_of(RunSpec(perf=unread)) == full
    every = [point_id_of(RunSpec(perf=PerfConfig(ac=Ac.every, ac_every=n))) for n in (2, 3)]
    assert every[0] != every[1]
