"""Start-up probe: can this MPI stack carry the RMA protocol? Otherwise fall back to the two-sided backend.

Two checks, both collective over the communicator the channels will use:

1. a window can be created at all (Debian's Open MPI disables the osc components that do RMA over TCP, so
   across hosts ``Win.Allocate`` fails with MPI_ERR_WIN while every single-host run passes);
2. passive-target RMA progresses without the target's help: the target stays out of MPI for ``probe_hold_s``
   while the origin does Fetch_and_op, Put and Flush to it. On osc/sm and osc/rdma these complete in
   microseconds; a component that needs the target to enter MPI (osc/ucx without a progress thread, osc/pt2pt)
   finishes only once the target wakes, and the protocol's pollers would then only progress while they poll.

The origin is rank 0; the target is the first rank on another host if there is one (the pair the protocol must
work across), else the last rank.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass

import numpy as np
from mpi4py import MPI

from hpc_rl.transport.config import TransportConfig
from hpc_rl.transport.wait import TransportError

log = logging.getLogger("hpc_rl.transport")

_PROBE_BYTES = 64 * 1024
_PAYLOAD_AT = 64


@dataclass(frozen=True)
class ProbeResult:
    """What the probe saw and chose; ``as_dict()`` goes into meta.json."""

    backend: str  # chosen: "rma" or "twosided"
    requested: str  # TransportConfig.backend
    window_ok: bool | None  # None: not probed (two-sided forced)
    passive_progress_ok: bool | None
    progress_s: float | None  # time the origin's Fetch_and_op + Put + Flush took while the target was out of MPI
    origin: int | None
    target: int | None
    cross_host: bool  # origin and target are on different hosts (processor names differ)
    thread_level: int  # MPI.Query_thread(): osc/pt2pt needs <= MPI_THREAD_SERIALIZED
    library: str  # first line of MPI.Get_library_version()
    reason: str

    def as_dict(self) -> dict:
        return asdict(self)


def probe_backend(comm, config: TransportConfig) -> ProbeResult:
    """Run the probe on every rank of ``comm`` (collective) and return the same result everywhere."""
    common = dict(requested=config.backend, thread_level=MPI.Query_thread(),
                  library=MPI.Get_library_version().splitlines()[0].strip().rstrip("\x00"))
    if config.backend == "twosided":
        result = ProbeResult("twosided", window_ok=None, passive_progress_ok=None, progress_s=None, origin=None,
                             target=None, cross_host=False, reason="two-sided backend set by config", **common)
        _log(comm, result)
        return result
    rank, size = comm.Get_rank(), comm.Get_size()
    names = comm.allgather(MPI.Get_processor_name())
    origin = 0
    target = next((r for r in range(size) if names[r] != names[origin]), size - 1)
    cross_host = names[origin] != names[target]
    try:
        win = MPI.Win.Allocate(_PROBE_BYTES, 1, comm=comm)
        error = ""
    except MPI.Exception as exc:
        win, error = None, f"rank {rank}: {exc}"
    errors = [e for e in comm.allgather(error) if e]
    if errors:
        # A rank whose Allocate succeeded while another's failed keeps its half-made window: freeing it is a
        # collective call the failed ranks cannot join.
        reason = f"window creation failed ({'; '.join(errors)})"
        if config.backend == "rma":
            raise TransportError(f"transport backend 'rma' set by config, but {reason}")
        result = ProbeResult("twosided", window_ok=False, passive_progress_ok=None, progress_s=None, origin=origin,
                             target=target, cross_host=cross_host, reason=reason, **common)
        _log(comm, result)
        return result
    elapsed, correct = _progress_test(comm, win, origin, target, config.probe_hold_s)
    progress_ok = correct and elapsed < config.probe_hold_s / 2
    if progress_ok:
        backend, reason = "rma", (f"window created and passive-target RMA to rank {target} completed in "
                                  f"{elapsed * 1e6:.0f} us while it stayed out of MPI")
    elif not correct:
        backend, reason = "twosided", f"passive-target Put/Fetch_and_op to rank {target} left wrong data"
    else:
        reason = (f"passive-target RMA to rank {target} took {elapsed:.3f} s while it stayed out of MPI for "
                  f"{config.probe_hold_s} s: no progress without the target")
        if config.require_passive_progress:
            backend = "twosided"
        else:
            backend, reason = "rma", reason + "; accepted (require_passive_progress=False)"
    if config.backend == "rma" and backend != "rma":
        raise TransportError(f"transport backend 'rma' set by config, but {reason}")
    result = ProbeResult(backend, window_ok=True, passive_progress_ok=progress_ok, progress_s=elapsed,
                         origin=origin, target=target, cross_host=cross_host, reason=reason, **common)
    _log(comm, result)
    return result


def _progress_test(comm, win, origin: int, target: int, hold_s: float) -> tuple[float, bool]:
    rank = comm.Get_rank()
    pattern = (np.arange(_PROBE_BYTES - _PAYLOAD_AT) % 251).astype(np.uint8)
    one = np.ones(1, np.uint64)
    old = np.zeros(1, np.uint64)
    win.Lock_all(MPI.MODE_NOCHECK)
    np.frombuffer(win.tomemory(), np.uint8)[:8] = 0  # allocated memory is not zeroed; the counter starts at 0
    win.Sync()
    if rank == origin and target != origin:
        # Warm-up while the target is still inside MPI (the Barrier), so connection set-up is not timed.
        win.Fetch_and_op(one, old, target, 0, op=MPI.NO_OP)
        win.Flush(target)
    comm.Barrier()
    elapsed = 0.0
    if rank == origin and target != origin:
        start = time.perf_counter()
        win.Fetch_and_op(one, old, target, 0, op=MPI.SUM)
        win.Put(pattern, target, _PAYLOAD_AT)
        win.Flush(target)
        elapsed = time.perf_counter() - start
    elif rank != origin:
        time.sleep(hold_s)  # out of MPI: whatever the origin completes now completed without this rank's help
    elapsed = comm.bcast(elapsed, root=origin)
    correct = True
    if rank == target and target != origin:
        win.Sync()
        mem = np.frombuffer(win.tomemory(), np.uint8)
        correct = bool(mem[:8].view(np.uint64)[0] == 1 and np.array_equal(mem[_PAYLOAD_AT:], pattern))
    correct = bool(comm.allreduce(int(correct), op=MPI.MIN))
    win.Unlock_all()
    win.Free()
    return elapsed, correct


def _log(comm, result: ProbeResult) -> None:
    if comm.Get_rank() == 0:
        log.info("transport backend %s (requested %s): %s", result.backend, result.requested, result.reason)
