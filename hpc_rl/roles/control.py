"""The control path: small pickled messages between the controller and the other roles, over MPI or in one process.

Data travels through the transport's channels as byte buffers; control messages (heartbeats, metrics, checkpoints,
stop requests, the opponent pool) are Python objects tagged as ``hpc_rl.roles.protocol`` says. ``MpiControl`` sends
them on a communicator of their own (a ``Dup`` of the world), ``LocalControlHub`` between roles living in one process
(the serial runner). Roles see only ``ControlEndpoint`` and, for everything but the controller, ``ControlLink``.
"""

from __future__ import annotations

import logging
import sys
import time
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable
from typing import Any, NoReturn

from hpc_rl.roles.protocol import CONTROLLER, TAG_HEARTBEAT

log = logging.getLogger(__name__)


class RunAborted(RuntimeError):
    """An in-process run ended by its controller (where an MPI job would be aborted)."""


class ControlEndpoint(ABC):
    """One rank's end of the control path. Sends never block; receives return None when nothing is pending."""

    rank: int
    size: int

    @abstractmethod
    def send(self, obj: Any, dest: int, tag: int) -> None: ...

    @abstractmethod
    def receive(self, tag: int, source: int) -> Any | None:
        """A pending message with ``tag`` from ``source``, or None."""

    @abstractmethod
    def receive_any(self) -> tuple[int, int, Any] | None:
        """``(source, tag, message)`` of the oldest pending message from any rank, or None."""

    @abstractmethod
    def flush(self) -> None:
        """Complete every send."""

    @abstractmethod
    def abort(self, message: str, last: Callable[[], None] = lambda: None) -> NoReturn:
        """End the whole run, naming why: under MPI a rank that only raised could leave its peers waiting. ``last``
        runs once the message is out and before the run ends (writing what can still be written): a launcher may
        kill the job at any moment, and the message is what the user needs first."""


class MpiControl(ControlEndpoint):
    # A probe that finds nothing enters Open MPI's progress loop, which yields the core when idle
    # (mpi_yield_when_idle): on an oversubscribed host one probe per step took a fifth of an env rank's time, on the
    # path every step waits for. ``receive`` polls for rare messages (stop, the opponent pool), so a (tag, source)
    # found empty is probed again only after this long; ``receive_any`` (the controller's loop) is not throttled.
    PROBE_INTERVAL_S = 0.005

    def __init__(self, comm):
        from mpi4py import MPI

        self._mpi = MPI
        self.comm = comm
        self.rank, self.size = comm.Get_rank(), comm.Get_size()
        self._pending: list = []
        self._quiet_until: dict[tuple[int, int], float] = {}  # (tag, source) -> when to probe it again

    def send(self, obj: Any, dest: int, tag: int) -> None:
        self._pending.append(self.comm.isend(obj, dest=dest, tag=tag))
        self._pending = [r for r in self._pending if not r.Test()]

    def receive(self, tag: int, source: int) -> Any | None:
        now = time.monotonic()
        if now < self._quiet_until.get((tag, source), 0.0):
            return None
        if self.comm.Iprobe(source=source, tag=tag):
            return self.comm.recv(source=source, tag=tag)
        self._quiet_until[(tag, source)] = now + self.PROBE_INTERVAL_S
        return None

    def receive_any(self) -> tuple[int, int, Any] | None:
        status = self._mpi.Status()
        if not self.comm.Iprobe(source=self._mpi.ANY_SOURCE, tag=self._mpi.ANY_TAG, status=status):
            return None
        source, tag = status.Get_source(), status.Get_tag()
        return source, tag, self.comm.recv(source=source, tag=tag)

    def flush(self) -> None:
        self._mpi.Request.Waitall(self._pending)
        self._pending = []

    def abort(self, message: str, last: Callable[[], None] = lambda: None) -> NoReturn:
        print(message, file=sys.stderr, flush=True)
        log.error(message)
        last()
        self._mpi.COMM_WORLD.Abort(1)
        raise AssertionError("unreachable: MPI_Abort returned")


class LocalControlHub:
    """The control path between ``size`` roles in one process: one mailbox per rank, in send order."""

    def __init__(self, size: int):
        self.size = size
        self.mailboxes: list[deque[tuple[int, int, Any]]] = [deque() for _ in range(size)]

    def endpoint(self, rank: int) -> LocalControl:
        if not 0 <= rank < self.size:
            raise ValueError(f"rank {rank} outside the hub's {self.size} ranks")
        return LocalControl(self, rank)


class LocalControl(ControlEndpoint):
    def __init__(self, hub: LocalControlHub, rank: int):
        self.hub, self.rank, self.size = hub, rank, hub.size

    def send(self, obj: Any, dest: int, tag: int) -> None:
        self.hub.mailboxes[dest].append((self.rank, tag, obj))

    def receive(self, tag: int, source: int) -> Any | None:
        box = self.hub.mailboxes[self.rank]
        for i, (src, t, obj) in enumerate(box):
            if src == source and t == tag:
                del box[i]
                return obj
        return None

    def receive_any(self) -> tuple[int, int, Any] | None:
        box = self.hub.mailboxes[self.rank]
        return box.popleft() if box else None

    def has_mail(self) -> bool:
        return bool(self.hub.mailboxes[self.rank])

    def flush(self) -> None:
        """Nothing in flight: a local send is delivered when it returns."""

    def abort(self, message: str, last: Callable[[], None] = lambda: None) -> NoReturn:
        log.error(message)
        last()
        raise RunAborted(message)


class ControlLink:
    """A rank's control messages to the controller: heartbeats (with stats) and anything else."""

    def __init__(self, endpoint: ControlEndpoint, heartbeat_s: float):
        self.endpoint, self.heartbeat_s = endpoint, heartbeat_s
        self._last_beat = 0.0

    def send(self, obj: Any, tag: int, dest: int = CONTROLLER) -> None:
        self.endpoint.send(obj, dest, tag)

    def beat(self, stats: dict | None = None, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._last_beat >= self.heartbeat_s:
            self._last_beat = now
            self.send({"stats": stats or {}, "time": time.time()}, TAG_HEARTBEAT)

    def receive(self, tag: int, source: int = CONTROLLER) -> Any | None:
        return self.endpoint.receive(tag, source)

    def flush(self) -> None:
        self.endpoint.flush()
