"""Ring occupancy: the owner's ``ready_slots()`` counts what was put and not yet taken, and takes nothing.

argv: backend policy (two-sided: block only; its drop_oldest writers send queued segments as they progress)
Rank 0 owns a ring of 4 slots; ranks 1 and 2 each put one segment, then (after the owner has looked) two more
each, filling the ring. The owner records ``ready_slots()`` at each stage: after the first two puts, after taking
them as views (held views are not READY), after releasing them, with the ring full, and after draining it. Prints
one JSON line on rank 0.
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import RingConfig, Transport, TransportConfig

SLOTS = 4


def main() -> None:
    backend, policy = sys.argv[1], sys.argv[2]
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    transport = Transport(comm, TransportConfig(backend=backend, timeout_s=30))
    ring = transport.experience_ring(0, RingConfig(slots=SLOTS, slot_bytes=4096, full_policy=policy))

    def wait_ready(count: int) -> int:
        """ready_slots() once it reaches ``count`` (two-sided receives complete as MPI progresses), or at 10 s."""
        deadline = time.monotonic() + 10
        while (got := ring.ready_slots()) < count and time.monotonic() < deadline:
            time.sleep(0.001)
        return got

    if rank == 0:
        seen = {"empty": ring.ready_slots()}
        comm.Barrier()  # the writers' first puts
        comm.Barrier()
        seen["two_put"] = wait_ready(2)
        seen["two_put_again"] = ring.ready_slots()  # counting took nothing
        views = ring.take_view()
        seen["taken"] = len(views)
        seen["while_held"] = ring.ready_slots()
        ring.release(views)
        seen["released"] = ring.ready_slots()
        comm.Barrier()  # the writers' second and third puts
        comm.Barrier()
        seen["full"] = wait_ready(SLOTS)
        drained = ring.poll()
        seen["drained"] = len(drained)
        seen["after_drain"] = ring.ready_slots()
        left = ring.close()
        print(json.dumps({"backend": transport.backend, "policy": policy, "slots": SLOTS, "seen": seen,
                          "left_at_close": len(left)}))
    else:
        comm.Barrier()
        ring.put(np.full(4096, rank, np.uint8))
        comm.Barrier()
        comm.Barrier()
        for _ in range(2):
            ring.put(np.full(4096, rank, np.uint8))
        comm.Barrier()
        ring.close()


main()
