"""slurm/train.sbatch and slurm/sweep.sbatch on the local cluster; preemption (USR2 -> checkpoint -> requeue),
cancellation (TERM -> checkpoint -> no requeue) and a rank's failure (SIGKILL -> requeue -> resume, up to a limit).

Preemption reaches a job the way Slurm delivers it: USR2 to the batch shell (``scancel --batch --signal=USR2``, or
the job's own ``--signal=B:USR2@...`` before its time limit), whose trap forwards it to srun and so to the ranks.
A plain ``scancel --signal=USR2`` would signal the job steps directly and skip the trap."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from hpc_rl.launch import rank_env
from hpc_rl.slurm import job_states, wait_for_jobs
from hpc_rl.storage import open_run, read_metrics

from requeue import show_job, start_requeued_now

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slurm, pytest.mark.slow, pytest.mark.timeout(900)]
QUICK = ["experiment=cartpole", "env.num_envs=4", "pipeline.checkpoint_every=2", "pipeline.heartbeat_timeout_s=120"]


def _sbatch(args: list[str], env: dict[str, str] | None = None) -> str:
    out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, cwd=ROOT,
                         env={**rank_env(), **(env or {})}, timeout=30)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().split(";")[0]


def test_train_sbatch_runs_one_job(slurm_cluster, tmp_path):
    job = _sbatch([f"--output={tmp_path}/%j.out", "slurm/train.sbatch", "run_name=one", f"runs_dir={tmp_path}",
                   *QUICK, "pipeline.max_versions=4"])
    states = wait_for_jobs([job], timeout=300)
    log = next(tmp_path.glob("*.out")).read_text()
    assert set(states.values()) == {"COMPLETED"}, log
    run = open_run(tmp_path / "one")
    assert json.loads((tmp_path / "one" / "status.json").read_text())["state"] == "finished"
    assert run.checkpoint_versions[-1] == 4
    assert run.meta["slurm"]["SLURM_JOB_ID"] == job and run.meta["world_size"] == 6


def _version(run_dir: Path) -> int:
    series = read_metrics(run_dir / "metrics.h5").get("train/policy_loss")
    return int(series["version"][-1]) if series is not None and len(series) else 0


VERSIONS = 80


def test_preempted_sweep_member_requeues_resumes_and_finishes(slurm_cluster, tmp_path):
    members = tmp_path / "members.txt"
    members.write_text("seed=0\nseed=1\n")
    sweep = f"sweep_{tmp_path.name}"
    # Enough versions after the signal for it to land mid-run: a USR2 that reaches the ranks while they shut down
    # after their last version ends the job by the signal, which is not what this test is about.
    job = _sbatch(["--array=0-1", f"--output={tmp_path}/%A_%a.out", "slurm/sweep.sbatch", str(members), sweep,
                   *QUICK, f"pipeline.max_versions={VERSIONS}"])
    runs = ROOT / "runs" / sweep
    try:
        deadline = time.monotonic() + 300
        while _version(runs / "1") < 6:
            assert time.monotonic() < deadline, f"member 1 never reached version 6: {job_states(job)}"
            time.sleep(1)
        subprocess.run(["scancel", "--batch", "--signal=USR2", f"{job}_1"], check=True, timeout=30)
        _release_requeued(f"{job}_1")
        states = wait_for_jobs([job], timeout=600)
        assert set(states.values()) == {"COMPLETED"}, states
        preempted, sibling = open_run(runs / "1"), open_run(runs / "0")
        assert preempted.meta["resumed_from"] >= 6
        assert preempted.meta["slurm"].get("SLURM_RESTART_COUNT") == "1"
        assert sibling.meta["resumed_from"] == -1 and sibling.meta["slurm"].get("SLURM_RESTART_COUNT", "0") == "0"
        for run in (preempted, sibling):
            versions = run.metrics["train/policy_loss"]["version"]
            assert list(versions) == list(range(1, VERSIONS + 1)), versions  # continuous: nothing lost, nothing twice
            assert run.checkpoint_versions[-1] == VERSIONS
        out = (tmp_path / f"{job}_1.out").read_text()
        assert "USR2 received (come back): forwarding to the ranks" in out  # through the batch shell's trap
        assert "stopping at version" in out and "requeued Slurm job" in out
        index = (runs / "index.tsv").read_text().splitlines()
        assert sorted(line.split("\t")[0] for line in index) == ["0", "1"]
        assert np.isfinite(preempted.metrics["train/value_loss"]["value"]).all()
    finally:
        subprocess.run(["scancel", job], timeout=30)
        subprocess.run(["rm", "-rf", str(runs)], timeout=30)


def _start_long_run(tmp_path: Path, *sbatch_args: str) -> tuple[str, Path]:
    """A train.sbatch job that would run for long, once it has published version 4."""
    job = _sbatch([f"--output={tmp_path}/%j.out", *sbatch_args, "slurm/train.sbatch", "run_name=long",
                   f"runs_dir={tmp_path}", *QUICK, "pipeline.max_versions=100000"])
    run_dir, deadline = tmp_path / "long", time.monotonic() + 300
    while _version(run_dir) < 4:
        assert time.monotonic() < deadline, f"the job never reached version 4: {job_states(job)}"
        time.sleep(1)
    return job, run_dir


def _release_requeued(job: str, *updates: str, restarts: int = 1) -> None:
    """Once Slurm has requeued ``job`` (for the ``restarts``-th time), start it at once (with ``updates`` to its
    record; tests/requeue.py)."""
    deadline = time.monotonic() + 240
    while int((fields := show_job(job)[0])["Restarts"]) < restarts or fields["JobState"] != "PENDING":
        assert time.monotonic() < deadline, f"the job was never requeued: {fields}"
        time.sleep(1)
    start_requeued_now(job, *updates)


def _requeued_resumes_and_continues(job: str, run_dir: Path, tmp_path: Path, signalled_at: int) -> None:
    """The preempted job was requeued once, resumed from the checkpoint it committed on USR2 (signalled at version
    ``signalled_at`` or later) and went on; stopped then with a plain scancel, its versions run from 1 to its last
    exactly once."""
    deadline = time.monotonic() + 300
    while True:
        fields = show_job(job)[0]
        meta = json.loads((run_dir / "meta.json").read_text()) if (run_dir / "meta.json").exists() else {}
        resumed_from = meta.get("resumed_from", -1)
        if fields["Restarts"] == "1" and resumed_from >= signalled_at and _version(run_dir) >= resumed_from + 3:
            break
        assert time.monotonic() < deadline, f"no resumed progress: {fields['JobState']}, restarts " \
                                             f"{fields['Restarts']}, resumed_from {resumed_from}"
        time.sleep(1)
    subprocess.run(["scancel", job], check=True, timeout=30)
    assert wait_for_jobs([job], timeout=120) == {job: "CANCELLED"}
    out = (tmp_path / f"{job}.out").read_text()
    assert "USR2 received (come back): forwarding to the ranks" in out, out  # the batch shell's trap
    assert "requeued Slurm job" in out and f"job {job} restart 1" in out, out
    run = open_run(run_dir)
    versions = list(run.metrics["train/policy_loss"]["version"])
    assert versions == list(range(1, versions[-1] + 1)), versions  # continuous: nothing lost, nothing twice
    assert versions[-1] > resumed_from and run.checkpoint_versions[-1] == versions[-1]


def test_usr2_to_the_batch_shell_requeues_a_training_job_that_resumes(slurm_cluster, tmp_path):
    job, run_dir = _start_long_run(tmp_path)
    try:
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, timeout=30)
        _release_requeued(job)
        _requeued_resumes_and_continues(job, run_dir, tmp_path, signalled_at=4)
    finally:
        subprocess.run(["scancel", job], timeout=30)


def _seconds(duration: str) -> int:
    """Seconds of a Slurm duration as scontrol prints it: ``[D-]HH:MM:SS``."""
    days, _, clock = duration.rpartition("-")
    hours, minutes, seconds = map(int, clock.split(":"))
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds


WARNING_S = 180  # the test's --signal=B:USR2@...: time before the limit at which Slurm warns the batch shell


def test_the_time_limit_signal_requeues_a_training_job_that_resumes(slurm_cluster, tmp_path):
    """``--signal=B:USR2@180``, and a time limit lowered once the run trains (``scontrol update TimeLimit``, as an
    admin may) to the whole minutes that make the warning due at once while leaving 2 to 3 minutes to the limit:
    Slurm's periodic time-limit check (every 30 s) signals the batch shell. Slurm's timer, not the test, sends the
    signal; the test only chooses when it falls due instead of waiting a minute-granular limit out. The requeued
    job's limit is raised, so it is not signalled again while the test watches it."""
    job, run_dir = _start_long_run(tmp_path, "--time=30", f"--signal=B:USR2@{WARNING_S}")
    try:
        elapsed = _seconds(show_job(job)[0]["RunTime"])
        subprocess.run(["scontrol", "update", f"JobId={job}", f"TimeLimit={(elapsed + WARNING_S) // 60}"],
                       check=True, timeout=30)
        _release_requeued(job, "TimeLimit=30")
        _requeued_resumes_and_continues(job, run_dir, tmp_path, signalled_at=4)
    finally:
        subprocess.run(["scancel", job], timeout=30)


def test_scancel_stops_the_run_and_the_job_stays_cancelled(slurm_cluster, tmp_path):
    """A plain scancel means stop (TERM), not "preempted, come back" (USR2): no requeue."""
    job, run_dir = _start_long_run(tmp_path)
    try:
        subprocess.run(["scancel", job], check=True, timeout=30)
        assert wait_for_jobs([job], timeout=120) == {job: "CANCELLED"}
        # Nothing may bring it back. A requeue would come from the job's own processes (the batch shell's handlers,
        # the failure handler after srun), and wait_for_jobs saw CANCELLED only once the job had stopped completing,
        # so once they had all ended (the batch shell waits for its handler; KillWait ends whatever is left): what
        # remains to see is slurmctld acting on a request it already took, a matter of seconds.
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            fields = show_job(job)[0]
            assert (fields["JobState"], fields["Restarts"]) == ("CANCELLED", "0"), fields
            time.sleep(1)
        out = (tmp_path / f"{job}.out").read_text()
        assert "signal 15: stopping at version" in out and "requeued" not in out, out
        # KillWait (10 s on the local cluster) left the controller time to commit the stop version
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "cancelled" and open_run(run_dir).checkpoint_versions[-1] == status["version"]
    finally:
        subprocess.run(["scancel", job], timeout=30)


def _srun_of(run_dir: Path, timeout: float) -> psutil.Process:
    """The srun of the job training ``run_dir`` (not the copy srun forks to watch over it)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for process in psutil.process_iter(["cmdline"]):
            cmdline = process.info["cmdline"] or []
            if cmdline[:1] == ["srun"] and f"run_name={run_dir.name}" in cmdline \
                    and f"runs_dir={run_dir.parent}" in cmdline and process.parent().name() != "srun":
                return process
        time.sleep(0.2)
    pytest.fail(f"no srun training {run_dir} after {timeout:.0f} s")


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb (make setup installs it) holds srun where it hangs")
def test_an_srun_that_outlives_its_step_is_ended_and_the_job_completes(slurm_cluster, tmp_path):
    """Slurm 22.05's srun can hang for good once every rank of a heterogeneous step has ended: its mpi/pmix plugin
    joins an abort-agent thread that never returns (met by tests/test_train_multihost.py, about one job in 25), and
    the job would hold its allocation until the time limit. gdb holds a real srun at that very call
    (pmixp_abort_agent_stop, which srun reaches only after every rank has ended): train.sbatch's watchdog ends srun
    once the step has left slurmctld, and the job, whose run finished, completes with status 0."""
    run_dir = tmp_path / "held"
    job = _sbatch([f"--output={tmp_path}/%j.out", "slurm/train.sbatch", f"run_name={run_dir.name}",
                   f"runs_dir={tmp_path}", *QUICK, "pipeline.max_versions=6", "pipeline.final_eval_games=0"],
                  env={"HPC_RL_SRUN_GRACE_S": "5"})
    out = tmp_path / f"{job}.out"
    srun = _srun_of(run_dir, timeout=120)
    with open(tmp_path / "gdb.txt", "w") as gdb_out:  # gdb and its sleep in a session of their own
        gdb = subprocess.Popen(["gdb", "-p", str(srun.pid), "-batch", "-ex", "set breakpoint pending on",
                                "-ex", "break pmixp_abort_agent_stop", "-ex", "continue", "-ex", "shell sleep 600"],
                               stdout=gdb_out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        try:
            deadline = time.monotonic() + 240
            while "after its step ended on every node: ending it" not in (text := out.read_text()):
                assert time.monotonic() < deadline and gdb.poll() is None, f"srun was not ended\n{text}"
                time.sleep(0.5)
        finally:
            os.killpg(gdb.pid, signal.SIGKILL)  # a traced process's death reaches its parent once its tracer is gone
            gdb.wait()
        held = (tmp_path / "gdb.txt").read_text()
        assert "hit Breakpoint 1" in held, held  # srun was held where Slurm's bug hangs it
        assert wait_for_jobs([job], timeout=120) == {job: "COMPLETED"}, out.read_text()
    finally:
        subprocess.run(["scancel", job], timeout=30)
    log = out.read_text()
    assert "hpc_rl: srun exited with 137" in log and "not requeued: the run ended finished" in log, log
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    assert open_run(run_dir).checkpoint_versions[-1] == 6


def test_a_refused_requeue_ends_the_job_with_the_reason_not_an_abort(slurm_cluster, tmp_path):
    """USR2 asks for a requeue; Slurm refuses it for a job submitted with --no-requeue."""
    job, run_dir = _start_long_run(tmp_path, "--no-requeue")
    try:
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, timeout=30)
        assert wait_for_jobs([job], timeout=120) == {job: "FAILED"}
        out = (tmp_path / f"{job}.out").read_text()
        assert f"scontrol requeue {job} failed" in out and "resumes from it when the same job is submitted" in out
        assert "MPI_ABORT" not in out, out
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "requeue_failed" and open_run(run_dir).checkpoint_versions[-1] == status["version"]
        assert show_job(job)[0]["Restarts"] == "0"
    finally:
        subprocess.run(["scancel", job], timeout=30)


def _progress(out: Path) -> int:
    """The last version the job's latest attempt printed (its progress lines ``v  <version> ...``), 0 before any."""
    text = out.read_text() if out.exists() else ""
    versions = [int(line.split()[1]) for line in text[text.rfind("hpc_rl: job "):].splitlines()
                if line.startswith("v ") and line.split()[1].isdigit()]
    return versions[-1] if versions else 0


def _kill_rank_mid_run(job: str, out: Path, run_dir: Path, rank: int, attempt: int) -> None:
    """SIGKILL ``rank`` of the job's ``attempt``-th start once that attempt has trained four versions (so that it
    committed a checkpoint: pipeline.checkpoint_every=2)."""
    deadline = time.monotonic() + 240
    while True:
        log = run_dir / "logs" / f"rank_{rank}.log"
        pids = [line.split("pid ")[1].split(",")[0] for line in (log.read_text() if log.exists() else "").splitlines()
                if f"rank {rank}: pid " in line]
        resumed = json.loads((run_dir / "meta.json").read_text()).get("resumed_from", -1) \
            if (run_dir / "meta.json").exists() else -1
        if len(pids) == attempt and _progress(out) >= max(resumed, 0) + 4:
            break
        assert time.monotonic() < deadline, f"attempt {attempt} never trained: {job_states(job)}, {pids}"
        time.sleep(0.2)
    os.kill(int(pids[-1]), signal.SIGKILL)


def test_a_killed_rank_requeues_the_job_which_resumes_until_the_runs_failure_limit(slurm_cluster, tmp_path):
    """An env rank SIGKILLed mid-run, then a learner: each time the job is requeued and resumes from the last
    committed checkpoint, and the run finishes with every version once. status.json records each failure with its
    cause. The limit is the run's: a later job of the same run, failing once more, is not requeued."""
    run, topology = "failing", ["--ntasks=4", "topology.env=1", "topology.learner=1"]  # controller, env, inference,
    out, run_dir = tmp_path / "first.out", tmp_path / run                               # learner: the fewest ranks
    job = _sbatch([f"--output={out}", topology[0], "slurm/train.sbatch", f"run_name={run}", f"runs_dir={tmp_path}",
                   *QUICK, *topology[1:], "pipeline.max_versions=40", "pipeline.max_failure_requeues=2",
                   "pipeline.final_eval_games=0"])
    try:
        for attempt, rank, role in ((1, 1, "env[0]"), (2, 3, "learner[0]")):
            _kill_rank_mid_run(job, out, run_dir, rank, attempt)
            _release_requeued(job, restarts=attempt)
            failure = json.loads((run_dir / "status.json").read_text())["failures"][-1]
            assert f"rank {rank} ({role})" in failure["cause"] and failure["requeued"], failure
            assert failure["job"] == job and failure["restart"] == attempt - 1
        assert wait_for_jobs([job], timeout=300) == {job: "COMPLETED"}, out.read_text()[-3000:]
        finished = open_run(run_dir)
        versions = list(finished.metrics["train/policy_loss"]["version"])
        assert versions == list(range(1, 41)), (versions, out.read_text()[-3000:])  # nothing lost or twice
        assert finished.meta["resumed_from"] == finished.status["failures"][1]["committed"] >= 2
        assert finished.status["state"] == "finished" and len(finished.status["failures"]) == 2
        text = out.read_text()
        assert text.count("requeued, resuming from version") == 2 and "restart 2" in text, text[-3000:]

        # A new job of the same run: its first failure is the run's third, past pipeline.max_failure_requeues=2.
        again = tmp_path / "again.out"
        job = _sbatch([f"--output={again}", topology[0], "slurm/train.sbatch", f"run_name={run}",
                       f"runs_dir={tmp_path}", *QUICK, *topology[1:], "pipeline.max_versions=100000",
                       "pipeline.max_failure_requeues=2"])
        _kill_rank_mid_run(job, again, run_dir, 1, attempt=4)
        assert wait_for_jobs([job], timeout=120) == {job: "FAILED"}
        assert show_job(job)[0]["Restarts"] == "0"  # not requeued
        status = json.loads((run_dir / "status.json").read_text())
        assert status["state"] == "failed" and [f["requeued"] for f in status["failures"]] == [True, True, False]
        assert "Run failing has failed 3 times, more than the 2 requeues pipeline.max_failure_requeues allows: " \
               "not requeued" in status["reason"] and "rank 1 (env[0])" in status["reason"], status["reason"]
        assert status["reason"] in again.read_text()
        versions = list(open_run(run_dir).metrics["train/policy_loss"]["version"])
        assert versions == list(range(1, versions[-1] + 1)) and versions[-1] > 40, versions
    finally:
        subprocess.run(["scancel", job], timeout=30)


def _multirun(tmp_path: Path, *overrides: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(ROOT / "jobs/train.py"), "-m", "hydra/launcher=local_slurm",
                           f"hydra.sweep.dir={tmp_path}/sweep", f"runs_dir={tmp_path}/sweep", "run_name=${hydra:job.num}",
                           *overrides], capture_output=True, text=True, cwd=ROOT, env=rank_env(), timeout=900)


def test_a_step_that_failed_to_launch_is_a_failure_and_the_requeued_job_resumes(slurm_cluster, tmp_path):
    """Slurm 22.05's srun exits 0 when its step's tasks fail to launch, as when the step's PMIx socket path is still
    taken (by the previous start's slurmstepd of the same step id, when a requeued job starts at once). Such a job
    must not complete as if its run had: its attempt is a failure, recorded and requeued, and the job resumes."""
    run, topology = "unlaunched", ["--ntasks=4", "topology.env=1", "topology.learner=1"]
    common = ["slurm/train.sbatch", f"run_name={run}", f"runs_dir={tmp_path}", *QUICK, *topology[1:],
              "pipeline.final_eval_games=0"]
    first = _sbatch([f"--output={tmp_path}/first.out", topology[0], *common, "pipeline.max_versions=4"])
    assert wait_for_jobs([first], timeout=300) == {first: "COMPLETED"}, (tmp_path / "first.out").read_text()
    out = tmp_path / "again.out"
    job = _sbatch(["--hold", f"--output={out}", topology[0], *common, "pipeline.max_versions=8",
                   "pipeline.max_failure_requeues=1"])
    config = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, check=True, timeout=30)
    taken = Path(re.search(r"^SlurmdSpoolDir\s*=\s*(\S+)", config.stdout, re.M).group(1)) / f"stepd.slurm.pmix.{job}.0"
    taken.touch()
    try:
        subprocess.run(["scontrol", "release", job], check=True, timeout=30)
        deadline = time.monotonic() + 240
        while not json.loads((tmp_path / run / "status.json").read_text()).get("failures"):
            assert time.monotonic() < deadline, f"no failure recorded: {job_states(job)}\n{out.read_text()}"
            time.sleep(0.5)
        taken.unlink(missing_ok=True)
        _release_requeued(job)
        assert wait_for_jobs([job], timeout=300) == {job: "COMPLETED"}, out.read_text()[-3000:]
    finally:
        taken.unlink(missing_ok=True)
        subprocess.run(["scancel", job], timeout=30)
    log = out.read_text()
    assert "hpc_rl: srun exited with 0" in log and "launch failed" in log, log[-3000:]
    finished = open_run(tmp_path / run)
    (failure,) = finished.status["failures"]
    assert failure["cause"].startswith("srun exited with status 0 but the run's controller ended nothing in this "
                                       "attempt") and failure["requeued"] and failure["committed"] == 4, failure
    assert finished.status["state"] == "finished" and finished.meta["resumed_from"] == 4
    assert list(finished.metrics["train/policy_loss"]["version"]) == list(range(1, 9))


def test_bad_sweep_member_fails_before_submission(slurm_cluster, tmp_path):
    before = subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout
    out = _multirun(tmp_path, "ppo.lr.start=0.001,-1")
    assert out.returncode != 0
    assert "sweep member #1" in out.stderr and "learning rate must be >= 0" in out.stderr
    assert not (tmp_path / "sweep" / ".submitit").exists()
    assert subprocess.run(["squeue", "-h", "-o", "%i"], capture_output=True, text=True).stdout == before


def test_hydra_sweep_runs_as_one_array_job_of_training_runs(slurm_cluster, tmp_path):
    out = _multirun(tmp_path, *QUICK, "pipeline.max_versions=3", "seed=0,1")
    assert out.returncode == 0, out.stdout + out.stderr
    sweep = tmp_path / "sweep"
    jobs = set()
    for member in ("0", "1"):
        run = open_run(sweep / member)
        assert run.checkpoint_versions[-1] == 3
        assert run.config["seed"] == int(member)
        jobs.add(run.meta["slurm"]["SLURM_ARRAY_JOB_ID"])
        assert run.meta["world_size"] == 6
    assert len(jobs) == 1
    index = dict(line.split("\t", 1) for line in (sweep / "index.tsv").read_text().splitlines())
    assert set(index) == {"0", "1"} and "seed=1" in index["1"]
