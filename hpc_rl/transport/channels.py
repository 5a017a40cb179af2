"""The three channels' interfaces. Each backend (``rma``, ``twosided``, ``local``) implements all three.

Channels are created collectively: every rank of the communicator constructs the channel with the same arguments
(ranks that take no part pass through; window creation and ``Dup`` are collective, and the local backend matches
its ranks' creations by their order), and every rank calls ``close()`` collectively at the end. Payloads are
C-contiguous numpy arrays (any dtype; they travel as bytes); what a channel returns is a private uint8 copy the
caller may keep, except the ring's ``take_view()``, which lends read-only views into the ring's own memory until
``release()``.
"""

from __future__ import annotations

import operator
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hpc_rl.transport.layout import as_bytes
from hpc_rl.transport.wait import TransportError

_nbytes = operator.attrgetter("nbytes")


@dataclass(eq=False, slots=True)
class Segment:
    """One experience segment taken out of a ring: who wrote it, its writer-local sequence number, its bytes.

    Not frozen: an owner builds one per segment it takes, and a frozen dataclass's ``__init__`` costs ~1.1 us
    against ~0.2 us (measured), a fifth of the owner's time per 64 KiB segment."""

    writer: int
    seq: int
    payload: np.ndarray  # uint8, checked against ``checksum``: a private copy (poll) or a read-only view (take_view)
    checksum: int
    slot: int | None = None  # take_view: the ring slot the view lends until release(); None for a private copy


class StepExchange(ABC):
    """env ⇄ inference, one request and one reply per step.

    env rank::

        ex.send_request(packed_obs_rewards_dones)
        actions = ex.wait_reply()

    inference rank::

        requests = ex.wait_requests(ex.clients_of(my_rank))    # {env_rank: payload}
        for env_rank, payload in requests.items(): ex.send_reply(env_rank, packed_actions)

    Each env has at most one request outstanding, so one slot per direction suffices and a reply cannot be
    overwritten before it is read. Sequence numbers are checked: a skipped or repeated step raises TransportError.
    """

    channel = "step"

    def __init__(self, comm, clients: Mapping[int, int], request_bytes: int, reply_bytes: int):
        for env_rank, inference_rank in clients.items():
            for role, r in (("env", env_rank), ("inference", inference_rank)):
                if not 0 <= r < comm.Get_size():
                    raise ValueError(f"clients maps to {role} rank {r}, outside the communicator of size "
                                     f"{comm.Get_size()}")
        if request_bytes < 1 or reply_bytes < 1:
            raise ValueError(f"request_bytes and reply_bytes must be >= 1, got {request_bytes}, {reply_bytes}")
        self.comm = comm
        self.rank = comm.Get_rank()
        self.clients = dict(clients)  # env rank -> the inference rank serving it
        self.request_bytes = request_bytes
        self.reply_bytes = reply_bytes

    def clients_of(self, inference_rank: int) -> list[int]:
        """The env ranks an inference rank serves, in rank order (the order of its request slots)."""
        return sorted(e for e, i in self.clients.items() if i == inference_rank)

    def _check_size(self, payload: np.ndarray, capacity: int, what: str) -> None:
        if payload.nbytes > capacity:
            raise ValueError(f"{what} of {payload.nbytes} bytes exceeds the channel's {capacity}-byte slot")

    def _is_new_request(self, env_rank: int, seq: int) -> bool:
        """Whether request ``seq`` of ``env_rank`` is the next one (False: the last one, seen already). A skipped
        step, or a step sent before the last was answered, raises TransportError. The inference side keeps
        ``_received`` and ``_replied``: the sequence number of every env's last request and last reply."""
        last = self._received[env_rank]
        if seq == last:
            return False
        if seq != last + 1:
            raise TransportError(f"step request {seq} from rank {env_rank} after {last}: a step was lost")
        if self._replied[env_rank] != last:
            raise TransportError(f"rank {env_rank} sent step {seq} before step {last} was answered")
        return True

    @abstractmethod
    def send_request(self, payload: np.ndarray) -> None:
        """env: send this step's request to the serving inference rank."""

    @abstractmethod
    def wait_reply(self, timeout_s: float | None = None) -> np.ndarray:
        """env: the reply to the last request; TransportTimeout naming the inference rank past the deadline."""

    @abstractmethod
    def poll_requests(self) -> dict[int, np.ndarray]:
        """inference: requests that have arrived since the last call (never waits)."""

    def wait_requests(self, env_ranks: Iterable[int], timeout_s: float | None = None) -> dict[int, np.ndarray]:
        """inference: wait until every rank in ``env_ranks`` has a request; TransportTimeout names a missing one."""
        missing = set(env_ranks)
        got: dict[int, np.ndarray] = {}
        waiter = None
        while True:
            for env_rank, payload in self.poll_requests().items():
                got[env_rank] = payload
                missing.discard(env_rank)
            if not missing:
                return got
            if waiter is None:
                waiter = self._waiter(min(missing), "requests", timeout_s)
            waiter.peer = min(missing)
            waiter.step()

    @abstractmethod
    def send_reply(self, env_rank: int, payload: np.ndarray) -> None:
        """inference: answer the request last received from ``env_rank``."""

    @abstractmethod
    def _waiter(self, peer: int | None, what: str, timeout_s: float | None): ...

    @abstractmethod
    def close(self) -> None:
        """Collective: release windows / cancel posted receives."""


class ExperienceRing(ABC):
    """Segments from any number of writers to one owner (a learner), through ``slots`` fixed-size slots.

    writer::

        seq = ring.put(segment_bytes)      # block: waits for a free slot; drop_oldest: may displace a READY one
        seqs = ring.put_many([a, b, c])    # several at once: the RMA ring's protocol cost is paid once per batch
        ...
        ring.close()                       # collective

    owner::

        for seg in ring.poll(): buffer.add(seg.payload)   # private copies; the slots are free again
        rest = ring.close()                                # collective: drains what writers sent before closing

    or, without the copy (the bytes are read where the writer put them)::

        views = ring.take_view()                          # read-only views into the ring, checked
        for seg in views: buffer.add(unpack(seg.payload))  # copy/convert them into private memory
        ring.release(views)                                # only now may writers reuse those slots

    ``drops`` on a writer lists the (writer, seq) of every segment that writer's puts displaced; ``dropped_total()``
    on the owner is the count over all writers. ``ready_slots()`` on the owner counts the segments waiting in the
    ring (the ring's occupancy).
    """

    channel = "ring"

    def __init__(self, comm, owner: int, config):
        if not 0 <= owner < comm.Get_size():
            raise ValueError(f"ring owner {owner} outside the communicator of size {comm.Get_size()}")
        self._check_same_on_every_rank(comm, owner, config)
        self.comm = comm
        self.rank = comm.Get_rank()
        self.owner = owner
        self.config = config
        self.seq = 0  # sequence number of this writer's last put
        self.drops: list[tuple[int, int]] = []
        self.lost_races = 0  # owner: copies discarded because a drop_oldest writer took the slot mid-copy
        self.blocked_puts = 0  # writer: puts that found the ring full and waited (block policy)

    def _check_same_on_every_rank(self, comm, owner: int, config) -> None:
        """Collective: every rank must build the ring alike. The owner frees slots by the policy the writers follow
        (under `block` it stores FREE without checking for a steal) and checks the checksums they send. Every rank
        sees the same gathered list, so every rank raises the same error."""
        views = comm.allgather((owner, config))
        for rank, view in enumerate(views):
            if view != views[0]:
                raise ValueError(f"ring created differently on rank {rank} (owner {view[0]}, {view[1]}) and on rank 0 "
                                 f"(owner {views[0][0]}, {views[0][1]}): every rank must pass the same owner and "
                                 f"RingConfig")

    @property
    def is_owner(self) -> bool:
        return self.rank == self.owner

    def _check_writer(self, payloads: Sequence[np.ndarray]) -> None:
        if self.is_owner:
            raise ValueError(f"rank {self.rank} owns this ring; the owner reads it, it does not put into it")
        largest = max(map(_nbytes, payloads))
        if largest > self.config.slot_bytes:
            raise ValueError(f"segment of {largest} bytes exceeds slot_bytes={self.config.slot_bytes}")

    def _check_owner(self, what: str) -> None:
        if not self.is_owner:
            raise ValueError(f"{what} is for the ring's owner (rank {self.owner}), called on rank {self.rank}")

    @abstractmethod
    def put(self, payload: np.ndarray, timeout_s: float | None = None) -> int:
        """writer: hand one segment to the owner; returns its sequence number (1, 2, ... per writer)."""

    def put_many(self, payloads: Sequence[np.ndarray], timeout_s: float | None = None) -> list[int]:
        """writer: hand several segments to the owner, in order; returns their sequence numbers.

        The RMA ring amortises its protocol over the batch (one ticket ``Fetch_and_op``, one ``Flush`` for all
        payloads, one ``Accumulate`` of READY words per run of slots); this default puts them one by one.
        """
        data = list(map(as_bytes, payloads))
        if data:
            self._check_writer(data)  # every segment is checked before the first is put: a bad batch puts nothing
        return [self.put(payload, timeout_s) for payload in data]

    def poll(self, alloc: Callable[[int], np.ndarray] | None = None) -> list[Segment]:
        """owner: every segment ready now, copied out and checked; their slots are free again.

        ``alloc(nbytes)`` gives the uint8 array a segment is copied into (default: a new array). A learner passes
        rows of its preallocated experience buffer: no allocation, and no page faults, per segment.
        """
        views = self.take_view()
        try:
            copies = []
            for seg in views:
                payload = alloc(seg.payload.size) if alloc is not None else np.empty(seg.payload.size, np.uint8)
                np.copyto(payload, seg.payload)
                copies.append(Segment(seg.writer, seg.seq, payload, seg.checksum))
        finally:
            self.release(views)
        return copies

    @abstractmethod
    def take_view(self) -> list[Segment]:
        """owner: every segment ready now and not yet taken, checked, as read-only views into the ring's memory.

        A view stays valid, and its slot stays out of the writers' reach, until ``release()`` (or ``close()``):
        copy what you keep before releasing. Each writer's segments come in the order it put them, across calls
        too (a segment whose writer's previous one has not arrived yet waits for a later call).
        """

    @abstractmethod
    def release(self, segments: Iterable[Segment]) -> None:
        """owner: hand the slots of views from ``take_view()`` back to the writers; the views become invalid.

        Raises ValueError for a segment that is not a view currently held (a copy, or one already released)."""

    @abstractmethod
    def ready_slots(self) -> int:
        """owner: slots holding a segment that was put and not yet taken (0..slots), without taking any."""

    def _check_release(self, held: dict, segments: Iterable[Segment]) -> list[int]:
        """The slots of ``segments``, each a view currently held; raises ValueError naming the first that is not."""
        slots: dict[int, None] = {}  # ordered, with O(1) membership
        for seg in segments:
            if seg.slot is None or held.get(seg.slot) is not seg or seg.slot in slots:
                raise ValueError(f"segment {seg.seq} from rank {seg.writer} is not a view held from take_view() "
                                 f"(a copy from poll(), or already released)")
            slots[seg.slot] = None
        return list(slots)

    @abstractmethod
    def dropped_total(self) -> int:
        """owner: segments displaced under ``drop_oldest`` so far, over all writers."""

    @abstractmethod
    def close(self, alloc: Callable[[int], np.ndarray] | None = None) -> list[Segment]:
        """Collective: writers finish their puts; the owner drains and returns what is left."""


class ParameterChannel(ABC):
    """One publisher, many readers; a reader always gets one whole published vector, never a mix of two.

    publisher: ``version = params.publish(flat_bytes)``; reader: ``got = params.poll()`` (``(version, bytes)`` if a
    newer version than the last one returned exists, else None) or ``params.wait_version(v)``.
    """

    channel = "params"

    def __init__(self, comm, publisher: int, max_bytes: int):
        if not 0 <= publisher < comm.Get_size():
            raise ValueError(f"publisher {publisher} outside the communicator of size {comm.Get_size()}")
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        self.comm = comm
        self.rank = comm.Get_rank()
        self.publisher = publisher
        self.max_bytes = max_bytes
        self.version = 0  # publisher: last published; reader: last returned
        self.retries = 0  # reader: copies discarded because the publisher rewrote the buffer meanwhile

    def _check_publish(self, payload: np.ndarray) -> None:
        if self.rank != self.publisher:
            raise ValueError(f"publish on rank {self.rank}; only the publisher (rank {self.publisher}) publishes")
        if payload.nbytes > self.max_bytes:
            raise ValueError(f"parameter vector of {payload.nbytes} bytes exceeds max_bytes={self.max_bytes}")

    def _check_reader(self) -> None:
        if self.rank == self.publisher:
            raise ValueError(f"rank {self.rank} publishes this channel; it does not read it")

    @abstractmethod
    def publish(self, payload: np.ndarray) -> int:
        """publisher: make ``payload`` the newest version; returns its version number (1, 2, ...)."""

    def progress(self) -> None:
        """publisher: call from idle loops. The two-sided backend sends versions held back by a slow reader here;
        the RMA backend has nothing to do (readers fetch)."""

    @abstractmethod
    def poll(self) -> tuple[int, np.ndarray] | None:
        """reader: the newest version if newer than the last returned, else None. Never returns a torn vector."""

    @abstractmethod
    def _waiter(self, peer: int | None, what: str, timeout_s: float | None): ...

    def wait_version(self, min_version: int, timeout_s: float | None = None) -> tuple[int, np.ndarray]:
        """reader: wait for a version >= ``min_version``; TransportTimeout naming the publisher past the deadline."""
        waiter = None
        while True:
            got = self.poll()
            if got is not None and got[0] >= min_version:
                return got
            if waiter is None:
                waiter = self._waiter(self.publisher, f"parameter version >= {min_version}", timeout_s)
            waiter.step()

    @abstractmethod
    def close(self) -> None:
        """Collective."""
