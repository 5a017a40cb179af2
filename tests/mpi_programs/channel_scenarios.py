"""The channel tests' scenarios: what every rank does, and the report made of every rank's result.

Each scenario runs unchanged on MPI ranks (``transport_channels.py NAME ARGV...`` under mpirun: the rma and
twosided backends) and on threads of one process over a ``LocalWorld`` (``run_on_threads``: the local backend), so
``tests/test_transport_channels.py`` holds all three backends to the same assertions. A scenario is built from its
argv (the backend first) and gives ``config``, the TransportConfig of every rank; ``run(comm, transport)`` is one
rank's part (``comm`` coordinates the test's ranks: MPI's communicator, or a ``ThreadComm``; ``transport`` is that
rank's); ``report(results)`` turns every rank's result, in rank order, into the JSON report rank 0 prints.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter

import numpy as np

from hpc_rl.transport import ArrayLayout, LocalWorld, RingConfig, Transport, TransportConfig, checksum


def payload_of(writer: int, seq: int, max_bytes: int) -> np.ndarray:
    """Segment ``seq`` of ``writer``: its length and bytes follow from the two, so the owner can check it."""
    rng = np.random.default_rng([writer, seq])
    nbytes = int(rng.integers(max_bytes // 4, max_bytes + 1)) // 8 * 8
    return rng.integers(0, 2**63, nbytes // 8, dtype=np.uint64).view(np.uint8)


class Ring:
    """Experience ring under pressure: rank 0 owns a small ring, every other rank writes segments into it.

    argv: backend slots segments_per_writer policy consumer_delay_s max_segment_bytes [assisted] [view] [batch]
    Every payload is generated from (writer rank, sequence number), so the owner checks each segment it consumes
    byte for byte, not only against the checksum in its header. ``view``: the owner consumes with ``take_view()``,
    checks each view in place while the writers race for slots, holds the views for ``consumer_delay_s``, checks
    them again (a byte changed while lent counts as bad), and only then releases them; else it copies with
    ``poll()``. ``batch``: writers hand over their segments with ``put_many`` in batches of 1, 2, ..., slots + 2
    segments (the largest ones more than the ring holds). ``assisted``: accept RMA that progresses only while the
    target is in MPI. ``in_order`` in the report: every writer's segments were consumed in the order it put them.
    """

    OPTIONS = {"assisted", "view", "batch"}

    def __init__(self, argv: list[str]):
        backend, slots, per_writer, policy, delay_s, max_bytes = argv[:6]
        self.options = set(argv[6:])
        if not self.options <= self.OPTIONS:
            raise ValueError(f"unknown options {sorted(self.options - self.OPTIONS)}")
        self.slots, self.per_writer, self.policy = int(slots), int(per_writer), policy
        self.delay_s, self.max_bytes = float(delay_s), int(max_bytes)
        self.config = TransportConfig(backend=backend, timeout_s=60,
                                      require_passive_progress="assisted" not in self.options)

    def _differs(self, seg) -> bool:
        """The segment's bytes differ from what its writer generated."""
        return not np.array_equal(seg.payload, payload_of(seg.writer, seg.seq, self.max_bytes))

    def _bad(self, copies) -> int:
        """Copies whose bytes differ from what their writers generated, or from their headers' checksums."""
        return sum(self._differs(seg) or checksum(seg.payload) != seg.checksum for seg in copies)

    def run(self, comm, transport) -> dict:
        ring = transport.experience_ring(0, RingConfig(slots=self.slots, slot_bytes=self.max_bytes,
                                                       full_policy=self.policy))
        comm.Barrier()
        if comm.Get_rank() != 0:
            produced, size = [], 0
            while len(produced) < self.per_writer:
                if "batch" in self.options:
                    size = size % (self.slots + 2) + 1
                    count = min(size, self.per_writer - len(produced))
                    batch = [payload_of(comm.Get_rank(), ring.seq + 1 + i, self.max_bytes) for i in range(count)]
                    seqs = ring.put_many(batch)
                else:
                    seqs = [ring.put(payload_of(comm.Get_rank(), ring.seq + 1, self.max_bytes))]
                produced.extend((comm.Get_rank(), seq) for seq in seqs)
            comm.Ibarrier().Wait()
            ring.close()
            return {"produced": produced, "drops": ring.drops, "blocked_puts": ring.blocked_puts}
        start = time.monotonic()
        consumed, bad, polls, max_ready, release_twice_refused = [], 0, 0, 0, None
        writers_done, done = comm.Ibarrier(), False
        while not done:
            done = writers_done.Test()  # one pass more once the writers are done: it takes what they put last
            max_ready = max(max_ready, ring.ready_slots())
            if "view" in self.options:
                views = ring.take_view()
                bad += sum(map(self._differs, views))
                time.sleep(self.delay_s)  # writers race for the slots while the views are held
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
                copies = ring.poll()
                bad += self._bad(copies)
                consumed.extend((seg.writer, seg.seq) for seg in copies)
                time.sleep(self.delay_s)
            polls += 1
        left = ring.close()
        bad += self._bad(left)
        consumed.extend((seg.writer, seg.seq) for seg in left)
        return {"consumed": consumed, "bad": bad, "polls": polls, "seconds": time.monotonic() - start,
                "max_ready": max_ready, "release_twice_refused": release_twice_refused,
                "dropped_total": ring.dropped_total(), "lost_races": ring.lost_races}

    def report(self, results: list[dict]) -> dict:
        owner, writers = results[0], results[1:]
        produced = {tuple(p) for w in writers for p in w["produced"]}
        drops = [tuple(d) for w in writers for d in w["drops"]]
        ids = [tuple(c) for c in owner["consumed"]]
        seqs: dict[int, list[int]] = {}
        for writer, seq in ids:
            seqs.setdefault(writer, []).append(seq)
        return {
            "in_order": all(s == sorted(s) for s in seqs.values()),
            "produced": len(produced), "consumed": len(ids), "distinct_consumed": len(set(ids)),
            "bad_payloads": owner["bad"], "consumed_equals_produced": set(ids) == produced,
            "consumed_or_dropped_equals_produced": set(ids) | set(drops) == produced,
            "dropped_and_consumed": len(set(ids) & set(drops)), "drops_listed": len(drops),
            "distinct_drops": len(set(drops)), "dropped_total": owner["dropped_total"],
            "lost_races": owner["lost_races"], "blocked_puts": sum(w["blocked_puts"] for w in writers),
            "polls": owner["polls"], "seconds": owner["seconds"], "max_ready": owner["max_ready"],
            "release_twice_refused": owner["release_twice_refused"],
        }


class Occupancy:
    """Ring occupancy: the owner's ``ready_slots()`` counts what was put and not yet taken, and takes nothing.

    argv: backend policy (two-sided: block only; its drop_oldest writers send queued segments as they progress)
    Rank 0 owns a ring of 4 slots; ranks 1 and 2 each put one segment, then (after the owner has looked) two more
    each, filling the ring. The owner records ``ready_slots()`` at each stage: after the first two puts, after
    taking them as views (held views are not READY), after releasing them, with the ring full, and after draining.
    """

    SLOTS = 4

    def __init__(self, argv: list[str]):
        backend, self.policy = argv
        self.config = TransportConfig(backend=backend, timeout_s=30)

    def run(self, comm, transport) -> dict:
        ring = transport.experience_ring(0, RingConfig(slots=self.SLOTS, slot_bytes=4096, full_policy=self.policy))
        if comm.Get_rank() != 0:
            comm.Barrier()
            ring.put(np.full(4096, comm.Get_rank(), np.uint8))
            comm.Barrier()
            comm.Barrier()
            for _ in range(2):
                ring.put(np.full(4096, comm.Get_rank(), np.uint8))
            comm.Barrier()
            ring.close()
            return {}

        def wait_ready(count: int) -> int:
            """ready_slots() once it reaches ``count`` (two-sided receives complete as MPI progresses), or at 10 s."""
            deadline = time.monotonic() + 10
            while (got := ring.ready_slots()) < count and time.monotonic() < deadline:
                time.sleep(0.001)
            return got

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
        seen["full"] = wait_ready(self.SLOTS)
        seen["drained"] = len(ring.poll())
        seen["after_drain"] = ring.ready_slots()
        return {"seen": seen, "left_at_close": len(ring.close())}

    def report(self, results: list[dict]) -> dict:
        return {"policy": self.policy, "slots": self.SLOTS, **results[0]}


def _refused(call) -> str | None:
    """The ValueError's message, or None when ``call`` did not raise one."""
    try:
        call()
    except ValueError as exc:
        return str(exc)
    return None


class RingMisuse:
    """A writer's bad puts are refused before they take a slot, and the ring goes on; a put after close() raises.

    argv: backend
    Rank 1 owns a ring of 4 slots of 4096 bytes; rank 0 writes. Rank 0 tries an oversized segment, a strided one,
    and (RMA) batches the compiled writer must refuse on its own; each must raise ValueError and leave the ring as it
    was: the segments put afterwards all arrive, with seqs 1, 2, ... The owner's own put is refused too. After
    close(), a put raises instead of reaching a freed window.
    """

    def __init__(self, argv: list[str]):
        (backend,) = argv
        self.config = TransportConfig(backend=backend, timeout_s=20)

    def run(self, comm, transport) -> dict:
        ring = transport.experience_ring(1, RingConfig(slots=4, slot_bytes=4096))
        report = {}
        good = [np.full(100 * (i + 1), i, np.uint8) for i in range(6)]
        if comm.Get_rank() == 0:
            report["oversized"] = _refused(lambda: ring.put(np.zeros(4097, np.uint8)))
            report["oversized_in_batch"] = _refused(lambda: ring.put_many([good[0], np.zeros(5000, np.uint8)]))
            report["strided"] = _refused(lambda: ring.put(np.zeros(8192, np.uint8)[::2]))
            if transport.backend == "rma":  # the compiled writer's own checks, below rma.py's
                writer = ring._writer
                report["c_too_many"] = _refused(lambda: writer.put([good[0]] * 5, 1, None, ring._claim, None))
                report["c_oversized"] = _refused(
                    lambda: writer.put([np.zeros(4097, np.uint8)], 1, None, ring._claim, None))
                report["c_checksums_mismatch"] = _refused(lambda: writer.put([good[0]], 1, [1, 2], ring._claim, None))
            report["seqs"] = [ring.put(good[0])] + ring.put_many(good[1:])
            comm.Barrier()  # every segment put
        else:
            report["owner_put"] = _refused(lambda: ring.put(good[0]))
            got = []
            while len(got) < len(good):
                got.extend((seg.seq, seg.payload.tolist()) for seg in ring.poll())
            comm.Barrier()
            report["received_in_order"] = [seq for seq, _ in got] == list(range(1, len(good) + 1))
            report["payloads_match"] = all(payload == good[seq - 1].tolist() for seq, payload in got)
        report["left_at_close"] = len(ring.close())
        if comm.Get_rank() == 0:
            try:
                ring.put(good[0])
                report["put_after_close"] = None
            except Exception as exc:  # noqa: BLE001 - any clear error will do; a crash or a hang will not
                report["put_after_close"] = f"{type(exc).__name__}: {exc}"
        return report

    def report(self, results: list[dict]) -> dict:
        return {"writer": results[0], "owner": results[1]}


E, A = 4, 2  # the step exchange's envs per env rank and agents per env
OBS = {"global": ((E, A, 5), np.dtype(np.float32)), "action_mask": ((E, A, 3), np.dtype(bool))}


def observation(env_rank: int, step: int) -> dict:
    rng = np.random.default_rng([env_rank, step])
    return {"global": rng.normal(size=(E, A, 5)).astype(np.float32), "action_mask": rng.random((E, A, 3)) < 0.5,
            "reward": np.full((E, A, 1), step, np.float32), "done": np.arange(E) == step % E}


def actions_for(obs: dict) -> dict:
    return {"action": obs["action_mask"].argmax(-1), "move": np.full((E, A), int(obs["reward"][0, 0, 0])),
            "target": (obs["global"][..., 0] > 0).astype(np.int64)}


class Step:
    """Step exchange: rank 0 serves every other rank (env ranks) for a number of steps, observations maybe in FP16.

    argv: backend steps fp16(0|1)
    Each env packs an observation built from (env rank, step) with ArrayLayout; inference checks it and answers with
    actions computed from it; the env checks the answer.
    """

    def __init__(self, argv: list[str]):
        backend, steps, fp16 = argv
        self.steps = int(steps)
        self.config = TransportConfig(backend=backend, timeout_s=30, fp16_observations=fp16 == "1")

    def run(self, comm, transport) -> dict:
        rank, size = comm.Get_rank(), comm.Get_size()
        request = ArrayLayout({**OBS, "reward": ((E, A, 1), np.dtype(np.float32)), "done": ((E,), np.dtype(bool))},
                              half=["global"] if self.config.fp16_observations else [])
        reply = ArrayLayout({head: ((E, A), np.dtype(np.int64)) for head in ("action", "move", "target")})
        steps = transport.step_exchange({env: 0 for env in range(1, size)}, request.nbytes, reply.nbytes)
        if rank != 0:
            bad = 0
            for step in range(1, self.steps + 1):
                obs = observation(rank, step)
                steps.send_request(request.pack(obs))
                got = reply.unpack(steps.wait_reply())
                want = actions_for(obs)
                bad += sum(not np.array_equal(got[k], want[k]) for k in want)
            steps.close()
            return {"bad_replies": bad}
        served, bad_requests, max_obs_error = 0, 0, 0.0
        for _ in range(self.steps):
            for env_rank, payload in steps.wait_requests(steps.clients_of(0)).items():
                obs = request.unpack(payload)
                want = observation(env_rank, served // (size - 1) + 1)
                max_obs_error = max(max_obs_error, float(np.abs(obs["global"] - want["global"]).max()))
                if not all(np.array_equal(obs[k], want[k]) for k in ("action_mask", "reward", "done")):
                    bad_requests += 1
                steps.send_reply(env_rank, reply.pack(actions_for(want)))
                served += 1
        steps.close()
        return {"served": served, "bad_requests": bad_requests, "max_obs_error": max_obs_error,
                "request_bytes": request.nbytes}

    def report(self, results: list[dict]) -> dict:
        return {**results[0], "bad_replies": sum(r["bad_replies"] for r in results[1:])}


def vector(version: int, words: int) -> np.ndarray:
    """Parameter version ``version``: ``(version << 32) | i`` for i in range(words)."""
    return (np.uint64(version) << np.uint64(32)) | np.arange(words, dtype=np.uint64)


class Params:
    """Parameter channel under a publisher writing as fast as it can: rank 0 publishes, every other rank reads.

    argv: backend seconds words [assisted]
    Version k is ``vector(k, words)``, so a reader can tell from any element which version it belongs to: a vector
    mixing two versions, or a version differing from the one returned with it, is caught element by element.
    """

    def __init__(self, argv: list[str]):
        backend, seconds, words = argv[:3]
        self.seconds, self.words = float(seconds), int(words)
        self.config = TransportConfig(backend=backend, timeout_s=30, require_passive_progress=argv[3:] != ["assisted"])

    def run(self, comm, transport) -> dict:
        params = transport.parameter_channel(0, self.words * 8)
        comm.Barrier()
        deadline = time.monotonic() + self.seconds
        if comm.Get_rank() == 0:
            while time.monotonic() < deadline:
                params.publish(vector(params.version + 1, self.words))
            final = comm.bcast(params.version, root=0)
            params.close()
            return {"published": final}
        received, mixed, wrong_version, backwards, last = 0, 0, 0, 0, 0
        expected_low = np.arange(self.words, dtype=np.uint64)

        def check(version: int, payload: np.ndarray) -> None:
            nonlocal received, mixed, wrong_version, backwards, last
            got = payload.view(np.uint64)
            high = got >> np.uint64(32)
            received += 1
            if got.size != self.words or not np.array_equal(got & np.uint64(0xFFFFFFFF), expected_low) \
                    or not np.all(high == high[0]):
                mixed += 1
            elif int(high[0]) != version:
                wrong_version += 1
            if version <= last:
                backwards += 1
            last = version

        while time.monotonic() < deadline:
            got = params.poll()
            if got is not None:
                check(*got)
        final = comm.bcast(None, root=0)
        if last < final:
            check(*params.wait_version(final))
        params.close()
        return {"rank": comm.Get_rank(), "received": received, "mixed": mixed, "wrong_version": wrong_version,
                "backwards": backwards, "last": last, "final": final, "retries": params.retries}

    def report(self, results: list[dict]) -> dict:
        return {"published": results[0]["published"], "readers": results[1:]}


class Idle:
    """CPU used by ranks waiting in the transport: rank 0 serves envs 1 and 2; env 2 arrives ``hold`` s late.

    argv: backend hold_s
    Env 1 sends at once and waits ``hold`` s for its reply; rank 0 waits ``hold`` s for env 2's request. Both waits
    are measured in CPU time, of the process (``cpu_s``: MPI ranks) and of the rank's thread (``thread_cpu_s``:
    ranks that are threads of one process), against wall time.
    """

    def __init__(self, argv: list[str]):
        backend, hold_s = argv
        self.hold_s = float(hold_s)
        self.config = TransportConfig(backend=backend, timeout_s=30)

    def run(self, comm, transport) -> dict:
        rank = comm.Get_rank()
        ex = transport.step_exchange({1: 0, 2: 0}, 8192, 8192)
        comm.Barrier()
        wall, cpu, thread_cpu = time.monotonic(), time.process_time(), time.thread_time()
        if rank == 0:
            for env_rank in ex.wait_requests([1, 2]):
                ex.send_reply(env_rank, np.full(8192, env_rank, np.uint8))
        else:
            if rank == 2:
                time.sleep(self.hold_s)  # late on purpose, outside the transport
            ex.send_request(np.ones(8192, np.uint8))
            ex.wait_reply()
        report = {"rank": rank, "wall_s": time.monotonic() - wall, "cpu_s": time.process_time() - cpu,
                  "thread_cpu_s": time.thread_time() - thread_cpu}
        ex.close()
        return report

    def report(self, results: list[dict]) -> dict:
        return {"ranks": results}


SCENARIOS = {"ring": Ring, "occupancy": Occupancy, "ring_misuse": RingMisuse, "step": Step, "params": Params,
             "idle": Idle}


class _Meeting:
    """The collective calls of ranks that are threads: arrivals counted per call, by each rank's call number."""

    def __init__(self, size: int, timeout_s: float):
        self.size = size
        self.timeout_s = timeout_s
        self._cond = threading.Condition()
        self._arrived: Counter[int] = Counter()
        self._values: dict[int, object] = {}
        self._failed: int | None = None  # a rank that raised: the others' collectives raise instead of hanging

    def arrive(self, call: int, value=None, has_value: bool = False) -> None:
        with self._cond:
            self._arrived[call] += 1
            if has_value:
                self._values[call] = value
            self._cond.notify_all()

    def _done(self, call: int) -> bool:
        if self._failed is not None:
            raise RuntimeError(f"rank {self._failed} failed")
        return self._arrived[call] == self.size

    def test(self, call: int) -> bool:
        with self._cond:
            return self._done(call)

    def wait(self, call: int):
        with self._cond:
            if not self._cond.wait_for(lambda: self._failed is not None or self._done(call), self.timeout_s):
                raise TimeoutError(f"collective call {call}: {self._arrived[call]} of {self.size} ranks arrived "
                                   f"within {self.timeout_s} s")
            self._done(call)
            return self._values.get(call)

    def fail(self, rank: int) -> None:
        with self._cond:
            self._failed = rank
            self._cond.notify_all()


class _Request:
    """An Ibarrier's (or a bcast's) request: ``Test()``, ``Wait()``."""

    def __init__(self, meeting: _Meeting, call: int):
        self._meeting = meeting
        self._call = call

    def Test(self) -> bool:  # noqa: N802 - mpi4py's names, which the scenarios call
        return self._meeting.test(self._call)

    def Wait(self):  # noqa: N802
        return self._meeting.wait(self._call)


class ThreadComm:
    """What the scenarios ask of ``comm`` to coordinate their ranks (mpi4py's calls), for ranks that are threads.

    The transport runs on the LocalWorld's communicator; this one is the test's own, blocking as MPI's collectives
    block (the ranks are threads, each waits for the others).
    """

    def __init__(self, rank: int, meeting: _Meeting):
        self.rank = rank
        self._meeting = meeting
        self._calls = 0

    def Get_rank(self) -> int:  # noqa: N802
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self._meeting.size

    def _arrive(self, value=None, has_value: bool = False) -> _Request:
        self._calls += 1
        self._meeting.arrive(self._calls, value, has_value)
        return _Request(self._meeting, self._calls)

    def Ibarrier(self) -> _Request:  # noqa: N802
        return self._arrive()

    def Barrier(self) -> None:  # noqa: N802
        self._arrive().Wait()

    def bcast(self, obj, root: int = 0):
        return self._arrive(obj, self.rank == root).Wait()


def run_on_threads(size: int, name: str, argv: list[str], timeout_s: float) -> dict:
    """Scenario ``name`` on ``size`` threads of this process, one per rank of a LocalWorld: the report the MPI
    program would print. Raises the first error a rank raised, or TimeoutError naming the ranks still running at
    ``timeout_s`` (they are daemon threads: they end with their own transport deadlines)."""
    scenario = SCENARIOS[name](argv)
    world, meeting = LocalWorld(size), _Meeting(size, timeout_s)
    results: list = [None] * size
    errors: list[tuple[int, BaseException]] = []

    def rank_main(rank: int) -> None:
        try:
            transport = Transport(world.comm(rank), scenario.config)
            results[rank] = scenario.run(ThreadComm(rank, meeting), transport)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller below
            errors.append((rank, exc))
            meeting.fail(rank)

    threads = [threading.Thread(target=rank_main, args=(rank,), name=f"rank {rank}", daemon=True)
               for rank in range(size)]
    # Ranks that are processes run at once; threads take turns holding the GIL. In one of Python's default 5 ms
    # turns a writer that never waits (drop_oldest) puts a hundred segments or more; 0.1 ms turns interleave the
    # ranks' calls about as finely as processes on their own cores do.
    switch_interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + timeout_s
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
    finally:
        sys.setswitchinterval(switch_interval)
    running = [thread.name for thread in threads if thread.is_alive()]
    if running:
        raise TimeoutError(f"scenario {name} {argv}: {', '.join(running)} still running after {timeout_s} s")
    if errors:
        rank, error = errors[0]
        raise RuntimeError(f"scenario {name} {argv}: rank {rank} raised {error!r}") from error
    return {"backend": scenario.config.backend, **scenario.report(results)}
