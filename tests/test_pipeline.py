"""The distributed pipeline with real ranks: learner equivalence, exactly-once accounting, failures, learning."""

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from hpc_rl.launch import mpirun_command, rank_env
from hpc_rl.storage import open_run

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.mpi, pytest.mark.slow, pytest.mark.timeout(900)]

# A small, quick CartPole job: 6 ranks, short segments.
SMALL = ["env=cartpole", "env.num_envs=4", "pipeline.segment_len=32", "pipeline.segments_per_batch=2",
         "ppo.num_minibatches=2"]


def _json_line(stdout: str) -> dict:
    return json.loads([line for line in stdout.splitlines() if line.startswith("{")][-1])


@pytest.mark.parametrize("allreduce", ["horovod", "mpi"])
def test_two_learners_make_the_update_of_one_learner_on_twice_the_batch(mpi, allreduce):
    out = mpi(2, ["tests/mpi_programs/learner_equivalence.py", allreduce], timeout=240)
    result = _json_line(out.stdout)
    assert result["learner_max_diff"] == 0.0
    assert result["single_max_diff"] <= 1e-5
    assert result["moved"] > 1e-3 and result["normaliser_moved"] > 1e-3  # the update and the normaliser did move


def test_nonfinite_loss_on_one_learner_is_skipped_on_every_learner(mpi):
    reports = _json_line_list(mpi(2, ["tests/mpi_programs/learner_nonfinite.py"], timeout=240).stdout)
    for r in reports:
        assert r["skipped"] == [0.0, 4.0, 0.0]  # every step of the poisoned update (2 epochs x 2 minibatches)
        assert r["changed"] == [True, False, True]
        assert r["finite"] and r["equal"]


def _json_line_list(stdout: str) -> list:
    return json.loads([line for line in stdout.splitlines() if line.startswith("[")][-1])


class Job:
    """A training job running in the background, its output collected line by line."""

    def __init__(self, cmd: list[str], cwd: Path):
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=cwd,
                                     env=rank_env(), start_new_session=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)

    @property
    def output(self) -> str:
        return "".join(self.lines)

    def wait_for(self, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while text not in self.output:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                pytest.fail(f"never saw {text!r}; output:\n{self.output}")
            time.sleep(0.5)

    def wait(self, timeout: float) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            pytest.fail(f"job still running after {timeout}s; output:\n{self.output}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _train_cmd(launcher: str, runs: Path, name: str, extra: list[str]) -> list[str]:
    args = [str(ROOT / "jobs/train.py"), f"run_name={name}", f"runs_dir={runs}", *SMALL, *extra]
    if launcher == "mpirun":
        return mpirun_command(6, args)
    return ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "--ntasks=6", sys.executable, "-m", "mpi4py", *args]


def _rank_pid(run_dir: Path, rank: int) -> int:
    for line in (run_dir / "logs" / f"rank_{rank}.log").read_text().splitlines():
        if " pid " in line:
            return int(line.split(" pid ")[1].split()[0].rstrip(","))
    raise AssertionError(f"rank {rank} logged no pid")


def test_every_segment_produced_is_consumed_exactly_once_or_left_at_stop(tmp_path):
    job = Job(_train_cmd("mpirun", tmp_path, "once", ["pipeline.max_versions=8", "pipeline.ring_slots=2"]), tmp_path)
    assert job.wait(300) == 0, job.output
    acc = json.loads((tmp_path / "once" / "accounting.json").read_text())
    produced = [tuple(x) for x in acc["produced"]]
    consumed = [tuple(x) for x in acc["consumed"]]
    left = [tuple(x) for x in acc["left"]]
    assert acc["version"] == 8
    assert len(consumed) == 8 * 2 * 2  # versions x learners x segments per batch
    assert len(set(produced)) == len(produced) and len(set(consumed)) == len(consumed)
    assert set(consumed) | set(left) == set(produced) and not set(consumed) & set(left)
    run = open_run(tmp_path / "once")
    assert run.checkpoint_versions[-1] == 8
    reuse = run.metrics["data/reuse"]["value"]
    # Consumed (every PPO epoch counts) / produced never exceeds the target, by default the epochs: each sample feeds
    # one update.
    target = run.config["ppo"]["epochs"]
    assert target > 1 and run.config["pipeline"]["target_reuse"] is None
    assert np.all(reuse <= target + 1e-9)
    assert list(run.metrics["train/policy_loss"]["version"]) == list(range(1, 9))
    occupancy = run.metrics["perf/ring_occupancy"]
    assert list(occupancy["version"]) == list(range(1, 9))  # one row per version: READY slots / slots, polled
    assert np.all((occupancy["value"] >= 0) & (occupancy["value"] <= 1))
    assert run.meta["transport"]["backend"] in ("rma", "twosided")


def _versions_printed(output: str) -> list[int]:
    """The versions of the controller's progress lines ("v   12  1:04 elapsed ...")."""
    return [int(m[1]) for m in re.finditer(r"^v\s*(\d+)\s+[\d:]+ elapsed", output, re.MULTILINE)]


def _failure(launcher: str, tmp_path: Path, what: str) -> None:
    """Kill an env rank or stop the inference rank of a running job: the job ends soon, saying which rank and role,
    and what it leaves (the latest checkpoint, the metrics up to the failure) reads back."""
    name = f"{what}_{launcher}"
    job = Job(_train_cmd(launcher, tmp_path, name, ["pipeline.max_versions=100000", "pipeline.heartbeat_timeout_s=15",
                                                    "pipeline.checkpoint_every=2"]), tmp_path)
    # Learner 0 sends version 2's checkpoint before version 3's metrics: once v3 is printed, v2 is committed.
    job.wait_for("v    3", timeout=240)
    run_dir = tmp_path / name
    seen = max(_versions_printed(job.output))
    if what == "kill_env":
        os.kill(_rank_pid(run_dir, 1), signal.SIGKILL)
    else:
        pid = _rank_pid(run_dir, 3)
        os.kill(pid, signal.SIGSTOP)
    start = time.monotonic()
    code = job.wait(90)
    elapsed = time.monotonic() - start
    if what == "stop_inference":
        os.kill(pid, signal.SIGKILL) if Path(f"/proc/{pid}").exists() else None
    assert code != 0
    assert elapsed < 60, f"the job took {elapsed:.0f}s to end"
    named = "rank 1 (env[0]) died" if what == "kill_env" else "rank 3 (inference[0]) has sent nothing"
    assert named in job.output, job.output
    said = re.search(r"Last committed checkpoint: version (\d+)", job.output)
    assert said, job.output
    run = open_run(run_dir)
    latest = run.load_checkpoint()  # verified against its digest
    assert latest.version == int(said[1]) and latest.version >= 2, said[0]
    assert all(np.all(np.isfinite(p)) for p in latest.sections["params"].values())
    # status.json names the rank too: what slurm/train.sbatch records as the failure's cause (hpc_rl/failures.py)
    assert run.status["state"] == "aborted" and run.status["reason"].startswith(named), run.status
    assert run.status["committed"] == latest.version
    rows = run.metrics["train/policy_loss"]["version"].tolist()
    assert rows == list(range(1, len(rows) + 1)) and rows[-1] >= max(seen, latest.version), (rows, seen)


@pytest.mark.parametrize("what", ["kill_env", "stop_inference"])
def test_failed_rank_ends_the_job_under_mpirun(tmp_path, what):
    _failure("mpirun", tmp_path, what)


@pytest.mark.slurm
@pytest.mark.parametrize("what", ["kill_env", "stop_inference"])
def test_failed_rank_ends_the_job_under_srun(slurm_cluster, tmp_path, what):
    _failure("srun", tmp_path, what)


def test_a_rank_that_raises_is_named_with_its_exception(tmp_path):
    """A rank that raises ends the job at once, and the controller names it with the exception (its last words on the
    lifeline), on stderr and in status.json, where a death of unknown cause was said before. Here both learners raise:
    a CUDA device asked for on a machine without one."""
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA, where pipeline.learner_device=cuda raises")
    job = Job(_train_cmd("mpirun", tmp_path, "raises", ["pipeline.learner_device=cuda"]), tmp_path)
    assert job.wait(120) != 0
    raised = (r"rank [45] \(learner\[[01]\]\) raised ValueError: device 'cuda' requested but CUDA is not "
              "available")
    assert re.search(raised + "; aborting the job. Last committed checkpoint: none.", job.output), job.output
    # Named before the TERM of the abort that follows could read as a user's stop (lifelines accepted at first look).
    assert "stopping at version" not in job.output, job.output
    status = open_run(tmp_path / "raises").status
    assert status["state"] == "aborted" and re.fullmatch(raised, status["reason"]), status


def test_a_run_time_limit_counts_every_sitting_of_the_run(tmp_path):
    # pipeline.max_run_seconds is the run's budget over all its sittings (a sweep member's): a first sitting ended by
    # its own limit (pipeline.max_seconds) leaves the rest to the next, which starts from the time spent before.
    budget = ["pipeline.max_versions=100000", "pipeline.max_run_seconds=20", "pipeline.final_eval_games=0"]
    first = Job(_train_cmd("mpirun", tmp_path, "budget", [*budget, "pipeline.max_seconds=5"]), tmp_path)
    assert first.wait(300) == 0, first.output
    assert "time limit of 5 s: stopping at version" in first.output, first.output
    summary = json.loads((tmp_path / "budget" / "summary.json").read_text())
    before = summary["run_seconds"]
    assert summary["state"] == "time_limit" and 5 <= before < 20, summary

    second = Job(_train_cmd("mpirun", tmp_path, "budget", budget), tmp_path)  # the same run, no sitting limit
    assert second.wait(300) == 0, second.output
    assert f"the run's time limit of 20 s ({before:.0f} s in earlier sittings): stopping at version" in second.output, \
        second.output
    summary = json.loads((tmp_path / "budget" / "summary.json").read_text())
    assert summary["state"] == "time_limit" and summary["run_seconds"] >= 20, summary
    run_seconds = open_run(tmp_path / "budget").metrics["perf/run_seconds"]
    assert np.all(np.diff(run_seconds["value"]) > 0)  # continued at the resume, not restarted
    assert run_seconds["value"][-1] == summary["run_seconds"]


def test_a_resumed_sitting_of_one_version_names_where_its_ranks_ran(tmp_path):
    # summary.json's devices come from the ranks' heartbeats. A sitting of one version can end within a heartbeat
    # period of an inference rank's first beat (sent without counters while it waited for parameters), so the
    # inference rank beats once more, unthrottled, when its last env rank stops.
    for versions in (2, 3):
        job = Job(_train_cmd("mpirun", tmp_path, "short", [f"pipeline.max_versions={versions}",
                                                            "pipeline.final_eval_games=0"]), tmp_path)
        assert job.wait(300) == 0, job.output
        summary = json.loads((tmp_path / "short" / "summary.json").read_text())
        assert summary["state"] == "finished" and summary["version"] == versions, summary
        assert summary["devices"] == {"inference": ["cpu"], "learner": ["cpu", "cpu"]}, summary["devices"]


CARTPOLE_VERSIONS = 60


def _cartpole(runs: Path, name: str, max_versions: int) -> Job:
    """The CartPole learning check: the learning defaults, what `env=cartpole` trains with (docs/LEARNING.md), on 6
    ranks for 60 versions of 2,048 env steps, the learning rate decaying linearly to 0 over them (so that the resume
    test has a schedule to continue), stopped after ``max_versions``. (The `cartpole` preset's earlier regime, one
    epoch of small minibatches over 400-500 versions, twice ended short of a greedy 475 in the suite: 391 and 285,
    the latter's sampled policy playing 490.)"""
    return Job(mpirun_command(6, [str(ROOT / "jobs/train.py"), "env=cartpole", f"run_name={name}", f"runs_dir={runs}",
                                  "ppo.lr.kind=linear", "ppo.lr.end=0", f"ppo.lr.versions={CARTPOLE_VERSIONS}",
                                  f"pipeline.max_versions={max_versions}"]), runs)


def _greedy_returns(run_dir: Path) -> tuple[np.ndarray, int]:
    from hpc_rl.evaluation import evaluate_return, load_policy

    policy, config, version = load_policy(run_dir)
    return evaluate_return(policy, config.env.make(num_envs=20), seed=2024), version


@pytest.fixture(scope="module")
def cartpole_run(tmp_path_factory) -> Path:
    """One uninterrupted CartPole run, shared by the learning test and the resume test (it takes about 30 s)."""
    runs = tmp_path_factory.mktemp("cartpole")
    job = _cartpole(runs, "cartpole", CARTPOLE_VERSIONS)
    assert job.wait(600) == 0, job.output
    return runs / "cartpole"


def test_distributed_job_learns_cartpole(cartpole_run):
    returns, version = _greedy_returns(cartpole_run)
    assert version == CARTPOLE_VERSIONS
    assert returns.mean() >= 475, f"greedy evaluation returns {returns}"
    run = open_run(cartpole_run)
    # The reuse target follows the epochs: every sample feeds one update, none is trained on twice.
    assert np.all(run.metrics["data/reuse"]["value"] <= 1.1 * run.config["ppo"]["epochs"])


def test_a_run_stopped_half_way_and_resumed_matches_an_uninterrupted_one(cartpole_run, tmp_path):
    first = _cartpole(tmp_path, "resumed", CARTPOLE_VERSIONS // 2)
    assert first.wait(600) == 0, first.output
    second = _cartpole(tmp_path, "resumed", CARTPOLE_VERSIONS)  # the same run name: resumes from `latest`
    assert second.wait(600) == 0, second.output
    resumed = open_run(tmp_path / "resumed")
    half = CARTPOLE_VERSIONS // 2
    assert f"from version {half}" in second.output and resumed.meta["resumed_from"] == half, second.output

    full = open_run(cartpole_run)
    series = {}
    for run in (full, resumed):
        metrics = run.metrics
        series[run.path] = metrics["train/policy_loss"]["version"].tolist()
        assert series[run.path] == list(range(1, CARTPOLE_VERSIONS + 1)), run.path  # every version exactly once
        for name, rows in metrics.items():  # no series repeats or goes back at the resume point
            assert np.all(np.diff(rows["version"]) > 0), (run.path, name)
    assert len(series[full.path]) == len(series[resumed.path])
    # The schedules are functions of the restored version: the learning rate decays on as if never interrupted.
    np.testing.assert_array_equal(resumed.metrics["train/lr"]["value"], full.metrics["train/lr"]["value"])

    # TensorBoard's view of the resumed run (two event files, one per attempt) is continuous too.
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

    events = EventAccumulator(str(resumed.path / "tensorboard"), size_guidance={SCALARS: 0})
    events.Reload()
    assert [e.step for e in events.Scalars("train/policy_loss")] == list(range(1, CARTPOLE_VERSIONS + 1))

    full_returns, _ = _greedy_returns(full.path)
    resumed_returns, version = _greedy_returns(resumed.path)
    assert version == CARTPOLE_VERSIONS
    print(f"greedy returns over 20 episodes: uninterrupted {full_returns.mean():.1f}, "
          f"resumed {resumed_returns.mean():.1f}")
    assert abs(resumed_returns.mean() - full_returns.mean()) <= 0.1 * full_returns.mean(), (
        f"uninterrupted {full_returns}, resumed {resumed_returns}")


def test_nonfinite_losses_halt_the_run_and_no_model_after_them_is_committed(tmp_path):
    # From version 4 on every loss is NaN (the fault-injection knob): versions 4, 5 and 6 skip their updates on
    # both learners, and the third skip in a row halts the run.
    job = Job(_train_cmd("mpirun", tmp_path, "nan", ["pipeline.max_versions=100", "pipeline.checkpoint_every=1",
                                                     "pipeline.fault_nonfinite_from_version=4",
                                                     "pipeline.max_nonfinite=3"]), tmp_path)
    code = job.wait(300)
    assert code != 0, job.output
    assert "non-finite halt at version 6: 3 updates in a row had non-finite losses" in job.output, job.output
    run = open_run(tmp_path / "nan")
    assert json.loads((run.path / "status.json").read_text())["state"] == "halted_nonfinite"
    steps = run.config["ppo"]["num_minibatches"] * run.config["ppo"]["epochs"]
    skipped = run.metrics["train/nonfinite_skipped"]
    assert skipped["version"].tolist() == [1, 2, 3, 4, 5, 6]  # the halting version's metrics are written too
    assert skipped["value"].tolist() == [0, 0, 0, steps, steps, steps]
    assert run.checkpoint_versions == [1, 2, 3]  # nothing from the poisoned versions
    for version in run.checkpoint_versions:
        params = run.load_checkpoint(version).sections["params"]
        assert all(np.all(np.isfinite(p)) for p in params.values())
    assert run.load_checkpoint().version == 3
