"""Evaluator rank: rates every new committed checkpoint against the reference agents; the controller keeps the table.

    while not stopped: v = the newest committed version not yet rated
                       play evaluation.games games of v against random, then against the frozen scripted bot
                       send the results to the controller (TAG_EVALUATION), which updates TrueSkill and writes eval/*

The evaluator only reads: it lists ``checkpoints/`` and loads a committed file (committed files are complete: a
commit is an ``os.replace``; a file pruned before it is loaded is skipped). When it falls behind, the versions
committed while it played are skipped for the newest one, so its figures follow training rather than lag further
and further. It beats while it plays (a game may last thousands of steps) and leaves a game at once when the
controller says stop. ``Evaluator(config, run_dir).rate(version)`` works without MPI.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path

from hpc_rl.config import TrainConfig
from hpc_rl.envs.scripted import scripted_bot_hash
from hpc_rl.evaluation import play_match, policy_from_checkpoint
from hpc_rl.league.tournament import REFERENCES, last_rated_version, pair_seed, version_name
from hpc_rl.storage import CheckpointError, load_checkpoint
from hpc_rl.storage.checkpoint import checkpoint_name, committed_versions
from hpc_rl.storage.layout import RunLayout

log = logging.getLogger(__name__)
IDLE_SLEEP_S = 0.05  # between looks for new work: an idle evaluator costs ~nothing, a stop waits at most this long
LOOK_EVERY_S = 1.0  # between listings of checkpoints/ (a directory listing is not free on a parallel filesystem)


class Stopped(Exception):
    """The controller said stop while a game was being played."""


class Evaluator:
    """Rates committed versions of the run in ``run_dir``; ``link`` (a ControlLink) only for ``run``."""

    def __init__(self, config: TrainConfig, run_dir: str | Path, link=None, resume_version: int = -1):
        if not config.env.is_moba:
            raise ValueError("evaluator ranks rate MOBA policies against the reference bots")
        self.config = config
        self.checkpoints = RunLayout(run_dir).checkpoints
        self.link = link
        # A resumed run carries on after the last version its table holds (ratings.json, read only).
        self.last_rated = last_rated_version(run_dir, resume_version)
        self.refused: set[int] = set()
        self.rated = 0
        self.skipped = 0  # committed versions passed over for a newer one
        self.bot_hash = scripted_bot_hash()

    def next_version(self) -> int | None:
        """The newest committed version newer than the last one rated (None if there is none)."""
        fresh = [v for v in committed_versions(self.checkpoints) if v > self.last_rated and v not in self.refused]
        if len(fresh) > 1:
            self.skipped += len(fresh) - 1
            log.info("skipping version(s) %s for the newest, %d", fresh[:-1], fresh[-1])
        return fresh[-1] if fresh else None

    def rate(self, version: int, on_step: Callable[[], None] | None = None) -> dict | None:
        """Play ``version`` against every reference: ``{"version", "matches": {reference: play_match result}, ...}``,
        or None when its checkpoint is gone (pruned) or does not verify."""
        try:
            ckpt = load_checkpoint(self.checkpoints / checkpoint_name(version))
        except CheckpointError as err:  # a pruned (missing) file is one too
            log.warning("version %d not rated: %s", version, err)
            self.refused.add(version)
            return None
        policy = policy_from_checkpoint(ckpt, self.config)
        ev = self.config.evaluation
        started = time.monotonic()
        matches = {ref: play_match(policy, ref, self.config, ev.games, pair_seed(ev.seed, version_name(version), ref),
                                   ev.deterministic, on_step=on_step)
                   for ref in REFERENCES}
        self.last_rated = version
        self.rated += 1
        seconds = time.monotonic() - started
        log.info("version %d rated in %.1f s: %s", version, seconds,
                 ", ".join(f"{m['wins']}/{m['draws']}/{m['losses']} vs {ref}" for ref, m in matches.items()))
        return {"version": version, "matches": matches, "seconds": seconds, "scripted_hash": self.bot_hash}

    def _stats(self) -> dict:
        return {"rated": self.rated, "skipped": self.skipped, "last_rated": self.last_rated}

    def run(self) -> None:
        """Under MPI: rate new versions until the controller says stop, then the run's final version if it asks."""
        from hpc_rl.roles.protocol import TAG_EVALUATION, TAG_STOP

        stop = None

        def between_steps() -> None:
            nonlocal stop
            self.link.beat(self._stats())
            stop = self.link.receive(TAG_STOP)
            if stop is not None:
                raise Stopped

        next_look = 0.0
        while True:
            stop = self.link.receive(TAG_STOP)
            if stop is not None:
                break
            if time.monotonic() >= next_look:
                next_look = time.monotonic() + LOOK_EVERY_S
                version = self.next_version()
                if version is not None:
                    try:
                        result = self.rate(version, on_step=between_steps)
                    except Stopped:
                        log.info("stopped while rating version %d (left unrated)", version)
                        break
                    if result is not None:
                        self.link.send(result, TAG_EVALUATION)
                    continue
            self.link.beat(self._stats())
            time.sleep(IDLE_SLEEP_S)
        final = stop.get("rate_final")
        if final is not None and final > self.last_rated:  # the controller committed it before saying stop
            result = self.rate(final, on_step=lambda: self.link.beat(self._stats()))
            if result is not None:
                self.link.send(result, TAG_EVALUATION)
        log.info("evaluator stopping: %d versions rated, %d skipped", self.rated, self.skipped)
        self.link.beat(self._stats(), force=True)
