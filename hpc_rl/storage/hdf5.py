"""Opening a run's HDF5 files (metrics.h5, checkpoints, pool.h5) while other processes open them too.

    with open_h5(path, "r", libver="latest", swmr=True) as f: ...

HDF5 locks a file with ``flock`` while it opens it (and for as long as a writer outside SWMR mode holds it): an
open that meets another process's lock fails at once with ``BlockingIOError`` ("unable to lock file", errno 11).
Such a collision is brief (a reader's open, a checkpoint being written), so ``open_h5`` retries it with backoff
and raises ``FileBusyError`` only after ``timeout_s``. Every other error (a missing or damaged file, the
consistency flag of a file open for writing elsewhere) is raised at once.
"""

from __future__ import annotations

import errno
import time
from pathlib import Path

import h5py

LOCK_TIMEOUT_S = 30.0


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
