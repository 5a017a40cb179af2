"""TensorBoard event files of a run's metrics, when the optional ``tensorboard`` package is installed.

``metrics.h5`` is the record; the event files are a view of it for ``tensorboard --logdir runs``. Every row of
series ``<name>`` becomes a scalar of tag ``<name>`` at TensorBoard step = policy version (the x axis runs are
compared by; the env step count is its own series, ``perf/env_steps``), with the row's wall time. TensorBoard stores
scalars as float32.

Two ways to get them:

- live: the controller writes ``runs/<run>/tensorboard/`` beside ``metrics.h5`` (``TensorBoardExport``). Each
  attempt of a run (the first, and every resume) starts a new event file with a ``SessionLog.START`` event at its
  first version; TensorBoard then drops the steps at or past it from earlier files, just as ``metrics.h5`` cuts the
  rows past the resumed version, so the curves stay continuous.
- offline, from any ``metrics.h5``::

      python -m hpc_rl.storage.tensorboard runs/my_run                 # -> runs/my_run/tensorboard/
      python -m hpc_rl.storage.tensorboard runs/my_run --out /tmp/tb --overwrite
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hpc_rl.storage.layout import RunLayout
from hpc_rl.storage.metrics import read_metrics

EVENT_GLOB = "events.out.tfevents.*"


def tensorboard_available() -> bool:
    try:
        importlib.import_module("tensorboard.summary.writer.event_file_writer")
    except ImportError:
        return False
    return True


class TensorBoardExport:
    """An event file for one attempt of a run; rows go in as they are logged to ``metrics.h5``.

    ``first_version`` is the first version this attempt will log (1 for a new run, the resumed version + 1 on
    resume): the ``SessionLog.START`` event there makes TensorBoard drop older files' steps from it on.
    """

    def __init__(self, logdir: str | Path, first_version: int = 1, flush_secs: float = 5.0):
        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.compat.proto.summary_pb2 import Summary
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        self._event, self._summary = Event, Summary
        self.logdir = Path(logdir)
        self.logdir.mkdir(parents=True, exist_ok=True)
        self._writer = EventFileWriter(str(self.logdir), flush_secs=flush_secs)
        self._writer.add_event(Event(wall_time=time.time(), step=int(first_version),
                                     session_log=SessionLog(status=SessionLog.START)))

    def log_many(self, values: Mapping[str, float], version: int, wall_time: float | None = None) -> None:
        """One event holding every value of ``version``."""
        summary = self._summary(value=[self._summary.Value(tag=name, simple_value=float(value))
                                       for name, value in values.items()])
        self._writer.add_event(self._event(wall_time=time.time() if wall_time is None else float(wall_time),
                                           step=int(version), summary=summary))

    def flush(self) -> None:
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


def open_export(logdir: str | Path, first_version: int = 1) -> TensorBoardExport | None:
    """A live export to ``logdir``, or None when ``tensorboard`` is not installed."""
    return TensorBoardExport(logdir, first_version) if tensorboard_available() else None


def export_metrics(metrics_path: str | Path, out: str | Path, overwrite: bool = False) -> int:
    """Write every row of ``metrics_path`` to a new event file in ``out``; returns the number of rows.

    ``out`` must hold no event files (they would be read together with the new one) unless ``overwrite``, which
    deletes them first.
    """
    if not tensorboard_available():
        raise RuntimeError("the tensorboard package is not installed: pip install 'hpc_rl[tensorboard]'")
    metrics_path, out = Path(metrics_path), Path(out)
    if not metrics_path.is_file():
        raise FileNotFoundError(f"no metrics file at {metrics_path}")
    existing = sorted(out.glob(EVENT_GLOB)) if out.is_dir() else []
    if existing and not overwrite:
        raise FileExistsError(f"{out} already holds {len(existing)} event file(s) (e.g. {existing[0].name}); "
                              "pass --overwrite to replace them or --out to write elsewhere")
    for path in existing:
        path.unlink()
    series = read_metrics(metrics_path)
    export = TensorBoardExport(out, first_version=1)
    rows = 0
    try:
        for name, data in sorted(series.items()):
            for version, wall_time, value in zip(data["version"], data["wall_time"], data["value"]):
                export.log_many({name: value}, int(version), float(wall_time))
            rows += len(data)
    finally:
        export.close()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_rl.storage.tensorboard",
        description="Export a run's metrics.h5 to TensorBoard event files (step = policy version).")
    parser.add_argument("run_dir", type=Path, help="a run directory (runs/<run>) or a metrics.h5 file")
    parser.add_argument("--out", type=Path, default=None,
                        help="directory for the event files (default: RUN_DIR/tensorboard)")
    parser.add_argument("--overwrite", action="store_true",
                        help="delete event files already in the output directory first (e.g. the live export's)")
    args = parser.parse_args(argv)
    path = args.run_dir
    metrics_path = path if path.suffix == ".h5" else RunLayout(path).metrics
    out = args.out or RunLayout(metrics_path.parent).tensorboard
    try:
        rows = export_metrics(metrics_path, out, args.overwrite)
    except (RuntimeError, FileNotFoundError, FileExistsError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    names = len(read_metrics(metrics_path))
    print(f"wrote {rows} rows of {names} series to {out} (tensorboard --logdir {out})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
