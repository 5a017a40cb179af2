"""RMA backend: passive-target windows, written by Put / Accumulate / Compare_and_swap, read by their owners.

The protocol (layouts, orders, why each call is there) is specified in ``docs/transport.md``; the comments here
point at its rules. Every window is created with ``Win.Allocate`` (so the MPI library places it where it can
reach it directly: shared memory on one host, registered memory on a network) and every rank holds
``Lock_all(MODE_NOCHECK)`` on it from creation to ``close()``: a passive-target epoch that never conflicts, so no
call here takes a lock per message.
"""

from __future__ import annotations

import importlib.util

import numpy as np
from mpi4py import MPI

from hpc_rl.transport.channels import ExperienceRing, ParameterChannel, Segment, StepExchange
from hpc_rl.transport.config import RingConfig, TransportConfig
from hpc_rl.transport.layout import (ALIGN, PHASE_READY, STATE, STATE_BYTES, TICKET_MASK, WORD, WORD_BYTES, align,
                                     as_bytes, checksum, free_for, ready, state_phase, state_ticket, writing)
from hpc_rl.transport.wait import TransportError, Waiter

# The one compiled module, built only where hpc_rl was installed with an MPI compiler wrapper on PATH (setup.py). A
# module that is built but does not load (linked against another MPI's library) raises the loader's own error.
if importlib.util.find_spec("hpc_rl.transport._ring") is None:
    raise ImportError("the rma transport backend needs hpc_rl.transport._ring, the experience ring's C module, which "
                      "was not built: no MPI compiler wrapper was found when hpc_rl was installed. Install or load "
                      "MPI (Debian: libopenmpi-dev) so that mpicc (or $MPICC) is on PATH, then reinstall: "
                      "pip install '.[mpi]' (-e for a checkout), or `make setup`")
from hpc_rl.transport import _ring  # noqa: E402

HEADER_BYTES = ALIGN  # every message slot: one cache line of header words, then the payload


class Window:
    """One ``Win.Allocate`` window with an open ``Lock_all(MODE_NOCHECK)`` epoch and word-sized RMA operations.

    Every remote operation here is completed by ``Flush`` before it returns (MPI does not order two operations to
    one target, so the protocol orders them by completing each before issuing the next).
    """

    def __init__(self, comm, nbytes: int, init=None):
        self.comm = comm
        self.rank = comm.Get_rank()
        self.win = MPI.Win.Allocate(nbytes, 1, comm=comm)
        self.win.Lock_all(MPI.MODE_NOCHECK)
        self.mem = np.frombuffer(self.win.tomemory(), np.uint8) if nbytes else np.empty(0, np.uint8)
        # Allocated memory is not zeroed, and header words start at 0 (seq 0, version 0) or at what ``init(mem)``
        # stores: clear it, let ``init`` write, make the stores visible, and let no rank start writing before every
        # owner has.
        self.mem[:] = 0
        if init is not None:
            init(self.mem)
        self.win.Sync()
        comm.Barrier()
        self._origin = np.zeros(1, WORD)
        self._result = np.zeros(1, WORD)
        self._state_origin = np.zeros(1, STATE)
        self._state_compare = np.zeros(1, STATE)
        self._state_result = np.zeros(1, STATE)
        self._noop = np.zeros(0, STATE)

    # --- the owner's view of its own memory (rule: Win.Sync before reading what others wrote) -----------------
    def sync(self) -> None:
        self.win.Sync()

    def local_word(self, offset: int) -> int:
        return int(self.mem[offset:offset + WORD_BYTES].view(WORD)[0])

    def local_words(self, offset: int, count: int) -> np.ndarray:
        return self.mem[offset:offset + count * WORD_BYTES].view(WORD)

    # --- remote operations, each completed before returning ----------------------------------------------------
    def put(self, buf: np.ndarray, rank: int, offset: int) -> None:
        """Issue a Put; it completes at the next ``flush(rank)``."""
        self.win.Put(buf, rank, offset)

    def flush(self, rank: int) -> None:
        self.win.Flush(rank)

    def replace(self, value: int, rank: int, offset: int) -> None:
        """Atomically store one word (Accumulate REPLACE: element-atomic, unlike a Put) and complete it."""
        self._origin[0] = value
        self.win.Accumulate(self._origin, rank, offset, op=MPI.REPLACE)
        self.win.Flush(rank)

    def fetch_add(self, value: int, rank: int, offset: int) -> int:
        """Atomic fetch-and-add of one word; returns its old value."""
        self._origin[0] = value
        self.win.Fetch_and_op(self._origin, self._result, rank, offset, op=MPI.SUM)
        self.win.Flush(rank)
        return int(self._result[0])

    def read(self, rank: int, offset: int) -> int:
        """Atomic remote read of one word (Fetch_and_op NO_OP)."""
        self.win.Fetch_and_op(self._origin, self._result, rank, offset, op=MPI.NO_OP)
        self.win.Flush(rank)
        return int(self._result[0])

    def cas_state(self, expected: int, new: int, rank: int, offset: int) -> int:
        """Compare_and_swap one 32-bit state word; returns the value found (== expected iff it swapped)."""
        self._state_origin[0] = new
        self._state_compare[0] = expected
        self.win.Compare_and_swap(self._state_origin, self._state_compare, self._state_result, rank, offset)
        self.win.Flush(rank)
        return int(self._state_result[0])

    def fetch_states(self, out: np.ndarray, rank: int, offset: int) -> None:
        """Atomically read consecutive 32-bit state words into ``out`` (Get_accumulate NO_OP: atomic per element,
        G3, unlike a Get); completes at the next ``flush(rank)``."""
        if self._noop.size < out.size:  # the origin NO_OP ignores; MPI forbids it to overlap the result
            self._noop = np.zeros(out.size, STATE)
        self.win.Get_accumulate(self._noop[:out.size], out, rank, offset, op=MPI.NO_OP)

    def local_states(self, offset: int, count: int) -> np.ndarray:
        return self.mem[offset:offset + count * STATE_BYTES].view(STATE)

    def get(self, out: np.ndarray, rank: int, offset: int) -> np.ndarray:
        self.win.Get(out, rank, offset)
        self.win.Flush(rank)
        return out

    def free(self) -> None:
        """Collective: end the epoch and free the window."""
        self.win.Unlock_all()
        self.win.Free()


def _message_slot_bytes(capacity: int) -> int:
    return HEADER_BYTES + align(capacity)


class _Messenger:
    """Single-slot messages (the step exchange's two directions).

    Slot layout: word 0 ``seq`` (the commit word), word 1 ``nbytes``, word 2 writer rank, word 3 checksum, padding
    to 64 bytes, payload. Writer: Put words 1-3, Put payload, Flush, Accumulate(REPLACE) seq, Flush. Reader (the
    slot's owner): Win.Sync, load seq; when it is the expected one, Win.Sync, copy out words 1-3 and the payload.
    """

    def __init__(self, window: Window):
        self.w = window
        self._meta = np.zeros(3, WORD)

    def send(self, target: int, slot: int, seq: int, payload: np.ndarray) -> None:
        data = as_bytes(payload)
        self._meta[:] = (data.size, self.w.rank, checksum(data))
        self.w.put(self._meta, target, slot + WORD_BYTES)
        if data.size:
            self.w.put(data, target, slot + HEADER_BYTES)
        self.w.flush(target)
        self.w.replace(seq, target, slot)

    def arrived_seq(self, slot: int) -> int:
        return self.w.local_word(slot)

    def take(self, slot: int, seq: int, channel: str) -> np.ndarray:
        self.w.sync()
        nbytes, writer, expected_sum = (int(x) for x in self.w.local_words(slot + WORD_BYTES, 3))
        payload = self.w.mem[slot + HEADER_BYTES:slot + HEADER_BYTES + nbytes].copy()
        if checksum(payload) != expected_sum:
            raise TransportError(f"transport channel {channel!r}: message {seq} from rank {writer} fails its checksum")
        return payload


class RmaStepExchange(StepExchange):
    """Window of an inference rank: one request slot per env it serves; window of an env rank: one reply slot."""

    def __init__(self, comm, config: TransportConfig, clients, request_bytes: int, reply_bytes: int):
        super().__init__(comm, clients, request_bytes, reply_bytes)
        self.config = config
        self._request_slot = _message_slot_bytes(request_bytes)
        self._reply_slot = _message_slot_bytes(reply_bytes)
        size = self._requests_base(self.rank) + len(self.clients_of(self.rank)) * self._request_slot
        self.window = Window(comm, size)
        self._msg = _Messenger(self.window)
        self._sent = 0  # env: seq of the last request
        self._received = {e: 0 for e in self.clients_of(self.rank)}  # inference: seq of the last request per env
        self._replied = dict(self._received)

    def _requests_base(self, rank: int) -> int:
        return self._reply_slot if rank in self.clients else 0

    def _request_offset(self, env_rank: int) -> int:
        server = self.clients[env_rank]
        return self._requests_base(server) + self.clients_of(server).index(env_rank) * self._request_slot

    def _waiter(self, peer, what, timeout_s):
        return Waiter(self.config.poll, timeout_s or self.config.timeout_s, self.channel, peer, what)

    def send_request(self, payload):
        if self.rank not in self.clients:
            raise ValueError(f"rank {self.rank} is not an env rank of this step exchange")
        self._check_size(payload, self.request_bytes, "request")
        self._sent += 1
        self._msg.send(self.clients[self.rank], self._request_offset(self.rank), self._sent, payload)

    def wait_reply(self, timeout_s=None):
        if self.rank not in self.clients or self._sent == 0:
            raise ValueError(f"rank {self.rank} has no request outstanding")
        waiter = None
        while True:
            self.window.sync()
            seq = self._msg.arrived_seq(0)
            if seq == self._sent:
                return self._msg.take(0, seq, self.channel)
            if seq > self._sent:
                raise TransportError(f"step reply {seq} from rank {self.clients[self.rank]} answers no request "
                                     f"(last request {self._sent})")
            if waiter is None:
                waiter = self._waiter(self.clients[self.rank], f"the reply to step {self._sent}", timeout_s)
            waiter.step()

    def poll_requests(self):
        got = {}
        self.window.sync()
        for index, env_rank in enumerate(self.clients_of(self.rank)):
            slot = self._requests_base(self.rank) + index * self._request_slot
            seq = self._msg.arrived_seq(slot)
            if not self._is_new_request(env_rank, seq):
                continue
            got[env_rank] = self._msg.take(slot, seq, self.channel)
            self._received[env_rank] = seq
        return got

    def send_reply(self, env_rank, payload):
        if self._received.get(env_rank, 0) == self._replied.get(env_rank, 0):
            raise ValueError(f"no unanswered request from env rank {env_rank} on rank {self.rank}")
        self._check_size(payload, self.reply_bytes, "reply")
        seq = self._received[env_rank]
        self._msg.send(env_rank, 0, seq, payload)
        self._replied[env_rank] = seq

    def close(self):
        self.window.free()


class RmaExperienceRing(ExperienceRing):
    """Owner's window: words [ticket counter, dropped counter], 32-bit state words of slots 0..N-1, the header table
    (one 64-byte row per slot: words [nbytes, writer, seq, checksum, ticket, after, kind]), then N payloads
    (slot_bytes each, 64-aligned).

    The headers sit in one table rather than in front of each payload so that a batch of k segments writes all its
    headers with one Put per run of consecutive slots.
    """

    TICKET = 0
    DROPPED = WORD_BYTES

    def __init__(self, comm, config: TransportConfig, owner: int, ring: RingConfig):
        super().__init__(comm, owner, ring)
        self.transport = config
        n = ring.slots
        self._states = 2 * WORD_BYTES
        self._header_table = align(self._states + n * STATE_BYTES)
        self._payload_area = self._header_table + n * HEADER_BYTES
        self._payload_stride = align(ring.slot_bytes)
        self.window = Window(comm, self._payload_area + n * self._payload_stride if self.is_owner else 0,
                             init=self._first_states if self.is_owner else None)
        self._writer = None if self.is_owner else _ring.Writer(
            self.window.win.py2f(), owner, self.rank, n, ring.slot_bytes, self.TICKET, self._states,
            self._header_table, self._payload_area, self._payload_stride)
        self._old_meta = np.zeros(7, WORD)
        # writer: (first ticket, count, tickets whose slots are not yet ours) of a batch whose put gave up after
        # taking its tickets; the next put (or close) fills them with void rows first, so no slot waits for it forever
        self._abandoned: tuple[int, int, set[int]] | None = None
        self._found = np.zeros(n, STATE)  # the states a writer reads while claiming
        self._held: dict[int, Segment] = {}  # owner: slot -> the view lent by take_view(), until release()
        self._dropped_at_close: int | None = None  # the window is gone after close(); its last count stays
        if self.is_owner:  # its window's state words and header table, and every slot's read-only payload view
            mem = self.window.mem
            self._reader = _ring.Owner(self.window.win.py2f(), self.rank, mem, n, self.TICKET, self._states,
                                       self._header_table)
            self._payloads = []
            for slot in range(n):
                view = mem[self.payload_offset(slot):self.payload_offset(slot) + ring.slot_bytes]
                view.flags.writeable = False
                self._payloads.append(view)

    def _first_states(self, mem: np.ndarray) -> None:
        """Slot i's first ticket is i: it starts FREE(i) (ticket 0 makes slot 0's word 0)."""
        n = self.config.slots
        mem[self._states:self._states + n * STATE_BYTES].view(STATE)[:] = free_for(np.arange(n, dtype=STATE))

    def state_offset(self, slot: int) -> int:
        """Byte offset of slot ``slot``'s state word in the owner's window (docs/transport.md, section 5)."""
        return self._states + slot * STATE_BYTES

    def header_offset(self, slot: int) -> int:
        """Byte offset of slot ``slot``'s header row in the owner's window."""
        return self._header_table + slot * HEADER_BYTES

    def payload_offset(self, slot: int) -> int:
        """Byte offset of slot ``slot``'s payload in the owner's window."""
        return self._payload_area + slot * self._payload_stride

    def _runs(self, first_ticket: int, count: int) -> list[tuple[int, int, int]]:
        """The runs of consecutive slots that tickets first_ticket .. first_ticket + count - 1 map to (one, or two
        when they wrap past the ring's last slot), each as (offset in the batch, length, byte offset of its first
        state word)."""
        first = first_ticket % self.config.slots
        head = min(count, self.config.slots - first)
        spans = [(0, first, head)] + ([(head, 0, count - head)] if count > head else [])
        return [(offset, length, self.state_offset(slot)) for offset, slot, length in spans]

    def put(self, payload, timeout_s=None):
        data = [as_bytes(payload)]
        self._check_writer(data)
        self._put_batch(data, timeout_s)
        return self.seq

    def put_many(self, payloads, timeout_s=None):
        data = list(map(as_bytes, payloads))
        if not data:
            return []
        self._check_writer(data)
        first_seq, n = self.seq + 1, self.config.slots
        for start in range(0, len(data), n):  # at most N tickets per batch: a batch never waits for itself
            self._put_batch(data[start:start + n], timeout_s)
        return list(range(first_seq, self.seq + 1))

    def _put_batch(self, data: list[np.ndarray], timeout_s: float | None) -> None:
        # One Fetch_and_op hands out len(data) consecutive tickets: the shared counter orders all puts, so under a
        # full ring the slot ticket t maps to holds the ring's oldest segment (ticket t - N), or is free for t. The
        # MPI calls are issued from C (_ring.c, Writer.put): from Python they cost ~15 us per batch, more than a
        # 64 KiB Put. It calls back _claim when a slot is not yet FREE for its ticket.
        self._fill_abandoned(timeout_s)
        sums = list(map(checksum, data)) if self.config.checksums else None
        self._writer.put(data, self.seq + 1, sums, self._claim, timeout_s)
        self.seq += len(data)

    def _fill_abandoned(self, timeout_s: float | None) -> None:
        """Publish void rows into the slots of the tickets a put gave up on, once they are this writer's: without
        them those slots would stay FREE for tickets no one fills, and every later ticket of theirs would wait
        forever. Waits for the slots (never steals: a void row is not worth a segment); raises TransportTimeout
        past the deadline, keeping the tickets for the next try."""
        if self._abandoned is None:
            return
        first, count, pending = self._abandoned
        self._wait_for_slots(pending, False, timeout_s)
        self._writer.void(first, count)
        self._abandoned = None

    def _read_states(self, first: int, count: int, runs) -> np.ndarray:
        """Issue atomic reads of the state words of tickets first .. first + count - 1 (``runs``: their slots' runs);
        the returned array holds them after the next ``flush(owner)``."""
        found = self._found[:count]
        for offset, length, state_at in runs:
            self.window.fetch_states(found[offset:offset + length], self.owner, state_at)
        return found

    def _claim(self, first: int, count: int, timeout_s: float | None) -> None:
        """Wait until the slots of tickets first .. first + count - 1 are this writer's: FREE(t) (only ticket t may
        fill it, so no CAS is needed), or under drop_oldest READY(t - N), stolen by CAS and counted. If the wait
        ends in an error the tickets are abandoned: the next put fills them with void rows first."""
        pending = set(range(first, first + count))
        self._abandoned = (first, count, pending)
        self._wait_for_slots(pending, self.config.full_policy == "drop_oldest", timeout_s)
        self._abandoned = None

    def _wait_for_slots(self, pending: set[int], steal: bool, timeout_s: float | None) -> None:
        """Discard from ``pending`` each ticket whose slot becomes this writer's, until none is left."""
        w, owner, n = self.window, self.owner, self.config.slots
        waiter = None
        while pending:
            low, high = min(pending), max(pending)
            found = self._read_states(low, high - low + 1, self._runs(low, high - low + 1))
            w.flush(owner)
            for ticket, state in zip(range(low, high + 1), found.tolist()):
                if ticket not in pending:
                    continue
                slot = ticket % n
                if state == free_for(ticket):
                    pending.discard(ticket)
                elif state == ready(ticket - n) and steal:
                    if w.cas_state(state, writing(ticket), owner, self.state_offset(slot)) == state:
                        self._count_drop(slot)
                        pending.discard(ticket)
                    # else the owner took it first: it will free it for this ticket; read again
                elif not 0 < (ticket - state_ticket(state)) & TICKET_MASK <= TICKET_MASK // 2:
                    # a ticket not earlier than ours, in a slot no one may touch before we fill it
                    raise TransportError(f"transport channel 'ring': slot {slot} of rank {owner} is in state "
                                         f"{state:#x} ({state_phase(state)}, ticket {state_ticket(state)}), which "
                                         f"no writer waiting with ticket {ticket} can find (corrupt)")
                # else an earlier round still holds the slot (its segment unconsumed, or its writer not done yet):
                # wait for the owner, or for the writers queued before us
            if not pending:
                return
            if waiter is None:
                self.blocked_puts += 1
                ticket = min(pending)
                waiter = Waiter(self.transport.poll, timeout_s or self.transport.timeout_s, self.channel, owner,
                                f"a free slot (slot {ticket % n}, ticket {ticket})")
            waiter.step()

    def _count_drop(self, slot: int) -> None:
        """After a steal: the slot's header still names the displaced segment (only writers write headers, and the
        slot is ours now); record whose it was before overwriting it."""
        w, owner = self.window, self.owner
        w.get(self._old_meta, owner, self.header_offset(slot))
        if int(self._old_meta[6]) == _ring.KIND_VOID:  # a ticket its writer gave up on: nothing was dropped
            return
        self.drops.append((int(self._old_meta[1]), int(self._old_meta[2])))
        w.fetch_add(1, owner, self.DROPPED)

    def take_view(self):
        self._check_owner("take_view")
        # Under `block` only the owner ever moves a slot out of READY (writers claim FREE ones only), so a READY
        # slot cannot change until the owner frees it: the owner takes it without touching its state word. Under
        # `drop_oldest` a writer may steal a READY slot: the owner's CAS READY(t) -> TAKEN(t) shuts writers out
        # (they wait on TAKEN as on WRITING) before it reads a byte, or fails because a writer stole it first.
        # _ring.c's Owner.take loads the states, CASes and reads the header rows of what it takes, in ticket order,
        # holding back a segment whose writer's previous one it has not handed out yet (per-writer order).
        rows, lost = self._reader.take(self.config.full_policy == "drop_oldest")
        self.lost_races += lost  # CASes a writer's steal beat; the writer counted the drop
        void = [row[5] for row in rows if row[7] == _ring.KIND_VOID]
        if void:  # tickets their writers gave up on: nothing to hand out, the slots go back at once
            self._reader.free(void)
            rows = [row for row in rows if row[7] != _ring.KIND_VOID]
        if not rows:
            return []
        slot_bytes, checksums = self.config.slot_bytes, self.config.checksums
        payloads, held = self._payloads, self._held
        found = []
        for nbytes, writer, seq, expected_sum, ticket, slot, state, _ in rows:
            # read-only: only writers write the ring; a full slot's view is the one made at start-up
            payload = payloads[slot] if nbytes == slot_bytes else payloads[slot][:nbytes]
            if ready(ticket) != state or nbytes > slot_bytes or (checksums and checksum(payload) != expected_sum):
                # The slot is useless: hand back every slot this call took before raising, so that a close()
                # after the error neither finds them again nor leaves views held.
                self._reader.free([row[5] for row in rows])
                for segment in found:
                    del held[segment.slot]
                raise TransportError(f"transport channel 'ring': segment {seq} from rank {writer} in slot {slot} "
                                     f"is torn (header ticket {ticket} vs state {state:#x}, or bad checksum)")
            segment = Segment(writer, seq, payload, expected_sum, slot)
            held[slot] = segment
            found.append(segment)
        return found

    def release(self, segments):
        # FREE(t + N) into each slot's state word, one Accumulate(REPLACE) per run of slots (_ring.c, Owner.free)
        self._check_owner("release")
        slots = self._check_release(self._held, segments)
        self._reader.free(slots)
        for slot in slots:
            del self._held[slot]

    def ready_slots(self):
        self._check_owner("ready_slots")
        self.window.sync()
        states = self.window.local_states(self._states, self.config.slots)
        ready_now = int(np.count_nonzero(states & 3 == PHASE_READY))
        # Under block the slots the owner holds views of stay READY in the window (it never marks them taken).
        return ready_now - (len(self._held) if self.config.full_policy == "block" else 0)

    def dropped_total(self):
        self._check_owner("dropped_total")
        if self._dropped_at_close is not None:
            return self._dropped_at_close
        self.window.sync()
        return self.window.local_word(self.DROPPED)

    def close(self, alloc=None):
        # Writers' puts are complete when put() returns; the owner keeps draining while writers still block on a
        # full ring, until every rank has arrived.
        left = []
        if self._held:  # views still lent out die with the window; their slots go back first
            self.release(list(self._held.values()))
        if not self.is_owner:  # the owner drains until every rank arrives: what other writers wait for comes free
            self._fill_abandoned(None)
        barrier = self.comm.Ibarrier()
        waiter = Waiter(self.transport.poll, self.transport.timeout_s, self.channel, None, "every rank to close")
        while not barrier.Test():
            if self.is_owner:
                left.extend(self.poll(alloc))
            waiter.step()
        if self.is_owner:
            left.extend(self.poll(alloc))
            self._dropped_at_close = self.dropped_total()
        (self._reader if self.is_owner else self._writer).close()  # later calls raise, never reach a freed window
        self.window.free()
        return left


class RmaParameterChannel(ParameterChannel):
    """Publisher's window: word 0 the seqlock S, then buffers 0 and 1: words [version, nbytes, checksum], payload.

    Publishing version k writes buffer k mod 2: S = 2k-1 (odd), Put buffer, S = 2k (even). A reader that loads S
    and finds version k = floor(S/2) stable in buffer k mod 2 copies that buffer; the copy is whole unless the
    publisher started rewriting that buffer meanwhile, i.e. S > 2k + 2 afterwards (version k+2 begun), or the
    header's version differs. Then the reader retries. Readers never wait for the publisher to finish a write:
    while version k+1 is being written, buffer k mod 2 is stable (the double buffer).
    """

    def __init__(self, comm, config: TransportConfig, publisher: int, max_bytes: int):
        super().__init__(comm, publisher, max_bytes)
        self.transport = config
        self._buffer_bytes = HEADER_BYTES + align(max_bytes)
        self.window = Window(comm, ALIGN + 2 * self._buffer_bytes if self.rank == publisher else 0)
        self._meta = np.zeros(3, WORD)

    def buffer_offset(self, version: int) -> int:
        """Byte offset of the buffer holding ``version`` in the publisher's window (docs/transport.md, section 6)."""
        return ALIGN + (version % 2) * self._buffer_bytes

    def _waiter(self, peer, what, timeout_s):
        return Waiter(self.transport.poll, timeout_s or self.transport.timeout_s, self.channel, peer, what)

    def publish(self, payload):
        self._check_publish(payload)
        data = as_bytes(payload)
        w, me = self.window, self.rank
        k = self.version + 1
        at = self.buffer_offset(k)
        # The publisher updates its own window through RMA calls too, so the same completion rules order its
        # writes against readers' atomic reads and Gets on every osc component (sm, rdma, pt2pt, ucx).
        w.replace(2 * k - 1, me, 0)
        self._meta[:] = (k, data.size, checksum(data))
        w.put(self._meta, me, at)
        if data.size:
            w.put(data, me, at + HEADER_BYTES)
        w.flush(me)
        w.replace(2 * k, me, 0)
        self.version = k
        return k

    def poll(self):
        self._check_reader()
        w, pub = self.window, self.publisher
        waiter = None
        while True:
            s = w.read(pub, 0)
            k = s // 2  # newest stable version
            if k <= self.version:
                return None
            at = self.buffer_offset(k)
            w.get(self._meta, pub, at)
            version, nbytes, expected_sum = (int(x) for x in self._meta)
            if version == k and nbytes <= self.max_bytes:
                payload = np.empty(nbytes, np.uint8)
                if nbytes:
                    w.get(payload, pub, at + HEADER_BYTES)
                if w.read(pub, 0) <= 2 * k + 2:  # buffer k mod 2 was not rewritten while we copied it
                    if checksum(payload) != expected_sum:
                        raise TransportError(f"transport channel 'params': version {k} from rank {pub} passed the "
                                             f"seqlock but fails its checksum")
                    self.version = k
                    return k, payload
            self.retries += 1
            if waiter is None:
                waiter = self._waiter(pub, f"a stable copy of parameter version {k}", None)
            waiter.step()

    def close(self):
        self.window.free()
