"""Starting a requeued Slurm job at once in the tests (tests/test_slurm_jobs.py, tests/test_train_multihost.py)."""

from __future__ import annotations

import re
import subprocess
import time

import psutil


def stepds_of(job: str) -> list[str]:
    """The titles of the slurmstepd processes still on this machine of ``job`` (an id ``scontrol`` takes: "42",
    an array task "41_1"; all the components of a heterogeneous job): "slurmstepd: [42.0]", "[42.batch]", ... The
    nodes of the local clusters are all on this machine."""
    for attempt in range(3):
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30)
        if shown.returncode == 0:
            break
        # On a loaded machine slurmctld, short of CPU, may not answer within its MessageTimeout: ask again.
        assert "Socket timed out" in shown.stderr and attempt < 2, shown.stderr
        time.sleep(1)
    ids = "|".join(re.findall(r"\bJobId=(\d+)", shown.stdout))
    title = re.compile(rf"slurmstepd: \[({ids})[.+]")
    titles = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or [""]
        if title.match(cmdline[0]):
            titles.append(cmdline[0])
    return titles


def start_requeued_now(job: str, *updates: str, timeout: float = 120) -> None:
    """Start the pending, requeued ``job`` now (with ``updates`` to its record): Slurm holds a requeued batch job for
    about two minutes (its BeginTime), a wait that is the scheduler's, not the run's. The hold also gives the job's
    previous start time to end on its nodes, which this waits for instead: a step launched while the previous
    start's slurmstepd of the same step id lives fails to launch (its PMIx socket is still bound), and slurmd
    refuses to start a job whose credential dates from the second its previous start's was revoked in ("Killing
    non-startable batch job: Job credential revoked")."""
    deadline = time.monotonic() + timeout
    while left := stepds_of(job):
        assert time.monotonic() < deadline, f"the previous start of job {job} never ended: {left}"
        time.sleep(0.5)
    time.sleep(2)
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now", *updates], check=True, timeout=30)
