"""Controller rank: run metadata, every file write, progress output, heartbeats, stop decisions.

    while not finished: receive heartbeats, metrics and checkpoints; write them; watch for silent ranks;
                        turn a signal or the time limit into "stop at version V"

Only the controller writes files (``config.yaml``, ``meta.json``, ``metrics.h5``, ``checkpoints/``, ``pool.h5``,
``summary.json``, ``status.json``; once a failed job's ranks have ended, slurm/train.sbatch adds the failure to
``status.json``). It prints what the user reads (``roles/console.py``): a banner before the first version, one
progress line per published version, and at the end the final evaluation and the summary (``conclude``).

It keeps the opponent pool: every checkpoint retention keeps for good (each ``keep_every``-th version) enters it;
inference ranks report their games against past versions, the controller lowers the beaten versions' qualities and
sends the pool back to them. It keeps the evaluator ranks'
TrueSkill table (``ratings.json``) and writes their ratings to ``metrics.h5``. A rank whose process ended (its
lifeline closed, see ``lifeline.py``), that raised (its last words on the lifeline: the exception) or that was silent
for ``heartbeat_timeout_s`` is named, by number and role, with what it raised, on
stderr, in the log and in ``status.json`` (state ``aborted``), the metrics so far are written, and the job aborted: a
dead or hung rank must not hold an allocation forever, and the user (and slurm/train.sbatch, which requeues a failed
job: ``hpc_rl/failures.py``) must learn which one it was.
"""

from __future__ import annotations

import json
import logging
import os
import shlex
import sys
import time
from collections import deque
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import numpy as np
import yaml

from hpc_rl import metric_names as M
from hpc_rl.config import ResumeError, TrainConfig, build_config, resumable_changes, show_setting, to_yaml
from hpc_rl.evaluation import checkpoint_policies, final_evaluation
from hpc_rl.launch import LAUNCHED
from hpc_rl.league.pool import OpponentPool
from hpc_rl.league.tournament import RatingBook, rating_line
from hpc_rl.populations import join_sections, merge_metrics, metric_name
from hpc_rl.roles.common import Backoff, StopFlag
from hpc_rl.roles.console import (progress_line, sitting_limit, start_banner, summary_block, time_left, waiting_line,
                                  win_figure)
from hpc_rl.roles.control import ControlEndpoint
from hpc_rl.roles.lifeline import Lifelines
from hpc_rl.roles.protocol import (TAG_ACCOUNTING, TAG_CHECKPOINT, TAG_DONE, TAG_EVALUATION, TAG_HALT, TAG_HEARTBEAT,
                                   TAG_METRICS, TAG_POOL, TAG_POOL_RESULT, TAG_STAGE, TAG_STOP)
from hpc_rl.slurm import RequeueError, requeue, slurm_job_id
from hpc_rl.stats import wilson_interval
from hpc_rl.storage import (Checkpoint, MetricsWriter, commit_checkpoint, load_checkpoint, load_latest,
                            prune_checkpoints, read_pool, write_pool)
from hpc_rl.storage.checkpoint import CheckpointWriteError, checkpoint_name, committed_versions
from hpc_rl.storage.hdf5 import DamagedFileError, set_aside, write_json_durably
from hpc_rl.storage.layout import RunLayout, runs_index
from hpc_rl.storage.metrics import MetricsWriteError
from hpc_rl.storage.run import record_config_changes, write_status
from hpc_rl.storage.runlock import release_run_lock
from hpc_rl.storage.tensorboard import open_export
from hpc_rl.topology import Role, Topology

log = logging.getLogger(__name__)
JOBS = Path(__file__).resolve().parent.parent.parent / "jobs"  # the commands the summary names
# Before a sitting's first version, a line this often says what the job has played: Go's first update waits for
# alphazero.min_positions, minutes of self-play, and a job that prints nothing that long looks hung.
WAITING_LINE_S = 30.0


def open_run_dir(config: TrainConfig, overrides: tuple[str, ...] = ()) -> Checkpoint | None:
    """The controller's start-up, in an MPI job and in one process alike: create the run directory, find the
    checkpoint to resume from, record the settings the resume changes, record the config, and return the checkpoint
    (None for a new run, which gets a line in the runs directory's index).

    A resume may change any setting but those that decide the shapes of the saved state (``SHAPE_KEYS``): these raise
    ResumeError, after the run lock (which the caller holds) is released and before any file of the run is touched."""
    layout = RunLayout.of(config.runs_dir, config.run_name)
    layout.root.mkdir(parents=True, exist_ok=True)
    resume = load_latest(layout.checkpoints)
    if resume is not None:
        try:
            changes = resumable_changes(_trained_settings(resume, layout, config), config.settings(), resume.path)
        except ResumeError:
            release_run_lock(layout.root)
            raise
        if changes:
            record_config_changes(layout.config_changes, resume.version, changes)
            lines = [f"  {key}: {show_setting(old)} -> {show_setting(new)}" for key, old, new in changes]
            text = "\n".join([f"resuming from {resume.path.name} with {len(changes)} changed setting(s), recorded in "
                               f"{layout.config_changes}:", *lines])
            print(text, flush=True)
            log.info("%s", text)
    layout.config.write_text(to_yaml(config))
    if resume is None:
        # One short line appended per new run (O_APPEND: concurrent sweep members do not interleave on a local
        # or Lustre/GPFS filesystem).
        with open(runs_index(config.runs_dir), "a") as index:
            index.write(f"{config.run_name}\t{' '.join(overrides)}\n")
    return resume


def _trained_settings(ckpt: Checkpoint, layout: RunLayout, config: TrainConfig) -> dict:
    """The settings ``ckpt`` was trained with: recorded in the file, or, for a checkpoint written before checkpoints
    held them, those of ``config.yaml`` (the last job's) or of ``config`` where the config hash says they are its."""
    if ckpt.config is not None:
        return ckpt.config
    if layout.config.is_file():
        written = yaml.safe_load(layout.config.read_text())
        try:
            previous = build_config(written) if isinstance(written, dict) else None
        except ValueError:  # written by a version of the code whose settings differ
            previous = None
        # Hashed as the code that wrote config.yaml hashed it: settings added since are left out.
        if previous is not None and previous.config_hash(written) == ckpt.config_hash:
            return previous.settings()
    if config.config_hash() == ckpt.config_hash:
        return config.settings()
    raise ResumeError(f"cannot resume from {ckpt.path}: it records no settings (written before checkpoints held "
                      f"them) and was trained with other ones (config hash {ckpt.config_hash[:12]}, this run's "
                      f"{config.config_hash()[:12]}): resume with the settings it was trained with")


def resume_pool(layout: RunLayout, resume_version: int, pool: OpponentPool, keep_every: int) -> OpponentPool:
    """``pool`` (empty) filled from ``pool.h5``, without versions newer than the resumed one or whose checkpoint is
    gone. A damaged ``pool.h5`` is set aside and the pool rebuilt from what decides its members, the checkpoints
    kept for it (every ``keep_every``-th version up to the resumed one), each entering as a new version does: the
    qualities they had earned are lost, the versions are not."""
    try:
        stored = read_pool(layout.pool) if resume_version >= 0 else None
    except DamagedFileError as err:
        aside = set_aside(layout.pool)
        for version in committed_versions(layout.checkpoints):
            if version <= resume_version and version % keep_every == 0:
                pool.add(version)
        line = (f"pool.h5 is damaged: set aside as {aside.name}; the opponent pool is rebuilt from the checkpoints "
                f"kept for it, {len(pool.versions)} past versions at equal quality ({err})")
        print(line, flush=True)
        log.error(line)
        return pool
    if stored is not None:
        for version, quality in zip(stored[0], stored[1]):
            if version <= resume_version and (layout.checkpoints / checkpoint_name(version)).is_file():
                pool.versions.append(version)
                pool.qualities.append(quality)
        log.info("opponent pool: %d past versions from pool.h5 (%d stored)", len(pool.versions), len(stored[0]))
    return pool


def selfplay_metrics(env: list[dict], seconds: float) -> dict[str, float]:
    """Go's self-play figures from the env ranks' counters (``hpc_rl.roles.go.GoEnvWorker``), since this job
    started."""
    total = {k: float(sum(s.get(k, 0) for s in env)) for k in ("games", "env_steps", "resigned", "black_wins",
                                                              "game_moves", "calibration_would_resign",
                                                              "calibration_false_positives")}
    games = total["games"]
    out = {M.GO_GAMES: games, M.GO_POSITIONS: total["env_steps"],
           M.GO_GAMES_PER_S: games / seconds if seconds > 0 else 0.0,
           M.GO_POSITIONS_PER_S: total["env_steps"] / seconds if seconds > 0 else 0.0}
    if games:
        out[M.GO_RESIGNED] = total["resigned"] / games
        out[M.GO_GAME_LENGTH] = total["game_moves"] / games
        out[M.GO_BLACK_WINS] = total["black_wins"] / games
    thresholds = [s["resign_threshold"] for s in env if s.get("resign_threshold") is not None]
    if thresholds:  # each env rank calibrates its own: their mean, over the ranks where one is in force
        out[M.GO_RESIGN_THRESHOLD] = float(np.mean(thresholds))
    if total["calibration_would_resign"]:
        out[M.GO_RESIGN_FALSE_POSITIVES] = total["calibration_false_positives"] / total["calibration_would_resign"]
    return out


def gating_metrics(inference: list[dict]) -> dict[str, float]:
    """Go's gating figures from the inference ranks' reports (``hpc_rl.roles.go.GoInferenceWorker.gate``), which
    play the same matches and agree: the self-play network's version, matches ended, candidates promoted, the last
    match's score."""
    gated = [s for s in inference if "gate_matches" in s]
    if not gated:
        return {}
    out = {M.GATE_SELFPLAY_VERSION: float(min(s["version"] for s in gated)),
           M.GATE_MATCHES: float(min(s["gate_matches"] for s in gated)),
           M.GATE_PROMOTED: float(min(s["gate_promoted"] for s in gated))}
    scores = [s["gate_score"] for s in gated if s["gate_score"] is not None]
    if scores:
        out[M.GATE_SCORE] = float(np.mean(scores))
    return out


class Controller:
    def __init__(self, config: TrainConfig, topology: Topology, control: ControlEndpoint, run_dir: Path,
                 resume_version: int, stop_flag: StopFlag | None, lifelines: Lifelines | None = None,
                 overrides: tuple[str, ...] = ()):
        """``stop_flag``: the signals that ask for a stop (None: none are watched, as in a run in one process);
        ``lifelines``: the other ranks' connections, closed when their process ends (None in one process);
        ``overrides``: the command line's config overrides (the summary's resume command repeats them)."""
        self.config, self.topology, self.control, self.run_dir = config, topology, control, run_dir
        self.overrides = overrides
        self.resume_version = resume_version
        self.layout = RunLayout(run_dir)
        self.stop_flag = stop_flag
        self.lifelines = lifelines
        # The caller holds the run lock: a metrics.h5 a crashed job left open is recovered.
        self.metrics = MetricsWriter(self.layout.metrics, resume_version=resume_version if resume_version >= 0
                                     else None, recover=True)
        # The run's wall time in its earlier sittings, up to the resumed version (pipeline.max_run_seconds).
        self.run_seconds_before = self.metrics.kept_last(M.RUN_SECONDS) or 0.0
        self.time_limit, self.time_limit_reason = sitting_limit(config.pipeline.max_seconds,
                                                                config.pipeline.max_run_seconds,
                                                                self.run_seconds_before)
        # TensorBoard's view of metrics.h5, when tensorboard is installed: this attempt starts at the next version.
        self.tensorboard = open_export(self.layout.tensorboard, first_version=max(resume_version, 0) + 1)
        if self.tensorboard is None:
            log.info("tensorboard is not installed: TensorBoard export is off (metrics.h5 has every metric; "
                     "python -m hpc_rl.storage.tensorboard exports it later)")
        self.last_seen = {r: time.monotonic() for r in range(1, control.size)}
        self.stats: dict[int, dict] = {}
        self.version = max(resume_version, 0)
        self.committed = resume_version
        self.stop_sent = False
        self.stopped_envs = False
        self.warming_up = config.env.warming_up(self.version)  # env ranks play the curriculum's warm-up
        self.steps_seen = (0, 0)  # env copy-steps, and those under game version 2's rules, at the last version
        self.last_metrics: dict[str, float] = {}  # the latest version's, as written to metrics.h5
        # or "preempted" (USR2: requeue), "cancelled" (TERM) or "time_limit" (pipeline.max_seconds)
        self.stop_reason = "finished"
        self.learners_done: int | None = None
        self.accounting: dict[int, dict] = {}
        self.history: deque[np.ndarray] = deque(maxlen=M.WIN_RATE_WINDOW + 1)
        self.population_history: deque[np.ndarray] = deque(maxlen=M.WIN_RATE_WINDOW + 1)  # the same, per population
        self.started = time.monotonic()
        self.last_line = time.monotonic()  # when the last progress or waiting line was printed
        self.pool = self._load_pool(resume_version) if config.uses_league else None
        # Evaluator ranks: the TrueSkill table (ratings.json, continued on resume) and each committed version's
        # (env steps, wall time), so a rating arriving later is written where its version was trained.
        self.ratings = RatingBook.load(run_dir, resume_version, recover=True) if topology.ranks(Role.EVALUATOR) \
            else None
        self.commit_rows: dict[int, tuple[int, float]] = {}
        self.pool_changed = False
        self.past_games = self.past_score = 0.0  # games against past versions (and the learning side's score) since
        #                                          the last published version
        # With populations (hpc_rl.populations) every population's first learner sends its metrics and checkpoints:
        # a version is written once every population's have arrived, as one row and one checkpoint file.
        self.populations = config.populations
        self.arrived: dict[str, dict[int, dict[int, dict]]] = {"metrics": {}, "checkpoint": {}}

    # --- the opponent pool ------------------------------------------------------------------------------
    def _load_pool(self, resume_version: int) -> OpponentPool:
        league = self.config.league
        return resume_pool(self.layout, resume_version, OpponentPool(latest_fraction=1.0 - league.past_fraction,
                                                                     eta=league.eta),
                           self.config.pipeline.keep_every)

    def _save_pool(self) -> None:
        write_pool(self.layout.pool, self.pool.versions, self.pool.qualities, eta=self.pool.eta,
                   latest_fraction=self.pool.latest_fraction)

    def _save_and_send_pool(self) -> None:
        self._save_pool()
        if self.learners_done is not None:
            return  # inference ranks are stopping; they drain only what was sent before (see run.py)
        message = {"versions": list(self.pool.versions), "qualities": list(self.pool.qualities)}
        for rank in self.topology.ranks(Role.INFERENCE):
            self.control.send(message, rank, TAG_POOL)
        self.pool_changed = False

    def _on_pool_results(self, results: list[tuple[int, float]]) -> None:
        for version, score in results:
            self.past_games += 1
            self.past_score += score
            if score == 1.0 and version in self.pool.versions:
                self.pool.record_win(version)
                self.pool_changed = True

    # --- messages ---------------------------------------------------------------------------------------
    def service(self) -> bool:
        """Handle every pending message; True if any arrived."""
        got = False
        while (received := self.control.receive_any()) is not None:
            got = True
            source, tag, message = received
            self.last_seen[source] = time.monotonic()
            if tag == TAG_HEARTBEAT:
                # A rank waiting on a peer beats without counters: keep its last ones (totals never go back).
                self.stats[source] = {**self.stats.get(source, {}), **message["stats"]}
            elif tag == TAG_METRICS:
                self._on_metrics(*message)
            elif tag == TAG_CHECKPOINT:
                self._on_checkpoint(*message)
            elif tag == TAG_DONE:
                self.learners_done = int(message)
            elif tag == TAG_ACCOUNTING:
                self.accounting[source] = message
            elif tag == TAG_HALT:
                self._on_halt(message)
            elif tag == TAG_POOL_RESULT:
                self._on_pool_results(message)
            elif tag == TAG_EVALUATION:
                self._on_evaluation(message)
        return got

    def _role_stats(self, role: Role) -> list[dict]:
        return [self.stats.get(r, {}) for r in self.topology.ranks(role)]

    @staticmethod
    def _env_clock(env: list[dict]) -> tuple[int, float]:
        """The env ranks' steps so far and the longest of their clocks (their heartbeats' stats): env steps/s."""
        return sum(s.get("env_steps", 0) for s in env), max((s.get("seconds", 0.0) for s in env), default=0.0)

    def _all_populations(self, kind: str, version: int, population: int, message: dict) -> list[dict] | None:
        """Every population's ``kind`` message of ``version`` once the last has arrived (in population order), else
        None; what older versions still wait for will not come (a population skipped it) and is dropped."""
        waiting = self.arrived[kind]
        waiting.setdefault(version, {})[population] = message
        if len(waiting[version]) < self.populations:
            return None
        got = waiting.pop(version)
        for older in [v for v in waiting if v < version]:
            del waiting[older]
        return [got[k] for k in range(self.populations)]

    def _on_metrics(self, version: int, metrics: dict, population: int = 0) -> None:
        per_population = self._all_populations("metrics", version, population, metrics)
        if per_population is None:
            return
        metrics = merge_metrics(per_population)
        self.version = version
        ends_warmup = self.warming_up and not self.config.env.warming_up(version)
        if ends_warmup or version <= self.config.env.share_moves_until():  # the env ranks' game changes with it
            for rank in self.topology.ranks(Role.ENV):
                self.control.send(version, rank, TAG_STAGE)
        if ends_warmup:
            self.warming_up = False
            log.info("version %d: the warm-up is over, env ranks play the scripted bot on the %g-unit map", version,
                     self.config.env.moba.map_size)
        env = self._role_stats(Role.ENV)
        inference = self._role_stats(Role.INFERENCE)
        steps, seconds = self._env_clock(env)
        metrics[M.ENV_STEPS] = float(steps)
        metrics[M.ENV_STEPS_PER_S] = steps / seconds if seconds > 0 else 0.0
        reported = [s for s in inference if "mean_batch" in s]
        if reported:  # nothing is logged before the inference ranks' first report
            metrics[M.INFERENCE_BATCH] = float(np.mean([s["mean_batch"] for s in reported]))
            metrics[M.INFERENCE_PASSES] = float(np.mean([s["passes"] for s in reported]))
            metrics[M.INFERENCE_MS] = float(np.mean([s["infer_ms"] for s in reported]))
        metrics[M.WALL_SECONDS] = time.monotonic() - self.started
        metrics[M.RUN_SECONDS] = self.run_seconds_before + metrics[M.WALL_SECONDS]
        for name, key, ranks in ((M.REQUEST_BYTES, "request_bytes", env),
                                 (M.REQUEST_OBSERVATION_BYTES, "observation_bytes", env),
                                 (M.SEGMENT_BYTES, "segment_bytes", env if self.config.env.is_go else inference),
                                 (M.SEGMENT_OBSERVATION_BYTES, "segment_observation_bytes", inference)):
            metrics[name] = float(sum(s.get(key, 0) for s in ranks))
        totals = np.array([sum(s.get(k, 0) for s in env) for k in ("bot_games", "bot_wins", "games", "returns_sum",
                                                                    "new_bot_games", "new_bot_wins", "lengths_sum")],
                          dtype=np.float64)
        self.history.append(totals)
        # Rates over the last WIN_RATE_WINDOW versions' games: recent enough to follow learning, enough games to mean
        # something.
        games, wins, episodes, returns, new_games, new_wins, lengths = totals - self.history[0]
        if games:
            metrics[M.WIN_RATE_VS_SCRIPTED] = wins / games
            metrics[M.GAMES_VS_SCRIPTED] = games
        if self.config.env.game_version > 1:
            new_steps = sum(s.get("new_version_steps", 0) for s in env)
            last_steps, last_new = self.steps_seen
            if steps > last_steps:
                metrics[M.NEW_VERSION_SHARE] = (new_steps - last_new) / (steps - last_steps)
            metrics[M.NEW_VERSION_SHARE_TARGET] = self.config.env.new_version_share_at(version)
            self.steps_seen = (steps, new_steps)
            if new_games:
                metrics[M.WIN_RATE_VS_SCRIPTED_NEW_VERSION] = new_wins / new_games
                metrics[M.GAMES_VS_SCRIPTED_NEW_VERSION] = new_games
        if episodes and returns:
            metrics[M.EPISODE_RETURN] = returns / episodes
        if self.config.env.is_go:
            metrics.update(selfplay_metrics(env, seconds))
            if self.config.env.go.gating.games:
                metrics.update(gating_metrics(inference))
        if episodes and lengths:
            metrics[M.EPISODE_LENGTH] = lengths / episodes
        if self.populations > 1:  # each population's agents' episodes (env ranks count them per population)
            self.population_history.append(sum((np.asarray(s["population_counts"]) for s in env
                                                if "population_counts" in s), np.zeros((self.populations, 3))))
            for k, (ended, returns, lengths) in enumerate(self.population_history[-1] - self.population_history[0]):
                if ended:
                    metrics[metric_name(k, M.EPISODE_RETURN)] = returns / ended
                    metrics[metric_name(k, M.EPISODE_LENGTH)] = lengths / ended
        if self.pool is not None:
            metrics[M.POOL_SIZE] = float(len(self.pool.versions))
            if self.past_games:
                metrics[M.GAMES_VS_PAST] = self.past_games
                metrics[M.SCORE_VS_PAST] = self.past_score / self.past_games
                self.past_games = self.past_score = 0.0
            if self.pool_changed:
                self._save_and_send_pool()
        now = time.time()
        self.last_metrics = metrics
        self.metrics.log_many(metrics, version=version, step=int(steps), wall_time=now)
        if self.tensorboard is not None:
            self.tensorboard.log_many(metrics, version, wall_time=now)
        self._progress(version, metrics, int(wins), int(games))

    def _progress(self, version: int, m: dict, wins: int, games: int) -> None:
        """One line: the version, the clock against the budget, and the figures that fit the environment (the win
        rate where the scripted bot plays, the episode return on Gymnasium)."""
        figures = [("env", f"{m[M.ENV_STEPS_PER_S]:.0f} steps/s"), ("staleness", f"{m[M.STALENESS_MEAN]:.2f}"),
                   ("reuse", f"{m[M.REUSE]:.2f}"), ("ring", f"{m.get(M.RING_OCCUPANCY, 0):.2f}")]
        if self.config.env.scripted_copies():
            figures.append(("win vs scripted", win_figure(wins, games, *wilson_interval(wins, games))))
        if M.EPISODE_RETURN in m:
            figures.append(("return", f"{m[M.EPISODE_RETURN]:.1f}"))
        if M.EPISODE_LENGTH in m:
            figures.append(("length", f"{m[M.EPISODE_LENGTH]:.1f}"))
        if self.config.env.is_go:
            figures += [("games", f"{m[M.GO_GAMES]:.0f}"), ("policy_loss", f"{m[M.POLICY_LOSS]:.3f}"),
                        ("value_loss", f"{m[M.VALUE_LOSS]:.3f}"), ("ownership_loss", f"{m[M.OWNERSHIP_LOSS]:.3f}")]
        else:
            figures += [("policy_loss", f"{m.get(M.POLICY_LOSS, 0):+.3f}"),
                        ("entropy", f"{m.get(M.ENTROPY, 0):.3f}")]
        elapsed = m[M.WALL_SECONDS]
        left = time_left(elapsed, version, max(self.resume_version, 0), self.config.pipeline.max_versions,
                         self.time_limit)
        line = progress_line(version, elapsed, left, figures)
        print(line, flush=True)
        log.info(line)
        self.last_line = time.monotonic()

    def _on_checkpoint(self, version: int, sections: dict, population: int = 0) -> None:
        if version <= self.committed:
            return
        per_population = self._all_populations("checkpoint", version, population, sections)
        if per_population is None:
            return
        bad = [name for s in per_population for name, value in s["params"].items() if not np.all(np.isfinite(value))]
        if bad:
            log.error("refusing to commit version %d: non-finite parameters %s", version, bad[:5])
            return
        sections = join_sections(per_population)
        # The rows logged so far reach metrics.h5 first: a crash after the commit loses none of the versions a
        # resume will not redo.
        self.metrics.flush()
        path = commit_checkpoint(self.layout.checkpoints, version, sections, self.config.config_hash(),
                                 config=self.config.settings())
        self.committed = version
        prune_checkpoints(self.layout.checkpoints, self.config.pipeline.keep_last, self.config.pipeline.keep_every)
        log.info("committed %s", path.name)
        if self.ratings is not None:
            self.commit_rows[version] = (sum(s.get("env_steps", 0) for s in self._role_stats(Role.ENV)), time.time())
        joins = version % self.config.pipeline.keep_every == 0
        if self.pool is not None and joins and version not in self.pool.versions:
            self.pool.add(version)  # kept for good by retention, so it stays loadable
            log.info("version %d joins the opponent pool (%d past versions)", version, len(self.pool.versions))
            self._save_and_send_pool()

    def _on_evaluation(self, result: dict) -> None:
        """An evaluator rank's games of one version: update the TrueSkill table, write eval/* at that version."""
        version = result["version"]
        if version <= self.ratings.last_version:  # in the table already (a resumed run's evaluator starts after it)
            return
        figures = self.ratings.add(version, result["matches"])
        self.ratings.save()
        step, wall = self.commit_rows.get(version, (0, time.time()))
        self.commit_rows = {v: row for v, row in self.commit_rows.items() if v > version}
        self.metrics.log_many(figures, version=version, step=step, wall_time=wall)
        if self.tensorboard is not None:
            self.tensorboard.log_many(figures, version, wall_time=wall)
        line = rating_line(version, figures)
        print(line, flush=True)
        log.info(line)

    # --- decisions --------------------------------------------------------------------------------------
    def _watch(self) -> None:
        for rank in self.lifelines.ended() if self.lifelines is not None else ():
            words = self.lifelines.last_words.get(rank)
            self._abort_for(rank, f"raised {words}" if words is not None else
                            "died: its process ended (killed by a signal, out of memory or crashed)")
        now = time.monotonic()
        limit = self.config.pipeline.heartbeat_timeout_s
        for rank, seen in self.last_seen.items():
            if now - seen > limit:
                self._abort_for(rank, f"has sent nothing for {now - seen:.0f} s (heartbeat_timeout_s={limit}): it is "
                                      "hung or stopped")

    def _abort_for(self, rank: int, what: str) -> NoReturn:
        """A rank is dead, failed or hung: end the job naming the rank, its role and the checkpoint a resume starts
        from, after writing that into ``status.json`` and the metrics logged so far (the checkpoints are committed
        already)."""

        cause = f"rank {rank} ({self.topology.role_map()[rank]}) {what}"

        def write_status_and_metrics() -> None:
            # The cause first, for the batch script that decides whether to requeue (hpc_rl/failures.py).
            write_status(self.run_dir, "aborted", self.version, committed=self.committed, reason=cause)
            try:
                self.metrics.flush()
            except MetricsWriteError as err:  # the rank's fate is the message; the full filesystem goes to the log
                log.error("%s", err)

        committed = f"version {self.committed}" if self.committed >= 0 else "none"
        self.control.abort(f"{cause}; aborting the job. Last committed checkpoint: {committed}.",
                           last=write_status_and_metrics)

    def _maybe_stop(self) -> None:
        if self.stop_sent:
            return
        reason = None
        if self.stop_flag is not None and self.stop_flag.raised:
            reason = f"signal {self.stop_flag.signum}"
            self.stop_reason = "preempted" if self.stop_flag.come_back else "cancelled"
        elif self.time_limit and time.monotonic() - self.started > self.time_limit:
            reason = self.time_limit_reason
            self.stop_reason = "time_limit"
        if reason:
            target = self.version + 1
            line = f"{reason}: stopping at version {target}"
            held = self._filling()
            if held is not None:  # Go's learners stop at once while their buffers fill (hpc_rl.roles.go)
                line += (f", or at version {self.version} if the learners' replay buffers still hold fewer than "
                         f"alphazero.min_positions ({held:,} of {self.config.alphazero.min_positions:,})")
            log.info("%s", line)
            print(line, flush=True)
            self.control.send(target, self.topology.ranks(Role.LEARNER)[0], TAG_STOP)
            self.stop_sent = True

    def run(self) -> int:
        """Until the learners are done and the final checkpoint is committed; returns the final version."""
        self.start()
        backoff = Backoff(self.config.transport.poll)
        while not self.step():
            backoff.wait()
        return self.learners_done

    def start(self) -> None:
        self._banner()
        if self.pool is not None and self.pool.versions:
            self._save_and_send_pool()

    def _banner(self) -> None:
        if self.stop_flag is None:
            stop = None  # one process: no signal is watched
        elif slurm_job_id() is not None:
            stop = (f"scancel {slurm_job_id()} stops at the next version and commits it; submitting the same job "
                    f"again resumes")
        elif os.environ.get(LAUNCHED):
            stop = "Ctrl-C stops at the next version and commits it; the same command resumes"
        else:  # a plain mpirun ends the job on Ctrl-C; a USR1 to this rank is the stop
            stop = f"kill -USR1 {os.getpid()} stops at the next version and commits it; the same command resumes"
        env = self.config.env
        what = (f"MOBA {env.moba.team_size}v{env.moba.team_size}" if env.is_moba else env.name) + " training"
        resumed = checkpoint_name(self.resume_version) if self.resume_version >= 0 else None
        text = start_banner(self.run_dir.resolve(), self.resume_version, resumed, self.topology.role_map(), what,
                            self.config.pipeline.max_versions, self.time_limit, stop)
        print(text, flush=True)
        log.info("%s", text)

    @contextmanager
    def _aborting_on_write_failure(self):
        """A full filesystem (or a quota) ends the job with one line naming the file and the space it needed; the
        last committed checkpoint stays the one a resume starts from."""
        try:
            yield
        except (CheckpointWriteError, MetricsWriteError) as err:
            self.control.abort(f"{err}. Aborting the job.")

    def step(self) -> bool:
        """Handle what arrived, watch the heartbeats and the stop conditions; True once the learners are done and
        their final version is committed (the other ranks have been told to stop)."""
        with self._aborting_on_write_failure():
            return self._step()

    def _step(self) -> bool:
        self.service()
        # A rank's death comes first: the launcher's TERM to every other rank follows it, and is not a user's stop.
        self._watch()
        self._maybe_stop()
        self._maybe_waiting_line()
        if self.learners_done is not None and not self.stopped_envs:
            for rank in self.topology.ranks(Role.ENV):
                self.control.send(True, rank, TAG_STOP)
            self.stopped_envs = True
        if self.learners_done is not None and self.committed >= self.learners_done:
            # Evaluator ranks stop now; after a finished run they rate its final version first (not after a
            # signal or the time limit, when the job must end soon).
            final = self.learners_done if self.stop_reason == "finished" else None
            for rank in self.topology.ranks(Role.EVALUATOR):
                self.control.send({"rate_final": final}, rank, TAG_STOP)
            return True
        return False

    def _filling(self) -> int | None:
        """In Go, the positions the emptiest learner's buffer holds while it is below ``alphazero.min_positions``
        (by the learners' last heartbeats); else None."""
        if not self.config.env.is_go:
            return None
        held = min((s.get("held", 0) for s in self._role_stats(Role.LEARNER)), default=0)
        return held if held < self.config.alphazero.min_positions else None

    def _maybe_waiting_line(self) -> None:
        """Before this sitting's first version, every ``WAITING_LINE_S``: the env ranks' rate and, in Go, the games
        played and the positions the emptiest learner's buffer holds against ``alphazero.min_positions``."""
        now = time.monotonic()
        if self.last_metrics or self.learners_done is not None or now - self.last_line < WAITING_LINE_S:
            return
        self.last_line = now
        env = self._role_stats(Role.ENV)
        steps, seconds = self._env_clock(env)
        figures = [("env", f"{steps / seconds:.0f} steps/s" if seconds > 0 else "n/a")]
        held = self._filling()
        if held is not None:
            figures += [("games", f"{sum(s.get('games', 0) for s in env):.0f}"),
                        ("replay", f"{held:,} of {self.config.alphazero.min_positions:,} positions before the "
                                   "first update")]
        line = waiting_line(self.version, now - self.started, figures)
        print(line, flush=True)
        log.info(line)

    def _on_halt(self, reason: str) -> None:
        """The learners halted on non-finite losses and wait for the end: write the metrics so far (the skipped
        updates are counted there as train/nonfinite_skipped) and the status, then abort the job, so it ends
        non-zero and a scheduler does not take it for finished."""
        self.metrics.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        write_status(self.run_dir, "halted_nonfinite", self.version, committed=self.committed, reason=reason)
        self.control.abort(f"{reason}. Last committed checkpoint: version {self.committed}. Aborting the job.")

    def finish(self) -> None:
        with self._aborting_on_write_failure():
            self.metrics.close()
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.pool is not None and self.pool.versions:
            self._save_pool()  # the latest qualities (the ranks have stopped)
        # The inference ranks put the segments; in Go the env ranks put the games.
        producers = self.topology.ranks(Role.ENV if self.config.env.is_go else Role.INFERENCE)
        produced = sorted(tuple(i) for r in producers for i in self.accounting.get(r, {}).get("produced", []))
        consumed = sorted(tuple(i) for r in self.topology.ranks(Role.LEARNER)
                          for i in self.accounting.get(r, {}).get("consumed", []))
        left = sorted(tuple(i) for r in self.topology.ranks(Role.LEARNER)
                      for i in self.accounting.get(r, {}).get("left", []))
        summary = {"produced": produced, "consumed": consumed, "left": left,
                   "version": self.learners_done, "seconds": time.monotonic() - self.started}
        self.layout.accounting.write_text(json.dumps(summary))
        self._write_status(self.stop_reason)
        log.info("segments produced %d, consumed %d, left unconsumed %d", len(produced), len(consumed), len(left))

    def conclude(self, evaluate: bool) -> dict:
        """After ``finish``: the final evaluation of the last committed version (``evaluate``, when the run
        finished or met its time limit: after a signal the job must end soon), then the summary, printed and
        written to ``summary.json``; the run lock is released last. Returns the summary."""
        final, note = None, None
        games = self.config.pipeline.final_eval_games
        if not evaluate:
            note = "the serial runner does not evaluate"
        elif not games:
            note = "pipeline.final_eval_games=0"
        elif self.stop_reason not in ("finished", "time_limit"):
            note = "stopped by a signal: the job ends without it"
        elif self.committed < 0:
            note = "no committed checkpoint"
        else:
            path = self.layout.checkpoints / checkpoint_name(self.committed)
            ckpt = load_checkpoint(path)
            what = ("games against the scripted bot" if self.config.env.is_moba else
                    "worlds' lifetimes, the policy's and the random bot's" if self.config.env.is_nmmo else
                    "greedy episodes")
            print(f"final evaluation of version {self.committed}: {games} {what}", flush=True)
            final = final_evaluation(checkpoint_policies(ckpt, self.config), self.config, games)
        summary = self._summary(final, note)
        write_json_durably(self.layout.summary, summary)
        text = summary_block(summary)
        print(text, flush=True)
        log.info("%s", text)
        release_run_lock(self.run_dir)
        return summary

    def _summary(self, final: dict | None, note: str | None) -> dict:
        """summary.json's content: how the run ended, the final evaluation, its files, the next commands."""
        root = self.run_dir.resolve()
        layout = RunLayout(root)
        files = {"run_dir": root, "checkpoints": layout.checkpoints}
        if self.committed >= 0:
            files["last_checkpoint"] = layout.checkpoints / checkpoint_name(self.committed)
        files["metrics"] = layout.metrics
        if layout.tensorboard.is_dir():
            files["tensorboard"] = layout.tensorboard
        if layout.replay.is_file():
            files["replay"] = layout.replay
        files["logs"] = layout.logs
        files["summary"] = layout.summary
        python, evaluate, ladder = (_shortest(Path(p)) for p in (sys.executable, JOBS / "evaluate.py",
                                                                  JOBS / "go_ladder.py"))
        commands = [f"tensorboard --logdir {layout.tensorboard}" if layout.tensorboard.is_dir() else
                    f"{python} -m hpc_rl.storage.tensorboard {root}   # TensorBoard event files, then tensorboard"]
        if self.config.env.is_go:  # a network plays Go in a ladder of fixed opponents (docs/go.md)
            commands.append(f"{python} {ladder} mctsbot:sec=0.1 --run {root} --versions {max(self.committed, 0)} "
                            f"--net-sec 0.1 --net-leaves 8 --games 100 --out {root / 'ladder'}   # the last "
                            f"checkpoint against OpenSpiel's MCTSBot at equal time a move")
        else:
            commands.append(f"{python} {evaluate} {root} --games 400   # evaluate the last checkpoint")
        if self.config.env.is_moba:
            commands.append(f"{python} -m hpc_rl.envs.render --run {root} --out {root}   # a replay GIF vs the "
                            f"scripted bot")
        commands.append(self._resume_command(python))
        version = self.learners_done if self.learners_done is not None else self.version  # closed early
        # Where each network-running role ran, as its ranks reported it (a GPU named by torch, or cpu).
        devices = {role.value: [s.get("device") for s in self._role_stats(role)]
                   for role in (Role.INFERENCE, Role.LEARNER)}
        return {"run_name": self.config.run_name, "state": self.stop_reason, "version": version,
                "seconds": time.monotonic() - self.started,
                # What a resume counts against pipeline.max_run_seconds: the run's time up to its last version.
                "run_seconds": self.last_metrics.get(M.RUN_SECONDS, self.run_seconds_before), "devices": devices,
                "final_eval": final, "final_eval_note": note,
                "files": {name: str(path) for name, path in files.items()}, "next": commands}

    def _resume_command(self, python: str) -> str:
        """The command that resumes this run (raise ``pipeline.max_versions`` to train past a finished one)."""
        if self.stop_flag is None:
            return f"# resume: SerialRunner(config) with run_name={self.config.run_name}"
        if slurm_job_id() is not None:
            return f"# resume: submit the same job again (run_name={self.config.run_name})"
        keep = [o for o in self.overrides if not o.startswith(("run_name=", "runs_dir="))]
        runs_dir = Path(self.config.runs_dir)
        where = [f"run_name={self.config.run_name}"] + ([] if runs_dir == Path("runs") else [f"runs_dir={runs_dir}"])
        command = [python, "-m", "hpc_rl.launch", str(self.control.size), _shortest(JOBS / "train.py"), *where, *keep]
        return " ".join(map(shlex.quote, command)) + "   # resume (past the last version: raise pipeline.max_versions)"

    def _write_status(self, state: str) -> None:
        write_status(self.run_dir, state, self.learners_done)

    def requeue(self) -> None:
        """After USR2 (Slurm's preemption or time-limit warning): put this job back in the queue, where it will
        resume from the checkpoint just committed. Called once every rank has finished with MPI, since a requeue
        ends the running job. A TERM received since (a ``scancel``) cancels the requeue. Raises RequeueError,
        after writing it into ``status.json``, when Slurm refuses."""
        if self.stop_reason != "preempted" or not self.config.pipeline.requeue:
            return
        job = slurm_job_id()
        if job is None:
            log.info("stopped by a signal outside Slurm: not requeued")
            return
        if not self.stop_flag.come_back:
            print(f"SIGTERM after the preemption signal: Slurm job {job} is not requeued", flush=True)
            return
        try:
            requeue(job)
        except RequeueError as e:
            if not self.stop_flag.come_back:  # a scancel meanwhile kills every process of the job, scontrol too
                print(f"SIGTERM while requeueing: Slurm job {job} is not requeued", flush=True)
                return
            self._write_status("requeue_failed")
            err = RequeueError(f"{e}; the run stopped at version {self.learners_done} and resumes from it when "
                               f"the same job is submitted again")
            log.error("%s", err)
            raise err from e
        print(f"requeued Slurm job {job}; it resumes from version {self.learners_done}", flush=True)


def _shortest(path: Path) -> str:
    """``path`` relative to the working directory when it lies below it, else absolute."""
    relative = os.path.relpath(path)
    return str(path) if relative.startswith("..") else relative
