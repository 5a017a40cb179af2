"""Lifelines: every rank holds a TCP connection to the controller while it runs, so that the controller learns at
once that a rank died, and which one, on whatever host it ran.

    lifelines = Lifelines(size)                                   # the controller: listen
    held = hold_lifeline(lifelines.address, lifelines.token, rank)  # every other rank: connect, keep it open
    lifelines.ended()                                             # the controller, in its loop: ranks now gone

The kernel closes the sockets of a process that ends for any reason (SIGKILL, the out-of-memory killer, a crash in C
code), so the controller reads end-of-file on that rank's connection. Heartbeats cannot say it in time: the launcher
(mpirun, srun) ends the whole job within a second of a rank's death and names only its number, while a silent rank
is named after ``heartbeat_timeout_s``. Heartbeats still find the ranks that are alive but hung or stopped.

A rank writes nothing after its hello (the job's token and its rank), so anything readable on its connection is its
end. A connection that does not present the token (anything else on the network) is dropped. A rank that cannot
reach the controller's host is watched by heartbeats alone, and says so in its log.
"""

from __future__ import annotations

import logging
import secrets
import selectors
import socket
import struct

log = logging.getLogger(__name__)
_HELLO = struct.Struct("!16sI")  # the job's token, the rank


class Lifelines:
    """The controller's end: a listening socket and one connection per rank that said hello."""

    def __init__(self, size: int):
        self.size = size
        self.token = secrets.token_bytes(16)
        self._server = socket.create_server(("", 0), backlog=max(size, 1))
        self._server.setblocking(False)
        self.address = (socket.gethostname(), self._server.getsockname()[1])
        self._selector = selectors.DefaultSelector()
        self._selector.register(self._server, selectors.EVENT_READ)
        self._hellos: dict[socket.socket, bytes] = {}  # accepted, hello not complete yet
        self.held: dict[int, socket.socket] = {}

    def ended(self) -> list[int]:
        """The ranks whose connection closed since the last call: their processes have ended."""
        ended = []
        for key, _ in self._selector.select(timeout=0):
            sock, rank = key.fileobj, key.data
            if sock is self._server:
                self._accept()
                continue
            try:
                data = sock.recv(_HELLO.size)
            except OSError:  # reset by the peer's kernel: closed too
                data = b""
            if rank is not None:
                if not data:
                    ended.append(rank)
                    del self.held[rank]
                    self._drop(sock)
            else:
                self._on_hello(sock, data)
        return ended

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._server.accept()
            except BlockingIOError:
                return
            sock.setblocking(False)
            self._hellos[sock] = b""
            self._selector.register(sock, selectors.EVENT_READ)

    def _on_hello(self, sock: socket.socket, data: bytes) -> None:
        hello = self._hellos.pop(sock) + data
        if data and len(hello) < _HELLO.size:
            self._hellos[sock] = hello
            return
        token, rank = _HELLO.unpack(hello) if len(hello) == _HELLO.size else (b"", 0)
        if not secrets.compare_digest(token, self.token) or not 0 < rank < self.size or rank in self.held:
            log.warning("dropped a lifeline connection that did not say a valid hello")
            self._drop(sock)
            return
        self.held[rank] = sock
        self._selector.modify(sock, selectors.EVENT_READ, rank)

    def _drop(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        sock.close()

    def close(self) -> None:
        for sock in [*self._hellos, *self.held.values(), self._server]:
            self._drop(sock)
        self._hellos, self.held = {}, {}
        self._selector.close()


def hold_lifeline(address: tuple[str, int], token: bytes, rank: int, timeout_s: float = 10.0
                  ) -> socket.socket | None:
    """Connect to the controller's ``Lifelines`` and say hello; keep the socket open until the process ends.
    None (logged) when the controller's host cannot be reached: heartbeats alone then watch this rank."""
    try:
        sock = socket.create_connection(address, timeout=timeout_s)
        sock.sendall(_HELLO.pack(token, rank))
    except OSError as err:
        log.warning("no lifeline to the controller at %s:%d (%s): only heartbeats watch this rank", *address, err)
        return None
    return sock
