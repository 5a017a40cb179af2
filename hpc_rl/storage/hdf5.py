"""Opening a run's HDF5 files (metrics.h5, checkpoints, pool.h5) while other processes open them too, and writing
them whole.

    with open_h5(path, "r", libver="latest", swmr=True) as f: ...
    write_new_file(tmp, (hdf5_image(fill),)); replace_durably(tmp, path)
    write_json_durably(path, content)                  # a JSON file of the run (ratings.json, summary.json), whole
    check_format(path, "metrics", f.attrs.get(FORMAT_ATTR), newest=2)   # refuse a file newer than this code

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
"""

from __future__ import annotations

import errno
import io
import json
import os
import time
from collections.abc import Callable, Sequence
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


class FileBusyError(RuntimeError):
    """Another process kept an HDF5 file locked for longer than the bound."""


def is_lock_error(err: BaseException) -> bool:
    """HDF5's "unable to lock file": another process holds the file's lock."""
    return isinstance(err, OSError) and (err.errno == errno.EAGAIN or "unable to lock file" in str(err))


def open_h5(path: str | Path, mode: str = "r", *, timeout_s: float = LOCK_TIMEOUT_S, **kwargs) -> h5py.File:
    """``h5py.File(path, mode, **kwargs)``, retrying a lock collision with backoff for up to ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    delay = 0.01
    while True:
        try:
            return h5py.File(path, mode, **kwargs)
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
