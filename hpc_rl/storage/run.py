"""Reading a run directory for analysis (no MPI, no torch needed).

    run = open_run("runs/my_run")
    run.config, run.meta                 # config.yaml and meta.json as dicts
    run.metrics["train/policy_loss"]     # structured array (version, step, wall_time, value)
    run.checkpoint_versions              # committed versions, ascending
    run.load_checkpoint()                # the verified latest one (falls back past corrupt files)
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpc_rl.slurm import slurm_environment
from hpc_rl.storage.checkpoint import Checkpoint, checkpoint_name, committed_versions, load_checkpoint, load_latest
from hpc_rl.storage.hdf5 import write_json_durably
from hpc_rl.storage.layout import RunLayout
from hpc_rl.storage.metrics import read_metrics
from hpc_rl.storage.pool import read_pool


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
        p = self.layout.meta
        return json.loads(p.read_text()) if p.exists() else {}

    @property
    def metrics(self) -> dict[str, Any]:
        return read_metrics(self.layout.metrics)

    @property
    def pool(self) -> dict[str, Any] | None:
        """The opponent pool: {"version": [...], "quality": [...], **attributes}, or None without a pool file."""
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


def write_meta(run_dir: str | Path, **fields: Any) -> Path:
    """Write ``meta.json``: git sha and dirty flag, every SLURM_* variable, host, command line, start time, and
    ``fields`` (world size, rank -> role map, transport backend, ...). Replaced atomically."""
    layout = RunLayout(run_dir)
    layout.root.mkdir(parents=True, exist_ok=True)
    meta = {
        **git_state(),
        "start_time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "host": socket.gethostname(),
        "argv": sys.argv,
        "slurm": slurm_environment(),
        **fields,
    }
    write_json_durably(layout.meta, meta)
    return layout.meta


def open_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no run directory at {path}")
    layout = RunLayout(path)
    if not any(p.exists() for p in (layout.meta, layout.metrics, layout.checkpoints)):
        raise FileNotFoundError(f"{path} is not a run directory (no {layout.meta.name}, {layout.metrics.name} or "
                                f"{layout.checkpoints.name}/)")
    return Run(path)
