"""``moba``: a small, fast, vectorised MOBA (1v1 and 5v5) with the difficulties of Dota 2 and Honor of Kings.

A square map with the two bases in opposite corners; ``lanes`` lanes (1 for 1v1: the diagonal; 3 for 5v5: top, middle,
bottom) join them, with ``towers_per_lane`` towers per team on each lane. Creep waves spawn every ``creep_wave_period``
steps and march along their lane, fighting whatever enemy comes within aggro range. Heroes come from a pool of four
types (warrior with a cleave, marksman with a piercing shot, mage with an area nuke, assassin with a dash that stuns),
with HP, mana, damage, range, speed, XP levels, gold from last hits, kills and towers (spent by a scripted item purchase
as in OpenAI Five), skills with cooldowns and respawn timers. A team sees only what its units see (fog of war). A team
wins by destroying the enemy base; a tower is invulnerable while the outer tower of its lane stands, a base while every
lane still has a tower of its team; a base does not shoot (Dota's Ancient), but heroes heal fast at their fountain
beside it once they have not been hurt for ``FOUNTAIN_CALM`` steps. The game is a draw at ``time_limit`` steps
(default 9000 = 20 game-minutes at 7.5 decisions per second, Honor of Kings' 133 ms).

One agent per hero: agent ``a`` controls hero slot ``a``; agents ``0..team_size-1`` are team 0. Every agent of both
teams is in the observation (self-play); which of them a learner controls is chosen by the pipeline.

Units of a copy live in fixed slots, in the order of ``spec.entities``: heroes, creeps (first half team 0), towers
(first half team 0; per team lane-major, outer tower first), bases (team 0, team 1). The target head indexes these
slots, and ``entities/<type>`` row ``i`` is slot ``i`` of that type, so a target is the concatenated row index.

Observation features (distances in map units divided by ``map_size``; ``d*`` are relative to the observing hero):

=========  ==================================================================================================
field      features
=========  ==================================================================================================
heroes     is_self, is_ally, is_enemy, x, y, dx, dy, dist, hp/max_hp, max_hp/1000, mana/max_mana,
           level/max_level, skill cooldown fraction, stunned, attack ready, hero type one-hot (4)      [19]
creeps     is_ally, is_enemy, x, y, dx, dy, dist, hp/max_hp, hp/500, is_ranged,
           dies to one attack of the observing hero (a last-hit chance), lane/(lanes-1)               [12]
towers     is_ally, is_enemy, x, y, dx, dy, dist, hp/max_hp, tier/towers_per_lane, invulnerable,
           lane/(lanes-1) (0 with one lane)                                                           [11]
bases      is_ally, is_enemy, x, y, dx, dy, dist, hp/max_hp, invulnerable                             [9]
global     time/time_limit, team, alive, hp/max_hp, mana/max_mana, level/max_level, xp to next level
           fraction, gold earned/1000, items/10, respawn steps/100, stunned, skill ready, attack ready,
           hero type one-hot (4), x, y, own structures standing fraction, enemy structures standing
           fraction, steps to next wave/period, attack damage/100, enemy heroes alive fraction (public, as
           on a MOBA's scoreboard)                                                                    [24]
=========  ==================================================================================================

Actions: primary ``noop``, ``move`` (reads the move head: 8 compass directions, one hero speed), ``attack`` and
``skill`` (read the target head). Attacking or casting on a legal target beyond reach walks the hero towards it, as a
MOBA's attack command does. Masks (Honor of Kings' action mask): a target is legal when it is an enemy, alive, seen by
the agent's team, not invulnerable, and within ``target_range`` of the hero; ``attack`` is legal when some target is,
``skill`` when moreover the skill is off cooldown and mana suffices; a dead or stunned hero may only ``noop``; moves
that would leave the map are illegal. A mask row is all False when no action reading that head is legal. Illegal
actions are ignored (played as ``noop``).

Reward events (``spec.reward_events``), per agent and step, before any weighting:

===========  ====================================================================================================
event        value
===========  ====================================================================================================
hp           change of the own hero's hp/max_hp (the drop to 0 on death counts, the refill on respawn does not)
tower_hp     change of the summed hp/max_hp of the own team's towers and base
gold         gold earned
mana         change of the own hero's mana/max_mana (Honor of Kings' "rate of mana"; respawn refill excluded)
death        1 when the own hero died
kill         number of enemy heroes whose last hit the own hero landed
xp           experience gained
last_hit     number of enemy creeps and structures whose last hit the own hero landed
win          1 on the step the own team destroys the enemy base
loss         1 on the step the own team loses its base
===========  ====================================================================================================

All randomness (lineups, starting level and gold: OpenAI Five's domain randomisation) is drawn at the start of a game
from a hash of (seed, global copy index, game index), so a copy plays the same games whether it is stepped alone or
with others, and whatever the other copies do.

``MobaConfig``, ``REWARD_EVENTS`` and the column of each event in the events array, ``EV_<EVENT>``, live in
``hpc_rl.envs.moba_config``, which imports neither numba nor torch.

The rules run in numba-compiled kernels that loop over the copies: ``_reset_all``, ``_step_all`` and ``_observe_all``.
A step of a copy goes through phases, each a function with a docstring, inlined into ``_step_copies``: ``_snapshot``
(the state the dense events are changes of), ``_tick_timers`` (timers, respawns), ``_start_positions`` (distances),
``_hero_actions``, ``_creep_actions`` and ``_tower_actions`` (decided on the start-of-step state, blows queued),
``_land_blows`` (damage, moves, stuns), ``_deaths`` (bounties, experience, the sparse events), ``_regenerate``
(regeneration, levels, items), ``_spawn_wave``, ``_dense_events``, and ``_end_game`` or the fog (``_compute_vis``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from hpc_rl.envs import moba_config
from hpc_rl.envs.api import Actions, Obs
from hpc_rl.envs.moba_config import (A_ATTACK, A_MOVE, A_NOOP, A_SKILL, EV_DEATH, EV_GOLD, EV_HP, EV_KILL, EV_LAST_HIT,
                                     EV_LOSS, EV_MANA, EV_TOWER_HP, EV_WIN, EV_XP, HERO_TYPES, MAX_LEVEL, NUM_MOVES,
                                     REWARD_EVENTS, MobaConfig)

DECISIONS_PER_SECOND = 7.5  # Honor of Kings acts every 133 ms

# Hero stat table columns; rows follow HERO_TYPES. Time in steps, distances in map units.
(HS_HP, HS_HP_LVL, HS_DMG, HS_DMG_LVL, HS_RANGE, HS_PERIOD, HS_SPEED, HS_VISION, HS_MANA, HS_MANA_LVL, HS_MANA_REGEN,
 HS_COST, HS_CD, HS_SRANGE, HS_SDMG, HS_SDMG_LVL, HS_RADIUS, HS_STUN, HS_DASH) = range(19)
HERO_STATS = np.array([
    # hp  hp/l  dmg dmg/l range per speed vis mana m/l regen cost  cd  srange sdmg sd/l radius stun dash
    [620, 91, 42, 7, 1.6, 6, 0.42, 9, 220, 20, 0.25, 60, 45, 2.5, 100, 10, 2.5, 0, 0],   # warrior: cleave
    [470, 65, 48, 9, 6.0, 7, 0.40, 10, 220, 20, 0.25, 70, 60, 9.0, 160, 14, 0.0, 0, 0],  # marksman: piercing shot
    [450, 58, 36, 5, 5.0, 8, 0.40, 10, 320, 30, 0.35, 90, 52, 7.0, 130, 14, 3.0, 0, 0],  # mage: area nuke
    [520, 72, 52, 9, 1.6, 6, 0.48, 9, 200, 15, 0.25, 60, 60, 6.0, 90, 10, 0.0, 8, 1],    # assassin: dash + stun
], dtype=np.float64)

# Non-hero unit stat table columns; rows: melee creep, ranged creep, tower, base.
US_HP, US_DMG, US_RANGE, US_PERIOD, US_SPEED, US_VISION, US_GOLD, US_XP = range(8)
UNIT_STATS = np.array([
    # hp   dmg range per speed vision gold xp
    [150, 14, 1.3, 7, 0.32, 6, 22, 30],    # melee creep
    [110, 20, 4.5, 9, 0.32, 7, 28, 25],    # ranged creep
    [1000, 70, 7.0, 7, 0.0, 9, 120, 120],  # tower (gold to every enemy hero)
    [1000, 0, 0.0, 7, 0.0, 10, 0, 0],      # base: does not shoot, like Dota's Ancient; the fountain defends
], dtype=np.float64)
ROW_MELEE, ROW_RANGED, ROW_TOWER, ROW_BASE = 0, 1, 2, 3

# Rules constants (steps, map units, gold, xp).
XP_PER_LEVEL = 120.0         # xp from level l to l+1 is XP_PER_LEVEL * l
XP_RADIUS = 9.0              # heroes of the killing side within this radius share a death's xp
HERO_GOLD, HERO_GOLD_LVL = 120.0, 10.0
HERO_XP, HERO_XP_LVL = 70.0, 25.0
ITEM_COST, ITEM_DMG, ITEM_HP = 300.0, 6.0, 50.0
RESPAWN_BASE, RESPAWN_LVL = 60.0, 20.0
HP_REGEN = 0.08
FOUNTAIN_RADIUS, FOUNTAIN_REGEN = 6.0, 0.03  # fraction of max hp and mana per step near the own base
FOUNTAIN_CALM = 20  # ... once the hero has taken no damage for this many steps (no invincible defender)
CREEP_AGGRO = 5.0
BASE_MARGIN = 0.1            # bases sit this fraction of map_size from their corner
TOWER_SPAN = (0.40, 0.20)    # outer and inner tower positions, as fractions of the lane from the own base
CREEP_SPAWN_OFFSET = 3.0

# Unit state columns: float ``uf[e, u, :]`` and int ``ui[e, u, :]``; hero state ``hf[e, h, :]``; copy ``gi[e, :]``.
UX, UY, UHP, UMAXHP, UDMG, URANGE, UPERIOD, UTIMER, USPEED, UVISION, UGOLD, UXP = range(12)
NUF = 12
IALIVE, ITEAM, ILANE, ISUB, IWAYPOINT = range(5)  # ISUB: hero type / creep ranged flag / tower tier (1 = outer)
NUI = 5
HMANA, HMAXMANA, HXP, HGOLD, HUNSPENT, HLEVEL, HCD, HRESPAWN, HSTUN, HITEMS, HAGGRO, HHURT = range(12)
NHF = 12
GT, GGAME = range(2)
NGI = 2

# Parameter vector layout passed to the compiled kernels.
(P_MAP, P_TS, P_LANES, P_TPL, P_H, P_C, P_T, P_U, P_WAVE_PERIOD, P_WAVE_MELEE, P_WAVE_RANGED, P_TIME_LIMIT,
 P_RAND_LEVEL, P_RAND_GOLD, P_RANDOMIZE, P_MIRRORED, P_TARGET_RANGE, P_UPGRADE_WAVES, P_UPGRADE, P_NPOOL) = range(20)
NP = 20

MOVE_DX = np.cos(np.arange(NUM_MOVES) * 2 * np.pi / NUM_MOVES)
MOVE_DY = np.sin(np.arange(NUM_MOVES) * 2 * np.pi / NUM_MOVES)


@dataclass
class MobaLayout:
    """The static map of a configuration: lane waypoints, tower and base positions, spawn points."""

    params: np.ndarray  # (NP,) float64, see P_*
    lane_waypoints: np.ndarray  # (lanes, 3, 2): own base of team 0, bend (or centre), base of team 1
    tower_xy: np.ndarray  # (T, 2)
    tower_lane: np.ndarray  # (T,) int64
    tower_tier: np.ndarray  # (T,) int64, 1 = outer
    base_xy: np.ndarray  # (2, 2)
    creep_spawn: np.ndarray  # (2, lanes, 2) where each team's creeps appear on each lane
    hero_spawn: np.ndarray  # (H, 2)
    pool: np.ndarray  # (len(hero_pool),) int64 hero type ids
    lineup: np.ndarray  # (H,) int64 hero type ids used without randomisation


def _lane_point(waypoints: np.ndarray, fraction: float) -> np.ndarray:
    """The point at ``fraction`` of the polyline's length from its first waypoint."""
    along = np.concatenate([[0.0], np.cumsum(np.linalg.norm(np.diff(waypoints, axis=0), axis=1))])
    d = fraction * along[-1]
    return np.array([np.interp(d, along, waypoints[:, 0]), np.interp(d, along, waypoints[:, 1])])


def make_layout(cfg: MobaConfig) -> MobaLayout:
    """Place bases, lanes, towers and spawn points; the map is point-symmetric about its centre, so no side is
    favoured (tested by scripted-against-scripted games with sides swapped)."""
    size = cfg.map_size
    lo, hi = BASE_MARGIN * size, (1 - BASE_MARGIN) * size
    base_xy = np.array([[lo, lo], [hi, hi]])
    bends = {1: [[size / 2, size / 2]], 3: [[lo, hi], [size / 2, size / 2], [hi, lo]]}[cfg.lanes]
    lane_waypoints = np.array([[base_xy[0], bend, base_xy[1]] for bend in bends], dtype=np.float64)
    tiers = np.linspace(TOWER_SPAN[0], TOWER_SPAN[1], cfg.towers_per_lane) if cfg.towers_per_lane > 1 \
        else np.array([TOWER_SPAN[0]])
    tower_xy, tower_lane, tower_tier = [], [], []
    for team in (0, 1):
        for lane in range(cfg.lanes):
            for tier, frac in enumerate(tiers, start=1):
                tower_xy.append(_lane_point(lane_waypoints[lane], frac if team == 0 else 1 - frac))
                tower_lane.append(lane)
                tower_tier.append(tier)
    creep_spawn = np.zeros((2, cfg.lanes, 2))
    for lane in range(cfg.lanes):
        length = np.linalg.norm(np.diff(lane_waypoints[lane], axis=0), axis=1).sum()
        creep_spawn[0, lane] = _lane_point(lane_waypoints[lane], CREEP_SPAWN_OFFSET / length)
        creep_spawn[1, lane] = _lane_point(lane_waypoints[lane], 1 - CREEP_SPAWN_OFFSET / length)
    heroes = 2 * cfg.team_size
    hero_spawn = np.zeros((heroes, 2))
    for h in range(heroes):
        team, k = divmod(h, cfg.team_size)
        offset = np.array([1.0 + 0.6 * k, 1.0 - 0.6 * k]) * (1 if team == 0 else -1)
        hero_spawn[h] = base_xy[team] + offset
    params = np.zeros(NP)
    params[P_MAP] = size
    params[P_TS] = cfg.team_size
    params[P_LANES] = cfg.lanes
    params[P_TPL] = cfg.towers_per_lane
    params[P_H] = heroes
    params[P_C] = 2 * cfg.creeps_per_team
    params[P_T] = 2 * cfg.lanes * cfg.towers_per_lane
    params[P_U] = heroes + 2 * cfg.creeps_per_team + 2 * cfg.lanes * cfg.towers_per_lane + 2
    params[P_WAVE_PERIOD] = cfg.creep_wave_period
    params[P_WAVE_MELEE] = cfg.wave_melee
    params[P_WAVE_RANGED] = cfg.wave_ranged
    params[P_TIME_LIMIT] = cfg.time_limit
    params[P_RAND_LEVEL] = cfg.random_start_level
    params[P_RAND_GOLD] = cfg.random_start_gold
    params[P_RANDOMIZE] = float(cfg.randomize_lineup)
    params[P_MIRRORED] = float(cfg.mirrored_pairs)
    params[P_TARGET_RANGE] = cfg.target_range
    params[P_UPGRADE_WAVES] = cfg.creep_upgrade_waves
    params[P_UPGRADE] = cfg.creep_upgrade
    params[P_NPOOL] = len(cfg.hero_pool)
    pool = np.array([HERO_TYPES.index(h) for h in cfg.hero_pool], dtype=np.int64)
    names = cfg.lineup or tuple(cfg.hero_pool[h % len(cfg.hero_pool)] for h in range(heroes))
    lineup = np.array([HERO_TYPES.index(h) for h in names], dtype=np.int64)
    return MobaLayout(params, lane_waypoints, np.array(tower_xy), np.array(tower_lane, dtype=np.int64),
                      np.array(tower_tier, dtype=np.int64), base_xy, creep_spawn, hero_spawn, pool, lineup)


# ---------------------------------------------------------------------------------------------------------------------
# Compiled kernels. Each loops over copies inside compiled code; per copy the work is O(units^2) with ~30 units (1v1).

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)

# The kernels hold the globals they read as constants, compiled in, and numba's cache is refreshed only when this file
# changes: after an edit of moba_config.py alone, cached kernels would write reward events into their old columns.
# MobaEnv checks that the cached code holds the current values of moba_config's integer constants.
_SHARED_CONSTANTS = tuple(value for name, value in vars(moba_config).items() if name.isupper() and type(value) is int)


@njit(cache=True)
def _compiled_shared_constants():
    """``_SHARED_CONSTANTS`` as this file's cached kernels were compiled with them."""
    return _SHARED_CONSTANTS


@njit(cache=True)
def _mix64(x):
    """SplitMix64's finaliser: a bijective hash of a 64-bit word."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _uniform(rng):
    """Next uniform float in [0, 1) from a SplitMix64 stream held in ``rng[0]``."""
    rng[0] = rng[0] + _GOLDEN
    return float(_mix64(rng[0]) >> np.uint64(11)) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def _hero_level_up(uf, hf, hs, e, h, htype):
    """Raise hero ``h`` one level: stats grow, current hp and mana grow by the same amount."""
    hf[e, h, HLEVEL] += 1.0
    uf[e, h, UMAXHP] += hs[htype, HS_HP_LVL]
    uf[e, h, UHP] += hs[htype, HS_HP_LVL]
    uf[e, h, UDMG] += hs[htype, HS_DMG_LVL]
    hf[e, h, HMAXMANA] += hs[htype, HS_MANA_LVL]
    hf[e, h, HMANA] += hs[htype, HS_MANA_LVL]


@njit(cache=True)
def _buy_items(uf, hf, e, h):
    """OpenAI Five scripted its item purchases: every ITEM_COST of unspent gold buys damage and hp at once."""
    while hf[e, h, HUNSPENT] >= ITEM_COST:
        hf[e, h, HUNSPENT] -= ITEM_COST
        hf[e, h, HITEMS] += 1.0
        uf[e, h, UDMG] += ITEM_DMG
        uf[e, h, UMAXHP] += ITEM_HP
        uf[e, h, UHP] += ITEM_HP


@njit(cache=True)
def _respawn(uf, ui, hf, hero_spawn, e, h):
    ui[e, h, IALIVE] = 1
    uf[e, h, UX] = hero_spawn[h, 0]
    uf[e, h, UY] = hero_spawn[h, 1]
    uf[e, h, UHP] = uf[e, h, UMAXHP]
    hf[e, h, HMANA] = hf[e, h, HMAXMANA]
    hf[e, h, HRESPAWN] = 0.0
    hf[e, h, HSTUN] = 0.0
    uf[e, h, UTIMER] = 0.0


@njit(cache=True)
def _set_unit(uf, ui, us, e, u, row, team, x, y, mult):
    uf[e, u, UX] = x
    uf[e, u, UY] = y
    uf[e, u, UMAXHP] = us[row, US_HP] * mult
    uf[e, u, UHP] = us[row, US_HP] * mult
    uf[e, u, UDMG] = us[row, US_DMG] * mult
    uf[e, u, URANGE] = us[row, US_RANGE]
    uf[e, u, UPERIOD] = us[row, US_PERIOD]
    uf[e, u, UTIMER] = 0.0
    uf[e, u, USPEED] = us[row, US_SPEED]
    uf[e, u, UVISION] = us[row, US_VISION]
    uf[e, u, UGOLD] = us[row, US_GOLD]
    uf[e, u, UXP] = us[row, US_XP]
    ui[e, u, IALIVE] = 1
    ui[e, u, ITEAM] = team


@njit(cache=True, _nrt=True)  # it allocates, also when called from _step_copies (which runs without NRT)
def _reset_copy(e, uf, ui, hf, gi, vis, seeds, P, hs, us, tower_xy, tower_lane, tower_tier, base_xy, hero_spawn,
                pool, lineup, game):
    """Start game number ``game`` of copy ``e``; every random draw comes from (copy seed, game)."""
    H, C, T = int(P[P_H]), int(P[P_C]), int(P[P_T])
    ts = int(P[P_TS])
    rng = np.empty(1, dtype=np.uint64)
    rng[0] = _mix64(seeds[e] ^ _mix64(np.uint64(game) + _GOLDEN))
    types = np.empty(H, dtype=np.int64)
    levels = np.empty(H, dtype=np.int64)
    golds = np.empty(H, dtype=np.float64)
    for h in range(H):
        k = int(_uniform(rng) * P[P_NPOOL])
        types[h] = pool[k] if P[P_RANDOMIZE] > 0.5 else lineup[h]
        levels[h] = 1 + int(_uniform(rng) * (P[P_RAND_LEVEL] + 1.0))
        golds[h] = _uniform(rng) * P[P_RAND_GOLD]
    swap = P[P_MIRRORED] > 0.5 and (e % 2) == 1
    gi[e, GT] = 0
    gi[e, GGAME] = game
    for h in range(H):
        src = (h + ts) % H if swap else h
        htype = types[src]
        ui[e, h, ITEAM] = h // ts
        ui[e, h, ISUB] = htype
        ui[e, h, ILANE] = 0
        ui[e, h, IWAYPOINT] = 0
        uf[e, h, UMAXHP] = hs[htype, HS_HP]
        uf[e, h, UDMG] = hs[htype, HS_DMG]
        uf[e, h, URANGE] = hs[htype, HS_RANGE]
        uf[e, h, UPERIOD] = hs[htype, HS_PERIOD]
        uf[e, h, USPEED] = hs[htype, HS_SPEED]
        uf[e, h, UVISION] = hs[htype, HS_VISION]
        uf[e, h, UGOLD] = 0.0
        uf[e, h, UXP] = 0.0
        for k in range(NHF):
            hf[e, h, k] = 0.0
        hf[e, h, HMAXMANA] = hs[htype, HS_MANA]
        hf[e, h, HLEVEL] = 1.0
        hf[e, h, HAGGRO] = -10.0
        hf[e, h, HHURT] = -1000.0
        uf[e, h, UHP] = uf[e, h, UMAXHP]
        for _ in range(levels[src] - 1):
            _hero_level_up(uf, hf, hs, e, h, htype)
        hf[e, h, HUNSPENT] = golds[src]
        _buy_items(uf, hf, e, h)
        _respawn(uf, ui, hf, hero_spawn, e, h)
    for c in range(H, H + C):
        ui[e, c, IALIVE] = 0
        ui[e, c, ITEAM] = 0 if c < H + C // 2 else 1
        uf[e, c, UHP] = 0.0
        uf[e, c, UMAXHP] = 1.0
    for k in range(T):
        u = H + C + k
        _set_unit(uf, ui, us, e, u, ROW_TOWER, 0 if k < T // 2 else 1, tower_xy[k, 0], tower_xy[k, 1], 1.0)
        ui[e, u, ILANE] = tower_lane[k]
        ui[e, u, ISUB] = tower_tier[k]
    for b in range(2):
        u = H + C + T + b
        _set_unit(uf, ui, us, e, u, ROW_BASE, b, base_xy[b, 0], base_xy[b, 1], 1.0)
        ui[e, u, ILANE] = 0
        ui[e, u, ISUB] = 0
    _compute_vis(e, uf, ui, vis, P)


@njit(cache=True)
def _compute_vis(e, uf, ui, vis, P):
    """Fog of war: a team sees its own units and every unit within vision range of one of its living units."""
    U = int(P[P_U])
    for u in range(U):
        alive = ui[e, u, IALIVE] == 1
        team = ui[e, u, ITEAM]
        vis[e, team, u] = alive
        vis[e, 1 - team, u] = False
    for u in range(U):
        if ui[e, u, IALIVE] == 0:
            continue
        team = ui[e, u, ITEAM]
        for v in range(U):
            if ui[e, v, IALIVE] == 0 or ui[e, v, ITEAM] == team or vis[e, team, v]:
                continue
            dx = uf[e, u, UX] - uf[e, v, UX]
            dy = uf[e, u, UY] - uf[e, v, UY]
            r = uf[e, u, UVISION]
            if dx * dx + dy * dy <= r * r:
                vis[e, team, v] = True


@njit(cache=True)
def _invulnerable(e, ui, P, inv):
    """A tower is invulnerable while the outer tower of its lane stands; a base while every lane has a tower."""
    H, C, T = int(P[P_H]), int(P[P_C]), int(P[P_T])
    tpl, lanes = int(P[P_TPL]), int(P[P_LANES])
    U = H + C + T + 2
    for u in range(U):
        inv[u] = False
    for k in range(T):
        u = H + C + k
        if k % tpl != 0 and ui[e, u - 1, IALIVE] == 1:
            inv[u] = True
    for team in range(2):
        covered = 0
        for lane in range(lanes):
            start = H + C + (team * lanes + lane) * tpl
            for k in range(tpl):
                if ui[e, start + k, IALIVE] == 1:
                    covered += 1
                    break
        inv[H + C + T + team] = covered == lanes


@njit(cache=True)
def _legal_target(e, h, v, ui, vis, inv, dist, target_range):
    return (ui[e, v, IALIVE] == 1 and ui[e, v, ITEAM] != ui[e, h, ITEAM] and vis[e, ui[e, h, ITEAM], v]
            and not inv[v] and dist <= target_range)


@njit(cache=True)
def _dist(x, y, tx, ty):
    return np.sqrt((x - tx) ** 2 + (y - ty) ** 2)


@njit(cache=True)
def _approach(x, y, tx, ty, step, keep):
    """Walk from (x, y) towards (tx, ty) by at most ``step``, stopping ``keep`` short of it."""
    dx, dy = tx - x, ty - y
    d = np.sqrt(dx * dx + dy * dy)
    walk = min(step, d - keep)
    if walk <= 0.0 or d <= 0.0:
        return x, y
    return x + dx / d * walk, y + dy / d * walk


@njit(cache=True)
def _step_all(uf, ui, hf, gi, vis, seeds, act, mov, tgt, P, hs, us, lane_wp, tower_xy, tower_lane, tower_tier,
              base_xy, creep_spawn, hero_spawn, pool, lineup, events, dones, winners, lengths):
    """One step of every copy (``_step_copies``), with the scratch space its copies share in turn."""
    H, U = int(P[P_H]), int(P[P_U])
    dist = np.empty((U, U))
    inv = np.empty(U, dtype=np.bool_)
    nx = np.empty(U)
    ny = np.empty(U)
    cap = U * (U + 1)  # an attack per unit, or a skill hitting every unit
    q_src = np.empty(cap, dtype=np.int64)
    q_dst = np.empty(cap, dtype=np.int64)
    q_amt = np.empty(cap)
    killed = np.empty(U, dtype=np.bool_)
    killer = np.empty(U, dtype=np.int64)
    stun_new = np.empty(H)
    hp0 = np.empty(H)
    mana0 = np.empty(H)
    was_dead = np.empty(H, dtype=np.bool_)
    struct0 = np.empty(2)
    struct1 = np.empty(2)
    base_lost = np.empty(2, dtype=np.bool_)
    _step_copies(uf, ui, hf, gi, vis, seeds, act, mov, tgt, P, hs, us, lane_wp, tower_xy, tower_lane, tower_tier,
                 base_xy, creep_spawn, hero_spawn, pool, lineup, events, dones, winners, lengths, dist, inv, nx, ny,
                 q_src, q_dst, q_amt, killed, killer, stun_new, hp0, mana0, was_dead, struct0, struct1, base_lost)


# The phases below are inlined into _step_copies, which runs without numba's reference counting (NRT): with it, the
# arrays every phase takes are counted in and out once per copy and phase, which made this kernel 30-40% slower in 1v1
# than one function (inlined or not). Nothing here allocates; _reset_copy, which does, asks for NRT itself.
@njit(cache=True, _nrt=False)
def _step_copies(uf, ui, hf, gi, vis, seeds, act, mov, tgt, P, hs, us, lane_wp, tower_xy, tower_lane, tower_tier,
                 base_xy, creep_spawn, hero_spawn, pool, lineup, events, dones, winners, lengths, dist, inv, nx, ny,
                 q_src, q_dst, q_amt, killed, killer, stun_new, hp0, mana0, was_dead, struct0, struct1, base_lost):
    """One step of every copy, in phases: timers and respawns; the actions of heroes, creeps and towers, all decided
    on the start-of-step state and queued as blows; blows, moves and stuns; deaths and bounties; regeneration, levels
    and items; creep waves; the dense reward events; and the end of a game (the copy restarts at once) or the fog."""
    E = uf.shape[0]
    H = int(P[P_H])
    for e in range(E):
        for a in range(H):
            for k in range(events.shape[2]):
                events[e, a, k] = 0.0
        dones[e] = False
        winners[e] = -1
        lengths[e] = 0
        t = gi[e, GT] + 1
        gi[e, GT] = t
        _snapshot(e, uf, ui, hf, P, was_dead, hp0, mana0, struct0)
        _tick_timers(e, uf, ui, hf, P, hero_spawn)
        _start_positions(e, uf, P, nx, ny, dist)
        _invulnerable(e, ui, P, inv)
        nq = _hero_actions(e, t, uf, ui, hf, vis, act, mov, tgt, P, hs, inv, dist, nx, ny, stun_new, q_src, q_dst,
                           q_amt, 0)
        nq = _creep_actions(e, uf, ui, P, lane_wp, inv, dist, nx, ny, q_src, q_dst, q_amt, nq)
        nq = _tower_actions(e, t, uf, ui, hf, P, dist, q_src, q_dst, q_amt, nq)
        _land_blows(e, t, uf, ui, hf, P, q_src, q_dst, q_amt, nq, nx, ny, stun_new, killed, killer)
        _deaths(e, uf, ui, hf, P, hero_spawn, killed, killer, events, base_lost)
        _regenerate(e, t, uf, ui, hf, P, hs, base_xy)
        _spawn_wave(e, t, uf, ui, P, us, creep_spawn)
        _dense_events(e, uf, ui, hf, P, was_dead, hp0, mana0, struct0, struct1, events)
        if base_lost[0] or base_lost[1] or t >= int(P[P_TIME_LIMIT]):
            _end_game(e, t, uf, ui, hf, gi, vis, seeds, P, hs, us, tower_xy, tower_lane, tower_tier, base_xy,
                      hero_spawn, pool, lineup, base_lost, events, dones, winners, lengths)
        else:
            _compute_vis(e, uf, ui, vis, P)


@njit(cache=True, inline="always")
def _structure_hp(e, uf, ui, P, out):
    """``out[team]``: the summed hp/max_hp of the team's standing towers and base (the ``tower_hp`` event's state)."""
    H, C, U = int(P[P_H]), int(P[P_C]), int(P[P_U])
    for team in range(2):
        out[team] = 0.0
    for u in range(H + C, U):
        if ui[e, u, IALIVE] == 1:
            out[ui[e, u, ITEAM]] += uf[e, u, UHP] / uf[e, u, UMAXHP]


@njit(cache=True, inline="always")
def _snapshot(e, uf, ui, hf, P, was_dead, hp0, mana0, struct0):
    """Record the start-of-step state that the dense reward events (hp, mana, tower_hp) are changes of: which heroes
    are dead, their hp and mana fractions (0 when dead), and each team's structure hp."""
    H = int(P[P_H])
    for h in range(H):
        was_dead[h] = ui[e, h, IALIVE] == 0
        hp0[h] = uf[e, h, UHP] / uf[e, h, UMAXHP] if not was_dead[h] else 0.0
        mana0[h] = hf[e, h, HMANA] / hf[e, h, HMAXMANA] if not was_dead[h] else 0.0
    _structure_hp(e, uf, ui, P, struct0)


@njit(cache=True, inline="always")
def _tick_timers(e, uf, ui, hf, P, hero_spawn):
    """Count down attack timers, skill cooldowns, stuns and respawn timers; a dead hero whose timer ran out respawns
    at its fountain."""
    H, U = int(P[P_H]), int(P[P_U])
    for u in range(U):
        uf[e, u, UTIMER] = max(0.0, uf[e, u, UTIMER] - 1.0)
    for h in range(H):
        hf[e, h, HCD] = max(0.0, hf[e, h, HCD] - 1.0)
        hf[e, h, HSTUN] = max(0.0, hf[e, h, HSTUN] - 1.0)
        if ui[e, h, IALIVE] == 0:
            hf[e, h, HRESPAWN] = max(0.0, hf[e, h, HRESPAWN] - 1.0)
            if hf[e, h, HRESPAWN] <= 0.0:
                _respawn(uf, ui, hf, hero_spawn, e, h)


@njit(cache=True, inline="always")
def _start_positions(e, uf, P, nx, ny, dist):
    """Every unit decides on the positions at the start of the step, so the order of units does not matter: the new
    positions ``nx, ny`` start as the current ones, and ``dist`` holds the current distances between all units."""
    U = int(P[P_U])
    for u in range(U):
        nx[u] = uf[e, u, UX]
        ny[u] = uf[e, u, UY]
        dist[u, u] = 0.0
        for v in range(u + 1, U):
            dx = uf[e, u, UX] - uf[e, v, UX]
            dy = uf[e, u, UY] - uf[e, v, UY]
            d = np.sqrt(dx * dx + dy * dy)
            dist[u, v] = d
            dist[v, u] = d


@njit(cache=True, inline="always")
def _hero_actions(e, t, uf, ui, hf, vis, act, mov, tgt, P, hs, inv, dist, nx, ny, stun_new, q_src, q_dst, q_amt,
                  nq):
    """Play every living, unstunned hero's action: a move sets its new position; an attack or skill on a legal
    target in reach queues its blows (a skill also its stun, dash, mana cost and cooldown), out of reach it walks
    towards the target. Illegal actions are ignored. Returns the queue length."""
    H, U = int(P[P_H]), int(P[P_U])
    size = P[P_MAP]
    target_range = P[P_TARGET_RANGE]
    for h in range(H):
        stun_new[h] = 0.0
    for h in range(H):
        if ui[e, h, IALIVE] == 0 or hf[e, h, HSTUN] > 0.0:
            continue
        a = act[e, h]
        if a == A_MOVE:
            m = mov[e, h]
            if 0 <= m < NUM_MOVES:
                x = uf[e, h, UX] + np.cos(m * 2.0 * np.pi / NUM_MOVES) * uf[e, h, USPEED]
                y = uf[e, h, UY] + np.sin(m * 2.0 * np.pi / NUM_MOVES) * uf[e, h, USPEED]
                if 0.0 <= x <= size and 0.0 <= y <= size:
                    nx[h] = x
                    ny[h] = y
        elif a == A_ATTACK or a == A_SKILL:
            v = tgt[e, h]
            if v < 0 or v >= U or not _legal_target(e, h, v, ui, vis, inv, dist[h, v], target_range):
                continue
            htype = ui[e, h, ISUB]
            if a == A_ATTACK:
                if dist[h, v] <= uf[e, h, URANGE]:
                    if uf[e, h, UTIMER] <= 0.0:
                        q_src[nq] = h
                        q_dst[nq] = v
                        q_amt[nq] = uf[e, h, UDMG]
                        nq += 1
                        uf[e, h, UTIMER] = uf[e, h, UPERIOD]
                        if v < H:
                            hf[e, h, HAGGRO] = t
                else:
                    nx[h], ny[h] = _approach(uf[e, h, UX], uf[e, h, UY], uf[e, v, UX], uf[e, v, UY],
                                             uf[e, h, USPEED], uf[e, h, URANGE] * 0.9)
            elif hf[e, h, HCD] <= 0.0 and hf[e, h, HMANA] >= hs[htype, HS_COST]:
                srange = hs[htype, HS_SRANGE]
                if dist[h, v] <= srange:
                    sdmg = hs[htype, HS_SDMG] + hs[htype, HS_SDMG_LVL] * (hf[e, h, HLEVEL] - 1.0)
                    radius = hs[htype, HS_RADIUS]
                    for w in range(U):
                        hit = w == v or (radius > 0.0 and dist[v, w] <= radius
                                         and ui[e, w, IALIVE] == 1 and ui[e, w, ITEAM] != ui[e, h, ITEAM]
                                         and not inv[w])
                        if hit:
                            q_src[nq] = h
                            q_dst[nq] = w
                            q_amt[nq] = sdmg
                            nq += 1
                            if w < H:
                                hf[e, h, HAGGRO] = t
                    if v < H:
                        stun_new[v] = max(stun_new[v], hs[htype, HS_STUN])
                    if hs[htype, HS_DASH] > 0.0:
                        nx[h], ny[h] = _approach(uf[e, h, UX], uf[e, h, UY], uf[e, v, UX], uf[e, v, UY],
                                                 srange, 1.0)
                    hf[e, h, HMANA] -= hs[htype, HS_COST]
                    hf[e, h, HCD] = hs[htype, HS_CD]
                else:
                    nx[h], ny[h] = _approach(uf[e, h, UX], uf[e, h, UY], uf[e, v, UX], uf[e, v, UY],
                                             uf[e, h, USPEED], srange * 0.9)
    return nq


@njit(cache=True, inline="always")
def _creep_actions(e, uf, ui, P, lane_wp, inv, dist, nx, ny, q_src, q_dst, q_amt, nq):
    """Every creep attacks (or walks towards) the nearest attackable enemy within aggro range, else marches along its
    lane. Returns the queue length."""
    H, C, U = int(P[P_H]), int(P[P_C]), int(P[P_U])
    for c in range(H, H + C):
        if ui[e, c, IALIVE] == 0:
            continue
        team = ui[e, c, ITEAM]
        best = -1
        best_d = CREEP_AGGRO
        for v in range(U):
            if ui[e, v, IALIVE] == 1 and ui[e, v, ITEAM] != team and not inv[v] and dist[c, v] <= best_d:
                best = v
                best_d = dist[c, v]
        if best >= 0:
            if best_d <= uf[e, c, URANGE]:
                if uf[e, c, UTIMER] <= 0.0:
                    q_src[nq] = c
                    q_dst[nq] = best
                    q_amt[nq] = uf[e, c, UDMG]
                    nq += 1
                    uf[e, c, UTIMER] = uf[e, c, UPERIOD]
            else:
                nx[c], ny[c] = _approach(uf[e, c, UX], uf[e, c, UY], uf[e, best, UX], uf[e, best, UY],
                                         uf[e, c, USPEED], uf[e, c, URANGE] * 0.9)
        else:
            lane = ui[e, c, ILANE]
            wp = ui[e, c, IWAYPOINT]
            wx, wy = lane_wp[lane, wp, 0], lane_wp[lane, wp, 1]
            if _dist(uf[e, c, UX], uf[e, c, UY], wx, wy) <= uf[e, c, USPEED]:
                last = lane_wp.shape[1] - 1
                wp = min(wp + 1, last) if team == 0 else max(wp - 1, 0)
                ui[e, c, IWAYPOINT] = wp
                wx, wy = lane_wp[lane, wp, 0], lane_wp[lane, wp, 1]
            nx[c], ny[c] = _approach(uf[e, c, UX], uf[e, c, UY], wx, wy, uf[e, c, USPEED], 0.0)
    return nq


@njit(cache=True, inline="always")
def _tower_actions(e, t, uf, ui, hf, P, dist, q_src, q_dst, q_amt, nq):
    """Every ready tower shoots, within its range, first a hero that hit one of their heroes in the last two steps
    (tower aggro), then the nearest creep, then the nearest hero. Bases do not shoot. Returns the queue length."""
    H, C, U = int(P[P_H]), int(P[P_C]), int(P[P_U])
    for s in range(H + C, U):
        if ui[e, s, IALIVE] == 0 or uf[e, s, UTIMER] > 0.0 or uf[e, s, UDMG] <= 0.0:
            continue
        team = ui[e, s, ITEAM]
        rng_s = uf[e, s, URANGE]
        best = -1
        best_rank = 1e18
        for v in range(H + C):
            if ui[e, v, IALIVE] == 0 or ui[e, v, ITEAM] == team or dist[s, v] > rng_s:
                continue
            if v < H:
                rank = dist[s, v] + (0.0 if hf[e, v, HAGGRO] >= t - 1 else 2000.0)
            else:
                rank = dist[s, v] + 1000.0
            if rank < best_rank:
                best_rank = rank
                best = v
        if best >= 0:
            q_src[nq] = s
            q_dst[nq] = best
            q_amt[nq] = uf[e, s, UDMG]
            nq += 1
            uf[e, s, UTIMER] = uf[e, s, UPERIOD]
    return nq


@njit(cache=True, inline="always")
def _land_blows(e, t, uf, ui, hf, P, q_src, q_dst, q_amt, nq, nx, ny, stun_new, killed, killer):
    """Land the queued blows, then move every unit to its new position and stun the survivors that a skill stunned.

    Blows land in queue order (heroes, creeps, structures, team 0 first within each) on even steps and in the reverse
    order on odd steps, so that neither team wins simultaneous last hits more often. The blow that empties hp is the
    last hit: ``killed[u]`` and ``killer[u]`` (the unit that landed it) record it."""
    H, U = int(P[P_H]), int(P[P_U])
    for u in range(U):
        killed[u] = False
        killer[u] = -1
    for n in range(nq):
        i = n if t % 2 == 0 else nq - 1 - n
        v = q_dst[i]
        if killed[v] or ui[e, v, IALIVE] == 0:
            continue
        uf[e, v, UHP] -= q_amt[i]
        if v < H:
            hf[e, v, HHURT] = t
        if uf[e, v, UHP] <= 0.0:
            killed[v] = True
            killer[v] = q_src[i]
    for u in range(U):
        uf[e, u, UX] = nx[u]
        uf[e, u, UY] = ny[u]
    for h in range(H):
        if stun_new[h] > 0.0 and not killed[h]:
            hf[e, h, HSTUN] = max(hf[e, h, HSTUN], stun_new[h])


@njit(cache=True, inline="always")
def _deaths(e, uf, ui, hf, P, hero_spawn, killed, killer, events, base_lost):
    """Remove the killed units and pay their bounties: a dead hero waits for its respawn at its fountain; the hero
    that landed a last hit gets the kill or last-hit event and the gold of a hero or creep; a fallen structure pays
    its gold to every enemy hero; the living enemy heroes near a death share its experience. ``base_lost[team]``
    tells whether the team's base fell."""
    H, C, U = int(P[P_H]), int(P[P_C]), int(P[P_U])
    base_lost[0] = False
    base_lost[1] = False
    for u in range(U):
        if not killed[u]:
            continue
        ui[e, u, IALIVE] = 0
        uf[e, u, UHP] = 0.0
        team = ui[e, u, ITEAM]
        k = killer[u]
        if u < H:
            level = hf[e, u, HLEVEL]
            gold, xp = HERO_GOLD + HERO_GOLD_LVL * level, HERO_XP + HERO_XP_LVL * level
            events[e, u, EV_DEATH] += 1.0
            hf[e, u, HRESPAWN] = RESPAWN_BASE + RESPAWN_LVL * level
            if k < H:
                events[e, k, EV_KILL] += 1.0
                hf[e, k, HGOLD] += gold
                hf[e, k, HUNSPENT] += gold
                events[e, k, EV_GOLD] += gold
        else:
            xp = uf[e, u, UXP]
            if u >= U - 2:
                base_lost[team] = True
            if k < H:
                events[e, k, EV_LAST_HIT] += 1.0
                if u < H + C:
                    hf[e, k, HGOLD] += uf[e, u, UGOLD]
                    hf[e, k, HUNSPENT] += uf[e, u, UGOLD]
                    events[e, k, EV_GOLD] += uf[e, u, UGOLD]
            if u >= H + C:
                for h in range(H):
                    if ui[e, h, ITEAM] != team:
                        hf[e, h, HGOLD] += uf[e, u, UGOLD]
                        hf[e, h, HUNSPENT] += uf[e, u, UGOLD]
                        events[e, h, EV_GOLD] += uf[e, u, UGOLD]
        n = 0
        for h in range(H):
            if ui[e, h, IALIVE] == 1 and ui[e, h, ITEAM] != team and _dist(
                    uf[e, h, UX], uf[e, h, UY], uf[e, u, UX], uf[e, u, UY]) <= XP_RADIUS:
                n += 1
        for h in range(H):
            if ui[e, h, IALIVE] == 1 and ui[e, h, ITEAM] != team and _dist(
                    uf[e, h, UX], uf[e, h, UY], uf[e, u, UX], uf[e, u, UY]) <= XP_RADIUS:
                hf[e, h, HXP] += xp / n
                events[e, h, EV_XP] += xp / n
        if u < H:  # the dead hero waits for its respawn at the fountain, out of sight of the enemy
            uf[e, u, UX] = hero_spawn[u, 0]
            uf[e, u, UY] = hero_spawn[u, 1]


@njit(cache=True, inline="always")
def _regenerate(e, t, uf, ui, hf, P, hs, base_xy):
    """Living heroes regain hp and mana (faster at their fountain once unhurt for ``FOUNTAIN_CALM`` steps), level up
    on their experience and buy items with their gold."""
    H = int(P[P_H])
    for h in range(H):
        if ui[e, h, IALIVE] == 0:
            continue
        htype = ui[e, h, ISUB]
        team = ui[e, h, ITEAM]
        at_fountain = (_dist(uf[e, h, UX], uf[e, h, UY], base_xy[team, 0], base_xy[team, 1]) <= FOUNTAIN_RADIUS
                       and t - hf[e, h, HHURT] > FOUNTAIN_CALM)
        hp_regen = HP_REGEN + (FOUNTAIN_REGEN * uf[e, h, UMAXHP] if at_fountain else 0.0)
        mana_regen = hs[htype, HS_MANA_REGEN] + (FOUNTAIN_REGEN * hf[e, h, HMAXMANA] if at_fountain else 0.0)
        uf[e, h, UHP] = min(uf[e, h, UMAXHP], uf[e, h, UHP] + hp_regen)
        hf[e, h, HMANA] = min(hf[e, h, HMAXMANA], hf[e, h, HMANA] + mana_regen)
        while hf[e, h, HLEVEL] < MAX_LEVEL and hf[e, h, HXP] >= XP_PER_LEVEL * hf[e, h, HLEVEL]:
            hf[e, h, HXP] -= XP_PER_LEVEL * hf[e, h, HLEVEL]
            _hero_level_up(uf, hf, hs, e, h, htype)
        _buy_items(uf, hf, e, h)


@njit(cache=True, inline="always")
def _spawn_wave(e, t, uf, ui, P, us, creep_spawn):
    """On the first step of every wave period, each team's wave enters each lane, in the free creep slots of the
    team; creeps that find none are not spawned. Creeps grow stronger every ``creep_upgrade_waves`` waves."""
    H, C = int(P[P_H]), int(P[P_C])
    lanes = int(P[P_LANES])
    period = int(P[P_WAVE_PERIOD])
    if not (t % period == 1 or period == 1):
        return
    wave = t // period
    mult = 1.0 + P[P_UPGRADE] * (wave // int(P[P_UPGRADE_WAVES]))
    per_wave = int(P[P_WAVE_MELEE]) + int(P[P_WAVE_RANGED])
    for team in range(2):
        slot = H + team * (C // 2)
        end = slot + C // 2
        for lane in range(lanes):
            for k in range(per_wave):
                while slot < end and ui[e, slot, IALIVE] == 1:
                    slot += 1
                if slot == end:
                    break
                row = ROW_MELEE if k < int(P[P_WAVE_MELEE]) else ROW_RANGED
                _set_unit(uf, ui, us, e, slot, row, team, creep_spawn[team, lane, 0], creep_spawn[team, lane, 1],
                          mult)
                ui[e, slot, ILANE] = lane
                ui[e, slot, ISUB] = row
                ui[e, slot, IWAYPOINT] = 1


@njit(cache=True, inline="always")
def _dense_events(e, uf, ui, hf, P, was_dead, hp0, mana0, struct0, struct1, events):
    """The hp, mana and tower_hp events: changes since ``_snapshot`` (``struct1`` is scratch space). A hero's death
    counts as a drop to 0; its refill on respawn does not count."""
    H = int(P[P_H])
    _structure_hp(e, uf, ui, P, struct1)
    for h in range(H):
        team = ui[e, h, ITEAM]
        alive = ui[e, h, IALIVE] == 1
        if not (was_dead[h] and alive):
            events[e, h, EV_HP] = (uf[e, h, UHP] / uf[e, h, UMAXHP] if alive else 0.0) - hp0[h]
            events[e, h, EV_MANA] = (hf[e, h, HMANA] / hf[e, h, HMAXMANA] if alive else 0.0) - mana0[h]
        events[e, h, EV_TOWER_HP] = struct1[team] - struct0[team]


@njit(cache=True, inline="always")
def _end_game(e, t, uf, ui, hf, gi, vis, seeds, P, hs, us, tower_xy, tower_lane, tower_tier, base_xy, hero_spawn,
              pool, lineup, base_lost, events, dones, winners, lengths):
    """End copy ``e``'s game: the team that destroyed the other's base (and kept its own) wins, else it is a draw;
    write the win and loss events and the outcome, and start the copy's next game."""
    H = int(P[P_H])
    winner = -1
    if base_lost[1] and not base_lost[0]:
        winner = 0
    elif base_lost[0] and not base_lost[1]:
        winner = 1
    for h in range(H):
        if winner >= 0:
            if ui[e, h, ITEAM] == winner:
                events[e, h, EV_WIN] = 1.0
            else:
                events[e, h, EV_LOSS] = 1.0
    dones[e] = True
    winners[e] = winner
    lengths[e] = t
    _reset_copy(e, uf, ui, hf, gi, vis, seeds, P, hs, us, tower_xy, tower_lane, tower_tier, base_xy, hero_spawn,
                pool, lineup, gi[e, GGAME] + 1)


@njit(cache=True)
def _observe_all(uf, ui, hf, gi, vis, P, hs, o_hero, m_hero, o_creep, m_creep, o_tower, m_tower, o_base, m_base,
                 o_glob, action_mask, move_mask, target_mask):
    """Fill every agent's observation of every copy: its team's view (fog), the features and the masks."""
    E = uf.shape[0]
    H, C, T, U = int(P[P_H]), int(P[P_C]), int(P[P_T]), int(P[P_U])
    size = P[P_MAP]
    tpl, lanes = int(P[P_TPL]), int(P[P_LANES])
    target_range = P[P_TARGET_RANGE]
    inv = np.empty(U, dtype=np.bool_)
    standing = np.empty(2)
    heroes_up = np.empty(2)
    for e in range(E):
        _invulnerable(e, ui, P, inv)
        standing[0] = 0.0
        standing[1] = 0.0
        heroes_up[0] = 0.0
        heroes_up[1] = 0.0
        for h in range(H):
            heroes_up[ui[e, h, ITEAM]] += ui[e, h, IALIVE]
        for s in range(H + C, U):
            if ui[e, s, IALIVE] == 1:
                standing[ui[e, s, ITEAM]] += 1.0
        period = P[P_WAVE_PERIOD]
        t = gi[e, GT]
        for a in range(H):
            team = ui[e, a, ITEAM]
            alive = ui[e, a, IALIVE] == 1
            htype = ui[e, a, ISUB]
            mx, my = uf[e, a, UX], uf[e, a, UY]
            can_act = alive and hf[e, a, HSTUN] <= 0.0
            any_target = False
            for u in range(U):
                seen = vis[e, team, u]
                dx, dy = uf[e, u, UX] - mx, uf[e, u, UY] - my
                d = np.sqrt(dx * dx + dy * dy)
                legal = can_act and _legal_target(e, a, u, ui, vis, inv, d, target_range)
                target_mask[e, a, u] = legal
                any_target = any_target or legal
                ally = 1.0 if ui[e, u, ITEAM] == team else 0.0
                if u < H:
                    row = o_hero[e, a, u]
                    m_hero[e, a, u] = seen
                elif u < H + C:
                    row = o_creep[e, a, u - H]
                    m_creep[e, a, u - H] = seen
                elif u < H + C + T:
                    row = o_tower[e, a, u - H - C]
                    m_tower[e, a, u - H - C] = seen
                else:
                    row = o_base[e, a, u - H - C - T]
                    m_base[e, a, u - H - C - T] = seen
                if not seen:
                    for k in range(row.shape[0]):
                        row[k] = 0.0
                    continue
                off = 0
                if u < H:
                    row[0] = 1.0 if u == a else 0.0
                    off = 1
                row[off] = ally
                row[off + 1] = 1.0 - ally
                row[off + 2] = uf[e, u, UX] / size
                row[off + 3] = uf[e, u, UY] / size
                row[off + 4] = dx / size
                row[off + 5] = dy / size
                row[off + 6] = d / size
                row[off + 7] = uf[e, u, UHP] / uf[e, u, UMAXHP]
                if u < H:
                    ut = ui[e, u, ISUB]
                    row[9] = uf[e, u, UMAXHP] / 1000.0
                    row[10] = hf[e, u, HMANA] / hf[e, u, HMAXMANA]
                    row[11] = hf[e, u, HLEVEL] / MAX_LEVEL
                    row[12] = hf[e, u, HCD] / hs[ut, HS_CD]
                    row[13] = 1.0 if hf[e, u, HSTUN] > 0.0 else 0.0
                    row[14] = 1.0 if uf[e, u, UTIMER] <= 0.0 else 0.0
                    for k in range(4):
                        row[15 + k] = 1.0 if k == ut else 0.0
                elif u < H + C:
                    row[8] = uf[e, u, UHP] / 500.0
                    row[9] = 1.0 if ui[e, u, ISUB] == ROW_RANGED else 0.0
                    row[10] = 1.0 if alive and uf[e, u, UHP] <= uf[e, a, UDMG] else 0.0
                    row[11] = ui[e, u, ILANE] / (lanes - 1) if lanes > 1 else 0.0
                elif u < H + C + T:
                    row[8] = ui[e, u, ISUB] / tpl
                    row[9] = 1.0 if inv[u] else 0.0
                    row[10] = ui[e, u, ILANE] / (lanes - 1) if lanes > 1 else 0.0
                else:
                    row[8] = 1.0 if inv[u] else 0.0
            skill_ready = hf[e, a, HCD] <= 0.0 and hf[e, a, HMANA] >= hs[htype, HS_COST]
            action_mask[e, a, A_NOOP] = True
            action_mask[e, a, A_MOVE] = can_act
            action_mask[e, a, A_ATTACK] = any_target
            action_mask[e, a, A_SKILL] = any_target and skill_ready
            for m in range(NUM_MOVES):
                x = mx + np.cos(m * 2.0 * np.pi / NUM_MOVES) * uf[e, a, USPEED]
                y = my + np.sin(m * 2.0 * np.pi / NUM_MOVES) * uf[e, a, USPEED]
                move_mask[e, a, m] = can_act and 0.0 <= x <= size and 0.0 <= y <= size
            g = o_glob[e, a]
            g[0] = t / P[P_TIME_LIMIT]
            g[1] = team
            g[2] = 1.0 if alive else 0.0
            g[3] = uf[e, a, UHP] / uf[e, a, UMAXHP]
            g[4] = hf[e, a, HMANA] / hf[e, a, HMAXMANA]
            g[5] = hf[e, a, HLEVEL] / MAX_LEVEL
            g[6] = hf[e, a, HXP] / (XP_PER_LEVEL * hf[e, a, HLEVEL])
            g[7] = hf[e, a, HGOLD] / 1000.0
            g[8] = hf[e, a, HITEMS] / 10.0
            g[9] = hf[e, a, HRESPAWN] / 100.0
            g[10] = 1.0 if hf[e, a, HSTUN] > 0.0 else 0.0
            g[11] = 1.0 if skill_ready else 0.0
            g[12] = 1.0 if uf[e, a, UTIMER] <= 0.0 else 0.0
            for k in range(4):
                g[13 + k] = 1.0 if k == htype else 0.0
            g[17] = mx / size
            g[18] = my / size
            g[19] = standing[team] / (T // 2 + 1)
            g[20] = standing[1 - team] / (T // 2 + 1)
            g[21] = ((period - (t - 1) % period) % period) / period
            g[22] = uf[e, a, UDMG] / 100.0
            g[23] = heroes_up[1 - team] / (H // 2)


class MobaEnv:
    """Many copies of one MOBA configuration stepped together (the ``VecEnv`` protocol of ``hpc_rl.envs.api``).

    ``first_copy`` is the global index of copy 0: copies split over several env ranks play the same games as one big
    env holding them all.
    """

    def __init__(self, config: MobaConfig, num_envs: int, first_copy: int = 0):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if first_copy < 0:
            raise ValueError(f"first_copy must be >= 0, got {first_copy}")
        if config.mirrored_pairs and (first_copy % 2 or num_envs % 2):
            raise ValueError(f"mirrored_pairs needs an even first_copy and num_envs, got {first_copy}, {num_envs}")
        if _compiled_shared_constants() != _SHARED_CONSTANTS:
            raise RuntimeError(f"numba's cache of {__file__} was compiled with another moba_config.py; delete its "
                               "files (moba.*.nbi, moba.*.nbc in __pycache__ or NUMBA_CACHE_DIR) and run again")
        self.config = config
        self.spec = config.spec()
        self.num_envs = num_envs
        self.first_copy = first_copy
        self.layout = make_layout(config)
        P = self.layout.params
        E, H, U = num_envs, int(P[P_H]), int(P[P_U])
        self.uf = np.zeros((E, U, NUF))
        self.ui = np.zeros((E, U, NUI), dtype=np.int64)
        self.hf = np.zeros((E, H, NHF))
        self.gi = np.zeros((E, NGI), dtype=np.int64)
        self.vis = np.zeros((E, 2, U), dtype=bool)
        self.seeds = np.zeros(E, dtype=np.uint64)
        self._seeded = False

    # Slot ranges of the unit kinds, in ``spec.entities`` order.
    @property
    def hero_slots(self) -> range:
        return range(0, self.spec.entities[0].max_count)

    @property
    def creep_slots(self) -> range:
        start = self.spec.entities[0].max_count
        return range(start, start + self.spec.entities[1].max_count)

    @property
    def tower_slots(self) -> range:
        start = self.creep_slots.stop
        return range(start, start + self.spec.entities[2].max_count)

    @property
    def base_slots(self) -> range:
        start = self.tower_slots.stop
        return range(start, start + 2)

    def reset(self, seed: int) -> Obs:
        if not 0 <= seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        pair = 2 if self.config.mirrored_pairs else 1
        ids = (self.first_copy + np.arange(self.num_envs, dtype=np.uint64)) // np.uint64(pair)
        self.seeds[:] = _copy_seeds(np.uint64(seed), ids)
        lay = self.layout
        _reset_all(self.uf, self.ui, self.hf, self.gi, self.vis, self.seeds, lay.params, HERO_STATS,
                            UNIT_STATS, lay.tower_xy, lay.tower_lane, lay.tower_tier, lay.base_xy, lay.hero_spawn,
                            lay.pool, lay.lineup)
        self._seeded = True
        return self.observe()

    def step(self, actions: Actions) -> tuple[Obs, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        if not self._seeded:
            raise RuntimeError("call reset(seed) before step()")
        lead = (self.num_envs, self.spec.num_agents)
        heads = {}
        for name, bound in (("action", self.spec.num_actions), ("move", self.spec.num_moves),
                            ("target", self.spec.num_targets)):
            if name not in actions:
                raise ValueError(f"actions lack the {name!r} head")
            head = np.asarray(actions[name])
            if head.shape != lead:
                raise ValueError(f"actions[{name!r}] has shape {head.shape}, expected {lead}")
            if head.size and (head.min() < 0 or head.max() >= bound):
                raise ValueError(f"actions[{name!r}] must lie in [0, {bound}), got [{head.min()}, {head.max()}]")
            heads[name] = np.ascontiguousarray(head, dtype=np.int64)
        E = self.num_envs
        events = np.zeros(lead + (len(REWARD_EVENTS),), dtype=np.float32)
        dones = np.zeros(E, dtype=bool)
        winners = np.zeros(E, dtype=np.int64)
        lengths = np.zeros(E, dtype=np.int64)
        lay = self.layout
        _step_all(self.uf, self.ui, self.hf, self.gi, self.vis, self.seeds, heads["action"], heads["move"],
                  heads["target"], lay.params, HERO_STATS, UNIT_STATS, lay.lane_waypoints, lay.tower_xy,
                  lay.tower_lane, lay.tower_tier, lay.base_xy, lay.creep_spawn, lay.hero_spawn, lay.pool,
                  lay.lineup, events, dones, winners, lengths)
        return self.observe(), events, dones, {"winner": winners, "episode_length": lengths}

    def observe(self) -> Obs:
        """The observation of the current state (what ``reset`` and ``step`` return)."""
        shapes = self.spec.observation_shapes(self.num_envs)
        obs = {key: np.empty(shape, dtype=dtype) for key, (shape, dtype) in shapes.items()}
        _observe_all(self.uf, self.ui, self.hf, self.gi, self.vis, self.layout.params, HERO_STATS,
                     obs["entities/heroes"], obs["entities/heroes/mask"], obs["entities/creeps"],
                     obs["entities/creeps/mask"], obs["entities/towers"], obs["entities/towers/mask"],
                     obs["entities/bases"], obs["entities/bases/mask"], obs["global"], obs["action_mask"],
                     obs["move_mask"], obs["target_mask"])
        return obs


@njit(cache=True)
def _copy_seeds(seed, ids):
    out = np.empty(ids.shape[0], dtype=np.uint64)
    for i in range(ids.shape[0]):
        out[i] = _mix64(seed ^ _mix64(ids[i] + _GOLDEN))
    return out


@njit(cache=True)
def _reset_all(uf, ui, hf, gi, vis, seeds, P, hs, us, tower_xy, tower_lane, tower_tier, base_xy, hero_spawn,
                        pool, lineup):
    for e in range(uf.shape[0]):
        _reset_copy(e, uf, ui, hf, gi, vis, seeds, P, hs, us, tower_xy, tower_lane, tower_tier, base_xy, hero_spawn,
                    pool, lineup, 0)
