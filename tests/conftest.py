"""Shared fixtures: launching real MPI jobs under a timeout, the local Slurm cluster, a small tmpfs; and the rule
on skips: a test is skipped only for an absence listed in ABSENCES, any other skip fails the session."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import NoReturn

import pytest

from hpc_rl.launch import mpirun_command, rank_env

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

# The only reasons a test may be skipped: the machine lacks something that no install provides. Every package the
# tests import is installed by `make setup` (and environment.yml), so a test imports it plainly and fails without
# it; a Slurm cluster that does not come up is a failure too. Any other skip (pytest.skip, importorskip, a skip
# marker) fails the session, listed in its report. A new kind is added here with the tests that need it.
ABSENCES = {
    "root": "root privileges: mounting a tmpfs, starting munged and slurmd, making network namespaces",
    "gpu": "a CUDA device: the GPU path's tests (tests/test_gpu.py; docs/GPU.md runs them on a GPU machine)",
}
CI_PROVIDES = {"root"}  # the CI machine (.ci/run) runs as root: there these absences fail instead
_ABSENT = re.compile(r"absent (\w+): ")


def skip_absent(kind: str, reason: str) -> NoReturn:
    """Skip the running test because this machine lacks ``kind`` (a key of ABSENCES); ``reason`` says what needs
    it. In CI, an absence of what CI provides fails the test instead."""
    if kind not in ABSENCES:
        raise ValueError(f"{kind!r} is not an absence a test may be skipped for (tests/conftest.py ABSENCES: "
                         f"{', '.join(sorted(ABSENCES))})")
    if IN_CI and kind in CI_PROVIDES:
        pytest.fail(f"{reason}, and CI (CI=true) runs with {kind}")
    pytest.skip(f"absent {kind}: {reason}")


@pytest.fixture(scope="session")
def absent():
    """``absent(kind, reason)`` skips the test for a listed absence (see ``skip_absent``)."""
    return skip_absent


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    text = longrepr[2] if isinstance(longrepr, tuple) else str(longrepr)
    return text.removeprefix("Skipped: ")


class SkipRule:
    """Fails the session when a test or a module was skipped for anything but an absence in ABSENCES, and lists
    them: such a skip hides a missing install or a broken test behind a green run."""

    def __init__(self):
        self.refused: list[tuple[str, str]] = []

    def _check(self, report: pytest.TestReport | pytest.CollectReport) -> None:
        if not report.skipped or hasattr(report, "wasxfail"):
            return
        reason = _skip_reason(report)
        allowed = _ABSENT.match(reason)
        if allowed is None or allowed[1] not in ABSENCES:
            self.refused.append((report.nodeid, reason))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self._check(report)

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        self._check(report)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        if self.refused and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter) -> None:
        if not self.refused:
            return
        terminalreporter.section("skips that fail the session", red=True)
        for nodeid, reason in self.refused:
            terminalreporter.line(f"{nodeid}: {reason}")
        terminalreporter.line(f"A test may be skipped only for an absence in tests/conftest.py ABSENCES "
                              f"({', '.join(sorted(ABSENCES))}), through skip_absent or the `absent` fixture.")


def pytest_configure(config: pytest.Config) -> None:
    config.pluginmanager.register(SkipRule(), "hpc_rl_skip_rule")


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
    that fills up (ENOSPC). Unmounted after the test. Without root the test is skipped; a mount that fails as root
    fails it."""
    mounted: list[Path] = []

    def mount(directory: str | Path, size: str) -> Path:
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() != 0:
            skip_absent("root", "mounting a tmpfs needs root")
        done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                              capture_output=True, text=True)
        if done.returncode != 0:
            pytest.fail(f"mount -t tmpfs at {directory} failed as root ({done.returncode}): {done.stderr.strip()}")
        mounted.append(directory)
        return directory

    yield mount
    for directory in reversed(mounted):
        subprocess.run(["umount", str(directory)], check=True)


@pytest.fixture(scope="session")
def slurm_cluster():
    """The local single-node Slurm cluster, brought up once per session.

    Without root the tests that need it are skipped, saying why (in CI that is a failure); a cluster that does not
    come up fails them, so a broken cluster never passes silently.
    """
    script = ROOT / "slurm" / "local_cluster.sh"
    was_running = subprocess.run(["bash", str(script), "status"], capture_output=True).returncode == 0
    if os.geteuid() != 0:
        skip_absent("root", "the local Slurm cluster needs root (munged and slurmd run as root/munge)")
    up = subprocess.run(["bash", str(script), "up"], capture_output=True, text=True, timeout=120)
    if up.returncode != 0:
        pytest.fail(f"slurm/local_cluster.sh up failed ({up.returncode}):\n{up.stdout}\n{up.stderr}")
    yield script
    if not was_running:  # leave the machine as the session found it
        subprocess.run(["bash", str(script), "down"], capture_output=True, timeout=60)
