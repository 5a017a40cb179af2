"""The settings of ``moba`` (``MobaConfig``) and the names they share with its kernels, without numba or torch.

``hpc_rl.config`` builds and checks a run's configuration from this module alone; ``hpc_rl.envs.moba`` imports it and
compiles the game. ``EV_<EVENT>`` is the column of an event in the ``reward_events`` array (E, A, len(REWARD_EVENTS))
that ``MobaEnv.step`` returns; the kernels write every event through its name, so the order of ``REWARD_EVENTS`` is
free.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from hpc_rl.envs.api import EntitySpec, EnvSpec

HERO_TYPES = ("warrior", "marksman", "mage", "assassin")
ACTIONS = ("noop", "move", "attack", "skill")
A_NOOP, A_MOVE, A_ATTACK, A_SKILL = 0, 1, 2, 3
NUM_MOVES = 8
MAX_LEVEL = 15
REWARD_EVENTS = ("hp", "tower_hp", "gold", "mana", "death", "kill", "xp", "last_hit", "win", "loss")
# The column of each event in a reward-event array (..., len(REWARD_EVENTS)).
EV_HP = REWARD_EVENTS.index("hp")
EV_TOWER_HP = REWARD_EVENTS.index("tower_hp")
EV_GOLD = REWARD_EVENTS.index("gold")
EV_MANA = REWARD_EVENTS.index("mana")
EV_DEATH = REWARD_EVENTS.index("death")
EV_KILL = REWARD_EVENTS.index("kill")
EV_XP = REWARD_EVENTS.index("xp")
EV_LAST_HIT = REWARD_EVENTS.index("last_hit")
EV_WIN = REWARD_EVENTS.index("win")
EV_LOSS = REWARD_EVENTS.index("loss")
# Honor of Kings table 6 (kill -0.5 as printed there); win/loss from OpenAI Five's win reward.
DEFAULT_REWARD_WEIGHTS = {"hp": 2.0, "tower_hp": 10.0, "gold": 0.008, "mana": 0.8, "death": -1.0, "kill": -0.5,
                          "xp": 0.008, "last_hit": 0.5, "win": 5.0, "loss": -5.0}

HERO_FEATURES, CREEP_FEATURES, TOWER_FEATURES, BASE_FEATURES, GLOBAL_FEATURES = 19, 12, 11, 9, 24


@dataclass(frozen=True)
class MobaConfig:
    """One MOBA game variant. ``MobaConfig()`` is 1v1 on one lane; ``MobaConfig.five_v_five()`` is 5v5 on three."""

    team_size: int = 1  # heroes per team (one agent each)
    lanes: int = 1  # 1 (the diagonal) or 3 (top, middle, bottom)
    towers_per_lane: int = 2  # towers per team per lane
    map_size: float = 64.0  # side of the square map, in map units (a hero walks ~0.4 per step)
    creep_wave_period: int = 225  # steps between creep waves (30 s at 7.5 decisions per second)
    wave_melee: int = 3  # melee creeps per wave per lane per team
    wave_ranged: int = 1  # ranged creeps per wave per lane per team
    max_waves_alive: int = 3  # creep slots per team = lanes * wave size * this; creeps finding no free slot are not
    # spawned, which caps the units per copy (speed)
    creep_upgrade_waves: int = 2  # creeps grow stronger every this many waves, so that games end
    creep_upgrade: float = 0.2  # added fraction of creep hp and damage per upgrade
    time_limit: int = 9000  # steps until a draw (20 game-minutes)
    hero_pool: tuple[str, ...] = HERO_TYPES  # hero types lineups are drawn from
    randomize_lineup: bool = True  # draw every hero from hero_pool each game (OpenAI Five); else use ``lineup``
    lineup: tuple[str, ...] = ()  # hero type per hero slot when not randomised; empty = hero_pool in turn
    random_start_level: int = 2  # starting level is 1 + uniform{0..this}
    random_start_gold: float = 600.0  # starting gold is uniform[0, this): up to one item bought at once
    mirrored_pairs: bool = False  # copies 2k and 2k+1 play the same draws with sides swapped (fair evaluation)
    target_range: float = 10.0  # how far a hero may pick a target (it walks into reach)
    reward_weights: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_REWARD_WEIGHTS))  # per event

    def __post_init__(self) -> None:
        if self.team_size < 1:
            raise ValueError(f"team_size must be >= 1, got {self.team_size}")
        if self.lanes not in (1, 3):
            raise ValueError(f"lanes must be 1 or 3, got {self.lanes}")
        if self.towers_per_lane < 1:
            raise ValueError(f"towers_per_lane must be >= 1, got {self.towers_per_lane}")
        if self.map_size < 24.0:
            raise ValueError(f"map_size must be >= 24, got {self.map_size}")
        if self.creep_wave_period < 1:
            raise ValueError(f"creep_wave_period must be >= 1, got {self.creep_wave_period}")
        if self.wave_melee < 0 or self.wave_ranged < 0 or self.wave_melee + self.wave_ranged < 1:
            raise ValueError(f"a wave needs at least one creep, got wave_melee={self.wave_melee}, "
                             f"wave_ranged={self.wave_ranged}")
        if self.max_waves_alive < 1:
            raise ValueError(f"max_waves_alive must be >= 1, got {self.max_waves_alive}")
        if self.creep_upgrade_waves < 1 or self.creep_upgrade < 0:
            raise ValueError(f"creep_upgrade_waves must be >= 1 and creep_upgrade >= 0, got "
                             f"{self.creep_upgrade_waves}, {self.creep_upgrade}")
        if self.time_limit < 1:
            raise ValueError(f"time_limit must be >= 1, got {self.time_limit}")
        if not self.hero_pool or any(h not in HERO_TYPES for h in self.hero_pool):
            raise ValueError(f"hero_pool must be a non-empty subset of {HERO_TYPES}, got {self.hero_pool}")
        if self.lineup and (len(self.lineup) != 2 * self.team_size or any(h not in HERO_TYPES for h in self.lineup)):
            raise ValueError(f"lineup must name {2 * self.team_size} heroes from {HERO_TYPES}, got {self.lineup}")
        if self.random_start_level < 0 or self.random_start_level >= MAX_LEVEL:
            raise ValueError(f"random_start_level must be in [0, {MAX_LEVEL}), got {self.random_start_level}")
        if self.random_start_gold < 0:
            raise ValueError(f"random_start_gold must be >= 0, got {self.random_start_gold}")
        if self.target_range <= 0:
            raise ValueError(f"target_range must be > 0, got {self.target_range}")
        if set(self.reward_weights) != set(REWARD_EVENTS):
            raise ValueError(f"reward_weights keys {sorted(self.reward_weights)} differ from {sorted(REWARD_EVENTS)}")

    @classmethod
    def five_v_five(cls, **overrides) -> MobaConfig:
        """5v5 on three lanes, on a larger map."""
        return cls(**{"team_size": 5, "lanes": 3, "map_size": 96.0, **overrides})

    @property
    def creeps_per_team(self) -> int:
        return self.lanes * (self.wave_melee + self.wave_ranged) * self.max_waves_alive

    def reward_weight_vector(self) -> np.ndarray:
        """The weights in ``REWARD_EVENTS`` order, to dot with ``reward_events``."""
        return np.array([self.reward_weights[k] for k in REWARD_EVENTS], dtype=np.float32)

    def spec(self) -> EnvSpec:
        heroes = 2 * self.team_size
        return EnvSpec(
            num_agents=heroes,
            agent_team=tuple(a // self.team_size for a in range(heroes)),
            global_features=GLOBAL_FEATURES,
            num_actions=len(ACTIONS),
            num_moves=NUM_MOVES,
            entities=(EntitySpec("heroes", heroes, HERO_FEATURES),
                      EntitySpec("creeps", 2 * self.creeps_per_team, CREEP_FEATURES),
                      EntitySpec("towers", 2 * self.lanes * self.towers_per_lane, TOWER_FEATURES),
                      EntitySpec("bases", 2, BASE_FEATURES)),
            action_uses_move=(False, True, False, False),
            action_uses_target=(False, False, True, True),
            reward_events=REWARD_EVENTS,
            learning_agents=tuple(range(heroes)),
        )
