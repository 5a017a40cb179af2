"""One writer per run: the run lock (``runs/<run>/lock``), taken by the controller before it writes anything.

    holder = acquire_run_lock(run_dir)   # raises RunLockedError naming the holder (host, pid, Slurm job)
    ...
    release_run_lock(run_dir)            # at a clean end

The lock is a file created with ``O_CREAT | O_EXCL``, holding JSON: host, pid, Slurm job id, start time. Exclusive
creation is atomic on local filesystems, NFSv3+ and Lustre/GPFS alike, where ``flock`` may be node-local (Lustre's
``localflock``) or missing, so two jobs on different nodes could both "hold" it. The price: a job that dies
without releasing it (SIGKILL, a node failure) leaves the file behind. The next job takes such a stale lock over,
with a log line, when its holder is provably gone:

- the holder's Slurm job is this job (a requeued job restarting) and the holder is not a live process here, or
- the holder's Slurm job is no longer running (``scontrol show job``: a terminal state, or unknown to Slurm), or
- the holder ran on this host and its pid is gone (or is this process: a run in one process started twice).

Anything else (a live pid here, a running Slurm job, another host without Slurm) is refused; the message says how
to remove a lock that is known to be stale. Two jobs taking over the same stale lock at the same instant is not
ruled out (the check and the unlink are two steps); it needs a crashed holder and two restarts within
milliseconds.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import time
from pathlib import Path

from hpc_rl.slurm import TERMINAL_STATES, job_states, slurm_job_id
from hpc_rl.storage.layout import RunLayout

log = logging.getLogger(__name__)


class RunLockedError(RuntimeError):
    """Another job holds the run."""


def this_holder() -> dict:
    return {"host": socket.gethostname(), "pid": os.getpid(), "slurm_job_id": slurm_job_id(),
            "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def describe(holder: dict) -> str:
    job = holder.get("slurm_job_id")
    return (f"host {holder.get('host')}, pid {holder.get('pid')}, "
            f"{'Slurm job ' + str(job) if job else 'no Slurm job'}, since {holder.get('start_time')}")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _slurm_job_running(job: str) -> bool | None:
    """Whether Slurm runs (or will run) ``job``: True, False (ended or unknown to Slurm), None (cannot ask)."""
    try:
        states = job_states(job)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None  # no Slurm here
    except RuntimeError as err:
        return False if "Invalid job id" in str(err) else None
    return any(state not in TERMINAL_STATES for state in states.values())


def stale_reason(holder: dict, me: dict) -> str | None:
    """Why ``holder``'s lock is stale (its job is provably gone), or None when it may still be running."""
    same_host = holder.get("host") == me["host"]
    pid = holder.get("pid")
    alive_here = same_host and isinstance(pid, int) and _pid_alive(pid)
    if same_host and pid == me["pid"]:
        return "this process took it earlier (a run in one process started again without closing the first)"
    job = holder.get("slurm_job_id")
    if job and job == me["slurm_job_id"] and not alive_here:
        return f"it is this Slurm job's ({job}): the job was requeued"
    if job and job != me["slurm_job_id"] and _slurm_job_running(job) is False:
        return f"Slurm job {job} is no longer running"
    if same_host and isinstance(pid, int) and not alive_here:
        return f"pid {pid} is gone from {me['host']}"
    return None


def _read(path: Path) -> dict | None:
    """The lock's JSON; None if the file is gone; {} if unreadable (a holder between creating and writing it)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (ValueError, OSError):
        return {}


def acquire_run_lock(run_dir: str | Path) -> dict:
    """Take the run lock of ``run_dir`` (created if missing) for this process; returns the lock's content.

    Raises RunLockedError naming the holder when another job that may be running holds it."""
    layout = RunLayout(run_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    path = layout.lock
    me = this_holder()
    for _ in range(3):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if holder == {}:  # being written: give its creator a moment
                time.sleep(0.5)
                holder = _read(path)
            if holder is None:
                continue  # released meanwhile
            why = stale_reason(holder, me) if holder else "the lock file is empty or unreadable"
            if why is None:
                raise RunLockedError(
                    f"{layout.root} is in use by another job ({describe(holder)}): one job writes a run at a time. "
                    f"If that job is gone, delete {path} and start again.")
            line = f"taking over the stale run lock of {layout.root} ({describe(holder)}): {why}"
            log.warning(line)
            print(line, flush=True)
            if _read(path) == holder:
                path.unlink(missing_ok=True)
            continue
        with os.fdopen(fd, "w") as fh:
            fh.write(json.dumps(me) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        return me
    raise RunLockedError(f"could not take the run lock {path}: other jobs keep taking it")


def release_run_lock(run_dir: str | Path) -> None:
    """Remove the run lock if this process holds it."""
    path = RunLayout(run_dir).lock
    holder = _read(path)
    me = this_holder()
    if holder and holder.get("host") == me["host"] and holder.get("pid") == me["pid"]:
        path.unlink(missing_ok=True)
