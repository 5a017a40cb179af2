"""The local Slurm cluster: sbatch array jobs with srun --mpi=pmix, aborts under srun, and Hydra+submitit sweeps."""

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hpc_rl.launch import rank_env
from hpc_rl.slurm import wait_for_jobs

ROOT = Path(__file__).resolve().parent.parent
pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def _sbatch(args: list[str], cwd: Path) -> str:
    out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, cwd=cwd,
                         env=rank_env(), timeout=30)
    assert out.returncode == 0, f"sbatch failed: {out.stderr}"
    return out.stdout.strip().split(";")[0]


def test_local_cluster_is_up_idempotent_and_declares_eight_ranks(slurm_cluster):
    again = subprocess.run(["bash", str(slurm_cluster), "up"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T %c"], capture_output=True, text=True, timeout=30)
    name, state, cpus = nodes.stdout.split()
    assert state.rstrip("*") in ("idle", "mixed", "allocated"), nodes.stdout
    assert int(cpus) >= 8
    status = subprocess.run(["bash", str(slurm_cluster), "status"], capture_output=True, text=True, timeout=30)
    assert status.returncode == 0 and "slurmctld: running" in status.stdout


def test_sbatch_array_runs_mpi_ranks_through_srun_pmix(slurm_cluster, tmp_path):
    script = tmp_path / "array.sbatch"
    script.write_text(f"""#!/bin/bash
#SBATCH --ntasks=4
#SBATCH --output={tmp_path}/out_%A_%a.txt
srun --mpi=pmix --kill-on-bad-exit=1 {sys.executable} -m mpi4py {ROOT}/tests/mpi_programs/hello_ranks.py
""")
    job = _sbatch(["--array=0-1", str(script)], tmp_path)
    states = wait_for_jobs([job], timeout=180)
    assert set(states.values()) == {"COMPLETED"}, states
    outputs = sorted(tmp_path.glob(f"out_{job}_*.txt"))
    assert len(outputs) == 2
    for task, path in enumerate(outputs):
        report = json.loads([line for line in path.read_text().splitlines() if line.startswith("{")][-1])
        assert report["rank_sum"] == 0 + 1 + 2 + 3
        assert {r["size"] for r in report["ranks"]} == {4}
        assert {r["array_task"] for r in report["ranks"]} == {str(task)}


def test_raising_rank_aborts_whole_job_under_srun(slurm_cluster, tmp_path):
    start = time.monotonic()
    out = subprocess.run(
        ["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "--ntasks=3", sys.executable, "-m", "mpi4py",
         str(ROOT / "tests/mpi_programs/raise_on_rank.py"), "1"],
        capture_output=True, text=True, env=rank_env(), timeout=90, cwd=tmp_path)
    elapsed = time.monotonic() - start
    assert out.returncode != 0
    assert "deliberate failure on rank 1" in out.stderr
    assert elapsed < 30, f"srun took {elapsed:.1f}s to end the job after a rank raised"


def test_hydra_submitit_multirun_is_one_array_job_of_mpi_members(slurm_cluster, tmp_path):
    sweep_dir = tmp_path / "sweep"
    cmd = [sys.executable, str(ROOT / "jobs/stack_check.py"), "-m", "member=0,1",
           "hydra/launcher=local_slurm", "hydra.launcher.tasks_per_node=3", f"hydra.sweep.dir={sweep_dir}"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=rank_env(), timeout=300, cwd=tmp_path)
    assert out.returncode == 0, f"multirun failed:\n{out.stdout}\n{out.stderr}"
    reports = [json.loads(p.read_text()) for p in sorted(sweep_dir.glob("*/stack_check_rank*.json"))]
    assert len(reports) == 2 * 3, f"expected 6 rank reports, found {len(reports)}: {os.listdir(sweep_dir)}"
    assert len({r["array_job"] for r in reports}) == 1, "the sweep was not one array job"
    assert {r["array_job"] for r in reports} != {None}
    for member in (0, 1):
        ranks = [r for r in reports if r["member"] == member]
        assert sorted(r["rank"] for r in ranks) == [0, 1, 2]
        assert {r["size"] for r in ranks} == {3}
        assert len({r["array_task"] for r in ranks}) == 1
    # The launcher profile's per-job shared-memory directory is removed when the member's batch script ends (a
    # little after the member's result is there, so allow a few seconds).
    shown = subprocess.run(["scontrol", "-o", "show", "job", reports[0]["array_job"]], capture_output=True,
                           text=True, timeout=30)
    members = re.findall(r"\bJobId=(\d+)", shown.stdout)
    assert len(members) == 2, shown.stdout
    deadline = time.monotonic() + 30
    while (left := [m for m in members if Path(f"/dev/shm/hpc_rl.{m}").exists()]) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, f"sweep members left /dev/shm/hpc_rl.<job> behind: {left}"


def test_sweep_whose_members_die_without_a_result_fails_instead_of_hanging(slurm_cluster, tmp_path):
    # No SLURM_MPI_TYPE: srun starts the ranks without PMIx, so every rank fails in MPI_Init and leaves no result.
    cmd = [sys.executable, str(ROOT / "jobs/stack_check.py"), "-m", "member=0,1", "hydra/launcher=local_slurm",
           "hydra.launcher.tasks_per_node=2", "hydra.launcher.setup=[]", f"hydra.sweep.dir={tmp_path}/sweep"]
    start = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=rank_env(), timeout=240, cwd=tmp_path)
    assert out.returncode != 0
    assert "sweep members ended without a result" in out.stderr, out.stderr
    assert time.monotonic() - start < 120
