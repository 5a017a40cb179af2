"""The transport across hosts: 3 hosts emulated as network namespaces on this machine, ranks spread over them.

Each "host" is a network namespace on a private bridge, with its own hostname, /etc/hosts, /tmp, /dev/shm and SysV
IPC namespace, so Open MPI cannot use shared memory between "hosts" and talks TCP over the bridge, as between
real nodes. ``mpirun`` reaches the hosts through a stand-in for ssh that enters the namespaces. Debian's Open MPI
cannot create windows across hosts as configured (``osc = ^ucx,pt2pt``): the probe must see that and fall back
to two-sided, or, given osc/pt2pt at a serialized thread level and ``require_passive_progress=False``, run the
RMA protocol over TCP. Outside CI, where namespaces cannot be made (not root, no ``ip``), these tests skip with
the reason; in CI (CI=true) that is a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
pytestmark = [pytest.mark.mpi, pytest.mark.slow]

HOSTS = ("tp1", "tp2", "tp3")
RANKS = 2 * len(HOSTS)

# ``in-host.sh HOST CMD...`` runs CMD "on" HOST: private mount, UTS and IPC namespaces (hostname, /etc/hosts,
# /tmp, /dev/shm of that host only), then the host's network namespace. Directories listed in TP_SHARED that lie
# under /tmp (a checkout or venv there) stay visible inside the private /tmp.
IN_HOST = r"""#!/bin/bash
h=$1; shift
exec unshare --mount --uts --ipc --propagation slave -- /bin/bash -c '
  set -e
  h=$1; shift
  hostname "$h"
  mount --bind "$TP_DIR/hosts" /etc/hosts
  D="$TP_DIR/nodes/$h"; mkdir -p "$D"; chmod 1777 "$D"
  for d in $TP_SHARED; do
    case "$d" in /tmp/*) t="$D/${d#/tmp/}"; mkdir -p "$t"; mount --bind "$d" "$t";; esac
  done
  mount --bind "$D" /tmp
  mount -t tmpfs -o size=256m "shm-$h" /dev/shm
  exec nsenter --net="/run/netns/$TP_NETNS_PREFIX$h" -- "$@"' _ "$h" "$@"
"""

# Open MPI's rsh launcher calls ``AGENT [options] HOST COMMAND...``.
FAKE_SSH = r"""#!/bin/bash
while [[ "$1" == -* ]]; do shift; done
h=$1; shift
exec "$TP_DIR/in-host.sh" "$h" /bin/sh -c "$*"
"""


def _run(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)


class EmulatedHosts:
    """A bridge and one network namespace per host, named after this process so concurrent sessions never meet."""

    def __init__(self):
        tag = os.getpid() % 100_000
        self.prefix = f"hr{tag}"  # netns names: hr<pid>tp1 ...
        self.bridge = f"hrb{tag}"
        self.subnet = f"10.{100 + tag % 100}.{tag % 250}"
        self.dir = Path(tempfile.mkdtemp(prefix="hpc_rl_hosts_", dir="/var/tmp"))  # outside /tmp: hosts hide /tmp
        self.netns: list[str] = []
        self.bridge_made = False

    def up(self) -> None:
        (self.dir / "in-host.sh").write_text(IN_HOST)
        (self.dir / "fake-ssh.sh").write_text(FAKE_SSH)
        for name in ("in-host.sh", "fake-ssh.sh"):
            (self.dir / name).chmod(0o755)
        (self.dir / "hostfile").write_text("".join(f"{h} slots=2\n" for h in HOSTS))
        lines = ["127.0.0.1 localhost", f"{self.subnet}.254 {os.uname().nodename.split('.')[0]}"]
        lines += [f"{self.subnet}.{i} {h}" for i, h in enumerate(HOSTS, 1)]
        (self.dir / "hosts").write_text("\n".join(lines) + "\n")
        _run("ip", "link", "add", self.bridge, "type", "bridge")
        self.bridge_made = True
        _run("ip", "addr", "add", f"{self.subnet}.254/24", "dev", self.bridge)
        _run("ip", "link", "set", self.bridge, "up")
        for i, host in enumerate(HOSTS, 1):
            ns, veth = self.prefix + host, f"{self.bridge}v{i}"
            _run("ip", "netns", "add", ns)
            self.netns.append(ns)
            _run("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            _run("ip", "link", "set", veth, "master", self.bridge, "up")
            _run("ip", "-n", ns, "addr", "add", f"{self.subnet}.{i}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")

    def env(self) -> dict[str, str]:
        """Environment for ``mpirun`` on the root namespace: ranks go to the hosts, traffic over the bridge."""
        shared = " ".join(sorted({str(ROOT), sys.prefix, str(Path(sys.executable).resolve().parent.parent)}))
        return {
            "TP_DIR": str(self.dir), "TP_NETNS_PREFIX": self.prefix, "TP_SHARED": shared,
            "OMPI_MCA_plm_rsh_agent": str(self.dir / "fake-ssh.sh"),
            "OMPI_MCA_orte_default_hostfile": str(self.dir / "hostfile"),
            "OMPI_MCA_oob_tcp_if_include": f"{self.subnet}.0/24",
            "OMPI_MCA_btl_tcp_if_include": f"{self.subnet}.0/24",
        }

    def down(self) -> None:
        for ns in self.netns:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True, text=True).stdout.split()
            for pid in pids:  # only ranks/daemons this fixture's jobs started can live in these namespaces
                subprocess.run(["kill", "-9", pid], capture_output=True)
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        if self.bridge_made:
            subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def hosts():
    reason = None
    if os.geteuid() != 0:
        reason = "emulating hosts needs root (network namespaces, mounts)"
    elif not all(shutil.which(tool) for tool in ("ip", "unshare", "nsenter")):
        reason = "emulating hosts needs ip, unshare and nsenter"
    emulated = None if reason else EmulatedHosts()
    if emulated is not None:
        try:
            emulated.up()
        except subprocess.CalledProcessError as exc:
            reason = f"could not create network namespaces: {' '.join(exc.cmd)}: {exc.stderr.strip()}"
            emulated.down()
    if reason:
        if IN_CI:
            pytest.fail(reason)
        pytest.skip(reason)
    yield emulated
    emulated.down()


PT2PT = {"OMPI_MCA_osc": "pt2pt", "MPI4PY_RC_THREAD_LEVEL": "serialized"}


def _report(out) -> dict:
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON report in output:\n{out.stdout}\n{out.stderr}"
    return json.loads(lines[-1])


def test_probe_across_hosts_falls_back_to_twosided(mpi, hosts):
    r = _report(mpi(RANKS, ["tests/mpi_programs/transport_probe.py", "auto"], timeout=120, env=hosts.env()))
    assert r["agree"]
    assert r["probe"]["cross_host"], "origin and target should be on different hosts"
    assert r["probe"]["window_ok"] is False and "MPI_ERR_WIN" in r["probe"]["reason"]
    assert r["backend"] == "twosided"


def test_probe_across_hosts_finds_pt2pt_rma_when_assisted_progress_is_allowed(mpi, hosts):
    r = _report(mpi(RANKS, ["tests/mpi_programs/transport_probe.py", "auto", "assisted"], timeout=120,
                    env={**hosts.env(), **PT2PT}))
    assert r["probe"]["cross_host"] and r["probe"]["window_ok"] is True
    assert r["probe"]["passive_progress_ok"] is False  # osc/pt2pt needs the target inside MPI
    assert r["probe"]["thread_level"] == 2  # MPI_THREAD_SERIALIZED
    assert r["backend"] == "rma"


@pytest.mark.parametrize("config", ["default", "pt2pt"])
def test_ring_exactly_once_across_hosts(mpi, hosts, config):
    env = hosts.env() if config == "default" else {**hosts.env(), **PT2PT}
    argv = ["tests/mpi_programs/transport_ring.py", "auto", "4", "20", "block", "0.005", "16384"]
    r = _report(mpi(RANKS, argv + ([] if config == "default" else ["assisted"]), timeout=180, env=env))
    assert r["backend"] == ("twosided" if config == "default" else "rma")
    assert r["produced"] == 5 * 20
    assert r["consumed"] == r["distinct_consumed"] == 100 and r["consumed_equals_produced"]
    assert r["bad_payloads"] == 0


@pytest.mark.parametrize("config", ["default", "pt2pt"])
def test_parameter_channel_across_hosts(mpi, hosts, config):
    env = hosts.env() if config == "default" else {**hosts.env(), **PT2PT}
    argv = ["tests/mpi_programs/transport_params.py", "auto", "2", "8192"]
    r = _report(mpi(RANKS, argv + ([] if config == "default" else ["assisted"]), timeout=180, env=env))
    assert r["backend"] == ("twosided" if config == "default" else "rma")
    assert r["published"] > 10
    for reader in r["readers"]:
        assert reader["received"] > 0
        assert reader["mixed"] == 0 and reader["wrong_version"] == 0 and reader["backwards"] == 0
        assert reader["last"] == r["published"]
