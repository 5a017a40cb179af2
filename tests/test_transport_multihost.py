"""The transport across hosts: ranks spread over 3 hosts emulated by ``slurm/local_cluster.sh up --hosts 3``
(tests/multihost.py: the cluster and its ``hosts`` fixture).

Jobs go through ``sbatch`` and ``srun --mpi=pmix`` (2 ranks per host); one also goes through ``mpirun`` with the
script's ``on`` command standing in for ssh. Debian's Open MPI cannot create windows across hosts as configured
(``osc = ^ucx,pt2pt``): the probe must see that and fall back to two-sided, or, given osc/pt2pt at a serialized
thread level and ``require_passive_progress=False``, run the RMA protocol over TCP; either way the choice must land
in the run's meta.json.
"""

import os
import subprocess
from pathlib import Path

import pytest

from hpc_rl.storage.run import open_run

from multihost import HOSTS, MH_CONF, PT2PT, RANK_HOSTS, cluster, hosts, report  # noqa: F401 (a fixture)

pytestmark = [pytest.mark.mpi, pytest.mark.slurm, pytest.mark.slow]


def test_multihost_cluster_runs_beside_the_single_node_cluster(hosts, slurm_cluster):
    again = cluster("up", "--hosts", "3")
    assert again.returncode == 0 and "already up" in again.stdout, again.stderr
    other_size = cluster("up", "--hosts", "2")
    assert other_size.returncode != 0 and "3-host cluster is running" in other_size.stderr
    env = {**os.environ, "SLURM_CONF": str(MH_CONF)}
    nodes = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], check=False, capture_output=True, text=True, env=env,
                           timeout=30)
    assert sorted(line.split()[0] for line in nodes.stdout.splitlines()) == list(HOSTS), nodes.stdout
    single = subprocess.run(["sinfo", "-h", "-N", "-o", "%N"], check=False, capture_output=True, text=True, timeout=30,
                            env={k: v for k, v in os.environ.items() if k != "SLURM_CONF"})
    assert single.stdout.split() and not set(single.stdout.split()) & set(HOSTS), single.stdout
    assert "hpcrlmh" not in Path("/etc/slurm/slurm.conf").read_text()
    assert cluster("status").returncode == 0 and cluster("status", "--hosts", "3").returncode == 0


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
    r = report(out.stdout)
    assert r["backend"] == "rma"
    _check_ring(r)
    assert r["release_twice_refused"] is True
    meta = open_run(Path(env["TRANSPORT_META_DIR"])).meta
    _check_meta(meta, "rma")
