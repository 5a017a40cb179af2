"""Small helpers around the Slurm command-line tools (no accounting daemon is assumed: `sacct` may not exist)."""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterable
from pathlib import Path

TERMINAL_STATES = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED",
                   "BOOT_FAIL", "DEADLINE"}


def job_states(job_id: str) -> dict[str, str]:
    """``{job or array-task id: state}`` for a job (every task of an array job), from ``scontrol show job``.

    Works without accounting, for as long as slurmctld remembers finished jobs (MinJobAge).
    """
    out = subprocess.run(["scontrol", "-o", "show", "job", str(job_id)], capture_output=True, text=True, timeout=30)
    if out.returncode != 0:
        raise RuntimeError(f"scontrol show job {job_id} failed: {out.stderr.strip()}")
    states = {}
    for line in out.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        task = fields.get("ArrayTaskId")
        key = f"{fields['ArrayJobId']}_{task}" if task and fields.get("ArrayJobId") else fields["JobId"]
        states[key] = fields["JobState"]
    return states


def wait_for_jobs(job_ids: list[str], timeout: float, poll: float = 0.5) -> dict[str, str]:
    """Wait until every job (and every task of an array job) is in a terminal state; return their states.

    Polls with backoff up to a second: one ``scontrol show job`` a second costs slurmctld little, and a longer
    ceiling would add seconds to the wait for a job that ends a minute in. Raises TimeoutError naming the jobs still
    running after ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        states: dict[str, str] = {}
        for job in job_ids:
            states.update(job_states(job))
        if states and all(s in TERMINAL_STATES for s in states.values()):
            return states
        if time.monotonic() > deadline:
            running = {k: v for k, v in states.items() if v not in TERMINAL_STATES}
            raise TimeoutError(f"Slurm jobs still not finished after {timeout:.0f}s: {running}")
        time.sleep(poll)
        poll = min(poll * 1.5, 1.0)


def task_folders(submitit_dir: Path, earlier: set[str] = frozenset()) -> list[str]:
    """The job folders submitit made in ``submitit_dir``, those named in ``earlier`` left out: one per array task
    ("<job>_<task>"; the array's own "<job>" folder then holds nothing of a member), or one for a single job."""
    folders = sorted(p.name for p in submitit_dir.iterdir() if p.is_dir() and p.name not in earlier) \
        if submitit_dir.is_dir() else []
    return [name for name in folders if "_" in name] or folders


def submitted_jobs(submitit_dir: Path, earlier: set[str] = frozenset()) -> list[str]:
    """The job ids (an array's own id once) of the folders ``task_folders`` names."""
    return sorted({name.split("_")[0] for name in task_folders(submitit_dir, earlier)})


def active_jobs(job_ids: Iterable[str]) -> list[str]:
    """Those of ``job_ids`` with a task not yet in a terminal state. A job slurmctld has forgotten (MinJobAge) has
    ended long ago: it is not active."""
    active = []
    for job in job_ids:
        try:
            states = job_states(job)
        except RuntimeError:
            continue
        if any(state not in TERMINAL_STATES for state in states.values()):
            active.append(job)
    return active


def cancel(job_ids: Iterable[str]) -> None:
    """``scancel`` the jobs (every task of an array job); one that has ended already is no error."""
    job_ids = list(job_ids)
    if job_ids:
        subprocess.run(["scancel", *job_ids], capture_output=True, timeout=30)


class RequeueError(RuntimeError):
    """``scontrol requeue`` did not requeue the job (refused, killed, timed out or not installed)."""


def _job_field(job_id: str, field: str) -> str | None:
    """``field`` of ``scontrol show job job_id``, or None if unknown (no such job, field or scontrol)."""
    try:
        out = subprocess.run(["scontrol", "-o", "show", "job", job_id], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(rf"\b{field}=(\S+)", out.stdout)
    return found[1] if found else None


def restarts(job_id: str) -> int | None:
    """How many times Slurm has requeued ``job_id`` (``Restarts`` of ``scontrol show job``), or None if unknown."""
    value = _job_field(job_id, "Restarts")
    return int(value) if value is not None and value.isdigit() else None


def job_stderr(job_id: str) -> Path | None:
    """Where the batch job writes its stderr (``StdErr`` of ``scontrol show job``; srun's own messages go there), or
    None if unknown."""
    value = _job_field(job_id, "StdErr")
    return Path(value) if value is not None else None


def requeue(job_id: str, timeout: float = 60) -> None:
    """Put this running batch job back in the queue (``scontrol requeue``); raises RequeueError saying why not.

    A requeue ends the running job with TERM, which can kill ``scontrol`` itself before it reports success: a
    failed call is judged by whether Slurm counted a restart of this job since it started."""
    try:
        out = subprocess.run(["scontrol", "requeue", job_id], capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        why = f"did not run to the end: {e}"
    else:
        if out.returncode == 0:
            return
        why = "failed: " + (out.stderr.strip() or (f"killed by signal {-out.returncode}" if out.returncode < 0
                                                   else f"exit status {out.returncode}, no message"))
    before = int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    for wait in (0.0, 0.5, 1.0, 2.0):  # slurmctld may still be processing the request
        time.sleep(wait)
        if (restarts(job_id) or 0) > before:
            return
    raise RequeueError(f"scontrol requeue {job_id} {why}")


def slurm_job_id() -> str | None:
    """This job's id as scontrol takes it: ``<array job>_<task>`` for an array task, else the job id."""
    if "SLURM_ARRAY_JOB_ID" in os.environ and "SLURM_ARRAY_TASK_ID" in os.environ:
        return f"{os.environ['SLURM_ARRAY_JOB_ID']}_{os.environ['SLURM_ARRAY_TASK_ID']}"
    return os.environ.get("SLURM_JOB_ID")


def slurm_environment() -> dict[str, str]:
    """Every ``SLURM_*`` variable of this process (recorded in a run's meta.json)."""
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith("SLURM_")}
