"""A job whose ranks failed is requeued and resumes, a limited number of times per run (slurm/train.sbatch).

    python -m hpc_rl.failures <srun's exit status> <the attempt's start, Unix seconds> [the job's Hydra overrides...]

The batch shell outlives its ranks: when srun ends and no TERM reached the shell (a ``scancel``, Slurm's preemption
or time limit, or a requeue already under way: never requeued here), train.sbatch runs this, whatever srun's exit
status (0 too: Slurm 22.05's srun exits 0 when its step failed to launch). It judges how the attempt ended
(``attempt_cause``): a rank's death, exception or hang named by the controller (``status.json`` state ``aborted``),
a failure the controller could not name (it was killed or raised itself, or a rank without a lifeline raised and
aborted the job), or an attempt whose
controller never ended the run (its ranks never ran), is a failure; a run that ended by a decision (finished,
preempted, cancelled, halted on non-finite losses, a refused requeue) or that was refused at its start (a bad
config, the run locked by another job, a checkpoint that does not fit: ``EXIT_BAD_CONFIG``, ``EXIT_REFUSED``) is
not, since the same job would end the same way again.
A failure is appended to ``status.json``'s ``failures`` with its cause, and the job is requeued (``scontrol
requeue``; it resumes from the last committed checkpoint, as after a preemption) while the run's failures are at
most ``pipeline.max_failure_requeues``; past it the state is ``failed`` with a message naming the failures, and the
job ends non-zero.

Its exit status is 1 when the attempt failed, 0 when it did not: what the job ends with where srun's own status was
0 or lost (train.sbatch's watchdog ended an srun that outlived its step).

The count is the run's, kept in its directory across jobs, not Slurm's ``SLURM_RESTART_COUNT``: that one counts the
requeues of one job id, preemptions included, and starts again at 0 for a job submitted anew.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # importing storage loads h5py: jobs/train.py imports this module before MPI starts
    from hpc_rl.storage.layout import RunLayout

# Exit statuses of a job refused before it trained (jobs/train.py, hpc_rl/roles/run.py): the same job would be
# refused again, so it is never requeued. Any other non-zero status is a failure.
EXIT_BAD_CONFIG = 2  # the command line's config is invalid
EXIT_REFUSED = 3  # the run is locked by another job, its checkpoint does not fit, --ntasks (or a heterogeneous
#                   job's component sizes) is wrong, or Slurm refused a preemption's requeue

# The states a controller writes when the run ended by its own decision (``Controller.finish``, ``_on_halt``, the
# refused requeue): not a failure.
DECIDED = ("finished", "preempted", "cancelled", "time_limit", "requeue_failed", "halted_nonfinite")


def attempt_cause(exit_status: int, status: dict[str, Any], started: float, srun_report: str | None) -> str | None:
    """Why the attempt that started at ``started`` (Unix seconds) and whose srun ended with ``exit_status`` failed,
    or None where it did not fail: where the run ended by a decision of its controller written in this attempt, not
    by srun's status alone, which is 0 for a step whose tasks never launched. ``status``: the run's ``status.json``
    now ({} without one); only what this attempt wrote into it (its ``time`` not before ``started``) says how this
    attempt ended. ``srun_report``: the first failed task srun reported (``first_failed_task``): srun may end the
    job before the controller names the rank (a rank that dies inside a PMIx exchange, or the controller itself)."""
    if exit_status in (EXIT_BAD_CONFIG, EXIT_REFUSED):
        return None
    written_now = status.get("time", float("-inf")) >= started
    if written_now and status.get("state") in DECIDED:
        return None
    if written_now and status.get("state") == "aborted":
        return status["reason"]
    if exit_status == 0:  # Slurm 22.05's srun exits 0 when its step's tasks failed to launch
        return ("srun exited with status 0 but the run's controller ended nothing in this attempt: its ranks never "
                "ran (a step that failed to launch; the job's output and slurmd's log say why)")
    unnamed = f"srun exited with status {exit_status} before the controller named a rank"
    if srun_report is None:
        return f"{unnamed} (a rank raised and aborted the job, or its output was not found: the job's output says)"
    return f"{srun_report}, as srun reported first ({unnamed})"


# srun's report of tasks that ended badly: "srun: error: <node>: task 3: Killed", "...: tasks 0-2: Killed",
# "...: task 0: Exited with exit code 1". A task is a rank.
SRUN_TASK_FAILED = re.compile(r"^srun: error: \S+: (tasks?) ([0-9][0-9,-]*): (.+)$")


def first_failed_task(output: str, roles: dict[str, str]) -> str | None:
    """The first task that srun reported failed in the last attempt in ``output`` (the job's stderr from its last
    ``hpc_rl: job `` line, which train.sbatch prints at each start), named as rank and role (``roles``: meta.json's
    rank -> role), or None."""
    attempt = output[output.rfind("\nhpc_rl: job ") + 1:]
    for line in attempt.splitlines():
        found = SRUN_TASK_FAILED.match(line)
        if found:
            kind, tasks, what = found.groups()
            if kind == "task":
                return f"rank {tasks} ({roles.get(tasks, 'role unknown')}): {what}"
            return f"ranks {tasks}: {what}"
    return None


def _from(committed: int) -> str:
    return f"version {committed}" if committed >= 0 else "the start"


def judge_failure(failures: list[dict[str, Any]], cause: str, committed: int, limit: int,
                  run_name: str) -> tuple[bool, str]:
    """Whether the run's latest failure (the last of ``failures``, its ``cause``; ``committed``: the version a
    resume starts from) is requeued: while the run's failures are at most ``limit``. Returns that and the reason
    ``status.json`` gives, which past the limit names the failures and what to do."""
    if len(failures) <= limit:
        return True, (f"{cause}; requeued, resuming from {_from(committed)} (the run's failure {len(failures)}; "
                      f"pipeline.max_failure_requeues={limit})")
    return False, (f"{cause}. Run {run_name} has failed {len(failures)} times, more than the {limit} requeues "
                   f"pipeline.max_failure_requeues allows: not requeued (a failure on every attempt is a bug or a "
                   f"broken node, not bad luck). Find the cause in the job's output and the run's logs/; submitting "
                   f"the same job again resumes from {_from(committed)} (pipeline.max_failure_requeues="
                   f"{len(failures)} or more lets later failures requeue again)")


class _TermFlag:
    """A TERM while this runs (a ``scancel``, which every process of the job gets) cancels the requeue."""

    def __init__(self) -> None:
        self.raised = False
        signal.signal(signal.SIGTERM, self._raise)

    def _raise(self, signum, frame) -> None:
        self.raised = True


def after_srun(exit_status: int, started: float, overrides: list[str]) -> bool:
    """Judge the attempt; record a failure in ``status.json`` and requeue the job while the limit allows. Returns
    whether the attempt failed (a run whose failure cannot be judged, its config not composing or its directory
    never made, counts as failed)."""
    term = _TermFlag()
    if exit_status in (EXIT_BAD_CONFIG, EXIT_REFUSED):  # the job said why; its config may not even compose
        print(f"hpc_rl: exit status {exit_status}, a refusal: the same job would be refused again, not requeued",
              flush=True)
        return False
    from hpc_rl.config import compose_config
    from hpc_rl.slurm import RequeueError, requeue, slurm_job_id
    from hpc_rl.storage.checkpoint import committed_versions
    from hpc_rl.storage.layout import RunLayout
    from hpc_rl.storage.run import read_status, write_status

    try:
        config = compose_config(overrides)
    except Exception as err:  # noqa: BLE001 - Hydra's errors have no common base; the job's output said it first
        print(f"hpc_rl: not requeued: the job's config does not compose ({err})", flush=True)
        return True
    run_dir = Path(config.runs_dir) / config.run_name
    layout = RunLayout(run_dir)
    if not layout.meta.is_file():
        print(f"hpc_rl: not requeued: the job failed before it started run {run_dir}", flush=True)
        return True
    status = read_status(run_dir)
    job = slurm_job_id()
    cause = attempt_cause(exit_status, status, started, _srun_report(job, layout))
    if cause is None:
        if exit_status:  # srun's status alone would have called it a failure
            print(f"hpc_rl: not requeued: the run ended {status.get('state', 'without a status')}", flush=True)
        return False
    committed = max(committed_versions(layout.checkpoints), default=-1)
    failures = [*status.get("failures", []),
                {"cause": cause, "exit_status": exit_status, "job": job, "committed": committed, "time": time.time(),
                 "restart": int(os.environ.get("SLURM_RESTART_COUNT", "0"))}]
    requeued, reason = judge_failure(failures, cause, committed, config.pipeline.max_failure_requeues,
                                     config.run_name)
    if requeued and job is None:
        requeued, reason = False, f"{cause}; not requeued: not under Slurm"

    def record(requeued: bool, reason: str) -> None:
        failures[-1]["requeued"] = requeued
        write_status(run_dir, "requeued_after_failure" if requeued else "failed", committed, reason=reason,
                     failures=failures)
        print(f"hpc_rl: {reason}", file=sys.stdout if requeued else sys.stderr, flush=True)

    record(requeued, reason)  # before the requeue, which ends this job
    if not requeued:
        return True
    if term.raised:
        record(False, f"{cause}; not requeued: the job was cancelled")
        return True
    try:
        requeue(job)
    except RequeueError as err:
        record(False, f"{cause}; not requeued: {err}; submitting the same job again resumes from {_from(committed)}")
    return True


def _srun_report(job: str | None, layout: RunLayout) -> str | None:
    """``first_failed_task`` in the last 64 KiB of the job's stderr, or None where it cannot be read."""
    from hpc_rl.slurm import job_stderr

    path = job_stderr(job) if job is not None else None
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 65536))
            output = f.read().decode(errors="replace")
        roles = json.loads(layout.meta.read_text()).get("roles", {})
    except (OSError, ValueError):  # unreadable (another node's /tmp, /dev/null), or meta.json not JSON
        return None
    return first_failed_task(output, roles)


if __name__ == "__main__":
    sys.exit(1 if after_srun(int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]) else 0)
