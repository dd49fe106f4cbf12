"""The diagnosis: where a step's time goes, the bottleneck verdict and the hint.

Real parts: real trainers profiled by the real torch.profiler, points built to be host-bound (a
tiny model of many small operators) and device-bound (large matmuls); a real sweep of
`python -m nanogpt.run -m` with W&B offline, its table, recommendation and plot. The verdict and
hint rules are pure functions, checked on figures chosen to sit on either side of each rule.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import statistics
from types import SimpleNamespace

import pandas as pd
import pytest
import torch
from torch.autograd import DeviceType
from torch.autograd.profiler_util import FunctionEvent

from nanogpt.analysis import bottleneck as rules
from nanogpt.analysis import table as report
from nanogpt.analysis.bottleneck import Setting, judge
from nanogpt.analysis.store import read_result
from nanogpt.analysis.tidy import read_summary
from nanogpt.config.spec import Dtype, RunSpec
from nanogpt.hardware.cpu import matmul_emulated
from nanogpt.probes import diagnose, step_split
from nanogpt.publish.bottleneck_plot import KIND_PARTS, STEP_PARTS, bottleneck
from nanogpt.record import Diagnosis
from nanogpt.train.distributed import World
from nanogpt.train.trainer import build_trainer

from .conftest import SHAKESPEARE, needs_shared

# make test-compat runs this file on the oldest supported torch: its answers depend on torch's
# version (Dynamo's graphs and counters, FlopCounterMode, the profiler's events, torch.distributed)
pytestmark = pytest.mark.compat

SHARES = (
    "diag_step_device_frac",
    "diag_step_comm_frac",
    "diag_step_data_frac",
    "diag_step_host_frac",
)
KIND_SHARES = tuple(f"diag_device_time_{kind}_frac" for kind in rules.KINDS)

# ------------------------------------------------------------------------------------------
# Interval arithmetic (kernels on several streams overlap)
# ------------------------------------------------------------------------------------------


def test_union_and_difference_of_intervals_match_a_count_of_covered_units():
    rng = random.Random(0)
    for _ in range(300):
        a = [(s, s + rng.randint(1, 12)) for s in rng.sample(range(60), rng.randint(0, 8))]
        b = [(s, s + rng.randint(1, 12)) for s in rng.sample(range(60), rng.randint(0, 8))]
        covered_a = {t for start, end in a for t in range(start, end)}
        covered_b = {t for start, end in b for t in range(start, end)}
        merged_a, merged_b = step_split._merge(a), step_split._merge(b)
        assert step_split._length(merged_a) == len(covered_a)
        assert all(x[1] < y[0] for x, y in zip(merged_a, merged_a[1:], strict=False))
        assert step_split._length(step_split._minus(merged_a, merged_b)) == len(
            covered_a - covered_b
        )


def op(name: str, *callers: str) -> SimpleNamespace:
    """A profiled operator and its callers, innermost first, as the profiler's tree links them
    (names as CUDA runs record them: this machine has no GPU to record them)."""
    parent = op(*callers) if callers else None
    return SimpleNamespace(name=name, cpu_parent=parent)


@pytest.mark.parametrize(
    "name,launcher,kind",
    [
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", op("aten::mm"), "matmul"),
        ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopA_NTN", op("aten::addmm"), "matmul"),
        ("triton_tem_fused_mm_0", None, "matmul"),  # Inductor's matmul template
        ("aten::bmm", op("aten::_scaled_dot_product_attention_math"), "attention"),
        ("flash_fwd_kernel", op("aten::_flash_attention_forward"), "attention"),
        (
            "void at::native::vectorized_elementwise_kernel<4>",
            op("aten::mul_", "Optimizer.step#AdamW.step"),
            "optimizer",
        ),
        ("multi_tensor_apply_kernel", op("aten::_foreach_add_"), "optimizer"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", op("nccl:all_reduce"), "communication"),
        ("void at::native::vectorized_elementwise_kernel<4>", op("aten::add"), "elementwise"),
        ("triton_per_fused_native_layer_norm_0", None, "elementwise"),
        ("## Call CompiledFxGraph fa3x ##", op("CompiledFunction"), "elementwise"),
        ("Memcpy HtoD (Pageable -> Device)", None, "other"),
        ("aten::addmm", op("autograd::engine::evaluate_function: AddmmBackward0"), "matmul"),
    ],
)
def test_kinds_come_from_the_launching_operator_its_callers_or_the_name(name, launcher, kind):
    assert step_split._kind(name, launcher) == kind


# ------------------------------------------------------------------------------------------
# The CUDA branch, on torch's own FunctionEvents built as Kineto builds them on a GPU
# ------------------------------------------------------------------------------------------


# FunctionEvent's keywords differ across the torch this project supports (pyproject.toml): torch
# 2.11, the GPU machines', has no `linked_correlation_id` (pytorch/pytorch#177662 added it). An
# attribute this torch's constructor lacks is set afterwards, as restore_from_kineto sets it.
def torch_event(kind: type, **fields) -> FunctionEvent:
    """kind(**fields), the CUDA attributes its constructor does not take set on the event."""
    takes = inspect.signature(kind).parameters
    later = {k: fields.pop(k) for k in step_split.CUDA_ATTRIBUTES if k in fields and k not in takes}
    made = kind(**fields)
    for name, value in later.items():
        setattr(made, name, value)
    return made


def cuda_step(annotations: bool = True, kind: type = FunctionEvent) -> list[FunctionEvent]:
    """One diagnosed CUDA step of 1,000 us as the profiler lays it out: the step's range on the
    CPU, an aten::mm that launched a 200 us gemm (its runtime launch call linked to it), and,
    when `annotations`, the GPU-timeline shadow Kineto emits of each record_function range (of
    CUDA type, spanning the range's kernels and the idle time between them)."""

    def event(id, name, start, end, device=DeviceType.CPU, link=0, user=False):
        return torch_event(
            kind,
            id=id,
            name=name,
            thread=1,
            start_us=start,
            end_us=end,
            device_type=device,
            linked_correlation_id=link,
            is_user_annotation=user,
        )

    step = event(1, step_split.STEP_MARK, 0.0, 1000.0, user=True)
    mm = event(2, "aten::mm", 100.0, 150.0)
    launch = event(900, "cudaLaunchKernel", 120.0, 130.0, link=2)
    gemm = event(900, "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n", 200.0, 400.0, DeviceType.CUDA, 2)
    for child in (mm,):
        step.append_cpu_child(child)
        child.set_cpu_parent(step)
    mm.append_cpu_child(launch)
    launch.set_cpu_parent(mm)
    events = [step, mm, launch, gemm]
    if annotations:  # the step's shadow, and an optimizer range's over an idle stretch
        events.append(event(1, step_split.STEP_MARK, 10.0, 990.0, DeviceType.CUDA, 1, True))
        events.append(event(3, "Optimizer.step#AdamW.step", 600.0, 900.0, DeviceType.CUDA, 3, True))
    return events


def function_event_of_torch_2_11() -> type:
    """FunctionEvent as torch 2.11 defines it (the GPU machines' torch, which this CPU lacks):
    the same constructor less the `linked_correlation_id` keyword, its events without it."""
    signature = inspect.signature(FunctionEvent)
    kept = [p for p in signature.parameters.values() if p.name != "linked_correlation_id"]

    class FunctionEvent_2_11(FunctionEvent):
        def __init__(self, *args, **kwargs):
            if "linked_correlation_id" in kwargs:
                raise TypeError("unexpected keyword argument 'linked_correlation_id'")
            super().__init__(*args, **kwargs)
            if hasattr(self, "linked_correlation_id"):
                del self.linked_correlation_id

    FunctionEvent_2_11.__signature__ = signature.replace(parameters=kept)
    return FunctionEvent_2_11


def test_the_cuda_step_builds_on_a_torch_without_the_linked_correlation_id_keyword():
    old = function_event_of_torch_2_11()
    with pytest.raises(TypeError, match="linked_correlation_id"):  # what the test built before
        old(id=1, name="aten::mm", thread=1, start_us=0.0, end_us=1.0, linked_correlation_id=0)
    events = cuda_step(kind=old)
    assert {type(e) for e in events} == {old}
    assert step_split.split_step(events, cuda=True) == step_split.split_step(cuda_step(), cuda=True)


def test_user_annotations_on_the_gpu_timeline_are_not_kernels():
    split = step_split.split_step(cuda_step(), cuda=True)
    # The gemm alone computes: 200 of 1,000 us. Counting the step's shadow would make it 98 %.
    assert split["diag_step_device_frac"] == pytest.approx(0.2)
    assert split["diag_device_time_matmul_frac"] == pytest.approx(1.0)
    assert split["diag_device_time_other_frac"] == 0
    assert split["diag_ops_per_step"] == 1
    assert rules.verdict(Diagnosis(**split)) == "host-bound"
    # The check can fail: the same events with the shadows are what the defect counted.
    assert step_split.split_step(cuda_step(annotations=False), cuda=True) == split


def test_events_of_a_torch_without_the_cuda_attributes_are_null_with_the_reason():
    events = cuda_step()
    for e in events:
        del e.linked_correlation_id  # as torch 2.11 builds them (pytorch/pytorch#177662)
    with pytest.raises(step_split.ProfilerAttributeMissing, match="linked_correlation_id"):
        step_split.split_step(events, cuda=True)
    # The CPU branch needs neither attribute.
    assert step_split.split_step(events, cuda=False)["diag_step_device_frac"] is not None


# ------------------------------------------------------------------------------------------
# The CPU branch: a step shares its core with the rest of the machine
# ------------------------------------------------------------------------------------------


def cpu_steps(*add_us: float, extra: bool = False) -> list[FunctionEvent]:
    """CPU steps of 1,000 us as the profiler lays them out, one per entry of `add_us`, each the
    length of its aten::add (10 us when nothing else took the core): a view (the floor, 1 us),
    a 200 us mm, then the add, Python in the gaps. A longer add is a preemption inside it: the
    step is longer by as much. `extra`: the last step also runs a 10 us aten::mul."""
    events, ids = [], iter(range(1, 10_000))

    def event(name, start, end, parent=None):
        made = torch_event(
            FunctionEvent, id=next(ids), name=name, thread=1, start_us=start, end_us=end
        )
        if parent is not None:
            parent.append_cpu_child(made)
            made.set_cpu_parent(parent)
        events.append(made)
        return made

    start = 0.0
    for i, add in enumerate(add_us):
        step = event(step_split.STEP_MARK, start, start + 990.0 + add)
        event("aten::view", start + 10.0, start + 11.0, step)
        event("aten::mm", start + 100.0, start + 300.0, step)
        event("aten::add", start + 500.0, start + 500.0 + add, step)
        if extra and i == len(add_us) - 1:
            event("aten::mul", start + 700.0 + add, start + 710.0 + add, step)
        start += 2000.0 + add
    return events


def test_a_preemption_inside_one_cpu_operator_is_not_counted_as_its_arithmetic():
    quiet = step_split.split_step(cpu_steps(10.0), cuda=False)
    # 199 us of the mm and 9 of the add above the view's 1 us floor: 208 of 1,000 us.
    assert quiet["diag_step_device_frac"] == pytest.approx(0.208)
    assert quiet["diag_op_floor_us"] == 1.0 and quiet["diag_ops_per_step"] == 3
    # The second step lost the core for 4 ms inside its add. Summed, that step's add would
    # make the point device-bound (4,406 of 5,990 us); each piece's least time is the quiet
    # step's.
    preempted = step_split.split_step(cpu_steps(10.0, 4010.0), cuda=False)
    assert preempted == quiet
    assert rules.verdict(Diagnosis(**preempted)) == "host-bound"
    # Steps that ran different operators cannot be matched piece by piece: averaged whole.
    unlike = step_split.split_step(cpu_steps(10.0, 4010.0, extra=True), cuda=False)
    assert unlike["diag_step_device_frac"] == pytest.approx((208 + 4217) / (1000 + 5000))
    assert unlike["diag_ops_per_step"] == 3.5


def test_kineto_events_give_back_what_function_events_lack():
    """A real profile on this CPU: strip the attributes torch 2.11 lacks from its
    FunctionEvents; restore_from_kineto matches every one to its Kineto event again. Whatever the
    torch, the step's range is the one user annotation, and a CPU profile links no kernel."""
    with diagnose.profile(use_kineto=True) as prof:
        with diagnose.record_function(step_split.STEP_MARK):
            torch.nn.functional.linear(torch.randn(16, 8), torch.randn(4, 8)).sum()
    events = list(prof.function_events)
    own = hasattr(events[0], "linked_correlation_id")  # torch 2.11's events lack it
    truth = [(e.linked_correlation_id, e.is_user_annotation) for e in events] if own else None
    for e in events:
        for name in step_split.CUDA_ATTRIBUTES:
            if hasattr(e, name):
                delattr(e, name)
    restored = diagnose.restore_from_kineto(events, prof.kineto_results)
    assert restored == len(events) > 3
    found = [(e.linked_correlation_id, e.is_user_annotation) for e in events]
    assert found == truth or not own
    assert [user for _, user in found] == [e.name == step_split.STEP_MARK for e in events]
    assert {link for link, _ in found} == {0}


# ------------------------------------------------------------------------------------------
# Real points on this CPU: host-bound and device-bound by construction
# ------------------------------------------------------------------------------------------

POINTS = {
    # 4 layers 8 wide at batch 1: ~2,000 operators a step, each on a few dozen numbers.
    "tiny": {"n_layer": 4, "n_head": 2, "n_embd": 8, "block_size": 4, "vocab_size": 32, "b": 1},
    # 1 layer 512 wide, 8 x 64 tokens: a few hundred operators, the matmuls 512 x 512 x 512.
    "wide": {"n_layer": 1, "n_head": 4, "n_embd": 512, "block_size": 64, "vocab_size": 512, "b": 8},
}


def point_spec(name: str) -> RunSpec:
    spec = RunSpec()
    shape = dict(POINTS[name])
    spec.perf.batch_size = shape.pop("b")
    for key, value in shape.items():
        setattr(spec.model, key, value)
    spec.bench.device = "cpu"
    return spec


@contextlib.contextmanager
def one_thread():
    """One intra-op thread: on a shared 2-core machine, OpenMP's barrier waits for a sibling
    thread another process descheduled, which stretches operators' time by the load, not by
    their work (a tiny operator then takes hundreds of microseconds)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def diagnosed():
    """Each point warmed up, then diagnosed for real: {name: (spec, figures, step_ms)}."""
    with one_thread():
        out = {}
        for name in POINTS:
            spec = point_spec(name)
            trainer = build_trainer(spec, torch.device("cpu"), World.from_env())
            for _ in range(2):
                trainer.step()
            # 5 steps: a step of the tiny point is a few ms, about the scheduler's time slice,
            # and beside the rest of the suite (3 workers on 2 cores) most of its steps lose the
            # core once. The split keeps each piece's least time over the steps
            # (step_split._typical_cpu_step), so one diagnosis is what a user gets, load and all.
            figures, step_ms, _ = diagnose.profile_diagnosis(trainer, 5)
            out[name] = (spec, figures, step_ms)
        return out


def test_shares_of_the_step_and_of_device_time_each_sum_to_one(diagnosed):
    for _, figures, step_ms in diagnosed.values():
        assert sum(figures[key] for key in SHARES) == pytest.approx(1.0)
        assert all(0 <= figures[key] <= 1 for key in SHARES)
        assert sum(figures[key] for key in KIND_SHARES) == pytest.approx(1.0)
        assert figures["diag_steps"] == 5 and len(step_ms) == 6  # one unrecorded step first
        assert figures["diag_step_comm_frac"] == 0  # one process: no collective


def test_tiny_model_is_host_bound_and_wide_one_device_bound(diagnosed):
    verdicts = {name: rules.verdict(Diagnosis(**f)) for name, (_, f, _) in diagnosed.items()}
    assert verdicts == {"tiny": "host-bound", "wide": "device-bound"}
    tiny, wide = diagnosed["tiny"][1], diagnosed["wide"][1]
    assert tiny["diag_ops_per_step"] > wide["diag_ops_per_step"]  # 4 layers against 1
    assert tiny["diag_us_per_op"] < wide["diag_us_per_op"] / 10
    kinds = {key: wide[key] for key in KIND_SHARES}
    assert max(kinds, key=kinds.get) == "diag_device_time_matmul_frac"
    # The per-operator floor is measured, in microseconds: far below the wide point's ops.
    assert 0 < wide["diag_op_floor_us"] < wide["diag_us_per_op"]


def test_the_hint_names_the_knob_and_the_figure_it_rests_on(diagnosed):
    spec, figures, _ = diagnosed["tiny"]
    judged = judge(Diagnosis(**figures), Setting.of(spec, "cpu", None))
    assert judged.bottleneck == "host-bound"
    assert "perf.compile=true" in judged.bottleneck_hint
    assert (
        f"host work is {figures['diag_step_host_frac']:.0%} of the step" in judged.bottleneck_hint
    )
    spec, figures, _ = diagnosed["wide"]
    judged = judge(Diagnosis(**figures), Setting.of(spec, "cpu", None))
    assert f"the device computes {figures['diag_step_device_frac']:.0%}" in judged.bottleneck_hint


class TokenizingSource:
    """A loader that tokenizes its text on the fly, every batch (tiktoken's GPT-2 encoding over
    100,000 characters): the slow input pipeline a data-bound point has."""

    def __init__(self, spec: RunSpec):
        import tiktoken

        self.encoding = tiktoken.get_encoding("gpt2")
        self.text = SHAKESPEARE.read_text(encoding="utf-8")
        self.shape, self.vocab, self.offset = (spec.perf.batch_size, spec.model.block_size), 0, 0
        self.vocab = spec.model.vocab_size

    def next_batch(self):
        chunk = self.text[self.offset : self.offset + 100_000]
        self.offset = (self.offset + 100_000) % (len(self.text) - 100_000)
        ids = torch.tensor(self.encoding.encode_ordinary(chunk)) % self.vocab
        n = self.shape[0] * self.shape[1]
        return ids[:n].view(self.shape), ids[1 : n + 1].view(self.shape)


@needs_shared
def test_a_loader_that_tokenizes_every_batch_is_data_bound():
    spec = point_spec("tiny")
    trainer = build_trainer(spec, torch.device("cpu"), World.from_env())
    trainer.source = TokenizingSource(spec)
    with one_thread():
        trainer.step()
        found, _, data_ms = diagnose.profile_diagnosis(trainer, 2)
    judged = judge(Diagnosis(**found), Setting.of(spec, "cpu", None))
    assert judged.bottleneck == "data-bound", found
    assert f"getting batches takes {found['diag_step_data_frac']:.0%}" in judged.bottleneck_hint
    # The loader's own operators (the tensor it builds) are data, not compute.
    assert found["diag_step_data_frac"] > found["diag_step_device_frac"]
    assert min(data_ms) > 0


def test_data_marker_is_gone_after_the_diagnosis():
    spec = point_spec("tiny")
    trainer = build_trainer(spec, torch.device("cpu"), World.from_env())
    source = trainer.source
    diagnose.profile_diagnosis(trainer, 1)
    assert trainer.source is source  # the measured steps that may follow fetch unmarked


# ------------------------------------------------------------------------------------------
# The rules
# ------------------------------------------------------------------------------------------


def figures(device=0.3, comm=0.0, data=0.0, host=0.7, headroom=0.2, **kinds) -> Diagnosis:
    shares = dict.fromkeys(KIND_SHARES, 0.0) | {
        f"diag_device_time_{k}_frac": v for k, v in kinds.items()
    }
    return Diagnosis(
        diag_step_device_frac=device,
        diag_step_comm_frac=comm,
        diag_step_data_frac=data,
        diag_step_host_frac=host,
        diag_ops_per_step=1400,
        diag_us_per_op=9.0,
        diag_mem_headroom_frac=headroom,
        **shares,
    )


def setting(**changes) -> Setting:
    base = {
        "device_type": "cuda",
        "dtype": "bf16",
        "compile": False,
        "compile_mode": "default",
        "attention": "auto",
        "optimizer_impl": "auto",
        "data": "synthetic",
    }
    return Setting(**(base | changes))


@pytest.mark.parametrize(
    "shares,expected",
    [
        ((0.9, 0.0, 0.0, 0.1), "device-bound"),
        ((0.3, 0.0, 0.0, 0.7), "host-bound"),
        ((0.2, 0.0, 0.5, 0.3), "data-bound"),
        ((0.3, 0.4, 0.0, 0.3), "communication-bound"),
        ((0.49, 0.0, 0.0, 0.51), "host-bound"),
    ],
)
def test_the_verdict_is_the_largest_share(shares, expected):
    device, comm, data, host = shares
    assert rules.verdict(figures(device, comm, data, host)) == expected


def test_no_figures_no_verdict():
    assert rules.verdict(Diagnosis()) is None
    assert judge(Diagnosis(diag_error="off"), setting()).bottleneck_hint is None


def test_host_bound_hints_follow_what_the_point_already_uses():
    eager = judge(figures(), setting()).bottleneck_hint
    assert "perf.compile=true perf.compile_mode=reduce-overhead" in eager
    assert "host work is 70% of the step (1,400 kernels a step, 9 us" in eager
    compiled = judge(figures(), setting(compile=True)).bottleneck_hint
    assert "perf.compile_mode=reduce-overhead" in compiled and "compile=true" not in compiled
    graphs = setting(compile=True, compile_mode="reduce-overhead")
    assert "bigger perf.batch_size" not in judge(figures(headroom=0.2), graphs).bottleneck_hint
    roomy = judge(figures(headroom=0.8), graphs).bottleneck_hint
    assert "memory headroom 80%: a bigger perf.batch_size" in roomy
    cpu = judge(figures(), setting(device_type="cpu")).bottleneck_hint
    assert "perf.compile=true (fewer, fused operators)" in cpu and "CUDA graphs" not in cpu


@pytest.mark.parametrize(
    "kinds,changes,knob",
    [
        ({"matmul": 0.7, "elementwise": 0.3}, {"dtype": "fp32"}, "perf.dtype=bf16"),
        ({"attention": 0.6, "matmul": 0.4}, {"attention": "math"}, "perf.attention=auto"),
        ({"elementwise": 0.6, "matmul": 0.4}, {}, "perf.compile=true (fuses elementwise"),
        ({"optimizer": 0.5, "matmul": 0.4}, {"optimizer_impl": "foreach"}, "impl=fused"),
        (
            {"optimizer": 0.5, "matmul": 0.4},
            {"optimizer_impl": "Muon for_loop (Muon's only), AdamW fused"},
            "Muon's Newton-Schulz steps",
        ),
        ({"matmul": 0.7, "elementwise": 0.3}, {"dtype": "bf16"}, "at its kernels' speed"),
    ],
)
def test_device_bound_hint_follows_the_kind_that_dominates(kinds, changes, knob):
    judged = judge(figures(device=0.9, host=0.1, **kinds), setting(**changes))
    assert judged.bottleneck == "device-bound" and knob in judged.bottleneck_hint
    top = max(kinds, key=kinds.get)
    assert f"{top} is {kinds[top]:.0%} of device time" in judged.bottleneck_hint


def test_an_emulated_matmul_is_named_whatever_the_verdict():
    why = "fp16 matmuls are emulated on this CPU (no amx_fp16 or avx512_fp16 flag)"
    for shares in ((0.9, 0.0, 0.0, 0.1), (0.2, 0.0, 0.0, 0.8)):
        d = figures(*shares, matmul=0.8, elementwise=0.2)
        judged = judge(d, setting(device_type="cpu", dtype="fp16", matmul_emulated=why))
        assert judged.bottleneck_hint.startswith(f"{why}; matmul is 80% of compute: try")
        assert judged.diag_matmul_emulated == why


def test_allocator_retries_lead_the_hint_with_what_to_try():
    assert rules.allocator_warning(None, None) is None  # a CPU point: no allocator counted
    assert rules.allocator_warning(0, 0) is None
    line = rules.allocator_warning(3, 0)
    assert line.startswith("the CUDA allocator had 3 allocation retries in the measured steps")
    assert "expandable_segments:True" in line and "perf.batch_size" in line
    assert "1 OOMs" in rules.allocator_warning(0, 1)
    for shares in ((0.9, 0.0, 0.0, 0.1), (0.2, 0.0, 0.0, 0.8)):  # whatever the verdict
        hint = judge(figures(*shares), setting(), line).bottleneck_hint
        assert hint.startswith(line + "; ")


def test_the_diagnosis_warns_of_the_windows_allocator_retries(caplog):
    # A real trainer diagnosed for real; the retries are the record's memory part's, as the
    # CUDA probe would have filled it (this machine has no CUDA allocator to retry).
    from nanogpt.probes.window import StepLog
    from nanogpt.record import Memory, Record

    spec = point_spec("tiny")
    spec.bench.diagnose_steps = 1
    trainer = build_trainer(spec, torch.device("cpu"), World.from_env())
    record = Record(memory=Memory(mem_alloc_retries=2, mem_ooms=0))
    with caplog.at_level("WARNING", logger=diagnose.logger.name):
        diagnose.run_diagnosis(spec, trainer, record, StepLog(), None)
    said = rules.allocator_warning(2, 0)
    assert said in caplog.text
    assert record.diagnosis.bottleneck_hint.startswith(said)
    spec.bench.diagnose = False  # off: still warned, no hint
    caplog.clear()
    with caplog.at_level("WARNING", logger=diagnose.logger.name):
        diagnose.run_diagnosis(spec, trainer, record, StepLog(), None)
    assert said in caplog.text and record.diagnosis.bottleneck_hint is None


@pytest.mark.parametrize(
    "flags,dtype,expected",
    [
        ({"sse", "avx2", "fma"}, Dtype.bf16, "no amx_bf16 or avx512_bf16 flag)"),  # Zen 3
        ({"avx2", "fma", "avx512f", "avx512_bf16"}, Dtype.fp16, "; bf16 is native here"),  # Zen 4
        ({"avx2", "fma", "avx512f", "avx512_bf16"}, Dtype.bf16, None),
        ({"avx512f", "amx_bf16", "avx512_fp16"}, Dtype.fp16, None),  # Sapphire Rapids
        ({"avx2", "fma"}, Dtype.fp32, None),
        (set(), Dtype.fp16, None),  # not x86: the flags say nothing, so nothing is claimed
    ],
)
def test_emulated_matmul_follows_the_cpu_flags(flags, dtype, expected):
    why = matmul_emulated(dtype, flags)
    assert why == expected if expected is None else why.endswith(expected)


# ------------------------------------------------------------------------------------------
# A real sweep: result.json, steps.csv, the table, the recommendation, W&B, the plot
# ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def diagnosed_sweep(wandb_sweep):
    """A diagnosed point and one not (bench.diagnose=true,false, 2 profiled steps), measured in
    the sweep's process, W&B offline: the session's (conftest.WANDB_SWEEP)."""
    return wandb_sweep


def job_of(sweep_dir, diagnose_on: bool):
    for path in sorted(sweep_dir.glob("*/result.json")):
        record = read_result(path)
        if ("bench.diagnose=true" in " ".join(record["overrides"]).lower()) == diagnose_on:
            return path.parent, record
    raise AssertionError("no such point")


def test_diagnosed_steps_are_logged_apart_and_enter_no_statistic(diagnosed_sweep):
    _, sweep_dir = diagnosed_sweep
    job_dir, record = job_of(sweep_dir, True)
    steps = pd.read_csv(job_dir / "steps.csv")
    assert steps["phase"].to_list() == ["warmup"] * 3 + ["measure"] * 4 + ["diagnose"] * 3
    measured = steps.loc[steps["phase"] == "measure", "step_ms"]
    assert record["step_ms_median"] == pytest.approx(measured.median())
    # the run's steps are stored once: steps.csv's, the record holds none of them
    assert "step_ms_measured" not in record
    assert steps.loc[steps["phase"] == "measure", "step_ms_job"].tolist() == measured.tolist()
    diagnosed = steps.loc[steps["phase"] == "diagnose", "step_ms"].to_list()
    assert record["diag_step_ms"] == pytest.approx(statistics.median(diagnosed[1:]))
    assert record["bottleneck"] in rules.VERDICTS.values()
    assert sum(record[key] for key in SHARES) == pytest.approx(1.0)
    assert record["diag_mem_headroom_bytes"] > 0 and 0 < record["diag_mem_headroom_frac"] < 1
    assert record["diag_error"] is None and record["diag_method"].startswith("torch.profiler")


def test_diagnosis_off_is_null_with_the_reason(diagnosed_sweep):
    _, sweep_dir = diagnosed_sweep
    job_dir, record = job_of(sweep_dir, False)
    assert record["bottleneck"] is None and record["diag_step_device_frac"] is None
    assert record["diag_error"] == "off (bench.diagnose=false)"
    steps = pd.read_csv(job_dir / "steps.csv")
    assert "diagnose" not in set(steps["phase"])


def test_verdict_is_in_the_table_the_recommendation_and_wandb(diagnosed_sweep):
    proc, sweep_dir = diagnosed_sweep
    summary = read_summary(sweep_dir)
    job_dir, record = job_of(sweep_dir, True)
    row = summary[summary["job_dir"] == str(job_dir.resolve())].iloc[0]
    assert row["bottleneck"] == record["bottleneck"]
    assert row["bottleneck_hint"] == record["bottleneck_hint"]
    assert row["diag_step_host_frac"] == pytest.approx(record["diag_step_host_frac"])
    header = next(line for line in proc.stdout.splitlines() if "step_ms" in line)
    assert "bottleneck" in header.split()
    markdown = (sweep_dir / report.SUMMARY_MD).read_text().splitlines()
    assert "bottleneck" in next(line for line in markdown if line.startswith("| point"))
    # The recommendation gives the fastest point's verdict and hint, and no verdict where that
    # point was not diagnosed (which of the two is faster is the machine's call).
    fastest = summary.loc[summary["tokens_per_s"].idxmax()]
    diagnosed = isinstance(fastest["bottleneck"], str)
    said = [line for line in proc.stdout.splitlines() if line.startswith("fastest point (")]
    assert len(said) == int(diagnosed), said
    verdict = f") is {fastest['bottleneck']}: {fastest['bottleneck_hint']}"
    assert all(line.endswith(verdict) for line in said), (said, verdict)
    from tests.wandb_reader import read_run, run_file

    (run_dir,) = sorted((job_dir / "run-1" / "wandb").glob("offline-run-*"))
    run = read_run(run_file(run_dir))
    for key in ("bottleneck", "bottleneck_hint", "diag_step_device_frac", "diag_step_host_frac"):
        assert run.summary[f"diagnosis/{key}"] == record[key]  # namespaced by part


def test_bottleneck_plot_stacks_each_points_figures(diagnosed_sweep):
    _, sweep_dir = diagnosed_sweep
    table = report.build_table(sweep_dir).table
    step_ax, kind_ax = bottleneck(table).axes
    for ax, parts in ((step_ax, STEP_PARTS), (kind_ax, KIND_PARTS)):
        # One segment a part per row, in the table's order (first point on top).
        stacks = {c.get_label(): [bar.get_width() for bar in c] for c in ax.containers}
        for column, name in parts:
            expected = (pd.to_numeric(table[column]) * 100).fillna(0.0).to_list()
            assert stacks[name] == pytest.approx(expected)
    totals = [sum(row) for row in zip(*(c.datavalues for c in step_ax.containers), strict=True)]
    diagnosed = table["bottleneck"].notna().to_list()
    assert [total == pytest.approx(100.0) for total in totals] == diagnosed
    assert [total == 0 for total in totals] == [not on for on in diagnosed]


# ------------------------------------------------------------------------------------------
# CUDA
# ------------------------------------------------------------------------------------------


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_small_batch_is_host_bound_and_large_matmuls_device_bound():
    """A 2-layer 64-wide model at batch 1 launches hundreds of microsecond kernels (the GPU
    waits for the host); a 4-layer 1024-wide model at 16 x 512 tokens keeps it busy."""
    shapes = {
        "host-bound": {"n_layer": 2, "n_head": 2, "n_embd": 64, "block_size": 64, "b": 1},
        "device-bound": {"n_layer": 4, "n_head": 16, "n_embd": 1024, "block_size": 512, "b": 16},
    }
    device = torch.device("cuda", 0)
    for expected, shape in shapes.items():
        spec = RunSpec()
        shape = dict(shape)
        spec.perf.batch_size = shape.pop("b")
        spec.perf.dtype = Dtype.bf16
        for key, value in shape.items():
            setattr(spec.model, key, value)
        trainer = build_trainer(spec, device, World.from_env())
        for _ in range(3):
            trainer.step()
        found, _, _ = diagnose.profile_diagnosis(trainer, 3)
        assert sum(found[key] for key in SHARES) == pytest.approx(1.0)
        assert found["diag_ops_per_step"] > 50  # kernels were seen and tied to the steps
        assert rules.verdict(Diagnosis(**found)) == expected, found
        if expected == "device-bound":
            kinds = {key: found[key] for key in KIND_SHARES}
            assert max(kinds, key=kinds.get) == "diag_device_time_matmul_frac"
        del trainer
        torch.cuda.empty_cache()
