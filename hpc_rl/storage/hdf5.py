"""Opening a run's HDF5 files (metrics.h5, checkpoints, pool.h5) while other processes open them too, and writing
them whole.

    with open_h5(path, "r", libver="latest", swmr=True) as f: ...
    write_new_file(tmp, (hdf5_image(fill),)); replace_durably(tmp, path)
    write_json_durably(path, content)                  # a JSON file of the run (ratings.json, summary.json), whole
    check_format(path, "metrics", f.attrs.get(FORMAT_ATTR), newest=2)   # refuse a file newer than this code
    DIGEST = Digested("pool.h5", newest=2)             # a file written whole: a digest header before its HDF5 bytes
    aside = set_aside(path)                            # a damaged file the run rebuilds, kept for a person to look at

Every HDF5 file of a run carries its layout's version in the root attribute ``format`` (docs/FORMAT.md). A reader
reads every format up to its own and refuses a newer one with ``FormatError``, naming both versions: guessing at a
layout it does not know could misread a run, and writing over it would lose what a newer version wrote.

HDF5 locks a file with ``flock`` while it opens it (and for as long as a writer outside SWMR mode holds it): an
open that meets another process's lock fails at once with ``BlockingIOError`` ("unable to lock file", errno 11).
Such a collision is brief (a reader's open, a checkpoint being written), so ``open_h5`` retries it with backoff
and raises ``FileBusyError`` only after ``timeout_s``. Every other error (a missing or damaged file, the
consistency flag of a file open for writing elsewhere) is raised at once.

A file that is written whole (a checkpoint, pool.h5, a rewritten metrics.h5) is built in memory by HDF5 and written
with plain file writes to a temporary file, then renamed: HDF5 never writes it to the filesystem itself, since after
a failed write (ENOSPC) closing the HDF5 file can crash the process.

HDF5 trusts its own metadata: a damaged file can make h5py raise anything (OSError, KeyError, ValueError,
RuntimeError, TypeError), read zeros where a chunk's address was lost, retry for minutes (an SWMR read retries every
metadata checksum failure) or crash the process. Checkpoints and pool.h5, written whole, therefore carry a digest of
their HDF5 bytes in HDF5's user block (``Digested``), checked before h5py parses a byte of them; metrics.h5, appended
in place, relies on HDF5's metadata checksums (``libver="latest"``), Fletcher32 on its data and fill values no row
has. Whatever a reader cannot trust is a ``DamagedFileError`` naming the file.
"""

from __future__ import annotations

import ctypes
import errno
import functools
import hashlib
import io
import json
import os
import re
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import h5py

LOCK_TIMEOUT_S = 30.0


FORMAT_ATTR = "format"


class FormatError(Exception):
    """A file written in a newer format than this code reads. Not an OSError or ValueError: no caller may take
    it for a damaged file and set it aside or rewrite it."""


def check_format(path: str | Path, kind: str, found, newest: int) -> int | None:
    """The format a file's ``format`` attribute names (None: the attribute is missing, the file predates
    versioning); FormatError when it is newer than ``newest``, the newest format of ``kind`` this code reads."""
    if found is None:
        return None
    if int(found) > newest:
        raise FormatError(f"{path}: {newer_format(kind, int(found), newest)}")
    return int(found)


def newer_format(kind: str, found: int, newest: int) -> str:
    """Why a file of format ``found`` is refused by code that reads ``kind`` up to format ``newest``."""
    return (f"{kind} format {found}, newer than this version of hpc_rl reads (format {newest} at most); read it "
            "with the version that wrote it or a later one")


class DamagedFileError(Exception):
    """A file of a run that cannot be trusted: unreadable, truncated, its digest or checksums not matching, or not
    the layout it should have; the message starts with the file's path. Neither an OSError (a busy file or a full
    filesystem is no damage) nor a FormatError (a newer file is not damaged: it is never set aside)."""


# What h5py raises on bytes it cannot parse (OSError for I/O and checksum errors, the others for bad metadata).
PARSE_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError)


def set_aside(path: Path) -> Path:
    """Rename a damaged ``path`` to ``<name>.damaged.<unix time>`` beside it, for a person to look at, and return the
    new path; the run then rebuilds the file (nothing is deleted)."""
    aside = path.with_name(f"{path.name}.damaged.{int(time.time())}")
    os.replace(path, aside)
    return aside


HEADER_BYTES = 512  # HDF5's smallest user block
HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


@dataclass(frozen=True)
class Digested:
    """A file written whole whose first ``HEADER_BYTES`` (HDF5's user block, which the library skips) are a digest
    header: three lines and NULs, ``hpc_rl <kind> <format>``, ``size <n>``, ``blake2b-256 <64 hex digits>``, ``n``
    the number of bytes after the header and the digest theirs. Formats before ``first`` had no header (the file
    starts with HDF5's signature)."""

    kind: str  # the file's name in the header and in messages: "checkpoint", "pool.h5"
    newest: int  # the format this code writes, the newest it reads
    first: int = 2  # the first format with the header

    def header(self, payload: bytes | memoryview) -> bytes:
        """The user block of a file whose HDF5 bytes (after the user block) are ``payload``."""
        return self._header(self.newest, len(payload), blake2b_hex(payload))

    def _header(self, fmt: int, size: int, digest: str) -> bytes:
        return f"hpc_rl {self.kind} {fmt}\nsize {size}\nblake2b-256 {digest}\n".encode().ljust(HEADER_BYTES, b"\0")

    def write(self, path: Path, fill: Callable[[h5py.File], None]) -> None:
        """Replace ``path`` with the HDF5 file ``fill`` writes, behind this digest header, crash-safely: a temporary
        file, flushed and fsynced, then ``os.replace``; a failed write leaves no temporary file."""
        payload = hdf5_image(fill, userblock=HEADER_BYTES)[HEADER_BYTES:]
        tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
        write_new_file(tmp, (self.header(payload), payload))
        try:
            replace_durably(tmp, path)
        finally:
            tmp.unlink(missing_ok=True)  # left only when the replace failed

    def header_format(self, data: bytes) -> int | None:
        """The format the header's first line names (None when there is no such line)."""
        found = re.match(rb"hpc_rl " + re.escape(self.kind.encode()) + rb" (\d+)\n", data[:HEADER_BYTES])
        return int(found[1]) if found else None

    def why_refused(self, data: bytes) -> str | None:
        """Why ``data`` (a whole file of format ``first`` or later) are not the bytes written, or None when they are.
        A newer format is refused too, naming both."""
        if is_bare_hdf5(data):
            return f"no digest: written before {self.kind} files carried one (format {self.first - 1})"
        if len(data) < HEADER_BYTES:
            return f"truncated: {len(data)} bytes, shorter than the {HEADER_BYTES}-byte digest header"
        header = re.fullmatch(rb"hpc_rl " + re.escape(self.kind.encode()) +
                              rb" (\d+)\nsize (\d+)\nblake2b-256 ([0-9a-f]{64})\n\0*", data[:HEADER_BYTES])
        if header is None:
            return f"damaged digest header (the first {HEADER_BYTES} bytes are not a {self.kind} header)"
        if int(header[1]) > self.newest:
            return newer_format(self.kind, int(header[1]), self.newest)
        if int(header[1]) < self.first:
            return f"format {int(header[1])} in a digest header, which formats before {self.first} lack"
        payload = memoryview(data)[HEADER_BYTES:]
        if int(header[2]) != len(payload):
            return f"{len(payload)} bytes after the header, the digest covers {int(header[2])} (truncated or extended)"
        stored, actual = header[3].decode(), blake2b_hex(payload)
        if actual != stored:
            return (f"digest mismatch: the bytes changed since they were written (stored {stored[:12]}, computed "
                    f"{actual[:12]})")
        # e.g. a leading zero added to the size
        if self._header(int(header[1]), len(payload), stored) != data[:HEADER_BYTES]:
            return "damaged digest header (not as written)"
        return None


def blake2b_hex(payload: bytes | memoryview) -> str:
    """The digest of a run's files written whole: BLAKE2b-256, in hex."""
    return hashlib.blake2b(payload, digest_size=32).hexdigest()


def is_bare_hdf5(data: bytes) -> bool:
    """A file without a digest header: it starts with HDF5's signature (written before its kind carried one)."""
    return data.startswith(HDF5_SIGNATURE)


class FileBusyError(RuntimeError):
    """Another process kept an HDF5 file locked for longer than the bound."""


def is_lock_error(err: BaseException) -> bool:
    """HDF5's "unable to lock file": another process holds the file's lock."""
    return isinstance(err, OSError) and (err.errno == errno.EAGAIN or "unable to lock file" in str(err))


# An SWMR reader retries a metadata block whose checksum fails (a writer may be rewriting it), sleeping twice as long
# after each try. HDF5's default of 100 tries makes a damaged file stall a read for days; 28 wait about 0.5 s in all,
# far longer than a torn read of a block being written takes to heal.
SWMR_READ_ATTEMPTS = 28


@functools.cache
def _set_metadata_read_attempts():
    """HDF5's ``H5Pset_metadata_read_attempts``, which h5py does not wrap, looked up once in the HDF5 library h5py
    is linked with (through one of h5py's extension modules: a lookup searches the libraries it links); None where
    that library does not export it."""
    try:
        function = ctypes.CDLL(h5py.h5p.__file__).H5Pset_metadata_read_attempts
    except (OSError, AttributeError):
        warnings.warn("the HDF5 library h5py links does not export H5Pset_metadata_read_attempts: a damaged "
                      "metrics.h5 can stall an SWMR read (HDF5's 100 doubling retries) instead of being refused",
                      RuntimeWarning, stacklevel=3)
        return None
    function.argtypes = [ctypes.c_int64, ctypes.c_uint]
    return function


def _open_swmr_read(path: str | Path) -> h5py.File:
    """``h5py.File(path, "r", libver="latest", swmr=True)`` with ``SWMR_READ_ATTEMPTS`` tries per metadata block
    (HDF5's own 100 where its library lacks the setting: ``_set_metadata_read_attempts``)."""
    set_attempts = _set_metadata_read_attempts()
    if set_attempts is None:
        return h5py.File(path, "r", libver="latest", swmr=True)
    fapl = h5py.h5p.create(h5py.h5p.FILE_ACCESS)
    fapl.set_libver_bounds(h5py.h5f.LIBVER_LATEST, h5py.h5f.LIBVER_LATEST)
    if set_attempts(fapl.id, SWMR_READ_ATTEMPTS) < 0:
        raise RuntimeError("H5Pset_metadata_read_attempts failed")
    fid = h5py.h5f.open(os.fsencode(path), h5py.h5f.ACC_RDONLY | h5py.h5f.ACC_SWMR_READ, fapl=fapl)
    return h5py.File(fid)


def open_h5(path: str | Path, mode: str = "r", *, timeout_s: float = LOCK_TIMEOUT_S, **kwargs) -> h5py.File:
    """``h5py.File(path, mode, **kwargs)``, retrying a lock collision with backoff for up to ``timeout_s``. An SWMR
    read (``mode="r", libver="latest", swmr=True``) retries a damaged metadata block a bounded number of times."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    swmr_read = mode == "r" and kwargs.get("swmr") is True  # SWMR needs libver="latest": the only one it takes
    while True:
        try:
            return _open_swmr_read(path) if swmr_read else h5py.File(path, mode, **kwargs)
        except OSError as err:
            if not is_lock_error(err):
                raise
            if time.monotonic() + delay > deadline:
                raise FileBusyError(
                    f"{path}: still locked by another process after {timeout_s:.0f} s of retries ({err}). On a "
                    "filesystem without working flock set HDF5_USE_FILE_LOCKING=FALSE") from err
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def fsync_path(path: Path) -> None:
    """fsync a file or a directory (a rename is durable once its directory is)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_durably(tmp: Path, final: Path) -> None:
    os.replace(tmp, final)
    fsync_path(final.parent)


def write_json_durably(path: Path, content) -> None:
    """Replace ``path`` with ``content`` as JSON, crash-safely: a reader sees the old file or the new one, whole."""
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    write_new_file(tmp, ((json.dumps(content, indent=2, sort_keys=True, default=str) + "\n").encode(),))
    replace_durably(tmp, path)


def hdf5_image(fill: Callable[[h5py.File], None], userblock: int = 0, **kwargs) -> memoryview:
    """The bytes of an HDF5 file that ``fill`` writes, built in memory (its first ``userblock`` bytes are zero;
    ``kwargs`` go to ``h5py.File``, e.g. ``libver``).

    Files are written whole from such an image rather than by HDF5 itself: after a failed write (ENOSPC), closing
    the HDF5 file can crash the process."""
    buffer = io.BytesIO()
    if userblock:
        kwargs["userblock_size"] = userblock
    with h5py.File(buffer, "w", **kwargs) as f:
        fill(f)
    return buffer.getbuffer()  # no copy


def write_new_file(tmp: Path, parts: Sequence[bytes | memoryview], on_written: Callable[[], None] = lambda: None
                   ) -> None:
    """Write ``parts`` to ``tmp``, flush, call ``on_written``, fsync; on any failure remove ``tmp`` and re-raise."""
    try:
        with open(tmp, "wb") as fh:
            for part in parts:
                fh.write(part)
            fh.flush()
            on_written()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
