"""A payload changed behind the protocol's back is caught: rank 1 puts a segment into rank 0's ring, then
overwrites one payload byte with a bare Put (as a torn write would); rank 0's poll must raise TransportError.

argv: channel(ring|params)
Prints one JSON line on rank 0.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import RingConfig, Transport, TransportConfig, TransportError
from hpc_rl.transport.rma import HEADER_BYTES


def main() -> None:
    channel = sys.argv[1]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    transport = Transport(comm, TransportConfig(backend="rma", timeout_s=10))
    if channel == "ring":
        ring = transport.experience_ring(0, RingConfig(slots=4, slot_bytes=4096))
        if rank == 1:
            ring.put(np.arange(4096, dtype=np.uint8))  # ticket 0 lands in slot 0
            ring.window.put(np.full(1, 7, np.uint8), 0, ring.payload_offset(0) + 100)
            ring.window.flush(0)
        comm.Barrier()
        error = None
        if rank == 0:
            try:
                ring.poll()
            except TransportError as exc:
                error = str(exc)
        ring.close()
    else:
        params = transport.parameter_channel(1, 4096)
        if rank == 1:
            params.publish(np.arange(4096, dtype=np.uint8))  # version 1 lands in buffer 1
            params.window.put(np.full(1, 7, np.uint8), 1, params.buffer_offset(1) + HEADER_BYTES + 100)
            params.window.flush(1)
        comm.Barrier()
        error = None
        if rank == 0:
            try:
                params.poll()
            except TransportError as exc:
                error = str(exc)
        params.close()
    if rank == 0:
        print(json.dumps({"channel": channel, "raised": error is not None, "message": error}))


main()
