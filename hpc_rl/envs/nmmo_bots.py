"""A reference bot for ``nmmo``: the forager, which reads the same observation a learner sees.

Every tick each living agent walks towards the nearest forest in its view when food is its scarcer resource, else
towards the nearest water (Manhattan distance on the crop; the step that shortens the longer axis first, the other
when that one is blocked), and moves at random among the legal moves that do not enter lava when there is none in
view or both steps are blocked. With chance ``aggression`` per tick it attacks the nearest legal target with a
random style among those that reach it. It keeps a world populated for benchmarks and replays; it does not plan around stone or other agents.
"""

from __future__ import annotations

import numpy as np

from hpc_rl.envs.api import Obs
from hpc_rl.envs.nmmo_config import (CROP_CHANNELS, CROP_MATERIALS, FOREST, LAVA, MOVE_DX, MOVE_DY, SELF_FEATURES,
                                     WATER, NmmoConfig)


class Forager:
    """``act(obs)`` answers for every agent of every copy; ``reset(done)`` is part of the actor interface and unused."""

    def __init__(self, config: NmmoConfig, seed: int = 0, aggression: float = 1.0):
        if not 0.0 <= aggression <= 1.0:
            raise ValueError(f"aggression must be in [0, 1], got {aggression}")
        self.config = config
        self.aggression = aggression
        self.rng = np.random.default_rng(seed)
        side = config.crop_side
        offsets = np.arange(side) - config.vision
        self.dy = np.repeat(offsets, side)  # row-major crop cells
        self.dx = np.tile(offsets, side)
        self.manhattan = np.abs(self.dy) + np.abs(self.dx)
        self.forest = CROP_MATERIALS.index(FOREST)
        self.water = CROP_MATERIALS.index(WATER)
        self.lava = CROP_MATERIALS.index(LAVA)
        # The crop cell each move leads to.
        self.step_cell = np.array([(config.vision + dy) * side + config.vision + dx
                                   for dy, dx in zip(MOVE_DY, MOVE_DX)])

    def act(self, obs: Obs) -> dict[str, np.ndarray]:
        g = obs["global"]
        E, A = g.shape[:2]
        crop = g[..., SELF_FEATURES:].reshape(E, A, -1, CROP_CHANNELS)
        thirsty = g[..., 3] < g[..., 2]  # water fraction below food fraction
        wanted = np.where(thirsty[..., None], crop[..., self.water], crop[..., self.forest]) > 0
        distance = np.where(wanted, self.manhattan, 1 << 20)
        best = distance.argmin(-1)
        found = distance.min(-1) < (1 << 20)
        dy, dx = self.dy[best], self.dx[best]
        # Prefer the axis with the longer way; at a water cell's side (distance 1) stay and drink.
        vertical = np.where(dy < 0, 1, 3)
        horizontal = np.where(dx > 0, 2, 4)
        first = np.where(np.abs(dy) >= np.abs(dx), vertical, horizontal)
        second = np.where(np.abs(dy) >= np.abs(dx), horizontal, vertical)
        legal = obs["move_mask"] & (crop[..., self.step_cell, self.lava] == 0)
        legal[..., 0] = True
        take = lambda m: np.take_along_axis(legal, m[..., None], -1)[..., 0]  # noqa: E731
        random_move = self._random_choice(legal)
        move = np.where(take(first) & (np.abs(dy) + np.abs(dx) > 0), first,
                        np.where(take(second) & (np.minimum(np.abs(dy), np.abs(dx)) > 0), second, random_move))
        arrived = found & ((self.manhattan[best] == 0) | (thirsty & (self.manhattan[best] == 1)))
        move = np.where(arrived, 0, np.where(found, move, random_move))
        targets = obs["target_mask"]
        target = targets.argmax(-1)  # the nearest legal one: rows are nearest first
        style = self._random_choice(obs["action_mask"] & np.arange(obs["action_mask"].shape[-1]).astype(bool))
        style = np.where(targets.any(-1) & (self.rng.random((E, A)) < self.aggression), style, 0)
        return {"action": style, "move": move, "target": target}

    def _random_choice(self, mask: np.ndarray) -> np.ndarray:
        """A uniformly random True index of each row of ``mask`` (0 where none is)."""
        keys = self.rng.random(mask.shape) * mask
        return keys.argmax(-1)

    def reset(self, done: np.ndarray) -> None:
        pass
