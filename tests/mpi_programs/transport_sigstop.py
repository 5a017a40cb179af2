"""A peer stopped with SIGSTOP: rank 0's wait on rank 1 must end in TransportTimeout within the deadline.

argv: backend channel(ring|step|params) timeout_s
Rank 1 sends its pid and waits for a go message; rank 0 stops it, then fills the ring / waits for a step reply /
waits for a new parameter version, catches the timeout, resumes rank 1 and both finish normally. Prints one JSON
line on rank 0.
"""

import json
import os
import signal
import sys
import time

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import RingConfig, Transport, TransportConfig, TransportTimeout


def main() -> None:
    backend, channel, timeout_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    transport = Transport(comm, TransportConfig(backend=backend, timeout_s=timeout_s))
    if channel == "ring":
        ring = transport.experience_ring(1, RingConfig(slots=4, slot_bytes=65536, full_policy="block"))
    elif channel == "step":
        ex = transport.step_exchange({0: 1}, 1024, 1024)
    else:
        params = transport.parameter_channel(1, 1024)
    if rank == 1:
        if channel == "params":
            params.publish(np.zeros(1024, np.uint8))
        comm.send(os.getpid(), dest=0)
        comm.recv(source=0)  # stopped somewhere in here
        if channel == "ring":
            segments = ring.close()
            comm.send(len(segments), dest=0)
        elif channel == "step":
            ex.wait_requests([0])
            ex.send_reply(0, np.ones(1024, np.uint8))
            ex.close()
        else:
            params.publish(np.ones(1024, np.uint8))
            params.close()
        return
    pid = comm.recv(source=1)
    os.kill(pid, signal.SIGSTOP)
    puts, error, start = 0, None, time.monotonic()
    try:
        if channel == "ring":
            while True:  # the first 4 fill the ring without the owner's help (RMA) or are matched (two-sided)
                start = time.monotonic()
                ring.put(np.full(65536, puts, np.uint8))
                puts += 1
        elif channel == "step":
            ex.send_request(np.ones(1024, np.uint8))
            start = time.monotonic()
            ex.wait_reply()
        else:
            params.wait_version(1, timeout_s=timeout_s)
            start = time.monotonic()
            params.wait_version(2)
    except TransportTimeout as exc:
        error = exc
    waited = time.monotonic() - start
    os.kill(pid, signal.SIGCONT)
    comm.send("go", dest=1)
    result = {"backend": transport.backend, "channel": channel, "timeout_s": timeout_s, "waited_s": waited,
              "raised": error is not None, "puts_before_error": puts}
    if error is not None:
        result.update(peer=error.peer, error_channel=error.channel, message=str(error))
    if channel == "ring":
        ring.close()
        result["owner_drained"] = comm.recv(source=1)
    elif channel == "step":
        result["reply_after_resume"] = int(ex.wait_reply()[0])
        ex.close()
    else:
        result["version_after_resume"] = params.wait_version(2)[0]
        params.close()
    print(json.dumps(result))


main()
