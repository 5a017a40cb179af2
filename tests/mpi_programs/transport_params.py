"""Parameter channel under a publisher writing as fast as it can: rank 0 publishes, every other rank reads.

argv: backend seconds words [assisted]
Version k is the vector ``(k << 32) | i`` for i in range(words), so a reader can tell from any element which
version it belongs to: a vector mixing two versions, or a version differing from the one returned with it, is
caught element by element. Prints one JSON line on rank 0. With TRANSPORT_META_DIR set, rank 0 also writes the
run's meta.json there (backend and probe result, the host of every rank, the SLURM_* variables).
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from run_meta import write_run_meta

from hpc_rl.transport import Transport, TransportConfig


def vector(version: int, words: int) -> np.ndarray:
    return (np.uint64(version) << np.uint64(32)) | np.arange(words, dtype=np.uint64)


def main() -> None:
    backend, seconds, words = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    assisted = sys.argv[4:] == ["assisted"]  # accept RMA that progresses only while the target is in MPI
    transport = Transport(comm, TransportConfig(backend=backend, timeout_s=30, require_passive_progress=not assisted))
    params = transport.parameter_channel(0, words * 8)
    write_run_meta(comm, transport)
    comm.Barrier()
    deadline = time.monotonic() + seconds
    if rank == 0:
        while time.monotonic() < deadline:
            params.publish(vector(params.version + 1, words))
        final = comm.bcast(params.version, root=0)
        params.close()
        reports = comm.gather(None, root=0)[1:]
        print(json.dumps({"backend": transport.backend, "published": final, "readers": reports}))
    else:
        received, mixed, wrong_version, backwards, last = 0, 0, 0, 0, 0
        expected_low = np.arange(words, dtype=np.uint64)

        def check(version: int, payload: np.ndarray) -> None:
            nonlocal received, mixed, wrong_version, backwards, last
            got = payload.view(np.uint64)
            high = got >> np.uint64(32)
            received += 1
            if got.size != words or not np.array_equal(got & np.uint64(0xFFFFFFFF), expected_low) \
                    or not np.all(high == high[0]):
                mixed += 1
            elif int(high[0]) != version:
                wrong_version += 1
            if version <= last:
                backwards += 1
            last = version

        while time.monotonic() < deadline:
            got = params.poll()
            if got is not None:
                check(*got)
        final = comm.bcast(None, root=0)
        if last < final:
            check(*params.wait_version(final))
        params.close()
        comm.gather({"rank": rank, "received": received, "mixed": mixed, "wrong_version": wrong_version,
                     "backwards": backwards, "last": last, "final": final, "retries": params.retries}, root=0)


main()
