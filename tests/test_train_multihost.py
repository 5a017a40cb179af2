"""Training across hosts: jobs/train.py as one Slurm heterogeneous job (slurm/train_het.sbatch) on the 3 hosts that
``slurm/local_cluster.sh up --hosts 3`` emulates (tests/multihost.py), each host a real slurmd: the controller and
the env rank on mh1, the inference rank on mh2, the learner on mh3, talking TCP. Preempted the way Slurm does it
(USR2 to the batch shell), the job commits a checkpoint, requeues itself and resumes on the same hosts, and its
versions run from 1 to the last exactly once. The smallest topology (4 ranks) keeps the job's two starts short."""

import json
import subprocess
import time

import pytest

from hpc_rl.launch import rank_env
from hpc_rl.slurm import job_states, wait_for_jobs
from hpc_rl.storage import open_run, read_metrics

from multihost import MH_CONF, ROOT, hosts  # noqa: F401 (a fixture)
from requeue import show_job, start_requeued_now

pytestmark = [pytest.mark.mpi, pytest.mark.slurm, pytest.mark.slow]

# Enough versions that the USR2 sent at version 2 lands mid-run: slurmctld takes seconds to deliver it on a loaded
# machine, and a cartpole version takes a tenth of one (12 versions ended before it once).
VERSIONS = 100
TOPOLOGY = ["topology.env=1", "topology.inference=1", "topology.learner=1"]
QUICK = ["experiment=cartpole", "env.num_envs=4", "pipeline.checkpoint_every=2", "pipeline.heartbeat_timeout_s=120",
         "pipeline.final_eval_games=0"]
# Component 0 (1 controller + 1 env rank) on mh1, component 1 (1 inference + 1 learner rank) on mh2 and mh3.
COMPONENTS = ["--ntasks=2", "-w", "mh1", ":", "--ntasks=2", "--ntasks-per-node=1", "-w", "mh2,mh3"]


def _version(run_dir) -> int:
    series = read_metrics(run_dir / "metrics.h5").get("train/policy_loss") if (run_dir / "metrics.h5").exists() \
        else None
    return int(series["version"][-1]) if series is not None and len(series) else 0


def test_training_across_hosts_is_preempted_and_resumes_with_each_role_on_its_host(hosts, monkeypatch):
    monkeypatch.setenv("SLURM_CONF", str(MH_CONF))  # sbatch, scancel, scontrol and hpc_rl.slurm ask this cluster
    run_dir, out = hosts.workdir / "runs" / "het", hosts.workdir / "train.out"
    submitted = subprocess.run(
        ["sbatch", "--parsable", f"--output={out}", *COMPONENTS, "slurm/train_het.sbatch", "run_name=het",
         f"runs_dir={run_dir.parent}", *TOPOLOGY, *QUICK, f"pipeline.max_versions={VERSIONS}"],
        capture_output=True, text=True, cwd=ROOT, env=rank_env(), timeout=30)
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    try:
        deadline = time.monotonic() + 240
        while _version(run_dir) < 2:
            assert time.monotonic() < deadline, f"no version 2: {job_states(job)}\n{out.read_text()}"
            time.sleep(0.5)
        subprocess.run(["scancel", "--batch", "--signal=USR2", job], check=True, timeout=30)
        while (fields := show_job(job)[0])["Restarts"] != "1" or fields["JobState"] != "PENDING":
            assert time.monotonic() < deadline, f"the job was never requeued: {fields}\n{out.read_text()}"
            time.sleep(0.5)
        start_requeued_now(job)
        try:
            states = wait_for_jobs([job], timeout=240)
        except TimeoutError as err:  # the job's own output says where it stood
            pytest.fail(f"{err}\n{out.read_text()[-6000:]}")
        log = out.read_text()
        assert set(states.values()) == {"COMPLETED"}, f"{states}\n{log}"  # both components
    finally:
        subprocess.run(["scancel", job], timeout=30)

    assert "USR2 received (come back): forwarding to the ranks" in log and "requeued Slurm job" in log, log
    assert f"job {job} restart 1" in log, log
    run = open_run(run_dir)
    versions = list(run.metrics["train/policy_loss"]["version"])
    assert versions == list(range(1, VERSIONS + 1)), versions  # continuous: nothing lost, nothing twice
    assert run.checkpoint_versions[-1] == VERSIONS
    assert json.loads((run_dir / "status.json").read_text())["state"] == "finished"
    meta = run.meta
    assert meta["resumed_from"] >= 2 and meta["slurm"]["SLURM_RESTART_COUNT"] == "1"
    # Each role on its intended host, as the resumed job recorded it; GPUs counted per host over inference and
    # learner ranks only (the learner is the first GPU rank of mh3).
    assert meta["roles"] == {"0": "controller[0]", "1": "env[0]", "2": "inference[0]", "3": "learner[0]"}
    assert meta["rank_hosts"] == ["mh1", "mh1", "mh2", "mh3"]
    assert meta["gpu_slots"] == {"2": 0, "3": 0}
    # Debian's Open MPI refuses windows across hosts: the probe found that and chose the two-sided fallback.
    probe = meta["transport"]["probe"]
    assert meta["transport"]["backend"] == "twosided" and probe["cross_host"] and probe["window_ok"] is False
