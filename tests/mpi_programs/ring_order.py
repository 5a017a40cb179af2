"""Whether each writer's segments are taken in the order it put them, with the owner polling flat out.

argv: backend seconds slots batch. Every rank but 0 writes batches of ``batch`` 8-byte segments (each holding its
own seq) into rank 0's ring of ``slots`` slots of 64 bytes (`block`) for ``seconds``; rank 0 takes views and
releases them flat out meanwhile, then drains the rest with close(). A batch's READY words land a part at a time,
so an owner that takes whatever slot it finds ready can take a batch's later segments before its first. Rank 0
prints one JSON line: the segments taken, how many came before a smaller seq of their writer, and whether each
writer's seqs 1..n came exactly once, each payload holding its own seq.
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import RingConfig, Transport, TransportConfig


def main() -> None:
    backend, seconds, slots, batch = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    comm = MPI.COMM_WORLD
    transport = Transport(comm, TransportConfig(backend=backend, timeout_s=60))
    ring = transport.experience_ring(0, RingConfig(slots=slots, slot_bytes=64, full_policy="block"))
    comm.Barrier()
    end = time.monotonic() + seconds
    if comm.Get_rank() != 0:
        seqs = np.zeros((batch, 1), np.int64)
        rows = list(seqs)  # one 8-byte segment per row, made once: the writer spends its time putting
        while time.monotonic() < end:
            seqs[:, 0] = np.arange(ring.seq + 1, ring.seq + 1 + batch)
            ring.put_many(rows)
        ring.close()
        comm.gather(ring.seq, root=0)
        return
    taken = []  # (writer, seq in the header, seq in the payload), in the order taken
    while time.monotonic() < end:
        views = ring.take_view()
        taken.extend((seg.writer, seg.seq, int(seg.payload.view(np.int64)[0])) for seg in views)
        ring.release(views)
    taken.extend((seg.writer, seg.seq, int(seg.payload.view(np.int64)[0])) for seg in ring.close())
    produced = comm.gather(0, root=0)
    seqs: dict[int, list[int]] = {writer: [] for writer in range(1, comm.Get_size())}
    for writer, seq, _ in taken:
        seqs[writer].append(seq)
    print(json.dumps({
        "backend": transport.backend,
        "segments": len(taken),
        "out_of_order": sum(later < earlier for s in seqs.values() for earlier, later in zip(s, s[1:])),
        "exactly_once": all(sorted(seqs[w]) == list(range(1, produced[w] + 1)) for w in seqs),
        "payloads_match": all(seq == value for _, seq, value in taken),
    }))


main()
