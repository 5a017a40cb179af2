"""Experience ring under pressure: rank 0 owns a small ring, every other rank writes segments into it.

argv: backend slots segments_per_writer policy consumer_delay_s max_segment_bytes [assisted] [view] [batch]
Every payload is generated from (writer rank, sequence number), so the owner can check each segment it consumes
byte for byte, not only against the checksum in its header. ``view``: the owner consumes with ``take_view()``,
checks each view in place while the writers race for slots, holds the views for ``consumer_delay_s``, checks them
again (a byte changed while lent counts as bad), and only then releases them; else it copies with ``poll()``.
``batch``: writers hand over their segments with ``put_many`` in batches of 1, 2, ..., slots + 2 segments (the
largest ones more than the ring holds). ``in_order`` in the report: every writer's segments were consumed in the
order it put them. Prints one JSON line on rank 0. With
TRANSPORT_META_DIR set, rank 0 also writes the run's meta.json there (backend and probe result, the host of every
rank, the SLURM_* variables).
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI

from run_meta import write_run_meta

from hpc_rl.transport import RingConfig, Transport, TransportConfig, checksum


def payload_of(writer: int, seq: int, max_bytes: int) -> np.ndarray:
    rng = np.random.default_rng([writer, seq])
    nbytes = int(rng.integers(max_bytes // 4, max_bytes + 1)) // 8 * 8
    return rng.integers(0, 2**63, nbytes // 8, dtype=np.uint64).view(np.uint8)


def main() -> None:
    backend, slots, per_writer, policy, delay_s, max_bytes = sys.argv[1:7]
    slots, per_writer, delay_s, max_bytes = int(slots), int(per_writer), float(delay_s), int(max_bytes)
    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    options = set(sys.argv[7:])
    if not options <= {"assisted", "view", "batch"}:
        raise SystemExit(f"unknown options {sorted(options - {'assisted', 'view', 'batch'})}")
    assisted = "assisted" in options  # accept RMA that progresses only while the target is in MPI
    view = "view" in options
    transport = Transport(comm, TransportConfig(backend=backend, timeout_s=60, require_passive_progress=not assisted))
    ring = transport.experience_ring(0, RingConfig(slots=slots, slot_bytes=max_bytes, full_policy=policy))
    write_run_meta(comm, transport)
    comm.Barrier()
    start = time.monotonic()
    if rank == 0:
        consumed, bad, polls, max_ready, release_twice_refused = [], 0, 0, 0, None
        writers_done = comm.Ibarrier()
        while not writers_done.Test():
            max_ready = max(max_ready, ring.ready_slots())
            if view:
                views = ring.take_view()
                bad += sum(not np.array_equal(seg.payload, payload_of(seg.writer, seg.seq, max_bytes))
                           for seg in views)
                time.sleep(delay_s)  # writers race for the slots while the views are held
                bad += sum(checksum(seg.payload) != seg.checksum for seg in views)
                consumed.extend((seg.writer, seg.seq) for seg in views)
                ring.release(views)
                if views and release_twice_refused is None:
                    try:
                        ring.release(views[:1])
                        release_twice_refused = False
                    except ValueError:
                        release_twice_refused = True
            else:
                for seg in ring.poll():
                    consumed.append(seg)
                time.sleep(delay_s)
            polls += 1
        consumed.extend(ring.close())
        elapsed = time.monotonic() - start
        for seg in consumed:
            if isinstance(seg, tuple):  # a view, checked above before it was released
                continue
            if not np.array_equal(seg.payload, payload_of(seg.writer, seg.seq, max_bytes)):
                bad += 1
            elif checksum(seg.payload) != seg.checksum:
                bad += 1
        reports = comm.gather(None, root=0)[1:]
        produced = {tuple(p) for r in reports for p in r["produced"]}
        drops = [tuple(d) for r in reports for d in r["drops"]]
        blocked_puts = sum(r["blocked_puts"] for r in reports)
        ids = [s if isinstance(s, tuple) else (s.writer, s.seq) for s in consumed]
        seqs: dict[int, list[int]] = {}
        for writer, seq in ids:
            seqs.setdefault(writer, []).append(seq)
        print(json.dumps({
            "in_order": all(s == sorted(s) for s in seqs.values()),
            "backend": transport.backend, "produced": len(produced), "consumed": len(ids),
            "distinct_consumed": len(set(ids)), "bad_payloads": bad,
            "consumed_equals_produced": set(ids) == produced,
            "consumed_or_dropped_equals_produced": set(ids) | set(drops) == produced,
            "dropped_and_consumed": len(set(ids) & set(drops)), "drops_listed": len(drops),
            "distinct_drops": len(set(drops)), "dropped_total": ring.dropped_total(),
            "lost_races": ring.lost_races, "blocked_puts": blocked_puts, "polls": polls, "seconds": elapsed,
            "max_ready": max_ready, "release_twice_refused": release_twice_refused,
        }))
    else:
        produced, size = [], 0
        while len(produced) < per_writer:
            if "batch" in options:
                size = size % (slots + 2) + 1
                count = min(size, per_writer - len(produced))
                batch = [payload_of(rank, ring.seq + 1 + i, max_bytes) for i in range(count)]
                produced.extend((rank, seq) for seq in ring.put_many(batch))
            else:
                produced.append((rank, ring.put(payload_of(rank, ring.seq + 1, max_bytes))))
        comm.Ibarrier().Wait()
        ring.close()
        comm.gather({"produced": produced, "drops": ring.drops, "blocked_puts": ring.blocked_puts}, root=0)


main()
