"""What the multi-host tests share: the 3-host Slurm cluster that ``slurm/local_cluster.sh up --hosts 3`` emulates
(module fixture ``hosts``), and running jobs on it.

Each emulated host is a network namespace on a private bridge with its own slurmd, hostname, /etc/hosts, /tmp,
/dev/shm and SysV IPC namespace, so Open MPI cannot use shared memory between "hosts" and talks TCP over the
bridge, as between real nodes. Without root (namespaces, mounts, slurmd) the tests skip with the reason (in CI,
which runs as root, that is a failure); a missing tool or a cluster that does not come up fails them. The cluster
is torn down after the module when it brought it up, and the teardown checks nothing of it is left.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from hpc_rl.launch import rank_env
from hpc_rl.slurm import wait_for_jobs
from hpc_rl.storage.run import open_run

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "slurm" / "local_cluster.sh"

MH_STATE = Path("/var/lib/hpc_rl_slurm_mh")  # as in slurm/local_cluster.sh
MH_CONF = MH_STATE / "slurm.conf"
HOSTS = ("mh1", "mh2", "mh3")
RANKS_PER_HOST = 2
RANK_HOSTS = [h for h in HOSTS for _ in range(RANKS_PER_HOST)]  # Slurm's block distribution
# Test sessions on one machine share the one multi-host cluster: each holds this lock while it uses it, so none
# tears the cluster down under another.
SESSION_LOCK = Path("/run/lock/hpc_rl_multihost_tests.lock")
PT2PT = {"OMPI_MCA_osc": "pt2pt", "MPI4PY_RC_THREAD_LEVEL": "serialized"}


def cluster(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], check=False, capture_output=True, text=True, timeout=timeout)


def leftovers() -> list[str]:
    """Anything of the multi-host cluster still on this machine: namespaces, bridge, daemons or ranks, mounts."""
    found = []
    netns = subprocess.run(["ip", "netns", "list"], check=False, capture_output=True, text=True).stdout.split("\n")
    found += [f"network namespace {line.split()[0]}" for line in netns if line.startswith("hpcrl-mh")]
    if subprocess.run(["ip", "link", "show", "hpcrlmh0"], check=False, capture_output=True).returncode == 0:
        found.append("bridge hpcrlmh0")
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(MH_CONF) in cmdline:
                found.append(f"process {proc.name}: {cmdline.strip()}")
    found += [f"mount {line.split()[1]}" for line in Path("/proc/self/mounts").read_text().splitlines()
              if str(MH_STATE) in line]
    return found


class SlurmHosts:
    """Runs MPI jobs on the emulated hosts; every job gets its own directory (outside /tmp, which hosts hide)."""

    def __init__(self, workdir: Path):
        self.workdir = workdir
        self.jobs = 0
        subnet_of_mh1 = next(line.split()[0] for line in (MH_STATE / "hosts").read_text().splitlines()
                             if line.split()[1:] == ["mh1"])
        self.subnet = subnet_of_mh1.rsplit(".", 1)[0] + ".0/24"

    def _job_dir(self) -> Path:
        self.jobs += 1
        job_dir = self.workdir / f"job{self.jobs}"
        job_dir.mkdir()
        return job_dir

    def sbatch(self, argv: list[str], env: dict[str, str], timeout: float) -> tuple[dict, dict]:
        """Run ``srun --mpi=pmix python -m mpi4py ARGV`` in an sbatch job over all hosts; return the JSON line
        rank 0 printed and the run's meta.json ({} if none). A job still running after ``timeout`` s is cancelled."""
        job_dir = self._job_dir()
        script = job_dir / "job.sbatch"
        script.write_text(f"""#!/bin/bash
#SBATCH --nodes={len(HOSTS)} --ntasks-per-node={RANKS_PER_HOST} --time=5
#SBATCH --output={job_dir}/slurm-%j.out
srun --mpi=pmix --kill-on-bad-exit=1 {sys.executable} -m mpi4py {' '.join(argv)}
""")
        job_env = rank_env({"SLURM_CONF": str(MH_CONF), "TRANSPORT_META_DIR": str(job_dir / "run"), **env})
        out = subprocess.run(["sbatch", "--parsable", f"--chdir={ROOT}", str(script)], check=False,
                             capture_output=True, text=True, env=job_env, timeout=30)
        assert out.returncode == 0, f"sbatch failed: {out.stderr}"
        job = out.stdout.strip().split(";")[0]
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SLURM_CONF", str(MH_CONF))  # hpc_rl.slurm's tools ask the multi-host slurmctld
            try:
                states = wait_for_jobs([job], timeout=timeout)
            except TimeoutError as exc:
                subprocess.run(["scancel", job], check=False, env=job_env, capture_output=True, timeout=30)
                pytest.fail(f"{exc}\n{self._output(job_dir, job)}")
        output = self._output(job_dir, job)
        assert states == {job: "COMPLETED"}, f"job {job} ended {states}:\n{output}"
        run = job_dir / "run"  # written by the programs that record their run (not by the probe alone)
        return report(output), open_run(run).meta if run.is_dir() else {}

    def mpirun_env(self, env: dict[str, str]) -> dict[str, str]:
        """Environment for ``mpirun`` on this machine launching ranks on the hosts through ``local_cluster.sh on``."""
        job_dir = self._job_dir()
        (job_dir / "hostfile").write_text("".join(f"{h} slots={RANKS_PER_HOST}\n" for h in HOSTS))
        return {
            "OMPI_MCA_plm_rsh_agent": f"{SCRIPT} on",
            "OMPI_MCA_orte_default_hostfile": str(job_dir / "hostfile"),
            "OMPI_MCA_oob_tcp_if_include": self.subnet,
            "OMPI_MCA_btl_tcp_if_include": self.subnet,
            "TRANSPORT_META_DIR": str(job_dir / "run"),
            **env,
        }

    @staticmethod
    def _output(job_dir: Path, job: str) -> str:
        path = job_dir / f"slurm-{job}.out"
        return path.read_text() if path.exists() else f"(no output file {path})"


def report(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"no JSON report in the job's output:\n{text}"
    return json.loads(lines[-1])


def lock_session() -> int:
    fd = os.open(SESSION_LOCK, os.O_CREAT | os.O_RDWR, 0o644)
    deadline, pause = time.monotonic() + 600, 0.5
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                pytest.fail(f"another test session held {SESSION_LOCK} (the multi-host cluster) for 600 s")
            time.sleep(pause)
            pause = min(pause * 1.5, 5.0)


@pytest.fixture(scope="module")
def hosts(absent):
    if os.geteuid() != 0:
        absent("root", "emulating hosts needs root (network namespaces, mounts, slurmd)")
    missing = [tool for tool in ("ip", "unshare", "nsenter", "slurmctld", "sbatch") if not shutil.which(tool)]
    if missing:
        pytest.fail(f"emulating hosts needs {', '.join(missing)}, which make setup installs")
    lock = lock_session()
    was_running = cluster("status", "--hosts", str(len(HOSTS))).returncode == 0
    up = cluster("up", "--hosts", str(len(HOSTS)))
    if up.returncode != 0:
        cluster("down", "--hosts", str(len(HOSTS)))
        os.close(lock)
        pytest.fail(f"slurm/local_cluster.sh up --hosts {len(HOSTS)} failed ({up.returncode}):\n{up.stdout}\n"
                    f"{up.stderr}")
    workdir = Path(tempfile.mkdtemp(prefix="hpc_rl_multihost_", dir="/var/tmp"))
    try:
        yield SlurmHosts(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if not was_running:  # leave the machine as the session found it, and prove nothing is left
            down = cluster("down", "--hosts", str(len(HOSTS)))
            left = leftovers()
            os.close(lock)
            assert down.returncode == 0 and not left, f"teardown left {left}:\n{down.stdout}\n{down.stderr}"
        else:
            os.close(lock)
