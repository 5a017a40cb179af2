"""``nmmo``: a massively multi-agent, persistent world after Neural MMO v1.3 (Suarez et al.), vectorised over copies.

A square tile map, generated per copy by thresholding Perlin ridge fractals, of grass and forest (passable), stone and
water (not), inside a border of lava that kills whoever steps on it. Agents spawn, one per tick, on a random tile of
the playable square's outer ring (grass; they forage inwards, as on the paper's map) until ``num_agents`` live; a slot
freed by a death takes the next spawn (the lowest free slot first). Each agent has food, water and health: food and
water drop by ``drain`` every tick; standing on a forest eats it (food refills; the tile turns to scrub, which grows
back with chance ``forest_regrow`` per tick), standing next to water drinks (water refills); each of food and water at
zero costs ``starve_damage`` health per tick, and while both are above half of their maximum health comes back by
``regen``. Agents fight in three styles: melee (reach 1, the most damage), range (reach 3) and mage (reach 4, the
least damage, but a hit freezes the target in place for ``freeze_ticks``). Accuracy and damage grow with the
attacker's level in the style and fall with the defender's defense; a hit also takes from the target as much food and
water as it did damage (the paper's pilfering). Levels (constitution: the maximum health; melee, range, mage;
defense; hunting and fishing: the maximum food and water) grow with use along the RuneScape experience curve. An agent
dies at zero health or on lava; newly spawned agents can not be attacked for ``immune_ticks``. The world is never
reset: an agent's episode is its lifetime (``infos["agent_done"]`` marks its last step), and ``dones`` stays False.

Agent ``a`` of a copy is slot ``a``; an empty slot (before its first spawn, after a death) observes zeros and may only
stay and not attack. A tick, for every copy (``_step_copy``): attacks, decided on the start-of-tick positions and
resolved in slot order (accuracy rolls, damage, freezes, pilfering, experience); moves (a frozen agent stays; water,
stone and the map's edge block); food and water (drain, eating, drinking, starvation, regeneration); damage and
deaths; levels; forest regrowth; one spawn; then the observation.

Observation (``NmmoEnv.observe``; the tables are in docs/nmmo.md):

=================  ==================================================================================================
field              features
=================  ==================================================================================================
global             the own agent (``SELF_FEATURES``): alive, health, food and water as fractions of their maxima, the
                   seven levels /99, frozen and immune ticks left (fractions), x and y in the playable square (0..1),
                   lifetime/1000, living agents / num_agents, next to water, agents in view / max_seen, distance to
                   the lava / vision (at most 1); then the (2·vision+1)² tile crop centred on the agent, row-major
                   (north-west first), ``CROP_CHANNELS`` per tile: lava, water, scrub, forest, stone (one-hot; grass
                   is all zero; beyond the map is lava), other agents on the tile
entities/agents    up to ``max_seen`` other agents in view, nearest first (Chebyshev distance, then row-major
                   offset): dx, dy, distance (/vision), health fraction, constitution, food and water fractions,
                   melee, range, mage and defense levels /99, frozen, immune, attackable (in reach of some style
                   and not immune), lifetime/1000
=================  ==================================================================================================

Actions: ``action`` is the attack style (none, melee, range, mage), ``move`` the move (stay, north, east, south,
west), ``target`` the row of ``entities/agents`` to attack; every style moves too. Masks: a target is legal when it
is not immune and within the longest reach (mage's); a style is legal when some target is within its reach; a move
is legal when the agent is alive, not frozen and the tile is grass, scrub, forest or lava. An attack whose target is
not legal, or beyond the chosen style's reach, does nothing, as does an illegal move.

All randomness (terrain, accuracy rolls, regrowth, spawn tiles) comes from one SplitMix64 stream per copy, seeded by
(seed, global copy): a copy plays the same world whether it is stepped alone or with others.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from hpc_rl.envs import nmmo_config
from hpc_rl.envs.api import Actions, Obs
from hpc_rl.envs.moba import _copy_seeds, _mix64, _uniform  # the one home of the per-copy SplitMix64 streams
from hpc_rl.envs.nmmo_config import (CROP_CHANNELS, EV_ALIVE, EV_DEATH, EV_FOOD, EV_WATER, FOREST, GRASS, LAVA,
                                     MAX_LEVEL, MOVE_DX, MOVE_DY, S_MAGE, S_MELEE, SCRUB, SELF_FEATURES,
                                     SK_CONSTITUTION, SK_DEFENSE, SK_FISHING, SK_HUNTING, SKILLS, STONE, WATER,
                                     NmmoConfig)

# Combat, per style (rows none, melee, range, mage): reach in tiles (Chebyshev), damage = base + slope·level/99.
REACH = np.array([0, 1, 3, 4], dtype=np.int64)
DAMAGE_BASE = np.array([0.0, 7.0, 3.0, 1.0])
DAMAGE_SLOPE = np.array([0.0, 63.0, 32.0, 24.0])
XP_PER_DAMAGE = 4.0  # to the style's skill (RuneScape); constitution gets a third of it, the defender's defense all
XP_PER_HARVEST = 10.0  # hunting per forest eaten, fishing per tick that drinking raised water
# The crop channel of each material and the value written there: grass has no channel, and writes 0 into lava's,
# so that the crop loop writes every tile without a branch.
_CROP_CHANNEL = np.zeros(len(nmmo_config.MATERIALS), dtype=np.int64)
_CROP_VALUE = np.zeros(len(nmmo_config.MATERIALS))
for _channel, _material in enumerate(nmmo_config.CROP_MATERIALS):
    _CROP_CHANNEL[_material] = _channel
    _CROP_VALUE[_material] = 1.0
_DY = np.array(MOVE_DY, dtype=np.int64)
_DX = np.array(MOVE_DX, dtype=np.int64)


def experience_table() -> np.ndarray:
    """(MAX_LEVEL + 1,): the experience needed for each level (index = level; RuneScape's curve, level 2 at 83 and
    level 99 at 13,034,431)."""
    table = np.zeros(MAX_LEVEL + 1)
    total = 0.0
    for level in range(1, MAX_LEVEL):
        total += np.floor(level + 300.0 * 2.0 ** (level / 7.0))
        table[level + 1] = np.floor(total / 4.0)
    table[0] = -1.0  # no level 0: every experience is at least level 1
    return table


XP_TABLE = experience_table()


def view_rank(vision: int) -> np.ndarray:
    """(side²,) int64: the rank of each crop cell (row-major) when the cells are ordered nearest first (Chebyshev
    distance, then row-major): the order in which agents in view are listed."""
    r = np.arange(-vision, vision + 1)
    dy, dx = np.meshgrid(r, r, indexing="ij")
    dy, dx = dy.ravel(), dx.ravel()
    order = np.lexsort((dx, dy, np.maximum(np.abs(dy), np.abs(dx))))
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    return rank


# Agent state columns ``ai[e, a, :]`` (int64; levels at LEVEL + skill) and copy state ``gi[e, :]``.
IALIVE, IY, IX, IHP, IFOOD, IWATER, IFREEZE, IIMMUNE, ILIFE, LEVEL = range(10)
NAI = LEVEL + len(SKILLS)
GTICK, GNDEP, GSTAMP, GALIVE = range(4)
NGI = 4
# Parameters ``P`` (float64) the kernels read.
(P_BORDER, P_VISION, P_DRAIN, P_STARVE, P_REGEN, P_REGROW, P_IMMUNE, P_FREEZE, P_XP, P_START, P_WATER, P_STONE,
 P_FOREST, P_SCALE) = range(14)


def params(config: NmmoConfig) -> np.ndarray:
    return np.array([config.border, config.vision, config.drain, config.starve_damage, config.regen,
                     config.forest_regrow, config.immune_ticks, config.freeze_ticks, config.xp_scale,
                     config.start_resources, config.water_share, config.stone_share, config.forest_share,
                     config.terrain_scale], dtype=np.float64)


def spawn_ring(config: NmmoConfig) -> np.ndarray:
    """(R, 2) int64 (y, x): the playable square's outer ring, where agents spawn (clockwise from the north-west)."""
    lo, hi = config.border, config.map_size - config.border - 1
    top = [(lo, x) for x in range(lo, hi)]
    right = [(y, hi) for y in range(lo, hi)]
    bottom = [(hi, x) for x in range(hi, lo, -1)]
    left = [(y, lo) for y in range(hi, lo, -1)]
    return np.array(top + right + bottom + left, dtype=np.int64)


# ---------------------------------------------------------------------------------------------------------------------
# Compiled kernels: each loops over the copies in compiled code.

# The kernels hold nmmo_config's constants compiled in; numba's cache notices edits of this file only, so NmmoEnv
# checks that the cached code holds the current values (as MobaEnv does for moba_config).
_SHARED_CONSTANTS = tuple(value for name, value in vars(nmmo_config).items() if name.isupper() and type(value) is int)


@njit(cache=True)
def _compiled_shared_constants():
    return _SHARED_CONSTANTS


@njit(cache=True)
def _gradient_noise(y, x, seed):
    """Perlin's gradient noise at (y, x) in lattice units, gradients hashed from the lattice point and ``seed``;
    roughly in [-1, 1]."""
    y0, x0 = np.floor(y), np.floor(x)
    fy, fx = y - y0, x - x0
    total = 0.0
    for cy in range(2):
        for cx in range(2):
            h = _mix64(seed ^ _mix64(np.uint64(np.int64(y0) + cy + 4096) * np.uint64(65536)
                                     + np.uint64(np.int64(x0) + cx + 4096)))
            angle = float(h >> np.uint64(11)) * (2.0 * np.pi / 9007199254740992.0)
            ry, rx = fy - cy, fx - cx
            dot = np.sin(angle) * ry + np.cos(angle) * rx
            wy = fy * fy * fy * (fy * (fy * 6.0 - 15.0) + 10.0)  # Perlin's quintic fade
            wx = fx * fx * fx * (fx * (fx * 6.0 - 15.0) + 10.0)
            total += dot * (wy if cy else 1.0 - wy) * (wx if cx else 1.0 - wx)
    return total * 1.4142135623730951


@njit(cache=True)
def _ridge_fractal(y, x, scale, seed):
    """A ridge fractal (three octaves of 1 - |noise|, each at twice the frequency and half the weight): high on the
    winding ridges where the noise crosses zero."""
    total, weight, norm = 0.0, 1.0, 0.0
    freq = 1.0 / scale
    for octave in range(3):
        total += weight * (1.0 - abs(_gradient_noise(y * freq, x * freq, seed + np.uint64(octave))))
        norm += weight
        weight *= 0.5
        freq *= 2.0
    return total / norm


@njit(cache=True)
def _generate_map(e, tiles, seeds, P):
    """Copy ``e``'s terrain: lava outside the border; inside, stone on the highest ridges of one fractal, water in
    its lowest valleys, forest on the highest ridges of a second one, grass elsewhere and on the spawn ring. The
    thresholds are quantiles, so the shares hold on every map."""
    S = tiles.shape[1]
    b = int(P[P_BORDER])
    n = S - 2 * b - 2  # the playable square without its ring
    seed_a = _mix64(seeds[e] ^ np.uint64(0xA5A5A5A5))
    seed_b = _mix64(seeds[e] ^ np.uint64(0x5A5A5A5A))
    rock = np.empty(n * n)
    wood = np.empty(n * n)
    for i in range(n):
        for j in range(n):
            rock[i * n + j] = _ridge_fractal(float(i), float(j), P[P_SCALE], seed_a)
            wood[i * n + j] = _ridge_fractal(float(i), float(j), P[P_SCALE], seed_b)
    sorted_rock = np.sort(rock)
    sorted_wood = np.sort(wood)
    water_below = sorted_rock[int(P[P_WATER] * (n * n - 1))] if P[P_WATER] > 0 else -1.0
    stone_above = sorted_rock[int((1.0 - P[P_STONE]) * (n * n - 1))] if P[P_STONE] > 0 else 2.0
    forest_above = sorted_wood[int((1.0 - P[P_FOREST]) * (n * n - 1))] if P[P_FOREST] > 0 else 2.0
    for y in range(S):
        for x in range(S):
            tiles[e, y, x] = LAVA if y < b or x < b or y >= S - b or x >= S - b else GRASS
    for i in range(n):
        for j in range(n):
            r, w = rock[i * n + j], wood[i * n + j]
            if r >= stone_above:
                m = STONE
            elif r <= water_below:
                m = WATER
            elif w >= forest_above:
                m = FOREST
            else:
                m = GRASS
            tiles[e, b + 1 + i, b + 1 + j] = m


@njit(cache=True)
def _level_of(xp):
    level = 1
    while level < MAX_LEVEL and xp >= XP_TABLE[level + 1]:
        level += 1
    return level


@njit(cache=True)
def _spawn(e, a, ai, xp, rng, ring, P):
    """A new agent in slot ``a`` on a random tile of the spawn ring: start_resources of food, water and health."""
    k = int(_uniform(rng[e:e + 1]) * ring.shape[0])
    start = int(P[P_START])
    ai[e, a, IALIVE] = 1
    ai[e, a, IY] = ring[k, 0]
    ai[e, a, IX] = ring[k, 1]
    ai[e, a, IHP] = start
    ai[e, a, IFOOD] = start
    ai[e, a, IWATER] = start
    ai[e, a, IFREEZE] = 0
    ai[e, a, IIMMUNE] = int(P[P_IMMUNE])
    ai[e, a, ILIFE] = 0
    for s in range(xp.shape[2]):
        level = start if s == SK_CONSTITUTION or s == SK_HUNTING or s == SK_FISHING else 1
        ai[e, a, LEVEL + s] = level
        xp[e, a, s] = max(XP_TABLE[level], 0.0)


@njit(cache=True)
def _reset_all(ai, xp, gi, tiles, regrow, dep, seen, rng, seeds, ring, P):
    for e in range(ai.shape[0]):
        rng[e] = seeds[e]
        _generate_map(e, tiles, seeds, P)
        regrow[e] = 0
        ai[e] = 0
        xp[e] = 0.0
        seen[e] = -1
        gi[e] = 0
        dep[e] = 0
        # The first agent is there from the start; the rest follow one per tick.
        _spawn(e, 0, ai, xp, rng, ring, P)
        gi[e, GALIVE] = 1


@njit(cache=True)
def _regrowth_ticks(r, p):
    """Ticks until an eaten forest grows back when it does so with chance ``p`` per tick: a geometric draw, made
    once when it is eaten (the same law as a roll every tick, without one)."""
    if p >= 1.0:
        return 1
    ticks = 1.0 + np.floor(np.log(1.0 - _uniform(r)) / np.log1p(-p)) if p > 0.0 else np.inf
    return int(min(ticks, 2.0 ** 62))


@njit(cache=True, inline="always")
def _passable(m):
    return m == GRASS or m == SCRUB or m == FOREST or m == LAVA


@njit(cache=True, inline="always")
def _near_water(e, tiles, y, x):
    S = tiles.shape[1]
    for k in range(1, 5):
        ny, nx = y + _DY[k], x + _DX[k]
        if 0 <= ny < S and 0 <= nx < S and tiles[e, ny, nx] == WATER:
            return True
    return False


@njit(cache=True)
def _step_all(ai, xp, gi, tiles, regrow, dep, seen, rng, ring, P, act, mov, tgt, events, agent_done, lifetime):
    """One tick of every copy, with the scratch space its copies share in turn."""
    A = ai.shape[1]
    damage = np.zeros(A, dtype=np.int64)
    frozen = np.zeros(A, dtype=np.int64)
    phi = np.zeros((A, 2))
    for e in range(ai.shape[0]):
        _step_copy(e, ai, xp, gi, tiles, regrow, dep, seen, rng, ring, P, act, mov, tgt, events, agent_done,
                   lifetime, damage, frozen, phi)


@njit(cache=True, inline="always")
def _resource_potential(e, a, ai):
    """Φ of the ``food`` and ``water`` reward events: food and water as fractions of their maxima."""
    return (ai[e, a, IFOOD] / ai[e, a, LEVEL + SK_HUNTING], ai[e, a, IWATER] / ai[e, a, LEVEL + SK_FISHING])


@njit(cache=True)
def _step_copy(e, ai, xp, gi, tiles, regrow, dep, seen, rng, ring, P, act, mov, tgt, events, agent_done, lifetime,
               damage, frozen, phi):
    A = ai.shape[1]
    S = tiles.shape[1]
    t = gi[e, GTICK]
    r = rng[e:e + 1]
    xs = P[P_XP]
    damage[:] = 0
    frozen[:] = 0
    # The start-of-tick potentials (before pilfering, eating and drinking change them).
    for a in range(A):
        if ai[e, a, IALIVE]:
            phi[a, 0], phi[a, 1] = _resource_potential(e, a, ai)
    # Attacks, on the start-of-tick state, in slot order: a target is a row of the attacker's last observation.
    for a in range(A):
        style = act[e, a]
        if ai[e, a, IALIVE] == 0 or style == 0:
            continue
        k = tgt[e, a]
        b = seen[e, a, k]
        if b < 0 or ai[e, b, IIMMUNE] > 0:
            continue
        reach = max(abs(ai[e, b, IY] - ai[e, a, IY]), abs(ai[e, b, IX] - ai[e, a, IX]))
        if reach > REACH[style]:
            continue
        level = ai[e, a, LEVEL + style]  # the styles' skills are in style order after constitution
        accuracy = 0.5 + (level - ai[e, b, LEVEL + SK_DEFENSE]) / 200.0
        if _uniform(r) >= accuracy:
            continue
        dealt = int(DAMAGE_BASE[style] + DAMAGE_SLOPE[style] * level / MAX_LEVEL)
        damage[b] += dealt
        if style == S_MAGE:
            frozen[b] = int(P[P_FREEZE])
        food = min(dealt, ai[e, b, IFOOD])
        water = min(dealt, ai[e, b, IWATER])
        ai[e, b, IFOOD] -= food
        ai[e, b, IWATER] -= water
        ai[e, a, IFOOD] = min(ai[e, a, IFOOD] + food, ai[e, a, LEVEL + SK_HUNTING])
        ai[e, a, IWATER] = min(ai[e, a, IWATER] + water, ai[e, a, LEVEL + SK_FISHING])
        xp[e, a, style] += XP_PER_DAMAGE * dealt * xs
        xp[e, a, SK_CONSTITUTION] += XP_PER_DAMAGE / 3.0 * dealt * xs
        xp[e, b, SK_DEFENSE] += XP_PER_DAMAGE * dealt * xs
    regrow_p = P[P_REGROW]
    for a in range(A):
        if ai[e, a, IALIVE] == 0:
            continue
        # Move (a frozen agent stays).
        m = mov[e, a]
        if m > 0 and ai[e, a, IFREEZE] == 0:
            ny, nx = ai[e, a, IY] + _DY[m], ai[e, a, IX] + _DX[m]
            if 0 <= ny < S and 0 <= nx < S and _passable(tiles[e, ny, nx]):
                ai[e, a, IY] = ny
                ai[e, a, IX] = nx
        y, x = ai[e, a, IY], ai[e, a, IX]
        # Food and water: drain, then eat the forest stood on and drink next to water.
        max_food, max_water = ai[e, a, LEVEL + SK_HUNTING], ai[e, a, LEVEL + SK_FISHING]
        ai[e, a, IFOOD] = max(ai[e, a, IFOOD] - int(P[P_DRAIN]), 0)
        ai[e, a, IWATER] = max(ai[e, a, IWATER] - int(P[P_DRAIN]), 0)
        if tiles[e, y, x] == FOREST:
            tiles[e, y, x] = SCRUB
            regrow[e, y, x] = t + _regrowth_ticks(r, regrow_p)
            dep[e, gi[e, GNDEP]] = y * S + x
            gi[e, GNDEP] += 1
            ai[e, a, IFOOD] = max_food
            xp[e, a, SK_HUNTING] += XP_PER_HARVEST * xs
        if _near_water(e, tiles, y, x) and ai[e, a, IWATER] < max_water:
            ai[e, a, IWATER] = max_water
            xp[e, a, SK_FISHING] += XP_PER_HARVEST * xs
        hp = ai[e, a, IHP]
        if ai[e, a, IFOOD] == 0:
            hp -= int(P[P_STARVE])
        if ai[e, a, IWATER] == 0:
            hp -= int(P[P_STARVE])
        if 2 * ai[e, a, IFOOD] > max_food and 2 * ai[e, a, IWATER] > max_water:
            hp = min(hp + int(P[P_REGEN]), ai[e, a, LEVEL + SK_CONSTITUTION])
        # Damage, freezes and timers, then death at zero health or on lava.
        hp -= damage[a]
        ai[e, a, IHP] = hp
        ai[e, a, IFREEZE] = max(ai[e, a, IFREEZE] - 1, frozen[a])
        ai[e, a, IIMMUNE] = max(ai[e, a, IIMMUNE] - 1, 0)
        ai[e, a, ILIFE] += 1
        if hp <= 0 or tiles[e, y, x] == LAVA:
            ai[e, a, IALIVE] = 0
            gi[e, GALIVE] -= 1
            events[e, a, EV_DEATH] = 1.0
            events[e, a, EV_FOOD] = -phi[a, 0]  # Φ of the dead is 0
            events[e, a, EV_WATER] = -phi[a, 1]
            agent_done[e, a] = True
            lifetime[e, a] = ai[e, a, ILIFE]
            continue
        events[e, a, EV_ALIVE] = 1.0
        for s in range(len(SKILLS)):
            ai[e, a, LEVEL + s] = _level_of(xp[e, a, s])
        # After the levels: a new maximum counts in the potential the next tick starts from.
        food, water = _resource_potential(e, a, ai)
        events[e, a, EV_FOOD] = food - phi[a, 0]
        events[e, a, EV_WATER] = water - phi[a, 1]
    # Forest regrowth: the eaten tiles whose time has come (swap-removed from the list).
    i = 0
    while i < gi[e, GNDEP]:
        cell = dep[e, i]
        y, x = cell // S, cell % S
        if regrow[e, y, x] <= t:
            tiles[e, y, x] = FOREST
            gi[e, GNDEP] -= 1
            dep[e, i] = dep[e, gi[e, GNDEP]]
        else:
            i += 1
    # One spawn per tick, into the lowest free slot.
    if gi[e, GALIVE] < A:
        for a in range(A):
            if ai[e, a, IALIVE] == 0:
                _spawn(e, a, ai, xp, rng, ring, P)
                gi[e, GALIVE] += 1
                break
    gi[e, GTICK] = t + 1


# Without numba's reference counting (NRT), as moba's step kernel: with it, every view of an agent's rows counts
# itself in and out; without it a view costs nothing. Nothing here allocates: the scratch space comes in.
@njit(cache=True, _nrt=False)
def _observe_all(ai, gi, tiles, seen, head, nxt, stamp, rank, P, glob, ent, ent_mask, action_mask, move_mask,
                 target_mask, found, found_rank, found_dy, found_dx):
    E, A = ai.shape[0], ai.shape[1]
    S = tiles.shape[1]
    K = ent.shape[2]
    V = int(P[P_VISION])
    side = 2 * V + 1
    b = int(P[P_BORDER])
    span = float(S - 2 * b - 1)
    immune_ticks = max(P[P_IMMUNE], 1.0)
    freeze_ticks = max(P[P_FREEZE], 1.0)
    for e in range(E):
        # Who stands where: a list per tile (head, nxt), valid where the tile's stamp is this call's.
        gi[e, GSTAMP] += 1
        now = gi[e, GSTAMP]
        for a in range(A):
            if ai[e, a, IALIVE]:
                y, x = ai[e, a, IY], ai[e, a, IX]
                if stamp[e, y, x] != now:
                    stamp[e, y, x] = now
                    head[e, y, x] = -1
                nxt[e, a] = head[e, y, x]
                head[e, y, x] = a
        for a in range(A):
            g = glob[e, a]
            g[:] = 0.0
            ent[e, a] = 0.0
            for k in range(K):
                ent_mask[e, a, k] = False
                target_mask[e, a, k] = False
                seen[e, a, k] = -1
            for s in range(action_mask.shape[2]):
                action_mask[e, a, s] = s == 0
            for m in range(move_mask.shape[2]):
                move_mask[e, a, m] = m == 0
            if ai[e, a, IALIVE] == 0:
                continue
            y, x = ai[e, a, IY], ai[e, a, IX]
            # The crop, row-major (through row views, which spare three index computations per access); the other
            # agents on its tiles are collected with their rank.
            nf = 0
            for i in range(side):
                ty = y - V + i
                row_base = SELF_FEATURES + i * side * CROP_CHANNELS
                if ty < 0 or ty >= S:
                    for j in range(side):
                        g[row_base + j * CROP_CHANNELS] = 1.0  # beyond the map: lava
                    continue
                tile_row = tiles[e, ty]
                stamp_row = stamp[e, ty]
                for j in range(side):
                    tx = x - V + j
                    base = row_base + j * CROP_CHANNELS
                    if tx < 0 or tx >= S:
                        g[base] = 1.0
                        continue
                    m = tile_row[tx]
                    g[base + _CROP_CHANNEL[m]] = _CROP_VALUE[m]
                    if stamp_row[tx] == now:
                        o = head[e, ty, tx]
                        while o >= 0:
                            if o != a:
                                g[base + CROP_CHANNELS - 1] += 1.0
                                found[nf] = o
                                found_rank[nf] = rank[i * side + j]
                                found_dy[nf] = i - V
                                found_dx[nf] = j - V
                                nf += 1
                            o = nxt[e, o]
            # Nearest first: a stable insertion sort by rank (a handful of agents in view, as a rule).
            for p in range(1, nf):
                q = p
                while q > 0 and found_rank[q - 1] > found_rank[q]:
                    found[q - 1], found[q] = found[q], found[q - 1]
                    found_rank[q - 1], found_rank[q] = found_rank[q], found_rank[q - 1]
                    found_dy[q - 1], found_dy[q] = found_dy[q], found_dy[q - 1]
                    found_dx[q - 1], found_dx[q] = found_dx[q], found_dx[q - 1]
                    q -= 1
            n = min(nf, K)
            for k in range(n):
                o, dy, dx = found[k], found_dy[k], found_dx[k]
                _agent_row(e, a, k, o, dy, dx, ai, P, ent, immune_ticks, freeze_ticks)
                seen[e, a, k] = o
                ent_mask[e, a, k] = True
                if ai[e, o, IIMMUNE] == 0:
                    reach = max(abs(dy), abs(dx))
                    target_mask[e, a, k] = reach <= REACH[S_MAGE]
                    for s in range(S_MELEE, S_MAGE + 1):
                        if reach <= REACH[s]:
                            action_mask[e, a, s] = True
            if ai[e, a, IFREEZE] == 0:
                for k in range(1, 5):
                    ny, nx = y + _DY[k], x + _DX[k]
                    move_mask[e, a, k] = 0 <= ny < S and 0 <= nx < S and _passable(tiles[e, ny, nx])
            glob[e, a, 0] = 1.0
            glob[e, a, 1] = ai[e, a, IHP] / ai[e, a, LEVEL + SK_CONSTITUTION]
            glob[e, a, 2] = ai[e, a, IFOOD] / ai[e, a, LEVEL + SK_HUNTING]
            glob[e, a, 3] = ai[e, a, IWATER] / ai[e, a, LEVEL + SK_FISHING]
            for s in range(len(SKILLS)):
                glob[e, a, 4 + s] = ai[e, a, LEVEL + s] / MAX_LEVEL
            glob[e, a, 11] = ai[e, a, IFREEZE] / freeze_ticks
            glob[e, a, 12] = ai[e, a, IIMMUNE] / immune_ticks
            glob[e, a, 13] = (x - b) / span
            glob[e, a, 14] = (y - b) / span
            glob[e, a, 15] = ai[e, a, ILIFE] / 1000.0
            glob[e, a, 16] = gi[e, GALIVE] / A
            glob[e, a, 17] = 1.0 if _near_water(e, tiles, y, x) else 0.0
            glob[e, a, 18] = n / K
            glob[e, a, 19] = min(min(y - b, x - b, S - b - 1 - y, S - b - 1 - x) + 1, V) / V


@njit(cache=True, inline="always")
def _agent_row(e, a, k, o, dy, dx, ai, P, ent, immune_ticks, freeze_ticks):
    """Row ``k`` of agent ``a``'s ``entities/agents``: agent ``o``, (dy, dx) from it."""
    V = P[P_VISION]
    reach = max(abs(dy), abs(dx))
    ent[e, a, k, 0] = dx / V
    ent[e, a, k, 1] = dy / V
    ent[e, a, k, 2] = reach / V
    ent[e, a, k, 3] = ai[e, o, IHP] / ai[e, o, LEVEL + SK_CONSTITUTION]
    ent[e, a, k, 4] = ai[e, o, LEVEL + SK_CONSTITUTION] / MAX_LEVEL
    ent[e, a, k, 5] = ai[e, o, IFOOD] / ai[e, o, LEVEL + SK_HUNTING]
    ent[e, a, k, 6] = ai[e, o, IWATER] / ai[e, o, LEVEL + SK_FISHING]
    for s in range(S_MELEE, S_MAGE + 1):
        ent[e, a, k, 6 + s] = ai[e, o, LEVEL + s] / MAX_LEVEL
    ent[e, a, k, 10] = ai[e, o, LEVEL + SK_DEFENSE] / MAX_LEVEL
    ent[e, a, k, 11] = ai[e, o, IFREEZE] / freeze_ticks
    ent[e, a, k, 12] = ai[e, o, IIMMUNE] / immune_ticks
    ent[e, a, k, 13] = 1.0 if ai[e, o, IIMMUNE] == 0 and reach <= REACH[S_MAGE] else 0.0
    ent[e, a, k, 14] = ai[e, o, ILIFE] / 1000.0


class NmmoEnv:
    """Many copies of one world stepped together (the ``VecEnv`` protocol of ``hpc_rl.envs.api``).

    ``first_copy`` is the global index of copy 0: copies split over several env ranks play the same worlds as one big
    env holding them all. ``step`` returns ``dones`` all False (the world goes on) and ``infos``: ``winner`` (-1) and
    ``episode_length`` (0) per copy, as the API asks, and per agent ``agent_done`` (E, A) bool, the agent in that slot
    died this tick (its episode, its lifetime, ended; the reward event ``death`` is 1), and ``lifetime`` (E, A), the
    ticks it lived, where ``agent_done``.
    """

    def __init__(self, config: NmmoConfig, num_envs: int, first_copy: int = 0):
        if num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {num_envs}")
        if first_copy < 0:
            raise ValueError(f"first_copy must be >= 0, got {first_copy}")
        if _compiled_shared_constants() != _SHARED_CONSTANTS:
            raise RuntimeError(f"numba's cache of {__file__} was compiled with another nmmo_config.py; delete its "
                               "files (nmmo.*.nbi, nmmo.*.nbc in __pycache__ or NUMBA_CACHE_DIR) and run again")
        self.config = config
        self.spec = config.spec()
        self.num_envs = num_envs
        self.first_copy = first_copy
        self.params = params(config)
        self.ring = spawn_ring(config)
        self.rank = view_rank(config.vision)
        E, A, S = num_envs, config.num_agents, config.map_size
        self.ai = np.zeros((E, A, NAI), dtype=np.int64)
        self.xp = np.zeros((E, A, len(SKILLS)))
        self.gi = np.zeros((E, NGI), dtype=np.int64)
        self.tiles = np.zeros((E, S, S), dtype=np.int8)
        self.regrow = np.zeros((E, S, S), dtype=np.int64)
        self.dep = np.zeros((E, S * S), dtype=np.int64)
        self.seen = np.full((E, A, config.max_seen), -1, dtype=np.int64)
        self.rng = np.zeros(E, dtype=np.uint64)
        self._head = np.zeros((E, S, S), dtype=np.int64)
        self._nxt = np.zeros((E, A), dtype=np.int64)
        self._stamp = np.zeros((E, S, S), dtype=np.int64)
        self._found = np.zeros((4, A), dtype=np.int64)  # observe's scratch: the agents in view of one agent
        self._seeded = False

    def reset(self, seed: int) -> Obs:
        """New worlds (terrain drawn from ``seed`` and the global copy index), each with its first agent."""
        if not 0 <= seed < 2**63:
            raise ValueError(f"seed must be in [0, 2**63), got {seed}")
        ids = self.first_copy + np.arange(self.num_envs, dtype=np.uint64)
        seeds = _copy_seeds(np.uint64(seed), ids)
        _reset_all(self.ai, self.xp, self.gi, self.tiles, self.regrow, self.dep, self.seen, self.rng, seeds,
                   self.ring, self.params)
        self._stamp[:] = 0
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
        events = np.zeros(lead + (len(self.spec.reward_events),), dtype=np.float32)
        agent_done = np.zeros(lead, dtype=bool)
        lifetime = np.zeros(lead, dtype=np.int64)
        _step_all(self.ai, self.xp, self.gi, self.tiles, self.regrow, self.dep, self.seen, self.rng, self.ring,
                  self.params, heads["action"], heads["move"], heads["target"], events, agent_done, lifetime)
        E = self.num_envs
        infos = {"winner": np.full(E, -1, dtype=np.int64), "episode_length": np.zeros(E, dtype=np.int64),
                 "agent_done": agent_done, "lifetime": lifetime}
        return self.observe(), events, np.zeros(E, dtype=bool), infos

    def observe(self) -> Obs:
        """The observation of the current state (what ``reset`` and ``step`` return)."""
        shapes = self.spec.observation_shapes(self.num_envs)
        obs = {key: np.empty(shape, dtype=dtype) for key, (shape, dtype) in shapes.items()}
        _observe_all(self.ai, self.gi, self.tiles, self.seen, self._head, self._nxt, self._stamp, self.rank,
                     self.params, obs["global"], obs["entities/agents"], obs["entities/agents/mask"],
                     obs["action_mask"], obs["move_mask"], obs["target_mask"], *self._found)
        return obs

    @property
    def alive(self) -> np.ndarray:
        """(E, A) bool: the slots holding a living agent."""
        return self.ai[:, :, IALIVE] == 1

    @property
    def positions(self) -> np.ndarray:
        """(E, A, 2) int64: the tile (row, column) of every slot's agent; meaningless where a slot is empty."""
        return self.ai[:, :, [IY, IX]]
