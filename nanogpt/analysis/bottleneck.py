"""Why a point is as fast as it is: the bottleneck verdict and the hint, from the figures of the
diagnosis phase (probes/diagnose.py measures them; the rules here are pure functions).

The step's wall time is split four ways that sum to 1: `device` (the device computes; on CPU,
the arithmetic inside operators), `communication` (collectives compute does not hide), `data`
(getting batches while the device is idle) and `host` (the rest: the device waits for Python,
the autograd engine and the dispatcher to hand it work). The verdict names the largest share:

    device-bound | communication-bound | data-bound | host-bound

There is no threshold to tune to a machine: whichever share is largest is where most of the
step goes, so it is what a change must shrink. The hint names the knob a user would try next,
each with the figure it rests on: CUDA graphs or compile for a host-bound point, a bigger batch
where memory allows it, the kind that dominates device time for a device-bound one (a 16-bit
dtype for fp32 matmuls on CUDA, a fused attention kernel for math/manual attention, compile for
elementwise and norm operators, a fused optimizer), and, whatever the verdict, a dtype whose
matmuls the device has to emulate and the CUDA allocator's retries in the measured steps
(`allocator_warning`).
"""

from __future__ import annotations

from dataclasses import dataclass

from nanogpt.config.spec import RunSpec
from nanogpt.record.diagnosis import Diagnosis

VERDICTS = {
    "device": "device-bound",
    "communication": "communication-bound",
    "data": "data-bound",
    "host": "host-bound",
}
KINDS = ("matmul", "attention", "elementwise", "optimizer", "communication", "other")
# A bigger batch is suggested where at least this share of memory is free: doubling the batch
# roughly doubles activations, the part of memory a batch grows.
BIGGER_BATCH_HEADROOM = 0.5


@dataclass(frozen=True)
class Setting:
    """What the point ran with, as the rules need it."""

    device_type: str
    dtype: str
    compile: bool
    compile_mode: str
    attention: str
    optimizer_impl: str
    data: str
    matmul_emulated: str | None = None

    @classmethod
    def of(
        cls,
        spec: RunSpec,
        device_type: str,
        matmul_emulated: str | None,
        optimizer_impl_used: str | None = None,
    ) -> Setting:
        """`optimizer_impl_used`: what actually stepped (fused, foreach, for_loop), when known;
        else the configured optimizer.impl."""
        perf = spec.perf
        return cls(
            device_type=device_type,
            dtype=perf.dtype.value,
            compile=perf.compile,
            compile_mode=perf.compile_mode,
            attention=perf.attention.value,
            optimizer_impl=optimizer_impl_used or spec.optimizer.impl.value,
            data=spec.data.kind.value,
            matmul_emulated=matmul_emulated,
        )


def verdict(d: Diagnosis) -> str | None:
    """The largest of the four shares of the step, by name; None without figures."""
    shares = {
        "device": d.diag_step_device_frac,
        "communication": d.diag_step_comm_frac,
        "data": d.diag_step_data_frac,
        "host": d.diag_step_host_frac,
    }
    if any(share is None for share in shares.values()):
        return None
    return VERDICTS[max(shares, key=lambda name: shares[name])]


def allocator_warning(retries: int | None, ooms: int | None) -> str | None:
    """What the CUDA caching allocator's trouble in the measured steps says, and what to try;
    None when it had none (or no such allocator: null counts). A retry is a cudaMalloc that
    failed, after which the allocator freed every cached block and tried again: a synchronizing,
    slow step, and the first sign of fragmentation near the memory limit, which explains a
    point slow for no visible reason."""
    if not retries and not ooms:
        return None
    seen = [f"{n} {what}" for n, what in ((retries, "allocation retries"), (ooms, "OOMs")) if n]
    return (
        f"the CUDA allocator had {' and '.join(seen)} in the measured steps (its cache freed "
        "and cudaMalloc tried again: fragmentation near the memory limit, and slow steps): try "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, or a smaller perf.batch_size"
    )


def hints(d: Diagnosis, s: Setting, allocator: str | None = None) -> list[str]:
    """What to try next, most promising first, each with the figure it rests on; `allocator`:
    allocator_warning's line, first when there is one."""
    found = verdict(d)
    out = [allocator] if allocator else []
    if s.matmul_emulated:
        matmul = (
            f"; matmul is {d.diag_device_time_matmul_frac:.0%} of compute"
            if d.diag_device_time_matmul_frac
            else ""
        )
        out.append(f"{s.matmul_emulated}{matmul}: try perf.dtype=fp32 or a dtype native here")
    if found == "host-bound":
        out += _host(d, s)
    elif found == "device-bound":
        out += _device(d, s)
    elif found == "data-bound":
        out.append(
            f"getting batches takes {d.diag_step_data_frac:.0%} of the step while the device "
            "waits: prefetch or cache them (data=synthetic makes them on the device, for "
            "comparison)"
        )
    elif found == "communication-bound":
        out.append(
            f"communication compute does not hide is {d.diag_step_comm_frac:.0%} of the step: "
            "try a bigger perf.grad_accum or perf.batch_size (one all-reduce for more work), or "
            "perf.compile=true (bucket all-reduces overlap backward)"
        )
    return out


def _host(d: Diagnosis, s: Setting) -> list[str]:
    idle = f"host work is {d.diag_step_host_frac:.0%} of the step"
    ops = f"{d.diag_ops_per_step:,.0f} {'kernels' if s.device_type == 'cuda' else 'operators'}"
    each = f"{d.diag_us_per_op:.3g} us of device time each" if d.diag_us_per_op else "each short"
    why = f"{idle} ({ops} a step, {each})"
    out = []
    if s.device_type == "cuda" and s.compile_mode != "reduce-overhead":
        knob = (
            "perf.compile_mode=reduce-overhead"
            if s.compile
            else ("perf.compile=true perf.compile_mode=reduce-overhead")
        )
        out.append(f"{why}: try {knob} (CUDA graphs launch the step at once)")
    elif not s.compile:
        out.append(f"{why}: try perf.compile=true (fewer, fused operators)")
    headroom = d.diag_mem_headroom_frac
    if headroom is not None and headroom >= BIGGER_BATCH_HEADROOM:
        out.append(
            f"memory headroom {headroom:.0%}: a bigger perf.batch_size gives each launch more "
            "work for the same host cost"
        )
    if not out:
        out.append(f"{why}: fewer, larger operations (a bigger batch or a wider model)")
    return out


def _device(d: Diagnosis, s: Setting) -> list[str]:
    kinds = {k: getattr(d, f"diag_device_time_{k}_frac") or 0.0 for k in KINDS}
    top = max(("matmul", "attention", "elementwise", "optimizer"), key=lambda k: kinds[k])
    share = f"{top} is {kinds[top]:.0%} of device time"
    busy = f"the device computes {d.diag_step_device_frac:.0%} of the step"
    if top == "matmul" and s.device_type == "cuda" and s.dtype == "fp32":
        return [f"{busy}, {share} in fp32: try perf.dtype=bf16 (or tf32): tensor cores"]
    if top == "attention" and s.attention in ("math", "manual"):
        return [f"{busy}, {share}: try perf.attention=auto (a fused attention kernel)"]
    if top == "elementwise" and not s.compile:
        return [f"{busy}, {share}: try perf.compile=true (fuses elementwise and norm operators)"]
    if top == "optimizer" and "Muon" in s.optimizer_impl:
        # no implementation to switch to: its cost a step is the matrices', whatever the batch
        why = "Muon's Newton-Schulz steps, a matrix at a time (it has no fused path)"
        return [f"{busy}, {share}: {why}; a bigger perf.batch_size spreads it over more tokens"]
    if top == "optimizer" and s.optimizer_impl != "fused":
        return [f"{busy}, {share}: try optimizer.impl=fused"]
    return [f"{busy}, {share}: the point is at its kernels' speed; fewer FLOPs or faster kernels"]


def judge(d: Diagnosis, s: Setting, allocator: str | None = None) -> Diagnosis:
    """The diagnosis with its verdict and hint filled in (in place, and returned); `allocator`:
    allocator_warning's line for the point's measured steps, if any."""
    d.diag_matmul_emulated = s.matmul_emulated
    d.bottleneck = verdict(d)
    d.bottleneck_hint = "; ".join(hints(d, s, allocator)) or None
    return d


def fastest_line(bottleneck, hint, name: str) -> str | None:
    """The recommendation's line on the fastest point: its verdict and what to try."""
    if not isinstance(bottleneck, str):
        return None
    line = f"fastest point ({name}) is {bottleneck}"
    return line + (f": {hint}" if isinstance(hint, str) else "")
