"""Reading a run directory for analysis (no MPI, no torch needed).

    run = open_run("runs/my_run")
    run.config, run.meta                 # config.yaml and meta.json as dicts
    run.config_changes                   # the settings each resume changed: [{"version", "key", "old", "new", ...}]
    run.metrics["train/policy_loss"]     # structured array (version, step, wall_time, value)
    run.checkpoint_versions              # committed versions, ascending
    run.load_checkpoint()                # the verified latest one (falls back past corrupt files)
    run.metrics_frame()                  # pandas: every metric in long form, one row per logged value
    run.ratings_frame()                  # pandas: the eval/<family>/<player> ratings, one row per value
    run.evaluations                      # jobs/evaluate.py's results: [{"version", "games", "seed", "time", "result"}]
    run.evaluations_frame()              # pandas: the evaluations of summary.json, evaluations.jsonl and the reports

Nothing here needs the run where it was written: every file is found relative to ``path`` (the absolute paths
``summary.json`` lists are for the reader of the job's output, and are never read back), and every read is safe
while the controller still writes the run (metrics.h5 is read in SWMR mode, every other file is replaced whole).
pandas is imported by the ``*_frame`` methods only. docs/FORMAT.md specifies every file.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from hpc_rl import metric_names as M
from hpc_rl.slurm import slurm_environment
from hpc_rl.storage.checkpoint import Checkpoint, checkpoint_name, committed_versions, load_checkpoint, load_latest
from hpc_rl.storage.hdf5 import write_json_durably
from hpc_rl.storage.layout import RunLayout
from hpc_rl.storage.metrics import ROW, read_metrics, read_table
from hpc_rl.storage.pool import read_pool


def _json_or_empty(path: Path) -> dict[str, Any]:
    """A run's JSON file, or {} where the run has not written it (yet)."""
    return json.loads(path.read_text()) if path.exists() else {}


@dataclass
class Run:
    path: Path

    @property
    def layout(self) -> RunLayout:
        return RunLayout(self.path)

    @property
    def config(self) -> dict[str, Any]:
        p = self.layout.config
        return yaml.safe_load(p.read_text()) if p.exists() else {}

    @property
    def meta(self) -> dict[str, Any]:
        return _json_or_empty(self.layout.meta)

    @property
    def config_changes(self) -> list[dict[str, Any]]:
        return read_config_changes(self.layout.config_changes)

    @property
    def metrics(self) -> dict[str, Any]:
        return read_metrics(self.layout.metrics)

    def metrics_frame(self):
        """Every value of ``metrics.h5`` as a pandas DataFrame in long form, one row per logged value, series by
        series (in the order they were first logged), each in version order. Columns: ``name`` (the series), ``version`` (the policy version it belongs to), ``step``
        (env steps of the whole run when it was logged; 0 for a version the offline tournament rated without the
        training having logged it), ``wall_time`` (Unix seconds; ``pd.to_datetime(df.wall_time, unit="s")`` for
        dates), ``value`` (float64, NaN where a version had nothing to measure) and ``source`` (empty for what the
        run logged, ``jobs/tournament.py`` for the offline tournament's series)."""
        import pandas as pd

        table = read_table(self.layout.metrics)
        frames = [pd.DataFrame({"name": name, **{key: series[key] for key in ROW.names},
                                "source": table.sources.get(name, "")}) for name, series in table.series.items()]
        columns = ["name", *ROW.names, "source"]
        return pd.concat(frames, ignore_index=True)[columns] if frames else pd.DataFrame(columns=columns)

    def ratings_frame(self):
        """The ratings of ``metrics.h5`` (series ``eval/<family>/<player>``: TrueSkill, its sigma, games, win and
        draw rates against each reference, and the offline tournament's Elo and Nash figures) as a DataFrame with
        the columns of ``metrics_frame`` plus ``family`` and ``player``; empty when the run was never rated.
        ``ratings.json`` (the evaluator ranks' TrueSkill table a resume continues) holds the same TrueSkill figures
        before they are made relative to the random player."""
        frame = self.metrics_frame()
        parsed = frame["name"].map(M.parse_rating)
        frame = frame[parsed.notna()].copy()
        frame["family"] = parsed[parsed.notna()].map(lambda fp: fp[0])
        frame["player"] = parsed[parsed.notna()].map(lambda fp: fp[1])
        return frame.reset_index(drop=True)

    @property
    def evaluations(self) -> list[dict[str, Any]]:
        """``jobs/evaluate.py``'s results (``evaluations.jsonl``), in the order written."""
        return read_evaluations(self.layout.evaluations)

    def evaluations_frame(self):
        """The evaluations of the run's checkpoints, one row each: the final evaluation of ``summary.json`` (source
        ``summary``), each of ``jobs/evaluate.py`` (source ``evaluate``) and a ``vs_scripted.json`` report's
        evaluations of the trained policy and of its reloaded checkpoint (sources ``vs_scripted``,
        ``vs_scripted/reloaded``). Columns: ``source``, ``version`` and the
        evaluation's own figures (MOBA: games, wins, draws, win_rate, ci95_low, ci95_high, bot, seed; Gymnasium:
        episodes, mean_return, std_return; Neural MMO: worlds, policy_mean_lifetime, policy_ci95_low, ...,
        lifetime_ratio); a figure an evaluation does not have is NaN."""
        import pandas as pd

        rows = []
        summary = self.summary
        if summary.get("final_eval"):
            rows.append(_evaluation_row("summary", summary["version"], summary["final_eval"]))
        rows += [_evaluation_row("evaluate", record["version"], record["result"]) for record in self.evaluations]
        report_path = self.layout.report("vs_scripted")
        if report_path.is_file():
            report = json.loads(report_path.read_text())
            rows.append(_evaluation_row("vs_scripted", report["version"], report["final"]))
            rows.append(_evaluation_row("vs_scripted/reloaded", report["reloaded_version"], report["reloaded"]))
        return pd.DataFrame(rows, columns=None if rows else ["source", "version"])

    @property
    def summary(self) -> dict[str, Any]:
        """``summary.json`` (how the job ended, its final evaluation, its files, the next commands), or {}."""
        return _json_or_empty(self.layout.summary)

    @property
    def status(self) -> dict[str, Any]:
        """``status.json`` (how the run's latest job ended, and the failures of its jobs), or {} before any job
        ended."""
        return _json_or_empty(self.layout.status)

    @property
    def pool(self) -> dict[str, Any] | None:
        """The opponent pool: {"version": [...], "quality": [...], **settings (eta, latest_fraction)}, or None
        without a pool file."""
        got = read_pool(self.layout.pool)
        return None if got is None else {"version": got[0], "quality": got[1], **got[2]}

    @property
    def checkpoint_versions(self) -> list[int]:
        return committed_versions(self.layout.checkpoints)

    def load_checkpoint(self, version: int | None = None) -> Checkpoint | None:
        directory = self.layout.checkpoints
        if version is None:
            return load_latest(directory)
        return load_checkpoint(directory / checkpoint_name(version))


def _evaluation_row(source: str, version: int, result: dict[str, Any]) -> dict[str, Any]:
    """One row of ``Run.evaluations_frame``: the figures of an evaluation, its interval (``ci95`` in summary.json,
    ``win_rate_ci95`` in a job's report; ``<player>_ci95``) split in two columns."""
    row = {"source": source, "version": version}
    for key, value in result.items():
        if key in ("ci95", "win_rate_ci95"):
            row["ci95_low"], row["ci95_high"] = value
        elif key.endswith("_ci95"):  # Neural MMO: one interval per player (policy_ci95, random_ci95)
            row[f"{key}_low"], row[f"{key}_high"] = value
        elif not isinstance(value, (list, dict)):
            row[key] = value
    return row


def git_state(repo: str | Path | None = None) -> dict[str, Any]:
    """``{"git_sha": ..., "git_dirty": ...}`` of the source tree this code runs from (None outside a checkout)."""
    repo = Path(repo) if repo else Path(__file__).resolve().parents[2]

    def git(*args: str) -> str | None:
        try:
            out = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.strip() if out.returncode == 0 else None

    sha = git("rev-parse", "HEAD")
    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": sha, "git_dirty": None if status is None else bool(status)}


# What meta.json keeps from its previous version when a start rewrites it: how the run came to be, not this start.
KEPT_META = ("surgery_from", "horizon_from")


def command_overrides(argv: Sequence[str], dropping: tuple[str, ...] = ()) -> list[str]:
    """The Hydra overrides of a run's command line (``meta.json``'s ``argv`` after the program): every ``key=value``
    in order, but options (``-…``) and those starting with one of ``dropping`` (what a new command sets itself)."""
    return [a for a in argv if "=" in a and not a.startswith(("-", *dropping))]


def write_meta(run_dir: str | Path, **fields: Any) -> Path:
    """Write ``meta.json``: git sha and dirty flag, every SLURM_* variable, host, command line, start time, and
    ``fields`` (world size, rank -> role map, transport backend, ...), keeping the previous file's ``KEPT_META``.
    Replaced atomically."""
    layout = RunLayout(run_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    try:
        previous = _json_or_empty(layout.meta)
    except ValueError:  # not JSON: nothing to keep, and this start replaces it
        previous = {}
    meta = {
        **{key: previous[key] for key in KEPT_META if key in previous},
        **git_state(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "argv": sys.argv,
        "slurm": slurm_environment(),
        **fields,
    }
    write_json_durably(layout.meta, meta)
    return layout.meta


def write_status(run_dir: str | Path, state: str, version: int | None, **fields: Any) -> dict[str, Any]:
    """Write ``status.json``: how the run's latest job ended (``state``, the last version trained, ``fields``), and
    return it. Its ``failures`` (``hpc_rl.failures``), unless given, are the previous file's: a run's failures are
    counted over all its jobs. Replaced atomically: readers poll it."""
    status = {"state": state, "version": version, "time": time.time(), **fields}
    status.setdefault("failures", read_status(run_dir).get("failures", []))
    write_json_durably(RunLayout(run_dir).status, status)
    return status


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """``status.json``, or {} where no job has ended yet or the file is not JSON (edited by hand: the next status
    replaces it)."""
    try:
        return _json_or_empty(RunLayout(run_dir).status)
    except ValueError:
        return {}


def read_config_changes(path: str | Path) -> list[dict[str, Any]]:
    """The lines of ``config_changes.jsonl`` in the order written ([] without the file)."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text().splitlines() if line] if path.exists() else []


def read_evaluations(path: str | Path) -> list[dict[str, Any]]:
    """The records of ``evaluations.jsonl`` in the order written ([] without the file): ``{"version", "games", "seed",
    "time", "result"}``. A line that is not such a record (one cut short by a process that died writing it) is
    skipped, so a reader never fails on the file."""
    path = Path(path)
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            record = json.loads(line)
            if isinstance(record.get("result"), dict) and all(isinstance(record.get(k), int)
                                                             for k in ("version", "games", "seed")):
                records.append(record)
        except (ValueError, AttributeError):
            continue
    return records


def record_evaluation(path: str | Path, version: int, games: int, seed: int, result: dict[str, Any]
                      ) -> dict[str, Any]:
    """Append one ``jobs/evaluate.py`` result to ``evaluations.jsonl`` (one whole line, flushed to disk) and
    return the record."""
    record = {"version": version, "games": games, "seed": seed, "time": time.time(), "result": result}
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())
    return record


def record_config_changes(path: str | Path, version: int, changes: list[tuple[str, Any, Any]]) -> list[dict[str, Any]]:
    """Append to ``config_changes.jsonl`` one line per setting a resume from ``version`` changed: ``{"version", "key",
    "old", "new", "time"}``. A change recorded already at that version (the same checkpoint resumed again with the
    same settings) is not repeated. Returns the lines appended."""
    seen = {(c["version"], c["key"], json.dumps(c["old"]), json.dumps(c["new"])) for c in read_config_changes(path)}
    lines = [{"version": version, "key": key, "old": old, "new": new, "time": time.time()} for key, old, new in changes
             if (version, key, json.dumps(old), json.dumps(new)) not in seen]
    if lines:
        with open(path, "a") as f:
            f.write("".join(json.dumps(line) + "\n" for line in lines))
            f.flush()
            os.fsync(f.fileno())
    return lines


def open_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no run directory at {path}")
    layout = RunLayout(path)
    if not any(p.exists() for p in (layout.meta, layout.metrics, layout.checkpoints)):
        raise FileNotFoundError(f"{path} is not a run directory (no {layout.meta.name}, {layout.metrics.name} or "
                                f"{layout.checkpoints.name}/)")
    return Run(path)
