"""Lifelines: every rank holds a TCP connection to the controller while it runs, so that the controller learns at
once that a rank died, and which one, on whatever host it ran.

    lifelines = Lifelines(size)                                   # the controller: listen
    held = hold_lifeline(lifelines.address, lifelines.token, rank)  # every other rank: connect, keep it open
    lifelines.ended()                                             # the controller, in its loop: ranks now gone
    say_last_words("ValueError: ...")                             # a rank that raised, before it aborts the job
    lifelines.last_words[rank]                                    # the controller: what that rank said

The kernel closes the sockets of a process that ends for any reason (SIGKILL, the out-of-memory killer, a crash in C
code), so the controller reads end-of-file on that rank's connection. Heartbeats cannot say it in time: the launcher
(mpirun, srun) ends the whole job within a second of a rank's death and names only its number, while a silent rank
is named after ``heartbeat_timeout_s``. Heartbeats still find the ranks that are alive but hung or stopped.

A rank writes nothing after its hello (the job's token and its rank) but, when it raises, its last words: the
exception's type and message, sent before it aborts the job (``hpc_rl.roles.run``), from which the controller names
the failure at once, where it would otherwise say "died" of unknown cause once the process is gone. End-of-file is
the end of a rank that said nothing. A connection that does not present the token (anything else on the network) is
dropped. A rank that cannot reach the controller's host is watched by heartbeats alone, and says so in its log.
"""

from __future__ import annotations

import logging
import secrets
import selectors
import socket
import struct

log = logging.getLogger(__name__)
_HELLO = struct.Struct("!16sI")  # the job's token, the rank
_WORDS = struct.Struct("!I")  # the length of the last words that follow
MAX_WORDS = 2000  # bytes of last words kept: a line for status.json, not the traceback (that goes to stderr)
_held: socket.socket | None = None  # this process's lifeline (one rank per process)


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
        self._words: dict[int, bytes] = {}  # last words arriving, per rank
        self.last_words: dict[int, str] = {}  # ranks that raised: what they said

    def ended(self) -> list[int]:
        """The ranks whose connection closed since the last call, or that said their last words (``last_words``):
        their processes have ended or are aborting the job."""
        ended = []
        # Until nothing more is ready (a bounded number of rounds): a connection accepted in one round has its hello,
        # and perhaps its last words, read in the next ones of the same call, so a rank that raised while the
        # controller was still starting is named at its first look, before the TERM of the abort that follows.
        for _ in range(16):
            ready = self._selector.select(timeout=0)
            if not ready:
                break
            for key, _ in ready:
                sock, rank = key.fileobj, key.data
                if sock is self._server:
                    self._accept()
                    continue
                try:
                    data = sock.recv(_WORDS.size + MAX_WORDS if rank is not None else _HELLO.size)
                except OSError:  # reset by the peer's kernel: closed too
                    data = b""
                if rank is not None:
                    if self._on_words(rank, data):
                        ended.append(rank)
                        del self.held[rank]
                        self._drop(sock)
                else:
                    self._on_hello(sock, data)
        return ended

    def _on_words(self, rank: int, data: bytes) -> bool:
        """Take what a held rank sent; True once it has ended (end-of-file) or said all its last words."""
        words = self._words.get(rank, b"") + data
        self._words[rank] = words
        complete = len(words) >= _WORDS.size and len(words) >= _WORDS.size + _WORDS.unpack_from(words)[0]
        if data and not complete:
            return False
        del self._words[rank]
        if len(words) > _WORDS.size:  # what arrived of them, all of them unless the connection broke
            self.last_words[rank] = words[_WORDS.size:_WORDS.size + MAX_WORDS].decode("utf-8", "replace")
        return True

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
    global _held
    _held = sock
    return sock


def say_last_words(text: str) -> None:
    """Send ``text`` (cut to ``MAX_WORDS`` bytes) to the controller on this process's lifeline, if it holds one: what
    a rank that raised says before it aborts the job. Never raises: the abort must follow whatever happens here."""
    if _held is None:
        return
    words = text.encode("utf-8", "replace")[:MAX_WORDS]
    try:
        _held.settimeout(2.0)
        _held.sendall(_WORDS.pack(len(words)) + words)
    except OSError as err:
        log.warning("last words not sent to the controller: %s", err)
