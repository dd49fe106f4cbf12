"""`hydra/launcher=slurm`: every point of a sweep is one task of a SLURM job array (submitit).

Built on hydra-submitit-launcher's SlurmLauncher, which runs each point's Hydra job inside its
SLURM job. What this class adds, from the submitting side:
- before anything is written, SLURM must be here and answer: else one line naming
  hydra/launcher and what is missing, exit 2;
- a point of dist.nproc=N over dist.nodes=M is a job of M nodes and N / M tasks on each, every
  task a rank, with a GPU each on CUDA (compose.job_shape; compose.job_gpus: gpus_per_node from them
  unless set; set to fewer, refused at submit); the first node is the ranks' rendezvous;
- it waits on the scheduler's own state of each job (squeue keeps ended jobs for MinJobAge),
  not on accounting (sacct), which a cluster may not run; a requeued job is waited for again;
- a job pending for a reason the cluster cannot resolve by itself (squeue's %r: its nodes DOWN
  or DRAINED, e.g. requeued after a node was lost under it; its partition down; a hold) for
  longer than hydra.launcher.pending_timeout_s is cancelled and its run recorded `error`,
  naming the reason and the nodes out; the sweep goes on (a job waiting for resources waits);
- a job that ended without a result (scancel, its time limit, a node failure, a rank lost) is
  recorded in its job dir with a status that says so (`cancelled`, `timeout`, `error`), keeping
  what the job measured before SLURM's SIGTERM, and naming the node of a task that died (srun's
  own line); a point whose job wrote an ok record stays ok;
- the sweep dir remembers its jobs (slurm_jobs.json): the same command run again after the
  submitting process died first cancels that run's jobs still queued or running, then resumes
  (points with an ok record are skipped, as ever);
- Ctrl-C or SIGTERM while waiting (its jobs, started by SLURM, get no signal of the terminal's)
  cancels the round's jobs (scancel), waits for SLURM to end them and records each run without
  an ok record `interrupted`; the grid sweeper then writes the table of what is done and exits
  130 (143), and the same command resumes (ok runs are kept).
"""

from __future__ import annotations

import copy
import signal
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, filter_overrides
from hydra_plugins.hydra_submitit_launcher.config import BaseQueueConf
from hydra_plugins.hydra_submitit_launcher.submitit_launcher import (
    SlurmLauncher as SubmititSlurmLauncher,
)
from omegaconf import OmegaConf, open_dict

from nanogpt.config.errors import ConfigError
from nanogpt.frontend.compose import in_place, job_gpus, job_shape, to_spec
from nanogpt.frontend.launchers.slurm_queue import (
    CONFIRM_S,
    ENDED,
    POLL_S,
    REQUEUE_WAIT_S,
    STATUS_OF,
    cancel,
    check_slurm,
    job_log,
    nodes_out,
    requeues_logged,
    scheduler_states,
    squeue_jobs,
    tasks_lost,
    unresolvable,
    wait_ended,
)
from nanogpt.record.faults import CONFIG_EXIT, describe
from nanogpt.record.files import read_json, write_json
from nanogpt.runner.handoff import Job
from nanogpt.runner.job import record_ended_outside

SIGNAL_EARLY_S = 60  # SLURM may send --signal this much before its time (its 30 s sweep)
CANCEL_WAIT_S = 60  # how long an interrupted sweep waits for SLURM to end the jobs it cancelled
JOBS_FILE = "slurm_jobs.json"  # point number -> SLURM job id, for a later run of the sweep


class SlurmLauncher(SubmititSlurmLauncher):
    def setup(self, *, hydra_context, task_function, config) -> None:
        check_slurm()  # before the sweeper writes multirun.yaml
        super().setup(hydra_context=hydra_context, task_function=task_function, config=config)
        self.stuck: dict[str, str] = {}  # job id -> why the sweep cancelled it (pending)
        if not self.params["pending_timeout_s"] > 0:
            print(
                "error: hydra.launcher.pending_timeout_s: must be positive; give the seconds a "
                "job may wait on nodes that are down before it is cancelled, e.g. 300",
                file=sys.stderr,
            )
            sys.exit(CONFIG_EXIT)
        limit_s, delay_s = 60 * self.params["timeout_min"], self.params["signal_delay_s"]
        if delay_s + SIGNAL_EARLY_S >= limit_s:
            print(
                f"warning: hydra/launcher=slurm: timeout_min={self.params['timeout_min']} with "
                f"signal_delay_s={delay_s}: SLURM sends the time-limit signal up to "
                f"{SIGNAL_EARLY_S} s early, so it is due as a job starts and may be missed "
                "(no requeue; the job ends at its limit); give each job longer",
                file=sys.stderr,
            )

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int):
        sweep_dir = Path(str(self.config.hydra.sweep.dir))
        sweep_dir.mkdir(parents=True, exist_ok=True)
        self._end_earlier_jobs(sweep_dir)
        jobs = self._submit(job_overrides, initial_job_idx)
        known = read_json(sweep_dir / JOBS_FILE) or {}
        numbers = range(initial_job_idx, initial_job_idx + len(jobs))
        known.update({str(n): job.job_id for n, job in zip(numbers, jobs, strict=True)})
        write_json(sweep_dir / JOBS_FILE, known)
        try:
            states = self._wait(jobs)
        except KeyboardInterrupt:  # Ctrl-C, or SIGTERM (faults.Stopped) on the submitting side
            return self._interrupted(jobs, job_overrides, numbers)
        return [
            self._outcome(job, overrides, number, states.get(job.job_id, ("UNKNOWN", "")))
            for job, overrides, number in zip(jobs, job_overrides, numbers, strict=True)
        ]

    def _submit(self, job_overrides, initial_job_idx: int) -> list:
        """One job array per (nodes, tasks a node, GPUs) among the points: a point of
        dist.nproc=N over dist.nodes=M is a job of M nodes, N / M tasks on each (its ranks,
        from SLURM's environment) and, on CUDA, a GPU per task (compose.job_shape,
        compose.job_gpus);
        the jobs in the points' order."""
        groups: dict[tuple[tuple[int, int], int | None], list[int]] = {}
        for i, overrides in enumerate(job_overrides):
            config = self.hydra_context.config_loader.load_sweep_config(
                self.config, list(overrides)
            )
            try:  # a sweeper whose points were not known at the multirun's start (the search)
                shape, gpus = job_shape(config), job_gpus(config)
            except ConfigError as err:
                print(f"error: {err} (nothing was submitted)", file=sys.stderr)
                sys.exit(CONFIG_EXIT)
            groups.setdefault((shape, gpus), []).append(i)
        jobs: list = [None] * len(job_overrides)
        for (shape, gpus), members in groups.items():
            submitted = self._submit_array(
                [job_overrides[i] for i in members],
                [initial_job_idx + i for i in members],
                shape,
                gpus,
            )
            for i, job in zip(members, submitted, strict=True):
                jobs[i] = job
        return jobs

    def job_parameters(self, shape: tuple[int, int], gpus: int | None) -> dict:
        """What the job of a point asks submitit's executor for: the launcher's keys, its
        `shape` (nodes, tasks a node: compose.job_shape), a task per rank, `gpus` GPUs a node
        (compose.job_gpus)."""
        params = dict(self.params)
        params["nodes"], params["tasks_per_node"] = shape
        params["gpus_per_node"] = gpus
        del params["submitit_folder"], params["max_num_timeout"]  # the executor's own
        del params["pending_timeout_s"]  # this launcher's own
        generic = set(OmegaConf.structured(BaseQueueConf).keys())
        return {key if key in generic else f"slurm_{key}": v for key, v in params.items()}

    def _submit_array(self, job_overrides, numbers: list[int], shape: tuple[int, int], gpus):
        """Submit points as one job array, as hydra-submitit-launcher does."""
        import submitit

        executor = submitit.AutoExecutor(
            cluster="slurm",
            folder=self.params["submitit_folder"],
            slurm_max_num_timeout=self.params["max_num_timeout"],
        )
        executor.update_parameters(**self.job_parameters(shape, gpus))
        for number, overrides in zip(numbers, job_overrides, strict=True):
            print(f"  #{number} : {' '.join(filter_overrides(overrides))}")
        state = Singleton.get_state()
        count = len(numbers)
        return executor.map_array(
            self,
            [list(o) for o in job_overrides],
            ["hydra.sweep.dir"] * count,
            numbers,
            [f"job_id_for_{n}" for n in numbers],
            [state] * count,
        )

    def _wait(self, jobs: list) -> dict[str, tuple[str, str]]:
        """Until every job has ended in SLURM's view (a requeued job is pending again)."""
        states: dict[str, tuple[str, str]] = {}
        unseen = dict.fromkeys((job.job_id for job in jobs), 0)
        failed_since: dict[str, float] = {}  # when a job was first seen ended but not COMPLETED
        followed = dict.fromkeys((job.job_id for job in jobs), 0)  # requeues waited out
        seen: dict[str, str] = {}  # each job's state at the last poll
        stuck_since: dict[str, float] = {}  # when a job was first seen pending unresolvably
        ran_on: dict[str, str] = {}  # the nodes a job last ran on
        while True:
            pending = [job for job in jobs if states.get(job.job_id, ("",))[0] not in ENDED]
            if not pending:
                return states
            now = squeue_jobs([job.job_id for job in pending])
            for job in pending:
                if job.job_id in now:
                    state, node, started, reason = now[job.job_id]
                    if node and state == "RUNNING":
                        ran_on[job.job_id] = node
                    if not unresolvable(state, reason):
                        stuck_since.pop(job.job_id, None)
                    elif self._cancel_stuck(job, reason, stuck_since, ran_on):
                        states[job.job_id] = ("CANCELLED", ran_on.get(job.job_id, ""))
                        continue
                    alive_again = state not in ENDED and seen.get(job.job_id) != state
                    seen[job.job_id] = state
                    # A job that submitit requeues (its time limit, a preemption) may read
                    # FAILED for a moment before it is pending again: a failed end is the
                    # job's end once it has lasted CONFIRM_S (submitit logs a requeue just
                    # after asking for it) and the log shows no requeue that the job has not
                    # yet followed by being pending, running or started again (or that rerun
                    # never came within REQUEUE_WAIT_S).
                    if state in ENDED and state != "COMPLETED":
                        first = failed_since.setdefault(job.job_id, time.time())
                        lasted = time.time() - first
                        requeues = requeues_logged(job)
                        rerun = started is not None and first < started <= time.time()
                        if requeues > followed[job.job_id] and rerun:
                            followed[job.job_id] = requeues  # it ran again: judge this end
                            failed_since[job.job_id] = first = time.time()
                            continue
                        if lasted < CONFIRM_S or (
                            lasted < REQUEUE_WAIT_S and requeues > followed[job.job_id]
                        ):
                            continue
                    elif alive_again:  # pending or running (again): a requeue so far is
                        followed[job.job_id] = requeues_logged(job)  # followed
                        failed_since.pop(job.job_id, None)
                    states[job.job_id] = (state, node)
                    continue
                unseen[job.job_id] += 1  # forgotten by the controller (MinJobAge): ended
                if job.paths.result_pickle.exists() or unseen[job.job_id] > 5:
                    states[job.job_id] = (
                        "COMPLETED" if job.paths.result_pickle.exists() else "UNKNOWN",
                        "",
                    )
            time.sleep(POLL_S)

    def _cancel_stuck(self, job, reason: str, since: dict[str, float], ran_on: dict) -> bool:
        """A job pending for `reason`, which the cluster cannot resolve by itself: once that
        has lasted hydra.launcher.pending_timeout_s, cancel it (say so, one line) and keep why
        for its record (self.stuck); whether it was cancelled."""
        bound = float(self.params["pending_timeout_s"])
        first = since.setdefault(job.job_id, time.time())
        if time.time() - first < bound:
            return False
        cancel([job.job_id])
        out = nodes_out()
        why = (
            f"pending over hydra.launcher.pending_timeout_s={bound:g} s for a reason the "
            f"cluster cannot resolve by itself ({reason}); nodes out: "
            + (", ".join(out) or "none listed")
            + (f"; it ran on {ran_on[job.job_id]} before" if job.job_id in ran_on else "")
            + "; cancelled by the sweep"
        )
        self.stuck[job.job_id] = why
        print(f"[error] SLURM job {job.job_id}: {why}", file=sys.stderr)
        return True

    def _outcome(self, job, overrides, number: int, state: tuple[str, str]) -> JobReturn:
        """The point's JobReturn; a job that ended without an ok record is recorded here."""
        if job.job_id in self.stuck:  # cancelled by the sweep: it could never run
            config = self._job_config(overrides, number, job)
            error = f"SlurmJob: job {job.job_id} {self.stuck[job.job_id]}"
            return self._record_outside(config, overrides, job, "error", error, state[1])
        try:  # rank 0's (task 0's): submitit's job.results() would wait for every task's,
            # and for a task that died without one, on accounting (sacct) a cluster may not run
            returned = job.task(0).result() if job.paths.result_pickle.exists() else None
        except Exception as err:  # the job raised, or submitit gave up on it
            returned, why = None, describe(err)
        else:
            why = None
        if isinstance(returned, JobReturn) and returned.status == JobStatus.FAILED:
            # raised inside Hydra's job: submitit's time-limit handler gives up this way
            returned, why = None, describe(returned._return_value)
        config = self._job_config(overrides, number, job)
        scheduler_state, node = state
        if scheduler_state == "COMPLETED" and isinstance(returned, JobReturn):
            return returned
        requeues = requeues_logged(job)
        if why is None and requeues and "this job is timed-out" in job_log(job):
            # requeued at its time limit, its rerun ended without a result: on SLURM 22.05
            # the rerun may get the time-limit signal at once, before submitit can catch it
            why = f"requeued {requeues} time(s) at its time limit; the rerun left no result"
        lost = tasks_lost(job)  # a rank that died: its node, from srun (a point across nodes)
        if lost and scheduler_state not in STATUS_OF:
            why = f"lost {'; '.join(lost)}" + (f"; {why}" if why else "")
        timed_out = why is not None and ("timed-out" in why or "time limit" in why)
        slurm_status = STATUS_OF.get(scheduler_state, "timeout" if timed_out else "error")
        error = (
            f"SlurmJob: job {job.job_id} ended {scheduler_state}"
            + (f" on {node}" if node else "")
            + (f" ({why})" if why else "")
        )
        return self._record_outside(config, overrides, job, slurm_status, error, node)

    def _job_config(self, overrides, number: int, job):
        """The run's composed config, as its job had it (its number, its SLURM job id)."""
        config = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
        with open_dict(config):
            config.hydra.job.num = number
            config.hydra.job.id = job.job_id
        return config

    def _record_outside(self, config, overrides, job, status: str, error: str, node: str):
        """Record the run of `job`, which ended without an ok record of its own, with `status`
        (runner/job.record_ended_outside keeps what the job recorded before it was stopped);
        its JobReturn, whose value is the status the run ended with."""
        job_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        task = copy.deepcopy(config)
        with open_dict(task):
            del task["hydra"]
        spec = to_spec(task, here=False)
        if spec.dist.nproc > 1:  # its ranks were the job's tasks: measured in rank 0's process
            spec = in_place(spec)
        point = Job(job_dir=job_dir, overrides=list(overrides), sweep_dir=job_dir.parent)
        final = record_ended_outside(spec, point, status, error, job.job_id, node or None)
        return JobReturn(
            overrides=list(overrides),
            cfg=task,
            hydra_cfg=config,
            working_dir=str(job_dir),
            task_name=str(config.hydra.job.name),
            status=JobStatus.COMPLETED,
            _return_value=final,
        )

    def _interrupted(self, jobs: list, job_overrides, numbers: range) -> list[JobReturn]:
        """Ctrl-C or SIGTERM while the round's jobs run: SLURM started them outside this
        process's group, so no signal reached them. Cancel them (scancel: SLURM sends each
        SIGTERM, and its job records what it measured as `interrupted`), wait until SLURM has
        ended them, and record every run without an ok record `interrupted`; a run that
        finished first keeps its own. The JobReturns go back to the grid sweeper, which stops
        on an interrupted run: the table of what is done, one line, exit 130 (143 after
        SIGTERM). The same command resumes: its ok runs are kept, the others measured."""
        ids = [job.job_id for job in jobs]
        # a second Ctrl-C must not stop scancel half-way (it would reach scancel, in this
        # group, too): ignored while it runs; after it, a second signal ends the wait and the
        # records early (the grid sweeper writes the table of what is recorded)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            cancel(ids)
        finally:
            signal.signal(signal.SIGINT, previous)
        print(
            f"interrupted: cancelled {len(ids)} SLURM job(s) of this round: {' '.join(ids)}",
            file=sys.stderr,
        )
        states = wait_ended(ids, at_most_s=CANCEL_WAIT_S)
        returns = []
        for job, overrides, number in zip(jobs, job_overrides, numbers, strict=True):
            state, node = states.get(job.job_id, ("UNKNOWN", ""))
            if state == "COMPLETED" and job.paths.result_pickle.exists():
                returns.append(self._outcome(job, overrides, number, (state, node)))
                continue
            config = self._job_config(overrides, number, job)
            why = f"SlurmJob: job {job.job_id} cancelled by the sweep on its interruption"
            returns.append(self._record_outside(config, overrides, job, "interrupted", why, node))
        return returns

    def _end_earlier_jobs(self, sweep_dir: Path) -> None:
        """Jobs of an earlier run of this sweep still queued or running: cancel them and wait
        for them to end, so that no two jobs measure one point into one job dir."""
        earlier = list((read_json(sweep_dir / JOBS_FILE) or {}).values())
        states = scheduler_states(earlier)
        alive = [jid for jid in earlier if jid in states and states[jid][0] not in ENDED]
        if alive:
            print(
                f"resume: cancelling {len(alive)} SLURM job(s) of an earlier run: {' '.join(alive)}"
            )
            cancel(alive)
            wait_ended(alive, at_most_s=120)
