"""CPU used by ranks waiting in the transport: rank 0 serves envs 1 and 2; env 2 arrives ``hold`` s late.

argv: backend hold_s
Env 1 sends at once and waits ``hold`` s for its reply; rank 0 waits ``hold`` s for env 2's request. Both waits
are measured in process CPU time (time.process_time) against wall time. Prints one JSON line on rank 0.
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import Transport, TransportConfig


def main() -> None:
    backend, hold = sys.argv[1], float(sys.argv[2])
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    transport = Transport(comm, TransportConfig(backend=backend, timeout_s=30))
    ex = transport.step_exchange({1: 0, 2: 0}, 8192, 8192)
    comm.Barrier()
    wall, cpu = time.monotonic(), time.process_time()
    if rank == 0:
        requests = ex.wait_requests([1, 2])
        for env_rank in requests:
            ex.send_reply(env_rank, np.full(8192, env_rank, np.uint8))
    elif rank == 1:
        ex.send_request(np.ones(8192, np.uint8))
        ex.wait_reply()
    else:
        time.sleep(hold)  # late on purpose, outside the transport
        ex.send_request(np.ones(8192, np.uint8))
        ex.wait_reply()
    report = {"rank": rank, "wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu}
    ex.close()
    reports = comm.gather(report, root=0)
    if rank == 0:
        print(json.dumps({"backend": transport.backend, "ranks": reports}))


main()
