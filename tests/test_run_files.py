"""A run's files under crashes, concurrent jobs and live readers, on real MPI ranks: a job killed mid-run (each role
in turn, SIGKILL) is resumed by the same command, with metrics.h5 recovered and versions continuing from the last
checkpoint; a second job on a running run refuses naming the holder; readers polling metrics.h5, the latest
checkpoint and the pool never break the job or fail themselves."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from hpc_rl.launch import mpirun_command, rank_env
from hpc_rl.storage import load_latest, open_run, read_metrics
from hpc_rl.storage.checkpoint import committed_versions
from hpc_rl.storage.layout import RunLayout
from test_pipeline import SMALL, Job

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(900)]

ROLE_RANKS = {"controller": 0, "env": 1, "inference": 3, "learner": 4}  # the 6-rank local topology


def _train(runs: Path, name: str, extra: list[str]) -> Job:
    return Job(mpirun_command(6, [str(ROOT / "jobs/train.py"), f"run_name={name}", f"runs_dir={runs}", *extra]), runs)


def _rank_pid(run_dir: Path, rank: int) -> int:
    """The pid of ``rank`` in the latest attempt (a rank's log gains a line per attempt)."""
    lines = [line for line in RunLayout(run_dir).rank_log(rank).read_text().splitlines() if " pid " in line]
    return int(lines[-1].split(" pid ")[1].split()[0].rstrip(","))


def _flushed(run_dir: Path) -> int:
    """The last version metrics.h5 holds a train/policy_loss row for (-1: none yet)."""
    rows = read_metrics(RunLayout(run_dir).metrics).get("train/policy_loss")
    return int(rows["version"][-1]) if rows is not None and len(rows) else -1


def _wait_for_rows_and_checkpoint(job: Job, run_dir: Path, version: int, timeout: float) -> None:
    """Until metrics.h5 holds rows past ``version`` and a checkpoint of ``version`` or later is committed."""
    deadline = time.monotonic() + timeout
    while not (_flushed(run_dir) > version
               and any(v >= version for v in committed_versions(RunLayout(run_dir).checkpoints))):
        if job.proc.poll() is not None or time.monotonic() > deadline:
            job.kill()
            pytest.fail(f"no rows past and checkpoint of version {version}; output:\n{job.output}")
        time.sleep(0.2)


def test_jobs_killed_mid_run_are_resumed_by_the_same_command(tmp_path):
    # One run, killed four times: the controller (it dies holding metrics.h5 in SWMR mode), then an env, an
    # inference and a learner rank; each time the same command resumes it, and the last attempt finishes.
    command = [*SMALL, "pipeline.max_versions=50", "pipeline.checkpoint_every=2", "pipeline.heartbeat_timeout_s=15"]
    run_dir = tmp_path / "r"
    layout = RunLayout(run_dir)
    job = _train(tmp_path, "r", command)
    resumed_from, kept = 0, {}
    for role, rank in ROLE_RANKS.items():
        _wait_for_rows_and_checkpoint(job, run_dir, resumed_from + 4, timeout=240)
        live = read_metrics(layout.metrics)
        for name, rows in kept.items():  # the rows up to the last resume point are intact
            np.testing.assert_array_equal(live[name][:len(rows)], rows, err_msg=f"{name} before killing {role}")
        os.kill(_rank_pid(run_dir, rank), signal.SIGKILL)
        assert job.wait(90) != 0, job.output
        resumed_from = load_latest(layout.checkpoints).version
        assert resumed_from < 50, job.output  # killed before the end
        before = read_metrics(layout.metrics)  # what the killed job left (an SWMR read sees it)
        assert _flushed(run_dir) >= resumed_from, role  # every checkpointed version's rows were flushed
        kept = {name: rows[rows["version"] <= resumed_from] for name, rows in before.items()}

        job = _train(tmp_path, "r", command)  # the same command again
        job.wait_for(f"resuming {run_dir} from version {resumed_from}", timeout=240)
        if role == "controller":
            job.wait_for("(was left open by a crashed job)", timeout=120)
            rows = sum(map(len, kept.values()))
            assert f"recovered metrics.h5: {rows} rows up to version {resumed_from}" in job.output, job.output
        assert "taking over the stale run lock" in job.output, (role, job.output)  # the killed job never released it
    assert job.wait(300) == 0, job.output
    run = open_run(run_dir)
    assert run.meta["resumed_from"] == resumed_from
    after = run.metrics
    for name, rows in kept.items():
        np.testing.assert_array_equal(after[name][:len(rows)], rows, err_msg=name)
    assert after["train/policy_loss"]["version"].tolist() == list(range(1, 51))  # every version exactly once
    for name, rows in after.items():
        assert np.all(np.diff(rows["version"]) > 0), name
    assert json.loads(layout.status.read_text())["state"] == "finished"
    assert not layout.lock.exists()  # released at the clean end


def test_a_second_job_is_refused_and_readers_never_break_a_live_run(tmp_path):
    # A MOBA run with the opponent pool (pool.h5, league/* series) polled flat out by two readers for its whole
    # length; metric names first appear mid-run, while the readers read.
    run_dir, stop = tmp_path / "live", tmp_path / "stop"
    layout = RunLayout(run_dir)
    command = ["env.num_envs=4", "env.moba.time_limit=300", "pipeline.segment_len=32", "pipeline.segments_per_batch=2",
               "ppo.num_minibatches=2", "pipeline.max_versions=100000", "pipeline.checkpoint_every=2",
               "pipeline.keep_every=2"]
    readers = [subprocess.Popen([sys.executable, str(ROOT / "tests/programs/read_run_forever.py"), str(run_dir),
                                 str(stop)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=rank_env())
               for _ in range(2)]
    try:
        first = _train(tmp_path, "live", command)
        first.wait_for("v    1", timeout=240)
        holder = json.loads(layout.lock.read_text())
        second = _train(tmp_path, "live", command)
        assert second.wait(180) != 0, second.output
        assert (f"is in use by another job (host {holder['host']}, pid {holder['pid']}, no Slurm job"
                in second.output), second.output
        assert first.proc.poll() is None, first.output  # refused while the first job ran
        _wait_for_rows_and_checkpoint(first, run_dir, 2, timeout=240)  # version 2 joins the pool
        os.kill(holder["pid"], signal.SIGUSR2)  # the first job stops at its next version, as when Slurm preempts it
        code = first.wait(180)
    finally:
        stop.touch()
        reports = [json.loads(r.communicate(timeout=120)[0].splitlines()[-1]) for r in readers]
    assert code == 0, first.output
    for report in reports:
        assert report["errors"] == [] and report["reads"] > 10, report
        assert set(report["names"]) > set(report["first_names"]), report  # names created while it read
    final = json.loads(layout.status.read_text())["version"]
    run = open_run(run_dir)
    assert run.metrics["train/policy_loss"]["version"].tolist() == list(range(1, final + 1))
    assert run.checkpoint_versions[-1] == final and run.pool["version"]
    assert (tmp_path / "index.tsv").read_text().count("live\t") == 1  # the second job wrote nothing
    assert layout.rank_log(0).read_text().count(" pid ") == 1
    assert not layout.lock.exists()


def _starting_ranks(name: str, count: int, timeout: float) -> list[int]:
    """The pids of the ``count`` Python ranks of the job whose command line names ``run_name=<name>``, as soon as
    they exist."""
    deadline = time.monotonic() + timeout
    while True:
        pids = []
        for proc in Path("/proc").iterdir():
            try:
                argv = (proc / "cmdline").read_bytes().split(b"\0")
            except (OSError, ValueError):
                continue
            if f"run_name={name}".encode() in argv and b"mpi4py" in argv and not argv[0].endswith(b"mpirun"):
                pids.append(int(proc.name))
        if len(pids) == count:
            return pids
        assert time.monotonic() < deadline, f"found {len(pids)} ranks of {name}"
        time.sleep(0.01)


def _catches_usr2(pid: int) -> bool:
    caught = next(line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("SigCgt"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGUSR2 - 1) & 1)


def test_a_preemption_signal_while_the_ranks_start_stops_the_run_at_its_first_version(tmp_path):
    """USR2 (``scancel --batch --signal=USR2`` relayed by srun, or Slurm's time-limit warning) reaching the ranks
    while they import torch and start MPI: held from jobs/train.py's first line, it stops the run at its first
    version, committed, instead of killing the ranks (Python's default for SIGUSR2)."""
    job = _train(tmp_path, "early", [*SMALL, "pipeline.max_versions=100000"])
    pids = _starting_ranks("early", 6, timeout=120)
    # Signal as soon as every rank holds USR2, or after 2 s (a rank that never holds it is killed, and the test
    # fails): either way long before the ranks finish importing the training stack.
    deadline = time.monotonic() + 2.0
    while not all(_catches_usr2(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.005)
    assert not (tmp_path / "early" / "status.json").exists()  # the run had not started
    for pid in pids:
        os.kill(pid, signal.SIGUSR2)
    code = job.wait(300)
    assert code == 0, job.output
    assert "signal 12: stopping at version 1" in job.output, job.output
    status = json.loads(RunLayout(tmp_path / "early").status.read_text())
    assert status["state"] == "preempted" and status["version"] == 1, status
    assert load_latest(RunLayout(tmp_path / "early").checkpoints).version == 1
