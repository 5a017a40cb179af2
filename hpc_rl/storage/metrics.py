"""``metrics.h5``: append-only time series, written by one process in SWMR mode so analysis can read a live run.

Layout: two resizable datasets in group ``/metrics``, both created before the file enters SWMR mode (HDF5 cannot
create a dataset in SWMR mode, and reopening the file outside it collides with readers' locks):

    names   one row per series: (name, source); a row's index is the series' id
    rows    one row per logged value: (name id, version, step, wall_time, value), each series in version order

A name seen for the first time is appended to ``names`` before any row naming it is appended to ``rows``, so a
reader that reads ``rows`` first and ``names`` second knows every id it meets. ``read_metrics`` returns each
series as a structured array of ``ROW``. ``source`` is empty for what a run logs; the offline tournament marks its
series (``hpc_rl.league.tournament``).

The root attribute ``format`` is ``FORMAT``: 2 is this layout; 1 was one dataset per name below ``/metrics``. Files
written before the attribute existed (format 1 or 2, told apart by their datasets) are still read; a newer format
is refused (``hdf5.check_format``). docs/FORMAT.md specifies the file.

Starting a writer on an existing file rewrites it (a temporary file, then ``os.replace``): on resume the rows past
the resumed version are cut, so every series stays continuous in the version. A file a crashed writer left in SWMR
mode (its consistency flag set, so HDF5 refuses to open it for writing) is rebuilt the same way from what an SWMR
read still sees, when the caller owns the run (``recover=True``: it holds the run lock).
"""

from __future__ import annotations

import logging
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import h5py
import numpy as np

from hpc_rl.storage.hdf5 import (FORMAT_ATTR, PARSE_ERRORS, DamagedFileError, FileBusyError, check_format, hdf5_image,
                                 open_h5, replace_durably, set_aside, write_new_file)

FORMAT = 2  # 2: the names and rows tables; 1: one dataset per name (read, never written)
ROW = np.dtype([("version", "<i8"), ("step", "<i8"), ("wall_time", "<f8"), ("value", "<f8")])
TABLE_ROW = np.dtype([("name", "<i4"), *ROW.descr])
NAME_BYTES = 128
NAME = np.dtype([("name", f"S{NAME_BYTES}"), ("source", "S32")])
# What HDF5 reads where a chunk's address was lost: a name id no row has (and, for ``names``, an empty name, which no
# series has), so such damage is refused instead of read as rows of series 0 at version 0.
MISSING_ROW = np.array((-1, -1, -1, np.nan, np.nan), TABLE_ROW)
GROUP = "metrics"
NAMES, ROWS = f"{GROUP}/names", f"{GROUP}/rows"
CHUNK = 4096
log = logging.getLogger(__name__)


class MetricsFileInUse(RuntimeError):
    """metrics.h5 is open for writing elsewhere, or a crashed writer left it so."""


class MetricsWriteError(OSError):
    """Rows could not be appended to metrics.h5 (a full filesystem, a quota). The writer is unusable after it: HDF5
    can crash the process when it later closes such a file, so the job should end at once (MPI_Abort does)."""


def _write_failure(path: Path, err: Exception, size: int) -> str:
    """One line: the file, the cause (the errno h5py buries in its message) and the bytes the rows needed."""
    found = re.search(r"errno = (\d+), error message = '([^']*)'", str(err))
    cause = f"{found[2]} (errno {found[1]})" if found else " ".join(str(err).split())[:200]
    return (f"cannot write {path}: {cause}; the rows needed {size} bytes free on {path.parent}; a resume keeps the "
            f"rows up to its checkpoint")


@dataclass
class MetricsTable:
    """Every series of a metrics file, with each series' source and the file's attributes."""

    series: dict[str, np.ndarray] = field(default_factory=dict)
    sources: dict[str, str] = field(default_factory=dict)
    attrs: dict = field(default_factory=dict)

    def cut_after(self, version: int) -> MetricsTable:
        return MetricsTable({n: s[s["version"] <= version] for n, s in self.series.items()}, dict(self.sources),
                            dict(self.attrs))

    @property
    def rows(self) -> int:
        return sum(len(s) for s in self.series.values())

    @property
    def last_version(self) -> int:
        return max((int(s["version"].max()) for s in self.series.values() if len(s)), default=-1)


def _check_name(name: str) -> None:
    if not name or name.startswith("/") or name.endswith("/") or len(name.encode()) > NAME_BYTES:
        raise ValueError(f"bad metric name {name!r} (non-empty, no leading or trailing '/', at most {NAME_BYTES} "
                         "bytes)")


def _read_open(f: h5py.File) -> MetricsTable:
    check_format(f.filename, "metrics.h5", f.attrs.get(FORMAT_ATTR), FORMAT)
    table = MetricsTable(attrs=dict(f[GROUP].attrs) if GROUP in f else {})
    if GROUP not in f:
        return table
    if ROWS not in f:  # the earlier layout: one dataset per name
        def visit(name, obj):
            if isinstance(obj, h5py.Dataset):
                table.series[name] = obj[()]
                table.sources[name] = str(obj.attrs.get("source", ""))
        f[GROUP].visititems(visit)
        return table
    rows = f[ROWS][()]  # before names: every id in these rows is in names (see the module docstring)
    names = f[NAMES][()]
    # Fill rows at the end are a batch whose extent a reader saw before its data (a live writer's, or a crashed
    # one's): not written yet. Anywhere else they are a chunk read as fill values, its address lost.
    written = np.flatnonzero(rows["name"] != MISSING_ROW["name"])
    rows = rows[:written[-1] + 1 if len(written) else 0]
    ids = rows["name"]
    # What HDF5's checksums do not catch: a chunk read as fill values, names in a file written before they carried
    # Fletcher32.
    if len(ids) and not 0 <= ids.min() <= ids.max() < len(names):
        raise DamagedFileError(f"{f.filename}: rows name series {ids.min()}..{ids.max()}, names has {len(names)}")
    decoded = [name.decode() for name in names["name"]]
    if not all(decoded) or len(set(decoded)) < len(decoded):
        raise DamagedFileError(f"{f.filename}: empty or repeated series names")
    order = np.argsort(ids, kind="stable")
    bounds = np.searchsorted(ids[order], np.arange(len(names) + 1))
    plain = np.empty(len(rows), ROW)
    for key in ROW.names:
        plain[key] = rows[key]
    for i, (name, source) in enumerate(zip(decoded, names["source"])):
        table.series[name] = plain[order[bounds[i]:bounds[i + 1]]]
        table.sources[name] = source.decode()
    return table


def read_table(path: str | Path) -> MetricsTable:
    """Every series of a ``metrics.h5``; safe while a writer appends (an SWMR read, which also reads a file a
    crashed writer left in SWMR mode). DamagedFileError when the file cannot be trusted."""
    if not Path(path).exists():
        return MetricsTable()
    try:
        with open_h5(path, "r", libver="latest", swmr=True) as f:
            return _read_open(f)
    except (FileBusyError, DamagedFileError):  # busy is not damaged (a RuntimeError, as h5py's parse errors)
        raise
    except PARSE_ERRORS as err:
        raise DamagedFileError(f"{path}: unreadable ({type(err).__name__}: {' '.join(str(err).split())})") from err


def read_metrics(path: str | Path) -> dict[str, np.ndarray]:
    """Every series of a ``metrics.h5`` as ``{name: structured array of ROW}``; safe while a writer appends."""
    return read_table(path).series


def write_table(path: str | Path, table: MetricsTable, swmr_writer: bool = False) -> h5py.File | None:
    """Replace ``path`` with a metrics file holding ``table``, crash-safely (a temporary file, then os.replace).
    ``swmr_writer``: return the file open for appending in SWMR mode, opened before the rename, so that no reader
    can hold the new file before its writer does (readers polling flat out could keep a writer out for good)."""
    path = Path(path)
    tmp = path.parent / f".{path.name}.{os.getpid()}.tmp"
    names = list(table.series)
    for name in names:
        _check_name(name)
    rows = np.empty(table.rows, TABLE_ROW)
    at = 0
    for i, name in enumerate(names):
        s = table.series[name]
        rows["name"][at:at + len(s)] = i
        for key in ROW.names:
            rows[key][at:at + len(s)] = s[key]
        at += len(s)

    def fill(f: h5py.File) -> None:
        f.attrs[FORMAT_ATTR] = FORMAT
        group = f.create_group(GROUP)
        for key, value in table.attrs.items():
            group.attrs[key] = value
        group.create_dataset("names", data=np.array([(n.encode(), table.sources.get(n, "").encode()) for n in names],
                                                    NAME), maxshape=(None,), chunks=(256,), fletcher32=True)
        group.create_dataset("rows", data=rows, maxshape=(None,), chunks=(CHUNK,), fletcher32=True,
                             fillvalue=MISSING_ROW)

    write_new_file(tmp, (hdf5_image(fill, libver="latest"),))
    writer = None
    if swmr_writer:
        writer = open_h5(tmp, "a", libver="latest")  # no other process knows the temporary name
        writer.swmr_mode = True
    replace_durably(tmp, path)
    return writer


def open_for_write_problem(path: Path) -> str | None:
    """Why ``path`` cannot be opened for writing (a writer holds it in SWMR mode or crashed holding it), or None."""
    try:
        with open_h5(path, "r+", libver="latest"):
            return None
    except OSError as err:
        return str(err)


class MetricsWriter:
    """Buffer rows and append them to ``metrics.h5`` every ``flush_every_s`` seconds (and on ``flush``/``close``).

    The file stays in SWMR mode from the constructor to ``close``. ``resume_version``: cut the rows past it.
    ``recover``: the caller owns the run, so a file left open by a crashed writer (or damaged) is rebuilt (or set
    aside) instead of refused.
    """

    def __init__(self, path: str | Path, resume_version: int | None = None, flush_every_s: float = 5.0,
                 recover: bool = False):
        self.path = Path(path)
        self.flush_every_s = flush_every_s
        self._pending: list[tuple[str, tuple]] = []
        self._last_flush = time.monotonic()
        table = MetricsTable()
        if self.path.exists():
            table = self._existing(resume_version, recover)
        self._file = write_table(self.path, table, swmr_writer=True)
        self._ids = {name: i for i, name in enumerate(table.series)}
        self._kept_last = {name: float(s["value"][-1]) for name, s in table.series.items() if len(s)}
        self._names_ds, self._rows_ds = self._file[NAMES], self._file[ROWS]

    def _existing(self, resume_version: int | None, recover: bool) -> MetricsTable:
        """The rows of the existing file to keep, recovering a file a crashed writer left open."""
        problem = open_for_write_problem(self.path)
        if problem is not None and not recover:
            raise MetricsFileInUse(f"{self.path} cannot be opened for writing ({problem}): a job is writing it, or "
                                   "one crashed while writing it; resuming the run recovers it")
        try:
            table = read_table(self.path)
        except DamagedFileError as err:
            if not recover:
                raise
            aside = set_aside(self.path)
            log.error("%s: set aside as %s, starting an empty metrics.h5", err, aside.name)
            print(f"metrics.h5 is damaged: set aside as {aside.name}, starting an empty one ({err})", flush=True)
            return MetricsTable()
        if resume_version is not None:
            table = table.cut_after(resume_version)
        if problem is not None:
            line = (f"recovered metrics.h5: {table.rows} rows up to version {table.last_version} (was left open by a "
                    "crashed job)")
            log.warning(line)
            print(line, flush=True)
        return table

    def kept_last(self, name: str) -> float | None:
        """The last value of series ``name`` that the file held when this writer started (past the cut), or None."""
        return self._kept_last.get(name)

    def log(self, name: str, version: int, step: int, value: float, wall_time: float | None = None) -> None:
        _check_name(name)
        row = (int(version), int(step), time.time() if wall_time is None else float(wall_time), float(value))
        self._pending.append((name, row))
        if time.monotonic() - self._last_flush >= self.flush_every_s:
            self.flush()

    def log_many(self, values: dict[str, float], version: int, step: int, wall_time: float | None = None) -> None:
        now = time.time() if wall_time is None else wall_time
        for name, value in values.items():
            self.log(name, version, step, value, now)

    def flush(self) -> None:
        if not self._pending:
            return
        new = list(dict.fromkeys(n for n, _ in self._pending if n not in self._ids))
        if new:  # names before the rows that use them
            names = np.array([(n.encode(), b"") for n in new], NAME)
            try:
                start = self._names_ds.shape[0]
                self._names_ds.resize((start + len(new),))
                self._names_ds[start:] = names
                self._names_ds.flush()
            except (OSError, RuntimeError) as err:
                raise MetricsWriteError(_write_failure(self.path, err, names.nbytes)) from err
            self._ids.update({n: start + i for i, n in enumerate(new)})
        rows = np.array([(self._ids[n], *row) for n, row in self._pending], TABLE_ROW)
        try:
            start = self._rows_ds.shape[0]
            self._rows_ds.resize((start + len(rows),))
            self._rows_ds[start:] = rows
            self._rows_ds.flush()
        except (OSError, RuntimeError) as err:  # h5py reports a failed write(2) as either
            raise MetricsWriteError(_write_failure(self.path, err, rows.nbytes)) from err
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

