"""What SLURM and submitit say about a sweep's jobs, for `hydra/launcher=slurm`
(frontend/launchers/slurm.py): whether SLURM is here and answers, each job's state from the
scheduler
(squeue keeps ended jobs for MinJobAge; accounting, sacct, may not run), why a pending job
waits (squeue's %r) and whether the cluster can resolve that by itself (`unresolvable`), which
nodes are down or drained, how often a job's runs asked to be requeued (submitit's log), and
which of its tasks died where (srun's own lines in that log). One line and exit 2 where SLURM
is missing.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

from nanogpt.record.faults import CONFIG_EXIT

ENDED = {  # SLURM job states after which a job never runs again
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
    "BOOT_FAIL", "DEADLINE", "SPECIAL_EXIT",
}  # fmt: skip
STATUS_OF = {"CANCELLED": "cancelled", "TIMEOUT": "timeout", "DEADLINE": "timeout"}
POLL_S = 2.0
CONFIRM_S = 15.0  # how long a failed end must last before it is the job's end
REQUEUE_WAIT_S = 600.0  # how long a job that logged its requeue may stay ended before it is
# taken as ended (SLURM holds a requeued job about 2 minutes before it is eligible again)


def fail(what: str) -> None:
    print(f"error: hydra/launcher=slurm: {what}", file=sys.stderr)
    sys.exit(CONFIG_EXIT)


def check_slurm() -> None:
    """SLURM's client is here and its controller answers; else one line and exit 2."""
    if shutil.which("sbatch") is None:
        fail(
            "sbatch is not on PATH (no SLURM client on this machine); run the sweep on the "
            "cluster's login node, or drop hydra/launcher=slurm to run it here."
        )
    conf = os.environ.get("SLURM_CONF")
    if conf and not Path(conf).is_file():  # SLURM's tools retry a missing file for 60 s
        fail(
            f"sbatch is here but no SLURM controller answers (SLURM_CONF={conf} is no file); "
            "set SLURM_CONF to the cluster's slurm.conf or start slurmctld, then rerun."
        )
    try:
        probe = subprocess.run(
            ["sinfo", "-h", "-o", "%P"], capture_output=True, text=True, timeout=60
        )
        answer = probe.stderr.strip().splitlines()[-1:] if probe.returncode else []
    except (OSError, subprocess.TimeoutExpired) as err:
        answer = [str(err)]
    if answer:
        fail(
            f"sbatch is here but no SLURM controller answers ({answer[0].strip()}); "
            "set SLURM_CONF to the cluster's slurm.conf or start slurmctld, then rerun."
        )


def scheduler_states(job_ids: list[str]) -> dict[str, tuple[str, str]]:
    """job id -> (state, node) for the jobs the controller still knows (array tasks one each)."""
    return {jid: (state, node) for jid, (state, node, _, _) in squeue_jobs(job_ids).items()}


def squeue_jobs(job_ids: list[str]) -> dict[str, tuple[str, str, float | None, str]]:
    """job id -> (state, node, start time in epoch seconds or None, the reason it waits or
    ended: squeue's %r, "None" when there is none) from squeue."""
    if not job_ids:
        return {}
    arrays = sorted({jid.split("_")[0] for jid in job_ids})
    command = ["squeue", "-h", "-r", "-t", "all", "-o", "%i|%T|%N|%S|%r", "-j", ",".join(arrays)]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    states = {}
    for line in out.splitlines():
        jid, state, node, start, reason = (line.split("|", 4) + ["", "", "", ""])[:5]
        try:  # squeue prints local time, e.g. 2026-11-24T02:49:54 (N/A when unknown)
            started = datetime.fromisoformat(start.strip()).timestamp()
        except ValueError:
            started = None
        states[jid.strip()] = (state.strip(), node.strip(), started, reason.strip())
    return states


# Why a pending job may wait for ever: what squeue's %r says when the job's nodes are gone
# (DOWN, DRAINED: e.g. "Nodes required for job are DOWN, DRAINED or reserved for jobs in higher
# priority partitions", "ReqNodeNotAvail, UnavailableNodes:n2"), its partition cannot run it,
# it is held, or its dependency can never be met. Waiting for resources, for its priority, for
# its begin time (a requeued job waits ~2 minutes) or a limit of the user's is no such reason:
# the cluster resolves those by itself.
UNRESOLVABLE = (
    "DOWN", "DRAINED", "ReqNodeNotAvail", "NodeDown", "PartitionDown", "PartitionInactive",
    "PartitionNodeLimit", "PartitionConfig", "BadConstraints", "DependencyNeverSatisfied",
    "JobHeld", "held", "InvalidAccount", "InvalidQOS",
)  # fmt: skip


def unresolvable(state: str, reason: str) -> bool:
    """Whether a job in `state` waits for a reason the cluster cannot resolve by itself."""
    return state == "PENDING" and any(word in reason for word in UNRESOLVABLE)


def nodes_out() -> list[str]:
    """The cluster's nodes that cannot run jobs, each as 'NODE (down*: Not responding)' (its
    state and SLURM's reason for it), from sinfo."""
    command = ["sinfo", "-h", "-N", "-t", "down,drain,fail", "-o", "%N|%T|%E"]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    found = []
    for line in out.splitlines():
        node, state, why = (line.split("|", 2) + ["", ""])[:3]
        why = "" if why.strip() in ("", "none") else f": {why.strip()}"
        found.append(f"{node.strip()} ({state.strip()}{why})")
    return list(dict.fromkeys(found))


def job_log(job) -> str:
    """The job's submitit log (SLURM appends a requeued run's output to the same files)."""
    texts = []
    for path in (job.paths.stdout, job.paths.stderr):
        try:
            texts.append(path.read_text(errors="replace"))
        except OSError:
            pass
    return "\n".join(texts)


def requeues_logged(job) -> int:
    """How often the job's runs asked SLURM to requeue it: submitit's logger writes
    "... - Requeued job N" just after `scontrol requeue`, at its time limit or on preemption."""
    return job_log(job).count(" - Requeued job ")


# srun's line for tasks that ended badly, in the job's log: "srun: error: NODE: task 1: Killed",
# "srun: error: NODE: tasks 0-1: Exited with exit code 1"
TASK_ENDED = re.compile(r"^srun: error: (\S+): (tasks? [0-9,\-]+): (.+)$", re.MULTILINE)


def tasks_lost(job) -> list[str]:
    """The job's tasks (every task a rank) that SLURM saw die or fail, each as 'task 1 on node
    NODE: Killed' (srun's own account, the node as SLURM names it)."""
    found = TASK_ENDED.findall(job_log(job))
    return [f"{tasks} on node {node}: {how.strip()}" for node, tasks, how in dict.fromkeys(found)]


def cancel(job_ids: list[str]) -> None:
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, timeout=60)


def wait_ended(job_ids: list[str], at_most_s: float) -> dict[str, tuple[str, str]]:
    """Poll until every job has ended (or the controller forgot it); their last states."""
    deadline = time.monotonic() + at_most_s
    states: dict[str, tuple[str, str]] = {}
    while True:
        states.update(scheduler_states(job_ids))
        running = [j for j in job_ids if j in states and states[j][0] not in ENDED]
        if not running or time.monotonic() > deadline:
            return states
        time.sleep(POLL_S)
