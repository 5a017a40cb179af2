"""A writer's bad puts are refused before they take a slot, and the ring goes on; a put after close() raises.

argv: backend
Rank 1 owns a ring of 4 slots of 4096 bytes; rank 0 writes. Rank 0 tries an oversized segment, a strided one, and
(RMA) batches the compiled writer must refuse on its own; each must raise ValueError and leave the ring as it was:
the segments put afterwards all arrive, with seqs 1, 2, ... The owner's own put is refused too. After close(),
a put raises instead of reaching a freed window. Prints one JSON line on rank 0.
"""

import json
import sys

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import RingConfig, Transport, TransportConfig


def refused(call) -> str | None:
    """The ValueError's message, or None when ``call`` did not raise one."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return None


def main() -> None:
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    transport = Transport(comm, TransportConfig(backend=sys.argv[1], timeout_s=20))
    ring = transport.experience_ring(1, RingConfig(slots=4, slot_bytes=4096))
    report = {"backend": transport.backend}
    good = [np.full(100 * (i + 1), i, np.uint8) for i in range(6)]
    if rank == 0:
        report["oversized"] = refused(lambda: ring.put(np.zeros(4097, np.uint8)))
        report["oversized_in_batch"] = refused(lambda: ring.put_many([good[0], np.zeros(5000, np.uint8)]))
        report["strided"] = refused(lambda: ring.put(np.zeros(8192, np.uint8)[::2]))
        if transport.backend == "rma":  # the compiled writer's own checks, below rma.py's
            writer = ring._writer
            report["c_too_many"] = refused(lambda: writer.put([good[0]] * 5, 1, None, ring._claim, None))
            report["c_oversized"] = refused(lambda: writer.put([np.zeros(4097, np.uint8)], 1, None, ring._claim, None))
            report["c_checksums_mismatch"] = refused(lambda: writer.put([good[0]], 1, [1, 2], ring._claim, None))
        report["seqs"] = [ring.put(good[0])] + ring.put_many(good[1:])
        comm.send("done", dest=1)
    else:
        report["owner_put"] = refused(lambda: ring.put(good[0]))
        got = []
        while len(got) < len(good):
            got.extend((seg.seq, seg.payload.tolist()) for seg in ring.poll())
        comm.recv(source=0)
        report["received_in_order"] = [seq for seq, _ in got] == list(range(1, len(good) + 1))
        report["payloads_match"] = all(payload == good[seq - 1].tolist() for seq, payload in got)
    left = ring.close()
    report["left_at_close"] = len(left)
    if rank == 0:
        try:
            ring.put(good[0])
            report["put_after_close"] = None
        except Exception as exc:  # noqa: BLE001 - any clear error will do; a crash or a hang will not
            report["put_after_close"] = f"{type(exc).__name__}: {exc}"
    reports = comm.gather(report, root=0)
    if rank == 0:
        print(json.dumps(reports))


main()
