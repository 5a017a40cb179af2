"""A payload changed behind the protocol's back is caught: rank 1 puts a segment into rank 0's ring, then
overwrites one payload byte with a bare Put (as a torn write would); rank 0's poll must raise TransportError.
step: rank 1's request is changed so, and then rank 0 stores a reply seq answering no request into rank 1's reply
slot; rank 1's wait_reply must raise too.

argv: channel(ring|params|step)
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
    elif channel == "step":
        steps = transport.step_exchange({1: 0}, 4096, 4096)
        if rank == 1:
            steps.send_request(np.arange(4096, dtype=np.uint8))  # step 1
            steps.window.put(np.full(1, 7, np.uint8), 0, steps._request_offset(1) + HEADER_BYTES + 100)
            steps.window.flush(0)
        comm.Barrier()
        error = None
        if rank == 0:
            try:
                steps.poll_requests()
            except TransportError as exc:
                error = str(exc)
            steps.window.replace(5, 1, 0)  # rank 1's reply slot: seq 5, while its last request was step 1
        comm.Barrier()
        reply_error = None
        if rank == 1:
            try:
                steps.wait_reply(timeout_s=5)
            except TransportError as exc:
                reply_error = str(exc)
        reply_error = comm.bcast(reply_error, root=1)
        steps.close()
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
        report = {"channel": channel, "raised": error is not None, "message": error}
        if channel == "step":
            report["reply_message"] = reply_error
        print(json.dumps(report))


main()
