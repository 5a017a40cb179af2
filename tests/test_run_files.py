"""A run's files under crashes, concurrent jobs and live readers, on real MPI ranks: a job killed mid-run is resumed
by the same command (metrics.h5 recovered, versions continuing from the last checkpoint), a second job on a running
run refuses naming the holder, and readers polling metrics.h5, the latest checkpoint and the pool never break the
job or fail themselves."""

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
from test_pipeline import SMALL, Job, _rank_pid

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(600)]

ROLE_RANKS = {"controller": 0, "env": 1, "inference": 3, "learner": 4}  # the 6-rank local topology


def _train(runs: Path, name: str, extra: list[str], ranks: int = 6) -> Job:
    return Job(mpirun_command(ranks, [str(ROOT / "jobs/train.py"), f"run_name={name}", f"runs_dir={runs}", *extra]),
               runs)


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


@pytest.mark.parametrize("role", ROLE_RANKS)
def test_a_job_killed_mid_run_is_resumed_by_the_same_command(tmp_path, role):
    command = [*SMALL, "pipeline.max_versions=30", "pipeline.checkpoint_every=2", "pipeline.heartbeat_timeout_s=15"]
    run_dir = tmp_path / "r"
    job = _train(tmp_path, "r", command)
    _wait_for_rows_and_checkpoint(job, run_dir, 4, timeout=240)
    os.kill(_rank_pid(run_dir, ROLE_RANKS[role]), signal.SIGKILL)
    assert job.wait(90) != 0, job.output
    resume_from = load_latest(RunLayout(run_dir).checkpoints).version
    assert resume_from < 30, job.output  # killed before the end
    before = read_metrics(RunLayout(run_dir).metrics)  # what the crashed job left (an SWMR read sees it)

    again = _train(tmp_path, "r", command)
    assert again.wait(300) == 0, again.output
    assert f"resuming {run_dir} from version {resume_from}" in again.output, again.output
    assert "taking over the stale run lock" in again.output  # the killed job never released it
    if role == "controller":  # killed holding metrics.h5 in SWMR mode
        assert "recovered metrics.h5:" in again.output and "(was left open by a crashed job)" in again.output
    run = open_run(run_dir)
    assert run.meta["resumed_from"] == resume_from
    after = run.metrics
    for name, rows in before.items():  # the rows up to the resume point are intact
        kept = rows[rows["version"] <= resume_from]
        np.testing.assert_array_equal(after[name][:len(kept)], kept, err_msg=name)
    assert after["train/policy_loss"]["version"].tolist() == list(range(1, 31))  # every version exactly once
    for name, rows in after.items():
        assert np.all(np.diff(rows["version"]) > 0), name
    assert json.loads(run.layout.status.read_text())["state"] == "finished"
    assert not run.layout.lock.exists()  # released at the clean end


def test_a_second_job_on_a_running_run_refuses_naming_the_holder(tmp_path):
    command = [*SMALL, "pipeline.max_versions=100000"]
    first = _train(tmp_path, "twice", command)
    first.wait_for("v    1", timeout=240)
    layout = RunLayout(tmp_path / "twice")
    holder = json.loads(layout.lock.read_text())
    second = _train(tmp_path, "twice", command)
    assert second.wait(120) != 0, second.output
    assert (f"is in use by another job (host {holder['host']}, pid {holder['pid']}, no Slurm job"
            in second.output), second.output
    assert first.proc.poll() is None, first.output  # refused while the first job ran
    os.kill(holder["pid"], signal.SIGUSR2)  # the first job stops at its next version, as when Slurm preempts it
    assert first.wait(120) == 0, first.output
    final = json.loads(layout.status.read_text())["version"]
    run = open_run(layout.root)
    assert run.metrics["train/policy_loss"]["version"].tolist() == list(range(1, final + 1))
    assert run.checkpoint_versions[-1] == final
    assert (tmp_path / "index.tsv").read_text().count("twice\t") == 1  # the second job wrote nothing
    assert layout.rank_log(0).read_text().count(" pid ") == 1
    assert not layout.lock.exists()


def test_readers_polling_a_live_run_never_break_it_or_fail(tmp_path):
    run_dir, stop = tmp_path / "live", tmp_path / "stop"
    readers = [subprocess.Popen([sys.executable, str(ROOT / "tests/programs/read_run_forever.py"), str(run_dir),
                                 str(stop)], stdout=subprocess.PIPE, text=True, cwd=ROOT, env=rank_env())
               for _ in range(2)]
    try:
        # MOBA with an evaluator rank and the opponent pool: rating and league series first appear mid-run.
        job = _train(tmp_path, "live", ["topology.evaluator=1", "env.num_envs=4", "env.moba.time_limit=300",
                                        "pipeline.segment_len=32", "pipeline.segments_per_batch=2",
                                        "ppo.num_minibatches=2", "pipeline.max_versions=6",
                                        "pipeline.checkpoint_every=2", "pipeline.keep_every=2",
                                        "evaluation.games=4"], ranks=7)
        code = job.wait(300)
    finally:
        stop.touch()
        reports = [json.loads(r.communicate(timeout=120)[0].splitlines()[-1]) for r in readers]
    assert code == 0, job.output
    for report in reports:
        assert report["errors"] == [] and report["reads"] > 10, report
        assert {"eval/trueskill/policy", "league/pool_size", "train/policy_loss"} <= set(report["names"]), report
    run = open_run(run_dir)
    assert run.metrics["train/policy_loss"]["version"].tolist() == list(range(1, 7))
    assert run.pool is not None and run.pool["version"]
