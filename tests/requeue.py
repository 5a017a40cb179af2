"""Slurm jobs as the tests see them (tests/test_slurm_jobs.py, tests/test_train_multihost.py): their records, and
starting a requeued one at once."""

from __future__ import annotations

import re
import subprocess
import time

import psutil


def show_job(job: str) -> list[dict[str, str]]:
    """``scontrol show job``'s record of ``job`` (an id scontrol takes: "42", an array task "41_1"), one dict per
    line: a heterogeneous job has one per component, its leader first."""
    for attempt in range(3):
        out = subprocess.run(["scontrol", "-o", "show", "job", job], capture_output=True, text=True, timeout=30)
        if out.returncode == 0:
            return [dict(f.split("=", 1) for f in line.split() if "=" in f) for line in out.stdout.splitlines()]
        # On a loaded machine slurmctld, short of CPU, may not answer within its MessageTimeout: ask again.
        assert "Socket timed out" in out.stderr and attempt < 2, out.stderr
        time.sleep(1)
    raise AssertionError("unreachable")


def stepds(job_ids: list[str]) -> list[str]:
    """The titles of the slurmstepd processes of these job ids still on this machine ("slurmstepd: [42.0]",
    "[42.batch]", ...): the nodes of the local clusters are all on this machine."""
    title = re.compile(rf"slurmstepd: \[({'|'.join(map(re.escape, job_ids))})[.+]")
    return [cmdline[0] for proc in psutil.process_iter(["cmdline"])
            if (cmdline := proc.info["cmdline"] or [""]) and title.match(cmdline[0])]


def start_requeued_now(job: str, *updates: str, timeout: float = 120) -> None:
    """Start the pending, requeued ``job`` now (with ``updates`` to its record): Slurm holds a requeued batch job for
    about two minutes (its BeginTime), a wait that is the scheduler's, not the run's. The hold also gives the job's
    previous start time to end on its nodes, which this waits for instead: a step launched while the previous
    start's slurmstepd of the same step id lives fails to launch (its PMIx socket is still bound), and slurmd
    refuses to start a job whose credential dates from the second its previous start's was revoked in ("Killing
    non-startable batch job: Job credential revoked")."""
    job_ids = [record["JobId"] for record in show_job(job)]  # every component of a heterogeneous job
    deadline = time.monotonic() + timeout
    while left := stepds(job_ids):
        assert time.monotonic() < deadline, f"the previous start of job {job} never ended: {left}"
        time.sleep(0.5)
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now", *updates], check=True, timeout=30)
