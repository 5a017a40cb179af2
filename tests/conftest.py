"""Shared fixtures: launching real MPI jobs under a timeout, the local Slurm cluster, a small tmpfs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_rl.launch import mpirun_command, rank_env

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def run_mpi(num_ranks: int, argv: list[str], timeout: float, env: dict | None = None, cwd: str | Path | None = None,
            check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python -m mpi4py ARGV`` on ``num_ranks`` local ranks; kill the whole job past ``timeout`` seconds."""
    cmd = mpirun_command(num_ranks, argv)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=rank_env(env), cwd=cwd or ROOT, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"MPI job {' '.join(argv)} did not finish within {timeout}s\nstdout:\n{out}\nstderr:\n{err}")
    result = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    if check and proc.returncode != 0:
        pytest.fail(f"MPI job {' '.join(argv)} exited {proc.returncode}\nstdout:\n{out}\nstderr:\n{err}")
    return result


@pytest.fixture(scope="session")
def mpi():
    """``mpi(num_ranks, argv, timeout)`` runs a real mpirun job (see ``run_mpi``)."""
    return run_mpi


@pytest.fixture
def tiny_tmpfs():
    """``tiny_tmpfs(directory, size)`` mounts a tmpfs of ``size`` (e.g. "1m") at ``directory``: a real filesystem
    that fills up (ENOSPC). Unmounted after the test; where mounting is not allowed (not root) the test is skipped."""
    mounted: list[Path] = []

    def mount(directory: str | Path, size: str) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                                               capture_output=True).returncode != 0:
            pytest.skip("mounting a tmpfs needs root")
        mounted.append(directory)
        return directory

    yield mount
    for directory in reversed(mounted):
        subprocess.run(["umount", str(directory)], check=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local single-node Slurm cluster, brought up once per session.

    Outside CI a machine where it cannot be brought up (not root, no Slurm) skips the tests that need it, saying
    why; in CI (CI=true) that is a failure, so a broken cluster never passes silently.
    """
    script = ROOT / "slurm" / "local_cluster.sh"
    reason = None
    was_running = subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0
    if os.geteuid() != 0:
        reason = "the local Slurm cluster needs root (munged and slurmd run as root/munge)"
    else:
        up = subprocess.run(["bash", str(script), "up"], capture_output=True, text=True, timeout=120)
        if up.returncode != 0:
            reason = f"slurm/local_cluster.sh up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}"
    if reason:
        if IN_CI:
            pytest.fail(reason)
        print(f"\nSKIP slurm tests: {reason}", file=sys.stderr)
        pytest.skip(reason)
    yield script
    if not was_running:  # leave the machine as the session found it
        subprocess.run(["bash", str(script), "down"], capture_output=True, timeout=60)
