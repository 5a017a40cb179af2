"""The experience ring under every kind of pressure at once, checked by its owner without trusting the ring.

argv: backend policy seconds. Rank 0 owns a ring of 3 slots of 256 bytes; every other rank (more writers than
slots) writes for ``seconds``: single puts and ``put_many`` batches of 1 to 2 × slots + 1 segments (larger than the
ring), of sizes from 32 bytes to ``slot_bytes`` around the 64-byte boundaries, and now and then an oversize put and
a batch holding one oversize segment, which must be refused before they take a slot or a sequence number. Puts
wait at most 0.25 s (``timeout_s``) and are tried again after a TransportTimeout, as the pipeline does; the ring's
``seq`` says how much of a batch went in before one. The owner changes speed in a cycle: flat out, slow (holding
its views 5 ms each time), then stalled for 0.7 s holding its views, long past the writers' deadline.

Every payload starts with four words of its own: writer, seq, length, and a CRC-32 of the other three and of the
bytes after them (derived from writer and seq). The owner checks them against the segment it was handed, apart from
the ring's own checksum. Rank 0 prints one JSON line: what every writer produced and dropped, what the owner took in
order, and the counts of the checks.
"""

import json
import sys
import time
import zlib

import numpy as np
from mpi4py import MPI

from hpc_rl.transport import RingConfig, Transport, TransportConfig, TransportTimeout

SLOTS, SLOT_BYTES = 3, 256
SIZES = [32, 63, 64, 65, 127, 128, 129, 191, 192, 193, 255, 256]  # every size around 64-byte slot boundaries
PUT_TIMEOUT_S = 0.25
PHASES = [("flat out", 0.8, 0.0), ("slow", 0.8, 0.005), ("stalled", 0.7, None)]  # name, seconds, hold per take


def payload(writer: int, seq: int, nbytes: int) -> np.ndarray:
    body = np.random.default_rng([writer, seq]).integers(0, 256, nbytes - 32, dtype=np.uint8)
    head = np.array([writer, seq, nbytes, 0], np.uint64)
    head[3] = zlib.crc32(body.tobytes(), zlib.crc32(head[:3].tobytes()))
    return np.concatenate([head.view(np.uint8), body])


def intact(segment) -> bool:
    """The segment's own four words match the ring's header and its bytes (no trust in the ring's checksum)."""
    data = np.asarray(segment.payload)
    if data.size < 32:
        return False
    writer, seq, nbytes, crc = (int(x) for x in data[:32].view(np.uint64))
    return (writer, seq, nbytes) == (segment.writer, segment.seq, data.size) and \
        crc == zlib.crc32(data[32:].tobytes(), zlib.crc32(data[:24].tobytes()))


def write(comm, ring, seconds: float) -> dict:
    rng = np.random.default_rng(comm.Get_rank())
    rank, tried, refused, timeouts, end = comm.Get_rank(), 0, 0, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        roll = rng.random()
        if roll < 0.05:  # refused before it takes a slot or a seq: the next put still gets seq + 1
            seq = ring.seq
            too_big = np.zeros(SLOT_BYTES + 64, np.uint8)
            for call, bad in ((ring.put, too_big[:SLOT_BYTES + 1]),
                              (ring.put_many, [payload(rank, seq + 1, 64)] * 2 + [too_big])):
                tried += 1
                try:
                    call(bad)
                except ValueError:
                    refused += 1
            assert ring.seq == seq, "a refused put took a sequence number"
            continue
        count = 1 if roll < 0.5 else int(rng.integers(1, 2 * SLOTS + 2))
        sizes = rng.choice(SIZES, count)
        put = 0
        while put < count:  # after a timeout, what is left of the batch
            batch = [payload(rank, ring.seq + 1 + i, int(n)) for i, n in enumerate(sizes[put:])]
            before = ring.seq
            try:
                if len(batch) == 1 and count == 1:
                    ring.put(batch[0], PUT_TIMEOUT_S)
                else:
                    ring.put_many(batch, PUT_TIMEOUT_S)
            except TransportTimeout:
                timeouts += 1
            put += ring.seq - before
    comm.Ibarrier().Wait()
    ring.close()
    return {"produced": ring.seq, "drops": ring.drops, "tried": tried, "refused": refused, "timeouts": timeouts}


def own(comm, ring) -> dict:
    taken, bad, cycles = [], 0, 0
    writers_done, done = comm.Ibarrier(), False
    while not done:
        for _, seconds, hold in PHASES:
            phase_end = time.monotonic() + seconds
            while time.monotonic() < phase_end and not done:
                done = writers_done.Test()  # one pass more once the writers are done
                views = ring.take_view()
                bad += sum(not intact(seg) for seg in views)
                taken.extend((seg.writer, seg.seq) for seg in views)
                if hold is None:  # stalled with the views held, the writers' slots out of reach
                    time.sleep(max(0.0, phase_end - time.monotonic()))
                elif hold:
                    time.sleep(hold)
                ring.release(views)
            if done:
                break
        cycles += 1
    left = ring.close()
    bad += sum(not intact(seg) for seg in left)
    taken.extend((seg.writer, seg.seq) for seg in left)
    return {"taken": taken, "bad": bad, "cycles": cycles, "dropped_total": ring.dropped_total()}


def main() -> None:
    backend, policy, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
    comm = MPI.COMM_WORLD
    transport = Transport(comm, TransportConfig(backend=backend, timeout_s=60))
    ring = transport.experience_ring(0, RingConfig(slots=SLOTS, slot_bytes=SLOT_BYTES, full_policy=policy))
    comm.Barrier()
    result = own(comm, ring) if comm.Get_rank() == 0 else write(comm, ring, seconds)
    results = comm.gather(result, root=0)
    if comm.Get_rank() != 0:
        return
    owner, writers = results[0], dict(enumerate(results[1:], start=1))
    produced = {(w, seq) for w, r in writers.items() for seq in range(1, r["produced"] + 1)}
    drops = [tuple(d) for r in writers.values() for d in r["drops"]]
    taken = [tuple(t) for t in owner["taken"]]
    by_writer: dict[int, list[int]] = {w: [] for w in writers}
    for writer, seq in taken:
        by_writer[writer].append(seq)
    print(json.dumps({
        "backend": transport.backend,
        "produced": len(produced), "taken": len(taken), "distinct_taken": len(set(taken)),
        "taken_not_produced": len(set(taken) - produced),
        "lost": len(produced - set(taken) - set(drops)),
        "drops_listed": len(drops), "distinct_drops": len(set(drops)), "drops_not_produced": len(set(drops) - produced),
        "dropped_and_taken": len(set(drops) & set(taken)), "dropped_total": owner["dropped_total"],
        "out_of_order": sum(b < a for s in by_writer.values() for a, b in zip(s, s[1:])),
        "bad": owner["bad"], "cycles": owner["cycles"],
        "oversize_tried": [r["tried"] for r in writers.values()],
        "refused": [r["refused"] for r in writers.values()], "timeouts": [r["timeouts"] for r in writers.values()],
    }))


main()
