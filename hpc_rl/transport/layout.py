"""Byte layouts: header words, the segment checksum, and packing named arrays into one flat message.

Every header word is a uint64 (8 bytes, naturally aligned), so a single word can be written by one atomic
``Accumulate(REPLACE)`` / ``Compare_and_swap`` and read by one aligned load. Payloads start on 64-byte
boundaries so that a Put of a payload never shares a cache line with a header word another rank updates.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np
import xxhash

WORD = np.dtype(np.uint64)
WORD_BYTES = WORD.itemsize
ALIGN = 64  # cache line


def align(nbytes: int, to: int = ALIGN) -> int:
    """``nbytes`` rounded up to a multiple of ``to``."""
    return -(-nbytes // to) * to


def checksum(payload: np.ndarray) -> int:
    """64-bit XXH3 of a payload's bytes.

    XXH3 runs at ~20-30 GB/s here, faster than the Put it protects (CRC32 runs at ~2 GB/s and would halve the
    ring's bandwidth); it detects a torn payload (bytes of two writes mixed) with probability 1 - 2^-64.
    """
    return xxhash.xxh3_64_intdigest(as_bytes(payload))


_UINT8 = np.dtype(np.uint8)  # numpy's builtin dtypes are singletons: compared with `is`, the fast path is ~0.15 us


def as_bytes(payload) -> np.ndarray:
    """A flat uint8 view of a C-contiguous array or bytes-like object (no copy)."""
    if type(payload) is np.ndarray and payload.dtype is _UINT8 and payload.ndim == 1 and payload.flags.c_contiguous:
        return payload  # already one: every segment the ring copies out, every put of a byte buffer (saves ~2 us)
    arr = np.asarray(payload) if not isinstance(payload, np.ndarray) else payload
    if not arr.flags.c_contiguous:
        raise ValueError("payload must be C-contiguous (a view with strides cannot be sent without a copy)")
    return arr.reshape(-1).view(np.uint8)


# --- ring slot states (one 32-bit word per slot) -----------------------------------------------------------
# Tickets 0, 1, 2, ... order all puts into a ring of N slots; ticket t goes to slot t mod N. A slot cycles
# FREE(t) → READY(t) → FREE(t + N): FREE(t) admits the writer holding ticket t and no other, so claiming a slot
# needs no Compare_and_swap, only a read (docs/transport.md, section 5). Under drop_oldest a writer may steal a
# READY(t − N) slot (→ WRITING(t), by CAS), and the owner marks a slot TAKEN(t) while it reads it in place. The
# 30-bit ticket in every state makes each one unique (no ABA: the same ticket returns to a slot only after 2^30
# puts). State words are 32-bit because Open MPI 4.1's osc/rdma over the vader BTL (what a single host selects)
# segfaults on a 64-bit Compare_and_swap (open-mpi/ompi#7967); 32-bit atomics work there and everywhere.
STATE = np.dtype(np.uint32)
STATE_BYTES = STATE.itemsize
TICKET_BITS = 30
TICKET_MASK = (1 << TICKET_BITS) - 1
PHASE_FREE = 0
PHASE_WRITING = 1
PHASE_READY = 2
PHASE_TAKEN = 3


def free_for(ticket):
    """The state of a slot that only the writer holding ``ticket`` may fill (ints or integer arrays)."""
    return (ticket & TICKET_MASK) << 2 | PHASE_FREE


def writing(ticket: int) -> int:
    return (ticket & TICKET_MASK) << 2 | PHASE_WRITING


def ready(ticket):
    return (ticket & TICKET_MASK) << 2 | PHASE_READY


def taken(ticket: int) -> int:
    return (ticket & TICKET_MASK) << 2 | PHASE_TAKEN


def state_phase(state: int) -> str:
    """"free", "writing", "ready" or "taken"."""
    return ("free", "writing", "ready", "taken")[state & 3]


def state_ticket(state: int) -> int:
    """The ticket's low 30 bits."""
    return state >> 2


@dataclass(frozen=True)
class Field:
    """One array of a packed message: its shape, its dtype in memory, and its dtype on the wire."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    wire_dtype: np.dtype
    offset: int
    wire_nbytes: int = field(init=False)  # computed once: pack and unpack run for every step of every env rank

    def __post_init__(self) -> None:
        object.__setattr__(self, "wire_nbytes", math.prod(self.shape) * self.wire_dtype.itemsize)


class ArrayLayout:
    """A fixed layout packing named arrays into one uint8 buffer, so a whole step travels as one payload.

    ``half`` names float32 fields sent as float16 (Honor of Kings ships observations in FP16: half the bytes,
    and observations are z-scored later, so FP16's 3 significant digits suffice). Unpacking gives them back as
    float32.
    """

    def __init__(self, fields: Mapping[str, tuple[tuple[int, ...], np.dtype]], half: Iterable[str] = ()):
        half = set(half)
        unknown = half - set(fields)
        if unknown:
            raise ValueError(f"half names fields not in the layout: {sorted(unknown)}")
        offset = 0
        self.fields: dict[str, Field] = {}
        for name, (shape, dtype) in fields.items():
            dtype = np.dtype(dtype)
            if name in half and dtype != np.float32:
                raise ValueError(f"field {name!r} is {dtype}; only float32 fields can travel as float16")
            wire = np.dtype(np.float16) if name in half else dtype
            f = Field(name, tuple(int(s) for s in shape), dtype, wire, offset)
            self.fields[name] = f
            offset = align(offset + f.wire_nbytes, WORD_BYTES)
        self.nbytes = offset
        self._half = tuple(half)  # unpacked into float32 copies
        self._out: np.ndarray | None = None  # the buffer packed into last, and its fields' views (most callers
        self._dests: dict[str, np.ndarray] = {}  # pack every step into the same buffer)

    def wire_nbytes(self, names: Iterable[str]) -> int:
        """The bytes the fields ``names`` take on the wire (float16 where they travel so), alignment padding aside."""
        return sum(self.fields[name].wire_nbytes for name in names)

    def pack(self, arrays: Mapping[str, np.ndarray], out: np.ndarray | None = None) -> np.ndarray:
        """Write every field into ``out`` (a uint8 buffer of at least ``nbytes``; allocated if None)."""
        if arrays.keys() != self.fields.keys():
            raise ValueError(f"arrays {sorted(arrays)} differ from the layout's fields {sorted(self.fields)}")
        if out is None:
            out = np.empty(self.nbytes, np.uint8)
        elif out.dtype != np.uint8 or out.size < self.nbytes:
            raise ValueError(f"out must be a uint8 buffer of >= {self.nbytes} bytes, got {out.dtype} {out.size}")
        if out is not self._out:
            self._out, self._dests = out, self._views(out)
        # Every step of every env rank packs its request and its reply: the common case (an array of the field's
        # dtype) is one slice assignment; any other value goes through copyto, which refuses a cast that loses
        # information, as the field's dtype asks.
        for f, dest in zip(self.fields.values(), self._dests.values()):
            value = arrays[f.name]
            if type(value) is not np.ndarray:
                value = np.asarray(value)
            if value.shape != f.shape:
                raise ValueError(f"field {f.name!r}: shape {value.shape}, layout expects {f.shape}")
            if value.dtype is f.wire_dtype:
                dest[...] = value
            else:
                np.copyto(dest, value, casting="same_kind" if f.wire_dtype != f.dtype else "no")
        return out

    def _views(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        # One constructor call per field (a slice, a view and a reshape take three times as long).
        return {name: np.ndarray(f.shape, f.wire_dtype, buf, f.offset) for name, f in self.fields.items()}

    def unpack(self, buf: np.ndarray) -> dict[str, np.ndarray]:
        """Every field of a packed buffer; float16 wire fields come back as new float32 arrays, others are views."""
        if buf.dtype != np.uint8 or buf.size < self.nbytes:
            raise ValueError(f"buf must be a uint8 buffer of >= {self.nbytes} bytes, got {buf.dtype} {buf.size}")
        views = self._views(buf)
        for name in self._half:
            views[name] = views[name].astype(np.float32)
        return views
