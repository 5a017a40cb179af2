"""Transport throughput and latency, 2 ranks on one host: ``python -m hpc_rl.bench transport --json``.

For each segment size (64 KiB, 1 MiB):

- ``rma_GBps``: segments through the RMA experience ring, writer to owner, including the owner's copy-out and
  checksum check; ``rma_nochecksum_GBps``: the same with ``checksums=False``;
- ``raw_put_GBps``: a bare ``Put`` + ``Flush`` loop of the same size into the same kind of window, same run;
- ``memcpy_GBps``: a numpy copy of one segment; ``twosided_GBps``: the two-sided ring;
- ``rma_over_raw_put``: the protocol's share of the bare Put bandwidth (the goal is >= 0.8);
- ``writer_cpu_us_per_segment`` (last run) and ``rma_over_raw_put_cpu``: the same comparison in the writer's CPU
  time, which a busy host disturbs less (the ring needs both ranks on a core at once, the bare loop only one, so
  wall-time ratios fall with load).

``roundtrip_us_8KiB``: env -> inference -> env through the step exchange, 8 KiB each way, per backend (median,
p90). Each bandwidth is the best of ``--repeats`` runs, since the machine is shared and only ratios carry over.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time

import numpy as np

from hpc_rl.launch import mpirun_command, rank_env

SIZES = (64 * 1024, 1024 * 1024)
RING_SLOTS = 32  # slots of the ring and of the bare-Put window; the owner drains a batch per poll


def add_arguments(parser) -> None:
    parser.add_argument("--bytes-per-run", type=int, default=512 << 20,
                        help="bytes moved per bandwidth measurement (per size, per method)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per bandwidth figure; the best is reported")
    parser.add_argument("--roundtrips", type=int, default=2000, help="round trips per latency figure")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds before the benchmark job is killed")


def run(args) -> dict:
    for name in ("bytes_per_run", "repeats", "roundtrips"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    argv = ["-m", "hpc_rl.bench.transport", str(args.bytes_per_run), str(args.repeats), str(args.roundtrips)]
    proc = subprocess.run(mpirun_command(2, argv), capture_output=True, text=True, env=rank_env(),
                          timeout=args.timeout)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"transport benchmark job failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return json.loads(lines[-1])


def _label(nbytes: int) -> str:
    return f"{nbytes >> 20}MiB" if nbytes >= 1 << 20 else f"{nbytes >> 10}KiB"


def _ranks(bytes_per_run: int, repeats: int, roundtrips: int) -> None:
    """Runs on both ranks: rank 0 writes / is the env, rank 1 owns / serves."""
    from mpi4py import MPI

    from hpc_rl.transport import RingConfig, Transport, TransportConfig
    from hpc_rl.transport.rma import Window
    from hpc_rl.transport.wait import Waiter

    comm = MPI.COMM_WORLD
    rank = comm.Get_rank()
    if comm.Get_size() != 2:
        raise ValueError(f"the transport benchmark runs on exactly 2 ranks, got {comm.Get_size()}")
    rma = Transport(comm, TransportConfig(backend="rma"))
    twosided = Transport(comm, TransportConfig(backend="twosided"))
    result: dict = {"probe": rma.probe.as_dict()}

    def ring_gbps(transport, nbytes: int, count: int, checksums: bool = True) -> float:
        ring = transport.experience_ring(1, RingConfig(slots=RING_SLOTS, slot_bytes=nbytes, checksums=checksums))
        segment = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        comm.Barrier()
        start, cpu = time.perf_counter(), time.process_time()
        if rank == 0:
            for _ in range(count):
                ring.put(segment)
            cpu_us[transport.backend, checksums] = (time.process_time() - cpu) / count * 1e6
            ring.close()
        else:
            # The owner copies into rows of a preallocated buffer, as a learner copies into its sample buffer.
            rows = np.empty((RING_SLOTS, nbytes), np.uint8)
            got, waiter, handed_out = 0, None, [0]

            def row(size: int) -> np.ndarray:
                handed_out[0] += 1
                return rows[handed_out[0] % RING_SLOTS, :size]

            while got < count:
                segments = ring.poll(row)
                got += len(segments)
                if segments:
                    waiter = None
                    continue
                waiter = waiter or Waiter(transport.config.poll, transport.config.timeout_s, "ring", 0, "segments")
                waiter.step()
            ring.close()
        elapsed = comm.bcast(time.perf_counter() - start, root=1)  # ends when the owner holds every segment
        return count * nbytes / elapsed / 1e9

    def raw_put_gbps(nbytes: int, count: int) -> float:
        window = Window(comm, RING_SLOTS * nbytes if rank == 1 else 0)
        segment = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        comm.Barrier()
        elapsed = 0.0
        if rank == 0:
            start, cpu = time.perf_counter(), time.process_time()
            for i in range(count):
                window.put(segment, 1, (i % RING_SLOTS) * nbytes)
                window.flush(1)
            elapsed = time.perf_counter() - start
            cpu_us["raw_put"] = (time.process_time() - cpu) / count * 1e6
        elapsed = comm.bcast(elapsed, root=0)
        window.free()
        return count * nbytes / elapsed / 1e9

    def memcpy_gbps(nbytes: int, count: int) -> float:
        src = np.random.default_rng(0).integers(0, 255, nbytes, dtype=np.uint8)
        dst = np.empty_like(src)
        start = time.perf_counter()
        for _ in range(count):
            np.copyto(dst, src)
        return count * nbytes / (time.perf_counter() - start) / 1e9

    cpu_us: dict = {}  # the writer's CPU time per segment (last run): independent of how busy the host is
    for nbytes in SIZES:
        count = max(16, bytes_per_run // nbytes)
        best = {"rma_GBps": 0.0, "raw_put_GBps": 0.0, "memcpy_GBps": 0.0, "twosided_GBps": 0.0,
                "rma_nochecksum_GBps": 0.0}
        for _ in range(repeats):
            best["raw_put_GBps"] = max(best["raw_put_GBps"], raw_put_gbps(nbytes, count))
            best["rma_GBps"] = max(best["rma_GBps"], ring_gbps(rma, nbytes, count))
            best["rma_nochecksum_GBps"] = max(best["rma_nochecksum_GBps"], ring_gbps(rma, nbytes, count, False))
            best["twosided_GBps"] = max(best["twosided_GBps"], ring_gbps(twosided, nbytes, count))
            best["memcpy_GBps"] = max(best["memcpy_GBps"], comm.bcast(memcpy_gbps(nbytes, count), root=0))
        best = {k: round(v, 3) for k, v in best.items()}
        best["rma_over_raw_put"] = round(best["rma_GBps"] / best["raw_put_GBps"], 3)
        best["rma_nochecksum_over_raw_put"] = round(best["rma_nochecksum_GBps"] / best["raw_put_GBps"], 3)
        writer_cpu = comm.bcast({"raw_put": cpu_us.get("raw_put"), "rma": cpu_us.get(("rma", True)),
                                 "rma_nochecksum": cpu_us.get(("rma", False)),
                                 "twosided": cpu_us.get(("twosided", True))}, root=0)
        best["writer_cpu_us_per_segment"] = {k: round(v, 2) for k, v in writer_cpu.items()}
        # The same share measured in CPU time: what the protocol costs the writer, however busy the host is.
        best["rma_over_raw_put_cpu"] = round(writer_cpu["raw_put"] / writer_cpu["rma"], 3)
        best["rma_nochecksum_over_raw_put_cpu"] = round(writer_cpu["raw_put"] / writer_cpu["rma_nochecksum"], 3)
        result[_label(nbytes)] = best

    latency = {}
    message = np.ones(8192, np.uint8)
    for name, transport in (("rma", rma), ("twosided", twosided)):
        exchange = transport.step_exchange({0: 1}, message.nbytes, message.nbytes)
        times = []
        comm.Barrier()
        for i in range(roundtrips + 100):  # the first 100 warm up
            if rank == 0:
                start = time.perf_counter()
                exchange.send_request(message)
                exchange.wait_reply()
                if i >= 100:
                    times.append(time.perf_counter() - start)
            else:
                exchange.wait_requests([0])
                exchange.send_reply(0, message)
        exchange.close()
        if rank == 0:
            latency[name] = {"median": round(float(np.median(times)) * 1e6, 2),
                             "p90": round(float(np.percentile(times, 90)) * 1e6, 2)}
    result["roundtrip_us_8KiB"] = latency
    if rank == 0:
        print(json.dumps(result))


if __name__ == "__main__":
    _ranks(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
