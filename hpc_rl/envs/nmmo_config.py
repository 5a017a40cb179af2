"""The settings of ``nmmo`` (``NmmoConfig``) and the names they share with its kernels, without numba or torch.

``hpc_rl.config`` builds and checks a run's configuration from this module alone; ``hpc_rl.envs.nmmo`` imports it and
compiles the world. The numbers the Neural MMO v1.3 paper gives are its defaults (10 food, water and health at spawn,
one food and one water lost per tick, health regained above half of both, spawning one agent per tick up to 128, a
15x15 view, −1 at death); the others are choices, listed with their reasons in docs/nmmo.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hpc_rl.envs.api import AGENT_DONE, EntitySpec, EnvSpec, StepInfo
from hpc_rl.populations import slot_population

# Tile materials. Grass, scrub (a forest already eaten, regrowing), forest and lava may be entered; lava kills.
MATERIALS = ("lava", "water", "grass", "scrub", "forest", "stone")
LAVA, WATER, GRASS, SCRUB, FOREST, STONE = range(6)
# The materials the tile crop shows, one channel each (grass is the crop's zero), then the other agents on the tile.
CROP_MATERIALS = (LAVA, WATER, SCRUB, FOREST, STONE)
CROP_CHANNELS = len(CROP_MATERIALS) + 1

# The move head: stay or one tile in a compass direction (y grows southwards, as the rows of the tile map).
MOVES = ("stay", "north", "east", "south", "west")
MOVE_DY = (0, -1, 0, 1, 0)
MOVE_DX = (0, 0, 1, 0, -1)
# The primary head is the attack style; every style and ``none`` move with the move head.
STYLES = ("none", "melee", "range", "mage")
S_NONE, S_MELEE, S_RANGE, S_MAGE = range(4)

# Skills (levels 1..MAX_LEVEL, gained by use through the RuneScape experience curve).
SKILLS = ("constitution", "melee", "range", "mage", "defense", "hunting", "fishing")
SK_CONSTITUTION, SK_MELEE, SK_RANGE, SK_MAGE, SK_DEFENSE, SK_HUNTING, SK_FISHING = range(7)
MAX_LEVEL = 99

REWARD_EVENTS = ("death", "alive", "food", "water")
EV_DEATH = REWARD_EVENTS.index("death")
EV_ALIVE = REWARD_EVENTS.index("alive")
EV_FOOD = REWARD_EVENTS.index("food")
EV_WATER = REWARD_EVENTS.index("water")
# The paper's reward: -1 at death, 0 otherwise. ``alive`` (1 for every tick lived) is the optional survival shaping;
# ``food`` and ``water`` are the change over the tick of Φ = food (water) / its maximum, 0 once dead: potential-based
# shaping (Ng, Harada & Russell 1999, with γ = 1), whose sum over a lifetime is −1 whatever the agent did, so it
# leaves the best policy as it is and only moves the reward of eating and drinking to the tick it happens.
DEFAULT_REWARD_WEIGHTS = {"death": -1.0, "alive": 0.0, "food": 0.0, "water": 0.0}

AGENT_FEATURES = 15
SELF_FEATURES = 20


@dataclass(frozen=True)
class NmmoConfig:
    """One world. ``NmmoConfig()`` holds 128 agents on an 80x80 map (64x64 inside the lava)."""

    num_agents: int = 128  # the spawn cap: agent slots per world (the paper's 128)
    map_size: int = 80  # tiles per side, the lava border included
    border: int = 8  # lava rows around the playable square
    vision: int = 7  # view radius in tiles: the crop is (2·vision + 1)² (the paper's 15x15)
    max_seen: int = 32  # agents in view observed as entities, nearest first
    # Terrain: shares of the playable tiles (the spawn ring, all grass, excluded).
    water_share: float = 0.08
    stone_share: float = 0.10
    forest_share: float = 0.30
    terrain_scale: float = 12.0  # tiles per period of the coarsest noise octave
    start_resources: int = 10  # food, water and health at spawn: hunting, fishing and constitution start at this level
    drain: int = 1  # food and water lost per tick
    starve_damage: int = 1  # health lost per tick for each of food and water at zero
    regen: int = 1  # health regained per tick while food and water are both above half
    forest_regrow: float = 0.025  # chance per tick that an eaten forest (scrub) grows back
    immune_ticks: int = 15  # a newly spawned agent can not be attacked for this many ticks
    freeze_ticks: int = 3  # a mage hit holds its target in place this long
    xp_scale: float = 1.0  # experience gained per use, scaled (the paper: the progression time scale is configurable)
    reward_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_REWARD_WEIGHTS))  # per event
    # Populations of agents with unshared policies (the paper trains 8): slot a belongs to population a mod K
    # (``hpc_rl.populations``); every agent spawning into it joins that population. 1: one policy plays every agent.
    populations: int = 1

    def __post_init__(self) -> None:
        if self.num_agents < 1:
            raise ValueError(f"nmmo.num_agents must be >= 1, got {self.num_agents}")
        if self.border < 1:
            raise ValueError(f"nmmo.border must be >= 1, got {self.border}")
        if self.map_size - 2 * self.border < 8:
            raise ValueError(f"nmmo.map_size must leave at least 8 tiles inside the border, got map_size "
                             f"{self.map_size} with border {self.border}")
        if self.vision < 1 or self.max_seen < 1:
            raise ValueError(f"nmmo.vision and nmmo.max_seen must be >= 1, got {self.vision}, {self.max_seen}")
        shares = (self.water_share, self.stone_share, self.forest_share)
        if min(shares) < 0 or sum(shares) >= 1:
            raise ValueError(f"nmmo water, stone and forest shares must be >= 0 and sum below 1, got {shares}")
        if self.terrain_scale <= 1:
            raise ValueError(f"nmmo.terrain_scale must be > 1, got {self.terrain_scale}")
        if not 1 <= self.start_resources <= MAX_LEVEL:
            raise ValueError(f"nmmo.start_resources must be in [1, {MAX_LEVEL}], got {self.start_resources}")
        if min(self.drain, self.starve_damage, self.regen, self.immune_ticks, self.freeze_ticks) < 0:
            raise ValueError("nmmo.drain, starve_damage, regen, immune_ticks and freeze_ticks must be >= 0")
        if not 0 <= self.forest_regrow <= 1:
            raise ValueError(f"nmmo.forest_regrow must be in [0, 1], got {self.forest_regrow}")
        if self.xp_scale < 0:
            raise ValueError(f"nmmo.xp_scale must be >= 0, got {self.xp_scale}")
        if not 1 <= self.populations <= self.num_agents or self.num_agents % self.populations:
            raise ValueError(f"nmmo.populations must be >= 1 and divide nmmo.num_agents ({self.num_agents}), so that "
                             f"every population has as many slots, got {self.populations}")
        if set(self.reward_weights) != set(REWARD_EVENTS):
            raise ValueError(f"nmmo.reward_weights keys {sorted(self.reward_weights)} differ from "
                             f"{sorted(REWARD_EVENTS)}")

    @property
    def crop_side(self) -> int:
        return 2 * self.vision + 1

    @property
    def global_features(self) -> int:
        """The own agent's features, then the tile crop (row-major, ``CROP_CHANNELS`` per tile)."""
        return SELF_FEATURES + self.crop_side ** 2 * CROP_CHANNELS

    def reward_weight_vector(self) -> np.ndarray:
        """The weights in ``REWARD_EVENTS`` order, to dot with ``reward_events``."""
        return np.array([self.reward_weights[k] for k in REWARD_EVENTS], dtype=np.float32)

    def spec(self) -> EnvSpec:
        return EnvSpec(
            num_agents=self.num_agents,
            agent_team=slot_population(self.num_agents, self.populations),  # each slot's population
            global_features=self.global_features,
            num_actions=len(STYLES),
            num_moves=len(MOVES),
            entities=(EntitySpec("agents", self.max_seen, AGENT_FEATURES),),
            action_uses_move=(True,) * len(STYLES),  # one move and one attack every tick
            action_uses_target=(False,) + (True,) * (len(STYLES) - 1),
            reward_events=REWARD_EVENTS,
            step_infos=(StepInfo(AGENT_DONE, (), "bool"),),
            agent_episodes=True,  # an agent's episode is its lifetime; the world goes on
            occupied_feature=0,  # ``global`` feature 0: alive (an empty slot observes zeros)
        )
