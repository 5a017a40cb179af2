"""Reference opponents for ``moba``: ``random`` and the frozen ``scripted`` bot, both acting on the learner's Obs.

Both see exactly what a learner sees (the observation dict with fog of war and masks) and act for every agent of every
copy at once, with numpy (no per-copy loop); both are actors (``hpc_rl.actors.Actor``) without memory. The scripted
bot is a fixed reference that later results are measured against: its behaviour is frozen, ``SCRIPTED_VERSION``
names it, and ``scripted_bot_hash()`` is recorded with every evaluation so that two results are comparable only if it
matches. The hash covers what the bot's strength depends on: this file, the game's rules, map layout and observations
(``SCRIPTED_SOURCES``: ``moba.py``, ``moba_config.py``, ``api.py``), the version and the parameters; a run's map
settings (``MobaConfig``) are recorded with its configuration. ``test_scripted_fingerprint`` (in
``tests/test_envs_scripted.py``) pins the behaviour itself: changing it on purpose means a new ``SCRIPTED_VERSION``
(docs/envs.md, "Scripted bot versions").

The scripted heuristic, in priority order for each hero:

1. dead: nothing to do;
2. hurt (hp below ``retreat_hp`` with no weaker enemy hero in reach, or healing at the fountain below
   ``heal_until``): walk home and wait there;
3. an enemy creep dies to one blow: last-hit it;
4. an enemy hero is in reach, not much healthier than the bot (``fight_margin``) and outside its towers' range: fight
   it, with the skill when ready;
5. an enemy structure is attackable and allied creeps are near it (the tower shoots creeps first), or it is the base
   (which does not shoot): push it;
6. enemy creeps are in reach and outside enemy tower range (or allied creeps tank there): farm the weakest;
7. otherwise follow the most advanced allied creep of the hero's lane, or wait at the lane's front tower.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from numba import njit

from hpc_rl.envs.api import Actions, Obs
from hpc_rl.envs.moba import (A_ATTACK, A_MOVE, A_NOOP, A_SKILL, FOUNTAIN_RADIUS, MOVE_DX, MOVE_DY, ROW_TOWER, US_RANGE,
                              UNIT_STATS, MobaConfig, MobaEnv)
from hpc_rl.play import play, team_agents

SCRIPTED_VERSION = 1  # a new one for every change of behaviour on purpose: docs/envs.md, "Scripted bot versions"
_ENVS = Path(__file__).resolve().parent
# The files the bot's behaviour and strength depend on: the bot, the rules and map layout (moba.py), the settings and
# event columns (moba_config.py), the observation layout (api.py).
SCRIPTED_SOURCES = (_ENVS / "scripted.py", _ENVS / "moba.py", _ENVS / "moba_config.py", _ENVS / "api.py")


@dataclass(frozen=True)
class ScriptedParams:
    """The scripted bot's thresholds (hp as fractions of max hp, distances in map units)."""

    retreat_hp: float = 0.25  # walk home below this hp
    heal_until: float = 0.9  # once home, stay until healed to this hp
    fight_margin: float = 0.1  # fight an enemy hero only if its hp fraction is at most ours plus this
    follow_distance: float = 2.0  # stop this close behind the allied creep being followed
    tower_margin: float = 1.0  # a unit within tower range plus this counts as under the tower

    def __post_init__(self) -> None:
        for name in ("retreat_hp", "heal_until"):
            if not 0.0 <= getattr(self, name) <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {getattr(self, name)}")
        for name in ("fight_margin", "follow_distance", "tower_margin"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")


def bot_digest(sources: dict[str, bytes], params: ScriptedParams = ScriptedParams()) -> str:
    """SHA-256 of the named source texts (in name order), the version and the parameters."""
    digest = hashlib.sha256()
    for name in sorted(sources):
        digest.update(f"{name} {len(sources[name])}\n".encode())
        digest.update(sources[name])
    digest.update(json.dumps({"version": SCRIPTED_VERSION, **asdict(params)}, sort_keys=True).encode())
    return digest.hexdigest()


def scripted_bot_hash(params: ScriptedParams = ScriptedParams()) -> str:
    """The identity of the reference opponent: ``bot_digest`` of ``SCRIPTED_SOURCES`` as they are on disk."""
    return bot_digest({path.name: path.read_bytes() for path in SCRIPTED_SOURCES}, params)


def _uniform_choice(mask: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Index of a uniformly drawn True entry along the last axis (0 where a row has none, or the head is empty)."""
    if mask.shape[-1] == 0:
        return np.zeros(mask.shape[:-1], dtype=np.int64)
    keys = np.where(mask, rng.random(mask.shape), -1.0)
    return keys.argmax(axis=-1)


class RandomBot:
    """Uniform over legal actions: the primary action, then the move and target heads, each uniform under its mask."""

    name = "random"

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def act(self, obs: Obs) -> Actions:
        return {"action": _uniform_choice(obs["action_mask"], self.rng),
                "move": _uniform_choice(obs["move_mask"], self.rng),
                "target": _uniform_choice(obs["target_mask"], self.rng)}

    def reset(self, done: np.ndarray) -> None:
        """Nothing to forget: every choice depends on the current observation only."""


class ScriptedBot:
    """The frozen heuristic of the module docstring, for a ``moba`` configuration."""

    name = "scripted"

    def __init__(self, config: MobaConfig, params: ScriptedParams = ScriptedParams()):
        self.config = config
        self.params = params
        self.spec = config.spec()
        self.hash = scripted_bot_hash(params)
        p, size = params, config.map_size
        team_slot = np.arange(self.spec.num_agents) % config.team_size
        # Distances as the observation gives them (divided by map_size); lane as the towers' lane feature.
        self.lane = (team_slot % config.lanes) / max(1, config.lanes - 1)
        self.thresholds = np.array([
            p.retreat_hp, p.heal_until, p.fight_margin, p.follow_distance / size,
            (UNIT_STATS[ROW_TOWER, US_RANGE] + p.tower_margin) / size, FOUNTAIN_RADIUS / size, 2.0 / size,
        ])

    def act(self, obs: Obs) -> Actions:
        E, A = obs["global"].shape[:2]
        action = np.empty((E, A), dtype=np.int64)
        move = np.empty((E, A), dtype=np.int64)
        target = np.empty((E, A), dtype=np.int64)
        _scripted(obs["global"], obs["entities/heroes"], obs["entities/heroes/mask"], obs["entities/creeps"],
                  obs["entities/creeps/mask"], obs["entities/towers"], obs["entities/towers/mask"],
                  obs["entities/bases"], obs["entities/bases/mask"], obs["action_mask"], obs["move_mask"],
                  obs["target_mask"], self.thresholds, self.lane, MOVE_DX, MOVE_DY, action, move, target)
        return {"action": action, "move": move, "target": target}

    def reset(self, done: np.ndarray) -> None:
        """Nothing to forget: the heuristic reads the current observation only."""


@njit(cache=True)
def _under_tower(x, y, towers, tower_m, bases, base_m, reach):
    """Whether (x, y) is within ``reach`` of a seen enemy tower or base."""
    for k in range(towers.shape[0]):
        if tower_m[k] and towers[k, 1] > 0.5 and np.hypot(towers[k, 2] - x, towers[k, 3] - y) <= reach:
            return True
    for k in range(bases.shape[0]):
        if base_m[k] and bases[k, 1] > 0.5 and np.hypot(bases[k, 2] - x, bases[k, 3] - y) <= reach:
            return True
    return False


@njit(cache=True)
def _tanked(sx, sy, creeps, creep_m, reach):
    """Whether an allied creep stands within ``reach`` of the structure at (sx, sy), drawing its fire."""
    for c in range(creeps.shape[0]):
        if creep_m[c] and creeps[c, 0] > 0.5 and np.hypot(creeps[c, 2] - sx, creeps[c, 3] - sy) <= reach:
            return True
    return False


@njit(cache=True)
def _scripted(glob, heroes, hero_m, creeps, creep_m, towers, tower_m, bases, base_m, action_mask, move_mask,
              target_mask, th, lane, move_dx, move_dy, action, move, target):
    retreat_hp, heal_until, fight_margin, follow, reach, fountain, home = (th[0], th[1], th[2], th[3], th[4], th[5],
                                                                          th[6])
    E, A = glob.shape[0], glob.shape[1]
    H, C, T = heroes.shape[2], creeps.shape[2], towers.shape[2]
    for e in range(E):
        for a in range(A):
            g = glob[e, a]
            act, tgt, wx, wy = A_NOOP, 0, 0.0, 0.0
            hp = g[3]
            bdx, bdy = 0.0, 0.0
            for b in range(2):
                if base_m[e, a, b] and bases[e, a, b, 0] > 0.5:
                    bdx, bdy = bases[e, a, b, 4], bases[e, a, b, 5]
            bd = np.hypot(bdx, bdy)
            tm = target_mask[e, a]
            decided = g[2] < 0.5  # 1. dead
            # 2. Retreat and heal at the fountain, unless an enemy hero in reach is weaker still (go for the kill).
            weakest = 2.0
            for h in range(H):
                if tm[h]:
                    weakest = min(weakest, heroes[e, a, h, 8])
            if not decided and ((hp < retreat_hp and weakest >= hp) or (bd <= fountain and hp < heal_until)):
                decided = True
                if bd > home:
                    act, wx, wy = A_MOVE, bdx, bdy
            # 3. Last hits: the weakest enemy creep that dies to one blow.
            if not decided:
                best = 2.0
                for c in range(C):
                    if tm[H + c] and creeps[e, a, c, 10] > 0.5 and creeps[e, a, c, 7] < best:
                        best, act, tgt, decided = creeps[e, a, c, 7], A_ATTACK, H + c, True
            # 4. Fight the weakest enemy hero in reach outside its towers, unless it is much healthier.
            if not decided:
                best = 2.0
                for h in range(H):
                    if (tm[h] and heroes[e, a, h, 8] <= hp + fight_margin and heroes[e, a, h, 8] < best
                            and not _under_tower(heroes[e, a, h, 3], heroes[e, a, h, 4], towers[e, a], tower_m[e, a],
                                                 bases[e, a], base_m[e, a], reach)):
                        best, tgt, decided = heroes[e, a, h, 8], h, True
                        act = A_SKILL if action_mask[e, a, A_SKILL] else A_ATTACK
            # 5. Push the nearest enemy structure that allied creeps tank (a base does not shoot back).
            if not decided:
                best = 1e9
                for k in range(T + 2):
                    row = towers[e, a, k] if k < T else bases[e, a, k - T]
                    if (tm[H + C + k] and row[6] < best
                            and (k >= T or _tanked(row[2], row[3], creeps[e, a], creep_m[e, a], reach))):
                        best, act, tgt, decided = row[6], A_ATTACK, H + C + k, True
            # 6. Farm the weakest enemy creep that is safe to hit.
            if not decided:
                best = 2.0
                for c in range(C):
                    if (tm[H + c] and creeps[e, a, c, 7] < best
                            and not _under_tower(creeps[e, a, c, 2], creeps[e, a, c, 3], towers[e, a], tower_m[e, a],
                                                 bases[e, a], base_m[e, a], reach)):
                        best, act, tgt, decided = creeps[e, a, c, 7], A_ATTACK, H + c, True
            # 7. Follow the allied creep of the own lane that is farthest from the own base, or else wait at the
            # lane's front tower (the base when the lane has fallen).
            best = -1.0
            wx, wy = bdx, bdy
            for c in range(C):
                row = creeps[e, a, c]
                if not decided and creep_m[e, a, c] and row[0] > 0.5 and abs(row[11] - lane[a]) < 1e-3:
                    far = np.hypot(row[4] - bdx, row[5] - bdy)
                    if far > best:
                        best, wx, wy = far, row[4], row[5]
            for k in range(T):
                row = towers[e, a, k]
                if (not decided and best < 0.0 and tower_m[e, a, k] and row[0] > 0.5
                        and abs(row[10] - lane[a]) < 1e-3):
                    far = np.hypot(row[4] - bdx, row[5] - bdy)
                    if far > best:
                        best, wx, wy = far, row[4], row[5]
            if not decided:
                act = A_MOVE if np.hypot(wx, wy) > follow else A_NOOP
            # A legal move closest to the wanted direction.
            best = -2.0
            m = 0
            for k in range(move_dx.shape[0]):
                cos = wx * move_dx[k] + wy * move_dy[k]
                if move_mask[e, a, k] and cos > best:
                    best, m = cos, k
            action[e, a] = act if action_mask[e, a, act] else A_NOOP
            move[e, a] = m
            target[e, a] = tgt


def make_bot(name: str, config: MobaConfig, seed: int = 0) -> RandomBot | ScriptedBot:
    """The reference opponent ``name`` ("random" or "scripted") for ``config``."""
    if name == "random":
        return RandomBot(seed)
    if name == "scripted":
        return ScriptedBot(config)
    raise ValueError(f"unknown bot {name!r}; choose 'random' or 'scripted'")


def play_games(config: MobaConfig, bots: tuple[str, str], num_games: int, seed: int) -> dict:
    """Play ``num_games`` games at once, ``bots[0]`` as team 0 and ``bots[1]`` as team 1; return the tally.

    Every copy plays one game (copies that finish early start a second one, which is not counted).
    """
    env = MobaEnv(config, num_games)
    players = [(make_bot(name, config, seed=seed + 1000 * (team + 1)), team_agents(env.spec, np.full(num_games, team)))
               for team, name in enumerate(bots)]
    games = play(env, players, seed)
    return {"bots": list(bots), "num_games": num_games, "wins_team0": int((games.winner == 0).sum()),
            "wins_team1": int((games.winner == 1).sum()), "draws": int((games.winner == -1).sum()),
            "mean_length": float(games.length.mean()), "scripted_version": SCRIPTED_VERSION,
            "scripted_hash": scripted_bot_hash()}


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel of the env and the bots with one tiny game.

    Run it once before starting many processes at once (``python -c "from hpc_rl.envs.scripted import warm_up;
    warm_up()"``): they then load the cached machine code instead of each compiling it (about 30 s).
    """
    config = MobaConfig(time_limit=3)
    play_games(config, ("scripted", "random"), 2, seed=0)
