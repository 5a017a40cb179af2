"""Open MPI's per-step shared-memory directory (hpc_rl.launch.isolate_shared_memory) is used and then removed."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpc_rl.launch import rank_env

pytestmark = [pytest.mark.mpi]
SHM = Path("/dev/shm")
ROOT = Path(__file__).resolve().parent.parent


def test_a_job_that_ends_normally_leaves_dev_shm_as_it_found_it(mpi):
    job = f"test{os.getpid()}"  # a job id no real Slurm job has
    mine = lambda: sorted(p.name for p in SHM.iterdir() if p.name.startswith(f"hpc_rl.{job}."))  # noqa: E731
    assert mine() == []
    out = mpi(3, ["tests/mpi_programs/shared_memory_dir.py", job], timeout=120)
    reports = json.loads([line for line in out.stdout.splitlines() if line.startswith("[")][-1])
    directory = {r["directory"] for r in reports}
    assert directory == {str(SHM / f"hpc_rl.{job}.batch")}  # mpirun has no SLURM_STEP_ID: the batch step's name
    for r in reports:  # the ranks' vader segments were in it while the job ran
        assert len([e for e in r["entries"] if e.startswith("vader_segment")]) == 3, r
    assert mine() == [], "the job left its shared-memory directory behind"


@pytest.mark.slurm
def test_an_srun_step_removes_its_directory(slurm_cluster, tmp_path):
    out = subprocess.run(["srun", "--mpi=pmix", "--kill-on-bad-exit=1", "--ntasks=3", sys.executable, "-m", "mpi4py",
                          str(ROOT / "tests/mpi_programs/shared_memory_dir.py")],
                         capture_output=True, text=True, env=rank_env(), timeout=180, cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    reports = json.loads([line for line in out.stdout.splitlines() if line.startswith("[")][-1])
    (directory,) = {r["directory"] for r in reports}
    assert re.fullmatch(r"/dev/shm/hpc_rl\.\d+\.0", directory), directory  # job id, step 0
    for r in reports:
        assert len([e for e in r["entries"] if e.startswith("vader_segment")]) == 3, r
    assert not Path(directory).exists(), "the job step left its shared-memory directory behind"
