"""Two-sided backend: the same channels over ``Isend``/``Issend``/``Irecv``, every request polled with ``Test``.

For MPI stacks where passive-target RMA does not progress without the target (or where windows cannot be created
at all, as with Debian's Open MPI across hosts over TCP). Every message is one header cache line (words: seq,
nbytes, writer, checksum, extra) followed by the payload, sent on a communicator duplicated per channel so tags
of different channels never match each other. See ``docs/transport.md`` for what each channel guarantees.
"""

from __future__ import annotations

from collections import deque

import numpy as np
from mpi4py import MPI

from hpc_rl.transport.channels import ExperienceRing, ParameterChannel, Segment, StepExchange
from hpc_rl.transport.config import RingConfig, TransportConfig
from hpc_rl.transport.layout import ALIGN, WORD, as_bytes, checksum
from hpc_rl.transport.wait import TransportError, Waiter

HEADER_BYTES = ALIGN
TAG = 7  # one tag per duplicated communicator is enough: each channel has its own


def _pack(buf: np.ndarray, seq: int, writer: int, payload: np.ndarray, extra: int = 0,
          with_checksum: bool = True) -> np.ndarray:
    data = as_bytes(payload)
    buf[HEADER_BYTES:HEADER_BYTES + data.size] = data
    buf[:5 * 8].view(WORD)[:] = (seq, data.size, writer, checksum(data) if with_checksum else 0, extra)
    return buf[:HEADER_BYTES + data.size]


def _unpack(buf: np.ndarray, channel: str) -> tuple[int, int, int, np.ndarray, int]:
    """(seq, writer, checksum, private payload copy, extra) of a received message; checks the checksum."""
    seq, nbytes, writer, expected_sum, extra = (int(x) for x in buf[:5 * 8].view(WORD))
    payload = buf[HEADER_BYTES:HEADER_BYTES + nbytes].copy()
    if checksum(payload) != expected_sum:
        raise TransportError(f"transport channel {channel!r}: message {seq} from rank {writer} fails its checksum")
    return seq, writer, expected_sum, payload, extra


class _Endpoint:
    """A duplicated communicator, the deadline settings, and the collective close shared by the channels."""

    def __init__(self, comm, config: TransportConfig, channel: str):
        self.comm = comm.Dup()
        self.config = config
        self.channel = channel

    def waiter(self, peer, what, timeout_s=None) -> Waiter:
        return Waiter(self.config.poll, timeout_s or self.config.timeout_s, self.channel, peer, what)

    def wait(self, request, peer, what, timeout_s=None) -> bool:
        """Poll ``request`` with Test under the deadline; True if it was not complete at the first Test."""
        waiter = None
        while not request.Test():
            if waiter is None:
                waiter = self.waiter(peer, what, timeout_s)
            waiter.step()
        return waiter is not None

    def barrier(self, while_waiting=None) -> None:
        """Ibarrier polled with Test, running ``while_waiting()`` between polls (it keeps receives progressing)."""
        request = self.comm.Ibarrier()
        waiter = self.waiter(None, "every rank to close")
        while not request.Test():
            if while_waiting is not None:
                while_waiting()
            waiter.step()

    def cancel(self, requests) -> None:
        for request in requests:
            if request is not None and request != MPI.REQUEST_NULL:
                request.Cancel()
                request.Wait()

    def free(self) -> None:
        self.comm.Free()


class TwoSidedStepExchange(StepExchange):
    def __init__(self, comm, config: TransportConfig, clients, request_bytes: int, reply_bytes: int):
        super().__init__(comm, clients, request_bytes, reply_bytes)
        self.ep = _Endpoint(comm, config, self.channel)
        self._sent = 0
        self._send_req = None
        self._staging = np.empty(HEADER_BYTES + request_bytes, np.uint8) if self.rank in self.clients else None
        self._reply_buf = np.empty(HEADER_BYTES + reply_bytes, np.uint8)
        self._reply_req = None
        served = self.clients_of(self.rank)
        self._received = {e: 0 for e in served}
        self._replied = dict(self._received)
        self._request_bufs = {e: np.empty(HEADER_BYTES + request_bytes, np.uint8) for e in served}
        self._request_reqs = {e: self.ep.comm.Irecv([self._request_bufs[e], MPI.BYTE], e, TAG) for e in served}
        self._reply_staging = {e: np.empty(HEADER_BYTES + reply_bytes, np.uint8) for e in served}
        self._reply_sends = {e: None for e in served}

    def _waiter(self, peer, what, timeout_s):
        return self.ep.waiter(peer, what, timeout_s)

    def send_request(self, payload):
        if self.rank not in self.clients:
            raise ValueError(f"rank {self.rank} is not an env rank of this step exchange")
        self._check_size(payload, self.request_bytes, "request")
        server = self.clients[self.rank]
        if self._send_req is not None:
            self.ep.wait(self._send_req, server, f"step {self._sent} to be received")
        self._sent += 1
        # The reply's receive is posted before the request leaves, so the reply always finds a buffer.
        self._reply_req = self.ep.comm.Irecv([self._reply_buf, MPI.BYTE], server, TAG)
        message = _pack(self._staging, self._sent, self.rank, payload)
        self._send_req = self.ep.comm.Isend([message, MPI.BYTE], server, TAG)

    def wait_reply(self, timeout_s=None):
        if self._reply_req is None:
            raise ValueError(f"rank {self.rank} has no request outstanding")
        server = self.clients[self.rank]
        self.ep.wait(self._reply_req, server, f"the reply to step {self._sent}", timeout_s)
        self._reply_req = None
        seq, _, _, payload, _ = _unpack(self._reply_buf, self.channel)
        if seq != self._sent:
            raise TransportError(f"step reply {seq} from rank {server} does not answer request {self._sent}")
        return payload

    def poll_requests(self):
        got = {}
        for env_rank, request in self._request_reqs.items():
            if not request.Test():
                continue
            seq, _, _, payload, _ = _unpack(self._request_bufs[env_rank], self.channel)
            last = self._received[env_rank]
            if seq != last + 1:
                raise TransportError(f"step request {seq} from rank {env_rank} after {last}: a step was lost")
            got[env_rank] = payload
            self._received[env_rank] = seq
            self._request_reqs[env_rank] = self.ep.comm.Irecv([self._request_bufs[env_rank], MPI.BYTE], env_rank, TAG)
        return got

    def send_reply(self, env_rank, payload):
        if self._received.get(env_rank, 0) == self._replied.get(env_rank, 0):
            raise ValueError(f"no unanswered request from env rank {env_rank} on rank {self.rank}")
        self._check_size(payload, self.reply_bytes, "reply")
        previous = self._reply_sends[env_rank]
        if previous is not None:
            self.ep.wait(previous, env_rank, f"reply {self._replied[env_rank]} to be received")
        seq = self._received[env_rank]
        message = _pack(self._reply_staging[env_rank], seq, self.rank, payload)
        self._reply_sends[env_rank] = self.ep.comm.Isend([message, MPI.BYTE], env_rank, TAG)
        self._replied[env_rank] = seq

    def close(self):
        for env_rank, request in self._reply_sends.items():
            if request is not None:
                self.ep.wait(request, env_rank, "the last reply to be received")
        if self._send_req is not None:
            self.ep.wait(self._send_req, self.clients[self.rank], "the last request to be received")
        self.ep.barrier()
        self.ep.cancel(list(self._request_reqs.values()) + [self._reply_req])
        self.ep.free()


class TwoSidedExperienceRing(ExperienceRing):
    """The owner keeps ``slots`` receives posted (its ring); a writer's ``Issend`` completes only once one of them
    has matched it, so at most ``slots`` segments sit in the owner's buffers and each writer has at most one
    segment in flight.

    ``block``: a put waits until the writer's previous segment was matched. ``drop_oldest``: a put never waits;
    segments queue in the writer's outbox of ``slots`` entries and the oldest queued one is dropped (counted)
    when it overflows. The drop count travels in the header's extra word, so the owner's total is exact once
    every writer has closed.

    Each writer's segments are handed out in the order it put them. MPI matches one writer's messages in the order
    they were sent, but to whichever receives are posted, and the owner re-posts its buffers in the order it
    releases them: buffer order is not send order. So each message names the seq of its writer's previous message
    sent (header word 5, 0 for none), and the owner holds a received one back, its buffer not re-posted, until it has
    handed that one out. A writer sends its next message only once the previous one was matched, so what a message
    waits for has arrived or is arriving: nothing waits on a message that was never sent.
    """

    def __init__(self, comm, config: TransportConfig, owner: int, ring: RingConfig):
        super().__init__(comm, owner, ring)
        self.ep = _Endpoint(comm, config, self.channel)
        self._inflight = None
        self._inflight_buffer = None
        self._spare: list[np.ndarray] = []  # staging buffers no longer in flight: reused, so no page faults per put
        self._outbox: deque[tuple[int, np.ndarray]] = deque()
        self._drops_by_writer: dict[int, int] = {}
        self._held: dict[int, Segment] = {}  # owner: receive buffer index -> the view lent by take_view()
        self._last_sent = 0  # writer: seq of its last message sent (after the drops), named by the next one
        # owner: buffers received and checked but held back, index -> (writer, seq, after, payload view, checksum);
        # and per writer the seq of the last segment handed out
        self._arrived: dict[int, tuple[int, int, int, np.ndarray, int]] = {}
        self._handed_out: dict[int, int] = {}
        if self.is_owner:
            self._bufs = [np.empty(HEADER_BYTES + ring.slot_bytes, np.uint8) for _ in range(ring.slots)]
            self._reqs = [self._post(i) for i in range(ring.slots)]

    def _post(self, index: int):
        return self.ep.comm.Irecv([self._bufs[index], MPI.BYTE], MPI.ANY_SOURCE, TAG)

    def _staging(self) -> np.ndarray:
        return self._spare.pop() if self._spare else np.empty(HEADER_BYTES + self.config.slot_bytes, np.uint8)

    def _release(self, message: np.ndarray) -> None:
        self._spare.append(message.base if message.base is not None else message)

    def _send(self, message: np.ndarray) -> None:
        words = message[:6 * 8].view(WORD)
        words[4], words[5] = len(self.drops), self._last_sent
        self._last_sent = int(words[0])
        self._inflight = self.ep.comm.Issend([message, MPI.BYTE], self.owner, TAG)
        self._inflight_buffer = message

    def _progress(self) -> None:
        if self._inflight is not None and self._inflight.Test():
            self._inflight = None
            self._release(self._inflight_buffer)
        if self._inflight is None and self._outbox:
            self._send(self._outbox.popleft()[1])

    def put(self, payload, timeout_s=None):
        payload = as_bytes(payload)  # refused (strided) before it takes a sequence number
        self._check_writer([payload])
        block = self.config.full_policy == "block"
        if block and self._inflight is not None:
            self.blocked_puts += self.ep.wait(self._inflight, self.owner,
                                              f"a free slot (segment {self.seq} to be received)", timeout_s)
            self._inflight = None
            self._release(self._inflight_buffer)
        self.seq += 1
        message = _pack(self._staging(), self.seq, self.rank, payload, with_checksum=self.config.checksums)
        if block:
            self._send(message)
        else:
            self._outbox.append((self.seq, message))
            if len(self._outbox) > self.config.slots:
                dropped_seq, dropped = self._outbox.popleft()
                self.drops.append((self.rank, dropped_seq))
                self._release(dropped)
            self._progress()
        return self.seq

    def _flush(self) -> None:
        waiter = None
        while True:
            self._progress()
            if self._inflight is None and not self._outbox:
                return
            if waiter is None:
                waiter = self.ep.waiter(self.owner, "the last segments to be received")
            waiter.step()

    def take_view(self):
        self._check_owner("take_view")
        status = MPI.Status()
        for index, request in enumerate(self._reqs):
            # A held or held-back buffer has no receive posted (its request is null and would test complete).
            if index in self._held or index in self._arrived or not request.Test(status):
                continue
            buf = self._bufs[index]
            seq, nbytes, writer, expected_sum, drops, after = (int(x) for x in buf[:6 * 8].view(WORD))
            payload = buf[HEADER_BYTES:HEADER_BYTES + nbytes].view()
            payload.flags.writeable = False  # the posted receive buffer: lent until release() re-posts it
            error = None
            if writer != status.Get_source():
                error = f"segment from rank {status.Get_source()} claims writer {writer}"
            elif self.config.checksums and checksum(payload) != expected_sum:
                error = f"segment {seq} from rank {writer} fails its checksum"
            if error is not None:
                # Re-post this buffer before raising: nothing was lent yet, and a close() after the error must
                # still find every other buffer posted or waiting its turn.
                self._reqs[index] = self._post(index)
                raise TransportError(f"transport channel 'ring': {error}")
            self._drops_by_writer[writer] = max(self._drops_by_writer.get(writer, 0), drops)
            self._arrived[index] = (writer, seq, after, payload, expected_sum)
        # Per writer, the arrived segments that follow the last one handed out, in the order they were sent.
        following = {(writer, after): index for index, (writer, _, after, _, _) in self._arrived.items()}
        segments = []
        for writer in {row[0] for row in self._arrived.values()}:
            while (index := following.get((writer, self._handed_out.get(writer, 0)))) is not None:
                _, seq, _, payload, expected_sum = self._arrived.pop(index)
                segment = Segment(writer, seq, payload, expected_sum, index)
                self._held[index] = segment
                segments.append(segment)
                self._handed_out[writer] = seq
        return segments

    def release(self, segments):
        self._check_owner("release")
        for index in self._check_release(self._held, segments):
            del self._held[index]
            self._reqs[index] = self._post(index)  # the buffer is the writers' again

    def ready_slots(self):
        self._check_owner("ready_slots")
        # Request.Get_status tests for completion without completing the request (MPI_Request_get_status), so
        # counting takes nothing; it also drives progress, as Test does.
        # A held-back buffer's request is null, which also tests complete: it counts, as it waits to be taken.
        return sum(1 for index, request in enumerate(self._reqs) if index not in self._held and request.Get_status())

    def dropped_total(self):
        self._check_owner("dropped_total")
        return sum(self._drops_by_writer.values())

    def close(self, alloc=None):
        left = []
        if self.is_owner:
            if self._held:  # views still lent out die with the buffers; re-post their receives first
                self.release(list(self._held.values()))
            self.ep.barrier(lambda: left.extend(self.poll(alloc)))
            left.extend(self.poll(alloc))
            self.ep.cancel(self._reqs)
        else:
            self._flush()
            self.ep.barrier()
        self.ep.free()
        return left


class TwoSidedParameterChannel(ParameterChannel):
    """The publisher pushes each new version to every reader, at most one message in flight per reader; a reader
    whose previous message is still in flight gets the newest version once it completes (intermediate versions
    are skipped, as a seqlock reader would skip them). A message is delivered whole or not at all, so a reader
    never sees a mix; the checksum is still checked."""

    def __init__(self, comm, config: TransportConfig, publisher: int, max_bytes: int):
        super().__init__(comm, publisher, max_bytes)
        self.ep = _Endpoint(comm, config, self.channel)
        self._readers = [r for r in range(comm.Get_size()) if r != publisher]
        self._latest = None
        self._inflight = {r: None for r in self._readers}
        self._sent_version = {r: 0 for r in self._readers}
        if self.rank != publisher:
            self._buf = np.empty(HEADER_BYTES + max_bytes, np.uint8)
            self._req = self._post()

    def _post(self):
        return self.ep.comm.Irecv([self._buf, MPI.BYTE], self.publisher, TAG)

    def _waiter(self, peer, what, timeout_s):
        return self.ep.waiter(peer, what, timeout_s)

    def progress(self) -> None:
        """publisher: start sending the newest version to readers whose previous message has been received."""
        for reader in self._readers:
            request = self._inflight[reader]
            if request is not None and request.Test():
                self._inflight[reader] = request = None
            if request is None and self._sent_version[reader] < self.version:
                # Each version has its own buffer, so one still in flight to another reader is never rewritten.
                self._inflight[reader] = self.ep.comm.Isend([self._latest, MPI.BYTE], reader, TAG)
                self._sent_version[reader] = self.version

    def publish(self, payload):
        self._check_publish(payload)
        k = self.version + 1
        self._latest = _pack(np.empty(HEADER_BYTES + payload.nbytes, np.uint8), k, self.rank, payload)
        self.version = k
        self.progress()
        return k

    def poll(self):
        self._check_reader()
        newest = None
        while self._req.Test():
            seq, _, _, payload, _ = _unpack(self._buf, self.channel)
            self._req = self._post()
            if seq > self.version and (newest is None or seq > newest[0]):
                newest = (seq, payload)
        if newest is not None:
            self.version = newest[0]
        return newest

    def close(self):
        if self.rank == self.publisher:
            waiter = None
            while True:
                self.progress()
                lagging = [r for r in self._readers
                           if self._inflight[r] is not None or self._sent_version[r] < self.version]
                if not lagging:
                    break
                if waiter is None:
                    waiter = self.ep.waiter(lagging[0], "the last version to be received")
                waiter.peer = lagging[0]
                waiter.step()
            self.ep.barrier()
        else:
            self.ep.barrier(self.poll)
            self.ep.cancel([self._req])
        self.ep.free()
