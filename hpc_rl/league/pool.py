"""OpenAI Five's opponent pool (appendix H): 80% of games against the latest policy, 20% against past versions.

A past version is drawn with probability ``p = softmax(q)`` over quality scores ``q``. A version entering the pool
gets the pool's maximum quality, so a new version is tried soon; when the current policy beats past version ``i``,
``q_i <- q_i - eta / (N p_i)`` (N past versions). Dividing by ``N p_i`` makes the expected decrease per game the same
for every version however often it is drawn, so only the win rate against it, not its draw frequency, lowers its
quality.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

LATEST = -1  # the opponent id meaning "the current policy" (self-play against itself)


def softmax(q: np.ndarray) -> np.ndarray:
    z = np.exp(q - q.max())
    return z / z.sum()


def quality_after_win(q: np.ndarray, i: int, eta: float) -> np.ndarray:
    """Qualities after the current policy beat past version at index ``i``: ``q_i - eta / (N p_i)``."""
    p = softmax(q)
    out = q.copy()
    out[i] -= eta / (len(q) * p[i])
    return out


def admit(drawn: int, in_play: Sequence[int], bound: int) -> int:
    """The opponent of a game starting now, whose draw from the pool was ``drawn``, on an inference rank whose other
    games play the past versions ``in_play`` (in the order they were admitted, oldest first).

    The draw stands when it is the latest policy, already in play, or when fewer than ``bound`` versions are in play;
    otherwise the game plays the version admitted last. Each distinct past version in play costs the inference rank
    one more forward pass per step (~2 ms on a CPU, most of it per-call overhead), so without a bound that cost grew
    with the pool and the copies per rank, and env throughput fell over a run. Joining the newest version lets the
    older ones finish their games and leave, so a fresh draw is admitted about once per game length and, over a run,
    past versions are still played in proportion to the pool's probabilities.
    """
    if bound < 1:
        raise ValueError(f"bound must be >= 1, got {bound}")
    if drawn == LATEST or drawn in in_play or len(in_play) < bound:
        return drawn
    return in_play[-1]


class VersionsInPlay:
    """The past versions one inference rank's games play, in the order they were admitted, at most ``bound``."""

    def __init__(self, bound: int):
        self.bound = bound
        self.admitted: list[int] = []

    def opponent(self, drawn: int, playing: set[int]) -> int:
        """The opponent of a game starting now (``admit``); ``playing``: the past versions its other games play."""
        self.admitted = [v for v in self.admitted if v in playing]
        version = admit(drawn, self.admitted, self.bound)
        if version != LATEST and version not in self.admitted:
            self.admitted.append(version)
        return version


@dataclass
class OpponentPool:
    """Past policy versions with quality scores; ``sample`` picks the opponent of one game."""

    latest_fraction: float = 0.8  # games against the current policy
    eta: float = 0.01  # quality learning rate
    versions: list[int] = field(default_factory=list)
    qualities: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not 0.0 <= self.latest_fraction <= 1.0:
            raise ValueError(f"latest_fraction must be in [0, 1], got {self.latest_fraction}")
        if self.eta <= 0:
            raise ValueError(f"eta must be > 0, got {self.eta}")
        if len(self.versions) != len(self.qualities):
            raise ValueError("versions and qualities differ in length")

    def add(self, version: int) -> None:
        if version in self.versions:
            raise ValueError(f"version {version} is already in the pool")
        self.qualities.append(max(self.qualities, default=0.0))
        self.versions.append(version)

    def probabilities(self) -> np.ndarray:
        return softmax(np.asarray(self.qualities, dtype=np.float64))

    def sample(self, rng: np.random.Generator) -> int:
        """The opponent of one game: ``LATEST`` or a past version id."""
        if not self.versions or rng.random() < self.latest_fraction:
            return LATEST
        return self.versions[rng.choice(len(self.versions), p=self.probabilities())]

    def record_win(self, version: int) -> None:
        """The current policy beat past ``version``: lower its quality."""
        i = self.versions.index(version)
        self.qualities = quality_after_win(np.asarray(self.qualities, dtype=np.float64), i, self.eta).tolist()
