"""Ranks that build one ring with different settings are stopped at creation, on every rank, not left to corrupt it.

argv: backend
Rank 1 asks for ``drop_oldest`` while the others ask for ``block``. Prints one JSON line on rank 0 with the error
each rank raised.
"""

import json
import sys

from mpi4py import MPI

from hpc_rl.transport import RingConfig, Transport, TransportConfig


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    transport = Transport(comm, TransportConfig(backend=sys.argv[1], timeout_s=10))
    policy = "drop_oldest" if rank == 1 else "block"
    try:
        transport.experience_ring(0, RingConfig(slots=4, slot_bytes=4096, full_policy=policy))
        error = None
    except ValueError as exc:
        error = str(exc)
    errors = comm.gather(error, root=0)
    if rank == 0:
        print(json.dumps({"backend": transport.backend, "errors": errors}))


main()
