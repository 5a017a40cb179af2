"""``metrics.h5``: append-only time series, written by one process in SWMR mode so analysis can read a live run.

Layout: ``/metrics/<name>`` (a name may contain ``/``: ``perf/env_steps_per_s`` lives in group ``/metrics/perf``), each
a resizable dataset of rows ``(version, step, wall_time, value)``. On resume the rows past the resumed version are
cut, so every series stays continuous in the version.

HDF5 cannot create datasets while a file is in SWMR mode: a name seen for the first time is created by briefly
reopening the file outside SWMR mode (this happens a few times at the start of a run, not on every row).
"""

from __future__ import annotations

import time
from pathlib import Path

import h5py
import numpy as np

ROW = np.dtype([("version", "<i8"), ("step", "<i8"), ("wall_time", "<f8"), ("value", "<f8")])
GROUP = "metrics"


class MetricsWriter:
    """Buffer rows and append them to ``metrics.h5`` every ``flush_every_s`` seconds (and on ``flush``/``close``)."""

    def __init__(self, path: str | Path, resume_version: int | None = None, flush_every_s: float = 5.0):
        self.path = Path(path)
        self.flush_every_s = flush_every_s
        self._pending: dict[str, list[tuple]] = {}
        self._last_flush = time.monotonic()
        self._file = h5py.File(self.path, "a", libver="latest")
        self._file.require_group(GROUP)
        if resume_version is not None:
            self._cut_after(resume_version)
        self._file.swmr_mode = True

    def _names(self) -> list[str]:
        names: list[str] = []
        self._file[GROUP].visititems(lambda n, o: names.append(n) if isinstance(o, h5py.Dataset) else None)
        return names

    def _cut_after(self, version: int) -> None:
        for name in self._names():
            ds = self._file[GROUP][name]
            keep = int(np.count_nonzero(ds["version"] <= version)) if ds.shape[0] else 0
            # Rows are appended in version order, so the rows to keep are a prefix.
            ds.resize((keep,))

    def log(self, name: str, version: int, step: int, value: float, wall_time: float | None = None) -> None:
        if not name or name.startswith("/") or name.endswith("/"):
            raise ValueError(f"bad metric name {name!r}")
        row = (int(version), int(step), time.time() if wall_time is None else float(wall_time), float(value))
        self._pending.setdefault(name, []).append(row)
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def log_many(self, values: dict[str, float], version: int, step: int, wall_time: float | None = None) -> None:
        now = time.time() if wall_time is None else wall_time
        for name, value in values.items():
            self.log(name, version, step, value, now)

    def flush(self) -> None:
        if not self._pending:
            return
        new = [n for n in self._pending if f"{GROUP}/{n}" not in self._file]
        if new:
            self._file.close()
            with h5py.File(self.path, "a", libver="latest") as f:
                for name in new:
                    f.create_dataset(f"{GROUP}/{name}", shape=(0,), maxshape=(None,), dtype=ROW, chunks=(1024,),
                                     fletcher32=True)
            self._file = h5py.File(self.path, "a", libver="latest")
            self._file.swmr_mode = True
        for name, rows in self._pending.items():
            ds = self._file[GROUP][name]
            start = ds.shape[0]
            ds.resize((start + len(rows),))
            ds[start:] = np.array(rows, dtype=ROW)
            ds.flush()
        self._pending.clear()
        self._last_flush = time.monotonic()

    def close(self) -> None:
        if self._file:
            self.flush()
            self._file.close()
            self._file = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_metrics(path: str | Path) -> dict[str, np.ndarray]:
    """Every series of a ``metrics.h5`` as ``{name: structured array of ROW}``; safe while a writer appends."""
    out: dict[str, np.ndarray] = {}
    if not Path(path).exists():
        return out
    with h5py.File(path, "r", libver="latest", swmr=True) as f:
        if GROUP not in f:
            return out
        f[GROUP].visititems(lambda n, o: out.__setitem__(n, o[()]) if isinstance(o, h5py.Dataset) else None)
    return out
