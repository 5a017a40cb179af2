"""Local backend: the three channels between ranks that live in one process, with no MPI at all.

A ``LocalWorld(size)`` stands for a communicator of ``size`` ranks inside this process; ``world.comm(rank)`` is what
``Transport`` and the channels are given for rank ``rank``. The ranks' roles may run as threads, or be stepped one
after another by a single thread: every operation takes one lock per channel for a few assignments and never holds
it while waiting, and every wait is a ``Waiter`` (``wait.py``: backoff, deadline, ``TransportTimeout`` naming the
peer), so a wait that no other thread can end raises at its deadline instead of hanging.

Channel creation is collective as under MPI, without waiting: the i-th channel each rank creates is one shared
state, made by the first rank to create it and joined by the others, who must ask for the same kind of channel
with the same arguments (``LocalWorld.join``). Payloads are copied on the way in (the caller may reuse its
buffer); what a channel returns is the caller's own, except the ring's ``take_view()``, which lends read-only
views of the ring's slots until ``release()``. What each channel guarantees is its interface's (``channels.py``);
``docs/transport.md``, section 9, says how the local backend meets it.
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from hpc_rl.transport.channels import ExperienceRing, ParameterChannel, Segment, StepExchange
from hpc_rl.transport.config import RingConfig, TransportConfig
from hpc_rl.transport.layout import align, as_bytes, checksum
from hpc_rl.transport.wait import TransportError, Waiter


class LocalComm:
    """Rank ``rank`` of a ``LocalWorld``: its rank and size, as a communicator gives them, and the world it belongs
    to (where its channels are created)."""

    __slots__ = ("world", "rank")

    def __init__(self, world: LocalWorld, rank: int):
        self.world = world
        self.rank = rank

    def Get_rank(self) -> int:  # noqa: N802 - the name mpi4py's communicators give it, which the channels call
        return self.rank

    def Get_size(self) -> int:  # noqa: N802
        return self.world.size


class _Shared:
    """What every rank of one channel shares, guarded by one lock: ``with state:`` holds it.

    A channel some rank created differently is refused (``refused`` holds the reason): every later use of it, on
    any rank, raises that ValueError, so no rank goes on with a channel the others do not agree on.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.refused: str | None = None

    def __enter__(self) -> _Shared:
        self._lock.acquire()
        if self.refused is not None:
            self._lock.release()
            raise ValueError(self.refused)
        return self

    def __exit__(self, *exc_info) -> None:
        self._lock.release()


class _Creation:
    """A channel that not every rank has joined yet: its kind and arguments as its first rank gave them."""

    __slots__ = ("kind", "args", "creator", "state", "joined")

    def __init__(self, kind: str, args: tuple, creator: int, state: _Shared):
        self.kind = kind
        self.args = args
        self.creator = creator
        self.state = state
        self.joined = 1


class LocalWorld:
    """``size`` ranks in this process, and the channels they create collectively."""

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"a LocalWorld needs at least 1 rank, got {size}")
        self.size = size
        self._lock = threading.Lock()
        self._created = [0] * size  # channels each rank has created so far
        self._joining: dict[int, _Creation] = {}  # channel index -> the channel, until every rank has joined it

    def comm(self, rank: int) -> LocalComm:
        """The communicator of rank ``rank``: give it to ``Transport`` as that rank's."""
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} outside the LocalWorld of size {self.size}")
        return LocalComm(self, rank)

    def join(self, rank: int, kind: str, args: tuple, make) -> _Shared:
        """Rank ``rank``'s next channel: the shared state its first creator made with ``make()``, or a new one.

        Channels match by creation order, as collective calls do under MPI. A rank asking for another kind of
        channel, or for the same one with other arguments, than the rank that created it first gets a ValueError
        naming both, and the channel is refused on every rank (``_Shared``).
        """
        with self._lock:
            index = self._created[rank]
            self._created[rank] += 1
            creation = self._joining.get(index)
            if creation is None:
                creation = self._joining[index] = _Creation(kind, args, rank, make())
            else:
                creation.joined += 1
            if creation.joined == self.size:  # every rank has it: the world need not keep it any longer
                del self._joining[index]
            if (kind, args) != (creation.kind, creation.args):
                error = (f"channel {index} of the LocalWorld was created as {kind!r} {args} on rank {rank} and as "
                         f"{creation.kind!r} {creation.args} on rank {creation.creator}: every rank must create the "
                         f"same channels in the same order, with the same arguments")
                creation.state.refused = creation.state.refused or error
                raise ValueError(error)
            if creation.state.refused is not None:
                raise ValueError(creation.state.refused)
            return creation.state


def _private_copy(payload) -> np.ndarray:
    """A uint8 copy of ``payload`` that no caller holds: what a channel stores, and later hands to its reader."""
    return as_bytes(payload).copy()


class _LocalChannel:
    """What the local channels share: their state in the world, their waits, and their closing."""

    channel: str
    rank: int

    def _join(self, comm: LocalComm, config: TransportConfig, args: tuple, make) -> None:
        self.transport = config
        self.state = comm.world.join(comm.rank, self.channel, args, make)
        self.closed = False

    def _waiter(self, peer: int | None, what: str, timeout_s: float | None) -> Waiter:
        return Waiter(self.transport.poll, timeout_s or self.transport.timeout_s, self.channel, peer, what)

    def _check_open(self) -> None:
        if self.closed:
            raise ValueError(f"transport channel {self.channel!r}: closed on rank {self.rank}")


class _StepState(_Shared):
    def __init__(self) -> None:
        super().__init__()
        # env rank -> (seq, payload): the last request / reply sent; the payload is None once its reader took it
        self.requests: dict[int, tuple[int, np.ndarray | None]] = {}
        self.replies: dict[int, tuple[int, np.ndarray | None]] = {}


class LocalStepExchange(_LocalChannel, StepExchange):
    """One request and one reply per env rank, each with its step's sequence number, checked as the RMA backend
    checks its slots: a request that skips a step, or comes before the last one was answered, raises."""

    def __init__(self, comm, config: TransportConfig, clients, request_bytes: int, reply_bytes: int):
        StepExchange.__init__(self, comm, clients, request_bytes, reply_bytes)
        self._join(comm, config, (self.clients, request_bytes, reply_bytes), _StepState)
        self._sent = 0  # env: seq of the last request
        self._answered = 0  # env: seq of the last reply returned
        self._served = self.clients_of(self.rank)
        self._received = {e: 0 for e in self._served}  # inference: seq of the last request per env
        self._replied = dict(self._received)

    def send_request(self, payload):
        self._check_open()
        if self.rank not in self.clients:
            raise ValueError(f"rank {self.rank} is not an env rank of this step exchange")
        self._check_size(payload, self.request_bytes, "request")
        data = _private_copy(payload)
        self._sent += 1
        with self.state as s:
            s.requests[self.rank] = (self._sent, data)

    def wait_reply(self, timeout_s=None):
        self._check_open()
        if self.rank not in self.clients or self._answered == self._sent:
            raise ValueError(f"rank {self.rank} has no request outstanding")
        server, waiter = self.clients[self.rank], None
        while True:
            with self.state as s:
                seq, payload = s.replies.get(self.rank, (0, None))
                if seq == self._sent:
                    s.replies[self.rank] = (seq, None)
            if seq == self._sent:
                self._answered = seq
                return payload
            if seq > self._sent:
                raise TransportError(f"step reply {seq} from rank {server} answers no request "
                                     f"(last request {self._sent})")
            if waiter is None:
                waiter = self._waiter(server, f"the reply to step {self._sent}", timeout_s)
            waiter.step()

    def poll_requests(self):
        self._check_open()
        got = {}
        with self.state as s:
            for env_rank in self._served:
                seq, payload = s.requests.get(env_rank, (0, None))
                if not self._is_new_request(env_rank, seq):
                    continue
                s.requests[env_rank] = (seq, None)
                got[env_rank] = payload
                self._received[env_rank] = seq
        return got

    def send_reply(self, env_rank, payload):
        self._check_open()
        if self._received.get(env_rank, 0) == self._replied.get(env_rank, 0):
            raise ValueError(f"no unanswered request from env rank {env_rank} on rank {self.rank}")
        self._check_size(payload, self.reply_bytes, "reply")
        data = _private_copy(payload)
        seq = self._received[env_rank]
        with self.state as s:
            s.replies[env_rank] = (seq, data)
        self._replied[env_rank] = seq

    def close(self):
        # Nothing to wait for: a message sent before close stays readable by its reader.
        self._check_open()
        self.closed = True


class _RingState(_Shared):
    """The ring's slots and who holds them: a slot is free, being written (claimed by a writer), ready (put, not
    yet taken) or held (taken by the owner, until it releases it)."""

    def __init__(self, ring: RingConfig) -> None:
        super().__init__()
        self.memory = np.empty((ring.slots, align(ring.slot_bytes)), np.uint8)
        # Free slots, the one released last at the right: a writer takes that one (LIFO), still warm in the caches,
        # and a run that keeps few segments in flight touches few of the slots (each is a whole segment's bytes).
        self.free = deque(range(ring.slots))
        self.ready: dict[int, int] = {}  # ticket -> slot, of the segments put and not yet taken
        self.headers: list[tuple[int, int, int, int]] = [(0, 0, 0, 0)] * ring.slots  # writer, seq, nbytes, checksum
        self.next_ticket = 0  # tickets order the segments as their writers claimed their slots
        self.dropped = 0
        self.closed: set[int] = set()  # ranks whose close() has returned


class LocalExperienceRing(_LocalChannel, ExperienceRing):
    """``slots`` slot buffers of ``slot_bytes``. A writer claims a free slot (under ``drop_oldest``, if none is free,
    it steals the oldest ready one and lists the segment in ``drops``), copies its segment in outside the lock and
    marks it ready; the owner takes ready segments in ticket order as read-only views of their slots and frees the
    slots on ``release()``. A put that times out has claimed nothing, so repeating it is safe.

    ``close()`` on a writer returns at once (its puts are complete); on the owner it drains the ring until every
    other rank has closed, so a single thread stepping every rank closes the writers first (an owner's close that
    times out keeps what it drained, and returns it when called again).
    """

    def __init__(self, comm, config: TransportConfig, owner: int, ring: RingConfig):
        ExperienceRing.__init__(self, comm, owner, ring)
        self._join(comm, config, (owner, ring), lambda: _RingState(ring))
        self._others = [r for r in range(comm.Get_size()) if r != owner]
        self._held: dict[int, Segment] = {}  # owner: slot -> the view lent by take_view(), until release()
        self._drained: list[Segment] = []  # owner: what close() has taken so far
        self._payloads = []  # owner: each slot's read-only view
        if self.is_owner:
            for slot in range(ring.slots):
                view = self.state.memory[slot, :ring.slot_bytes]
                view.flags.writeable = False
                self._payloads.append(view)

    def _check_same_on_every_rank(self, comm, owner, config):
        """Nothing to gather: ``LocalWorld.join`` compared every rank's owner and RingConfig."""

    def put(self, payload, timeout_s=None):
        self._check_open()
        data = as_bytes(payload)
        self._check_writer([data])
        expected_sum = checksum(data) if self.config.checksums else 0
        slot, ticket = self._claim(timeout_s)
        self.state.memory[slot, :data.size] = data  # the slot is this writer's alone until it is marked ready
        self.seq += 1
        with self.state as s:
            s.headers[slot] = (self.rank, self.seq, data.size, expected_sum)
            s.ready[ticket] = slot
        return self.seq

    def _claim(self, timeout_s: float | None) -> tuple[int, int]:
        """A slot for this writer's next segment, and its ticket; waits while every slot is ready or held (block),
        or held or being written (drop_oldest)."""
        waiter = None
        while True:
            with self.state as s:
                if s.free:
                    slot = s.free.pop()
                elif s.ready and self.config.full_policy == "drop_oldest":
                    slot = s.ready.pop(min(s.ready))
                    self.drops.append(s.headers[slot][:2])
                    s.dropped += 1
                else:
                    slot = None
                if slot is not None:
                    s.next_ticket += 1
                    return slot, s.next_ticket - 1
            if waiter is None:
                self.blocked_puts += 1
                waiter = self._waiter(self.owner, "a free slot", timeout_s)
            waiter.step()

    def take_view(self):
        self._check_open()
        self._check_owner("take_view")
        with self.state as s:
            taken = [(slot, *s.headers[slot]) for slot in map(s.ready.pop, sorted(s.ready))]
        found = []
        for slot, writer, seq, nbytes, expected_sum in taken:
            payload = self._payloads[slot] if nbytes == self.config.slot_bytes else self._payloads[slot][:nbytes]
            segment = Segment(writer, seq, payload, expected_sum, slot)
            self._held[slot] = segment
            found.append(segment)
            if self.config.checksums and checksum(payload) != expected_sum:
                self.release(found)  # hand back every slot this call took: a close() after the error finds none held
                with self.state as s:  # and the slots taken after it, never lent
                    s.free.extend(row[0] for row in taken[len(found):])
                raise TransportError(f"transport channel 'ring': segment {seq} from rank {writer} in slot {slot} "
                                     f"fails its checksum")
        return found

    def release(self, segments):
        self._check_open()
        self._check_owner("release")
        slots = self._check_release(self._held, segments)
        with self.state as s:
            s.free.extend(slots)
        for slot in slots:
            del self._held[slot]

    def ready_slots(self):
        self._check_open()
        self._check_owner("ready_slots")
        with self.state as s:
            return len(s.ready)

    def dropped_total(self):
        self._check_owner("dropped_total")
        with self.state as s:  # still counts after close(), as the other backends' do
            return s.dropped

    def close(self, alloc=None):
        self._check_open()
        if self.is_owner:
            if self._held:  # views still lent out die with the ring; their slots go back first
                self.release(list(self._held.values()))
            waiter = None
            while True:
                with self.state as s:
                    still_open = [r for r in self._others if r not in s.closed]
                # After the check: a writer that had closed had put everything before. Kept across a close that
                # times out, so that calling close() again returns them.
                self._drained.extend(self.poll(alloc))
                if not still_open:
                    break
                if waiter is None:
                    waiter = self._waiter(still_open[0], "every rank to close", None)
                waiter.peer = still_open[0]
                waiter.step()
        with self.state as s:
            s.closed.add(self.rank)
        self.closed = True
        left, self._drained = self._drained, []
        return left


class _ParamsState(_Shared):
    def __init__(self) -> None:
        super().__init__()
        self.version = 0
        self.payload: np.ndarray | None = None  # the newest version, read-only: readers copy it


class LocalParameterChannel(_LocalChannel, ParameterChannel):
    """The newest published vector, replaced whole under the lock; each reader copies it out."""

    def __init__(self, comm, config: TransportConfig, publisher: int, max_bytes: int):
        ParameterChannel.__init__(self, comm, publisher, max_bytes)
        self._join(comm, config, (publisher, max_bytes), _ParamsState)

    def publish(self, payload):
        self._check_open()
        self._check_publish(payload)
        data = _private_copy(payload)
        data.flags.writeable = False
        self.version += 1
        with self.state as s:
            s.version, s.payload = self.version, data
        return self.version

    def poll(self):
        self._check_open()
        self._check_reader()
        with self.state as s:
            version, payload = s.version, s.payload
        if version <= self.version:
            return None
        self.version = version
        return version, payload.copy()

    def close(self):
        self._check_open()
        self.closed = True
