"""How a job's end is judged and a run's failures counted (hpc_rl/failures.py), in-process. The requeue itself, on the
local Slurm cluster: tests/test_slurm_jobs.py."""

import json
import time

import pytest

from hpc_rl.config import PipelineConfig
from hpc_rl.failures import (EXIT_BAD_CONFIG, EXIT_REFUSED, after_srun, attempt_cause, first_failed_task,
                             judge_failure)
from hpc_rl.storage.run import read_status, write_meta, write_status

STARTED = 1000.0
ROLES = {"0": "controller", "1": "env[0]", "2": "inference[0]", "3": "learner[0]"}


@pytest.mark.parametrize("exit_status, status", [
    (EXIT_BAD_CONFIG, {}),
    (EXIT_REFUSED, {}),  # the run locked by another job: its status.json is not this job's to judge
    *[(exit_status, {"state": state, "time": STARTED + 5})
      for state in ("halted_nonfinite", "requeue_failed", "finished", "cancelled", "preempted", "time_limit")
      for exit_status in (0, 1)],
])
def test_a_job_that_ended_by_a_decision_or_was_refused_did_not_fail(exit_status, status):
    assert attempt_cause(exit_status, status, STARTED, "rank 1 (env[0]): Killed") is None


def test_the_cause_is_the_controllers_else_srun_s_first_report():
    aborted = {"state": "aborted", "reason": "rank 1 (env[0]) died: its process ended", "time": STARTED + 5}
    assert attempt_cause(1, aborted, STARTED, "rank 0 (controller): Exited with exit code 1") == aborted["reason"]
    # A status an earlier attempt wrote says nothing of this one, even one that ended by a decision.
    for earlier in ({**aborted, "time": STARTED - 60}, {"state": "preempted", "time": STARTED - 60}, {}):
        assert attempt_cause(137, earlier, STARTED, "rank 3 (learner[0]): Killed") == (
            "rank 3 (learner[0]): Killed, as srun reported first (srun exited with status 137 before the controller "
            "named a rank)")
    assert attempt_cause(1, {}, STARTED, None).startswith(
        "srun exited with status 1 before the controller named a rank (a rank raised")


def test_an_attempt_whose_controller_ended_nothing_failed_whatever_srun_s_status():
    """Slurm 22.05's srun exits 0 when its step's tasks failed to launch: status 0 is a success only where this
    attempt's controller ended the run."""
    for status in ({}, {"state": "finished", "time": STARTED - 60}, {"state": "running", "time": STARTED + 5}):
        assert attempt_cause(0, status, STARTED, None).startswith(
            "srun exited with status 0 but the run's controller ended nothing in this attempt: its ranks never ran")
    aborted = {"state": "aborted", "reason": "rank 1 (env[0]) died: its process ended", "time": STARTED + 5}
    assert attempt_cause(0, aborted, STARTED, None) == aborted["reason"]


def test_srun_s_first_failed_task_in_the_last_attempt_is_named_with_its_role():
    output = """hpc_rl: job 2 restart 0 on vm: run_name=k
v    5  0:20 elapsed
srun: error: vm: task 1: Killed
srun: error: vm: task 0: Exited with exit code 1
hpc_rl: job 2 restart 1 on vm: run_name=k
[vm:10070] Read -1, expected 2398332, errno = 3
srun: error: vm: task 3: Killed
srun: launch/slurm: _step_signal: Terminating StepId=2.0
srun: error: vm: tasks 0-2: Killed
hpc_rl: srun exited with 137
"""
    assert first_failed_task(output, ROLES) == "rank 3 (learner[0]): Killed"
    assert first_failed_task(output[:output.index("srun: error: vm: task 3")], ROLES) is None
    assert first_failed_task("srun: error: vm: tasks 0-2: Killed\n", ROLES) == "ranks 0-2: Killed"
    assert first_failed_task("srun: error: vm: task 7: Killed\n", ROLES) == "rank 7 (role unknown): Killed"


def test_failures_are_requeued_up_to_the_limit_then_the_run_fails_saying_how_often():
    failures = []
    for n in (1, 2):
        failures.append({"cause": "rank 1 (env[0]) died"})
        requeued, reason = judge_failure(failures, "rank 1 (env[0]) died", 8, limit=2, run_name="r")
        assert requeued and reason == (f"rank 1 (env[0]) died; requeued, resuming from version 8 (the run's failure "
                                       f"{n}; pipeline.max_failure_requeues=2)")
    failures.append({"cause": "rank 3 (learner[0]) died"})
    requeued, reason = judge_failure(failures, "rank 3 (learner[0]) died", 8, limit=2, run_name="r")
    assert not requeued
    assert reason.startswith("rank 3 (learner[0]) died. Run r has failed 3 times, more than the 2 requeues "
                             "pipeline.max_failure_requeues allows: not requeued")
    assert "resumes from version 8 (pipeline.max_failure_requeues=3 or more" in reason
    assert judge_failure([{}], "rank 0 (controller): Killed", -1, limit=0, run_name="r")[1].count(
        "resumes from the start") == 1


def test_the_controllers_status_keeps_the_runs_failures(tmp_path):
    failures = [{"cause": "rank 1 (env[0]) died", "requeued": True}]
    write_status(tmp_path, "requeued_after_failure", 6, reason="...", failures=failures)
    write_status(tmp_path, "finished", 40)  # the controller of the resumed job
    status = read_status(tmp_path)
    assert status["state"] == "finished" and status["version"] == 40 and status["failures"] == failures
    (tmp_path / "status.json").write_text("{not json")
    assert write_status(tmp_path, "cancelled", 41)["failures"] == [] and read_status(tmp_path)["state"] == "cancelled"


def test_the_limit_is_a_count():
    with pytest.raises(ValueError, match="pipeline.max_failure_requeues must be >= 0"):
        PipelineConfig(max_failure_requeues=-1)


def test_after_srun_records_the_failure_and_outside_slurm_does_not_requeue(tmp_path, monkeypatch, capsys):
    for name in ("SLURM_JOB_ID", "SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID"):
        monkeypatch.delenv(name, raising=False)
    overrides = ["experiment=cartpole", f"runs_dir={tmp_path}", "run_name=r"]
    assert after_srun(1, time.time(), overrides)  # failed before its controller made the run: nothing to record
    assert "not requeued: the job failed before it started run" in capsys.readouterr().out
    write_meta(tmp_path / "r", roles=ROLES)
    started = time.time()
    write_status(tmp_path / "r", "aborted", 3, committed=2, reason="rank 2 (inference[0]) has sent nothing")
    assert after_srun(1, started, overrides)
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["state"] == "failed" and status["reason"] == (
        "rank 2 (inference[0]) has sent nothing; not requeued: not under Slurm")
    assert [(f["cause"], f["exit_status"], f["requeued"], f["committed"]) for f in status["failures"]] == [
        ("rank 2 (inference[0]) has sent nothing", 1, False, -1)]
    assert not after_srun(EXIT_REFUSED, started, overrides)  # another job holds the run: its status is left alone
    assert json.loads((tmp_path / "r" / "status.json").read_text()) == status
    assert "a refusal: the same job would be refused again, not requeued" in capsys.readouterr().out
    # An attempt whose ranks ended the run by its decision did not fail, whatever srun's status (one the watchdog
    # of train.sbatch killed after its step ended): the job ends 0.
    started = time.time()
    write_status(tmp_path / "r", "finished", 12, committed=12)
    assert not after_srun(137, started, overrides)
    assert "not requeued: the run ended finished" in capsys.readouterr().out
    assert not after_srun(0, started, overrides) and capsys.readouterr().out == ""  # a plain finish says nothing
    # srun's 0 for an attempt after it, whose controller wrote nothing: a failure (outside Slurm: not requeued).
    assert after_srun(0, time.time() + 1, overrides)
    status = json.loads((tmp_path / "r" / "status.json").read_text())
    assert status["state"] == "failed" and status["failures"][-1]["cause"].startswith(
        "srun exited with status 0 but the run's controller ended nothing in this attempt")
