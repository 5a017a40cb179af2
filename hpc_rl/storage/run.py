"""Reading a run directory for analysis (no MPI, no torch needed).

    run = open_run("runs/my_run")
    run.config, run.meta                 # config.yaml and meta.json as dicts
    run.metrics["train/policy_loss"]     # structured array (version, step, wall_time, value)
    run.checkpoint_versions              # committed versions, ascending
    run.load_checkpoint()                # the verified latest one (falls back past corrupt files)
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hpc_rl.storage.checkpoint import Checkpoint, checkpoint_name, committed_versions, load_checkpoint, load_latest
from hpc_rl.storage.metrics import read_metrics

CONFIG_FILE = "config.yaml"
META_FILE = "meta.json"
METRICS_FILE = "metrics.h5"
POOL_FILE = "pool.h5"
CHECKPOINT_DIR = "checkpoints"
LOG_DIR = "logs"


@dataclass
class Run:
    path: Path

    @property
    def config(self) -> dict[str, Any]:
        p = self.path / CONFIG_FILE
        return yaml.safe_load(p.read_text()) if p.exists() else {}

    @property
    def meta(self) -> dict[str, Any]:
        p = self.path / META_FILE
        return json.loads(p.read_text()) if p.exists() else {}

    @property
    def metrics(self) -> dict[str, Any]:
        return read_metrics(self.path / METRICS_FILE)

    @property
    def checkpoint_versions(self) -> list[int]:
        return committed_versions(self.path / CHECKPOINT_DIR)

    def load_checkpoint(self, version: int | None = None) -> Checkpoint | None:
        directory = self.path / CHECKPOINT_DIR
        if version is None:
            return load_latest(directory)
        return load_checkpoint(directory / checkpoint_name(version))


def open_run(path: str | Path) -> Run:
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"no run directory at {path}")
    if not any((path / name).exists() for name in (META_FILE, METRICS_FILE, CHECKPOINT_DIR)):
        raise FileNotFoundError(f"{path} is not a run directory (no {META_FILE}, {METRICS_FILE} or {CHECKPOINT_DIR}/)")
    return Run(path)
