"""Every file of a run directory, and the runs directory's index, named once.

    runs/                      the runs directory (``runs_dir``); a Hydra sweep's members share one
      index.tsv                one line per new run: its name and the command line's overrides
      <run_name>/              ``RunLayout``
        lock  config.yaml  config_changes.jsonl  meta.json  metrics.h5  checkpoints/  pool.h5  ratings.json
        status.json  accounting.json
        summary.json  replay.gif  logs/rank_<k>.log  tensorboard/  <job>.json (a job's report, e.g. vs_scripted.json)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

INDEX_FILE = "index.tsv"


def runs_index(runs_dir: str | Path) -> Path:
    """The runs directory's index of runs (and a sweep directory's of its members)."""
    return Path(runs_dir) / INDEX_FILE


@dataclass(frozen=True, init=False)
class RunLayout:
    """The files of one run directory."""

    root: Path

    def __init__(self, root: str | Path):
        object.__setattr__(self, "root", Path(root))

    @classmethod
    def of(cls, runs_dir: str | Path, run_name: str) -> RunLayout:
        return cls(Path(runs_dir) / run_name)

    @property
    def lock(self) -> Path:
        """Who writes the run now (``hpc_rl.storage.runlock``): host, pid, Slurm job id, start time."""
        return self.root / "lock"

    @property
    def config(self) -> Path:
        """The run's TrainConfig as YAML (what a resumed or evaluated run is rebuilt from)."""
        return self.root / "config.yaml"

    @property
    def config_changes(self) -> Path:
        """The settings each resume changed: one JSON line per setting (version, key, old, new, time), appended."""
        return self.root / "config_changes.jsonl"

    @property
    def evaluations(self) -> Path:
        """Every ``jobs/evaluate.py`` result: one JSON line per checkpoint evaluated (version, seed, the result),
        appended; an evaluation recorded already with the same games, seed and opponent is not played again."""
        return self.root / "evaluations.jsonl"

    @property
    def meta(self) -> Path:
        """Who ran it: world size, roles, transport, config hash, the version it resumed from."""
        return self.root / "meta.json"

    @property
    def metrics(self) -> Path:
        """Every metric by version (``MetricsWriter``)."""
        return self.root / "metrics.h5"

    @property
    def checkpoints(self) -> Path:
        """Committed checkpoints, one HDF5 file per version (``checkpoint_name``)."""
        return self.root / "checkpoints"

    @property
    def pool(self) -> Path:
        """The opponent pool's versions and qualities."""
        return self.root / "pool.h5"

    @property
    def ratings(self) -> Path:
        """The controller's TrueSkill table, so that a resumed run continues it."""
        return self.root / "ratings.json"

    @property
    def status(self) -> Path:
        """How the run's latest job ended (finished, preempted, cancelled, requeue_failed, time_limit,
        halted_nonfinite, aborted; requeued_after_failure or failed) and the failures of its jobs."""
        return self.root / "status.json"

    @property
    def summary(self) -> Path:
        """How a job ended, its final evaluation, where its files are, the next commands (``Controller.conclude``)."""
        return self.root / "summary.json"

    @property
    def replay(self) -> Path:
        """An animated GIF of a game played by the run's checkpoint (``python -m hpc_rl.envs.render --run``)."""
        return self.root / "replay.gif"

    def replay_buffer(self, learner: int) -> Path:
        """A Go learner's replay buffer, written at its checkpoints and read when the run resumes
        (``hpc_rl.storage.replay_buffer``)."""
        return self.root / "replay_buffer" / f"learner{learner}.h5"

    @property
    def accounting(self) -> Path:
        """Segment ids produced, consumed and left at the stop (exactly-once accounting)."""
        return self.root / "accounting.json"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"rank_{rank}.log"

    @property
    def tensorboard(self) -> Path:
        """TensorBoard's view of metrics.h5."""
        return self.root / "tensorboard"

    def report(self, job: str) -> Path:
        """A job's JSON report (``jobs/<job>.py``)."""
        return self.root / f"{job}.json"
