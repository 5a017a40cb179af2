"""Hyperparameters as functions of the policy version (learning rate, entropy coefficient, team spirit, γ).

Every learner knows the version, so every learner computes the same value without exchanging it, and a run
resumed from a checkpoint continues the schedule where it left off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

KINDS = ("constant", "linear", "cosine", "exponential")


@dataclass(frozen=True)
class Schedule:
    """A value that moves from ``start`` to ``end`` over ``versions`` policy versions, then stays at ``end``."""

    start: float
    end: float | None = None  # None: equal to start (a constant)
    versions: int = 1  # the version at which ``end`` is reached
    kind: str = "linear"  # one of KINDS; "exponential" interpolates log-linearly (start and end > 0)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"schedule kind {self.kind!r} is not one of {KINDS}")
        if self.kind == "constant" and self.end is not None and self.end != self.start:
            # A config that overrides start and end of a default constant schedule, but not its kind, would
            # otherwise train at ``start`` throughout without a word.
            raise ValueError(f"a constant schedule stays at start={self.start}, but end={self.end} was given: set "
                             f"kind to one of {KINDS[1:]} to move from start to end")
        if self.versions < 1:
            raise ValueError(f"schedule versions must be >= 1, got {self.versions}")
        if self.kind == "exponential" and (self.start <= 0 or (self.end is not None and self.end <= 0)):
            raise ValueError(f"an exponential schedule needs start and end > 0, got {self.start}, {self.end}")

    def __str__(self) -> str:
        """``constant 0.001``, ``linear 0.001 to 0.0 by version 400``: how a change of schedule is printed."""
        if self.kind == "constant":
            return f"constant {self.start}"
        return f"{self.kind} {self.start} to {self.start if self.end is None else self.end} by version {self.versions}"

    def __call__(self, version: int) -> float:
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        end = self.start if self.end is None else self.end
        if self.kind == "constant":
            return self.start
        frac = min(version / self.versions, 1.0)
        if self.kind == "linear":
            return self.start + frac * (end - self.start)
        if self.kind == "cosine":
            return end + 0.5 * (self.start - end) * (1.0 + math.cos(math.pi * frac))
        return self.start * (end / self.start) ** frac


def constant(value: float) -> Schedule:
    return Schedule(value, kind="constant")
