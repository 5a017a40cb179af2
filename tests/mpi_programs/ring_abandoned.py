"""A put that gives up on a stalled owner leaves the ring working.

argv: backend. Rank 0 owns a ring of 2 slots (`block`) and takes nothing until rank 1 has put until a put timed out
(deadline 0.2 s) and then tried once more, timing out again. On RMA the first of those puts had taken a ticket, and
so a slot, before it waited: unless the writer fills that slot with a void row later, the slot stays FREE for a ticket
nobody fills and every later ticket of it waits forever. The owner then drains flat out while the writer puts 6 more
segments (each with a 5 s deadline). Rank 0 prints one JSON line: the timeouts, the writer's last seq, and whether
the owner took seqs 1..last exactly once, in order.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import RingConfig, Transport, TransportConfig, TransportTimeout


def main() -> None:
    comm = MPI.COMM_WORLD
    transport = Transport(comm, TransportConfig(backend=sys.argv[1], timeout_s=30))
    ring = transport.experience_ring(0, RingConfig(slots=2, slot_bytes=64, full_policy="block"))
    comm.Barrier()
    if comm.Get_rank() == 1:
        timeouts, attempts = 0, 0
        while timeouts < 2 and attempts < 10:  # fill the ring, then time out twice on the stalled owner
            attempts += 1
            try:
                ring.put(np.array([ring.seq + 1], np.int64), timeout_s=0.2)
            except TransportTimeout:
                timeouts += 1
        stalled_seq = ring.seq
        comm.Barrier()  # the owner starts taking
        for _ in range(6):
            ring.put(np.array([ring.seq + 1], np.int64), timeout_s=5.0)
        comm.Ibarrier().Wait()
        ring.close()
        comm.gather({"timeouts": timeouts, "stalled_seq": stalled_seq, "last_seq": ring.seq}, root=0)
        return
    comm.Barrier()
    taken, writer_done, done = [], comm.Ibarrier(), False
    while not done:
        done = writer_done.Test()
        views = ring.take_view()
        taken.extend((seg.seq, int(seg.payload.view(np.int64)[0])) for seg in views)
        ring.release(views)
    taken.extend((seg.seq, int(seg.payload.view(np.int64)[0])) for seg in ring.close())
    writer = comm.gather(None, root=0)[1]
    print(json.dumps({
        "backend": transport.backend, **writer,
        "taken_in_order_once": [seq for seq, _ in taken] == list(range(1, writer["last_seq"] + 1)),
        "payloads_match": all(seq == value for seq, value in taken),
    }))


main()
