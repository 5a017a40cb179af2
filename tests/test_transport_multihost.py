"""The transport across hosts: ranks spread over 3 hosts emulated by ``slurm/local_cluster.sh up --hosts 3``.

Each emulated host is a network namespace on a private bridge with its own slurmd, hostname, /etc/hosts, /tmp,
/dev/shm and SysV IPC namespace, so Open MPI cannot use shared memory between "hosts" and talks TCP over the
bridge, as between real nodes. Jobs go through ``sbatch`` and ``srun --mpi=pmix`` (2 ranks per host); one also
goes through ``mpirun`` with the script's ``on`` command standing in for ssh. Debian's Open MPI cannot create
windows across hosts as configured (``osc = ^ucx,pt2pt``): the probe must see that and fall back to two-sided,
or, given osc/pt2pt at a serialized thread level and ``require_passive_progress=False``, run the RMA protocol over
TCP; either way the choice must land in the run's meta.json. Without root (namespaces, mounts, slurmd) these tests
skip with the reason (in CI, which runs as root, that is a failure); a missing tool or a cluster that does not come
up fails them. The cluster is torn down after the module when it brought it up, and the teardown checks nothing of
it is left.
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
pytestmark = [pytest.mark.mpi, pytest.mark.slurm, pytest.mark.slow]

MH_STATE = Path("/var/lib/hpc_rl_slurm_mh")  # as in slurm/local_cluster.sh
MH_CONF = MH_STATE / "slurm.conf"
HOSTS = ("mh1", "mh2", "mh3")
RANKS_PER_HOST = 2
RANK_HOSTS = [h for h in HOSTS for _ in range(RANKS_PER_HOST)]  # Slurm's block distribution
# Test sessions on one machine share the one multi-host cluster: each holds this lock while it uses it, so none
# tears the cluster down under another.
SESSION_LOCK = Path("/run/lock/hpc_rl_multihost_tests.lock")
PT2PT = {"OMPI_MCA_osc": "pt2pt", "MPI4PY_RC_THREAD_LEVEL": "serialized"}


def _cluster(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
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
        return _report(output), open_run(run).meta if run.is_dir() else {}

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


def _report(text: str) -> dict:
    lines = [line for line in text.splitlines() if line.startswith("{")]
    assert lines, f"no JSON report in the job's output:\n{text}"
    return json.loads(lines[-1])


def _lock_session() -> int:
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
    lock = _lock_session()
    was_running = _cluster("status", "--hosts", str(len(HOSTS))).returncode == 0
    up = _cluster("up", "--hosts", str(len(HOSTS)))
    if up.returncode != 0:
        _cluster("down", "--hosts", str(len(HOSTS)))
        os.close(lock)
        pytest.fail(f"slurm/local_cluster.sh up --hosts {len(HOSTS)} failed ({up.returncode}):\n{up.stdout}\n"
                    f"{up.stderr}")
    workdir = Path(tempfile.mkdtemp(prefix="hpc_rl_multihost_", dir="/var/tmp"))
    try:
        yield SlurmHosts(workdir)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
        if not was_running:  # leave the machine as the session found it, and prove nothing is left
            down = _cluster("down", "--hosts", str(len(HOSTS)))
            left = leftovers()
            os.close(lock)
            assert down.returncode == 0 and not left, f"teardown left {left}:\n{down.stdout}\n{down.stderr}"
        else:
            os.close(lock)


def test_multihost_cluster_runs_beside_the_single_node_cluster(hosts, slurm_cluster):
    again = _cluster("up", "--hosts", "3")
    assert again.returncode == 0 and "already up" in again.stdout, again.stderr
    other_size = _cluster("up", "--hosts", "2")
    assert other_size.returncode != 0 and "3-host cluster is running" in other_size.stderr
    env = {**os.environ, "SLURM_CONF": str(MH_CONF)}
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, capture_output=True, text=True, env=env,
                           timeout=30)
    assert sorted(line.split()[0] for line in nodes.stdout.splitlines()) == list(HOSTS), nodes.stdout
    single = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], check=False, capture_output=True, text=True, timeout=30,
                            env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
    assert single.stdout.split() and not set(single.stdout.split()) & set(HOSTS), single.stdout
    assert "hpcrlmh" not in Path("/etc/slurm/slurm.conf").read_text()
    assert _cluster("status").returncode == 0 and _cluster("status", "--hosts", "3").returncode == 0


def test_probe_across_slurm_hosts_falls_back_to_twosided(hosts):
    r, _ = hosts.sbatch(["tests/mpi_programs/transport_probe.py", "auto"], {}, timeout=120)
    assert r["agree"]
    assert r["probe"]["cross_host"], "origin and target should be on different hosts"
    assert r["probe"]["window_ok"] is False and "MPI_ERR_WIN" in r["probe"]["reason"]
    assert r["backend"] == "twosided"


def test_probe_across_slurm_hosts_finds_pt2pt_rma_when_assisted_progress_is_allowed(hosts):
    r, _ = hosts.sbatch(["tests/mpi_programs/transport_probe.py", "auto", "assisted"], PT2PT, timeout=120)
    assert r["probe"]["cross_host"] and r["probe"]["window_ok"] is True
    assert r["probe"]["passive_progress_ok"] is False  # osc/pt2pt needs the target inside MPI
    assert r["probe"]["thread_level"] == 2  # MPI_THREAD_SERIALIZED
    assert r["backend"] == "rma"


def _check_meta(meta: dict, backend: str) -> None:
    """The run's meta.json names the backend the probe chose across hosts, and the ranks were spread."""
    assert meta["rank_hosts"] == RANK_HOSTS
    assert meta["transport"]["backend"] == backend
    probe = meta["transport"]["probe"]
    assert probe["cross_host"] and RANK_HOSTS[probe["origin"]] != RANK_HOSTS[probe["target"]]
    if backend == "twosided":
        assert probe["window_ok"] is False and "MPI_ERR_WIN" in probe["reason"]
    else:
        assert probe["window_ok"] is True and probe["thread_level"] == 2


def _check_ring(r: dict) -> None:
    assert r["produced"] == (len(RANK_HOSTS) - 1) * 20
    assert r["consumed"] == r["distinct_consumed"] == r["produced"] and r["consumed_equals_produced"]
    assert r["bad_payloads"] == 0


RING = ["tests/mpi_programs/transport_channels.py", "ring", "auto", "4", "20", "block", "0.005", "16384"]


@pytest.mark.parametrize("config", ["default", "pt2pt"])
def test_ring_exactly_once_across_slurm_hosts(hosts, config):
    backend = "twosided" if config == "default" else "rma"
    r, meta = hosts.sbatch(RING + ([] if config == "default" else ["assisted"]),
                           {} if config == "default" else PT2PT, timeout=180)
    assert r["backend"] == backend
    _check_ring(r)
    _check_meta(meta, backend)
    assert meta["slurm"]["SLURM_JOB_NUM_NODES"] == str(len(HOSTS))


@pytest.mark.parametrize("config", ["default", "pt2pt"])
def test_parameter_channel_across_slurm_hosts(hosts, config):
    backend = "twosided" if config == "default" else "rma"
    argv = ["tests/mpi_programs/transport_channels.py", "params", "auto", "2", "8192"]
    r, meta = hosts.sbatch(argv + ([] if config == "default" else ["assisted"]),
                           {} if config == "default" else PT2PT, timeout=180)
    assert r["backend"] == backend
    assert r["published"] > 10
    assert len(r["readers"]) == len(RANK_HOSTS) - 1
    for reader in r["readers"]:
        assert reader["received"] > 0
        assert reader["mixed"] == 0 and reader["wrong_version"] == 0 and reader["backwards"] == 0
        assert reader["last"] == r["published"]
    _check_meta(meta, backend)


def test_ring_exactly_once_across_hosts_under_mpirun(mpi, hosts):
    # The owner reads in place here (take_view / release): views of a window that osc/pt2pt fills over TCP.
    env = hosts.mpirun_env(PT2PT)
    out = mpi(len(RANK_HOSTS), RING + ["assisted", "view"], timeout=180, env=env)
    r = _report(out.stdout)
    assert r["backend"] == "rma"
    _check_ring(r)
    assert r["release_twice_refused"] is True
    meta = open_run(Path(env["TRANSPORT_META_DIR"])).meta
    _check_meta(meta, "rma")
