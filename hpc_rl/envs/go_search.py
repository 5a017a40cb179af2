"""Network-guided PUCT search over many games of Go at once (AlphaGo Zero, AlphaZero, ELF OpenGo), stepped so that
the leaves of every game are evaluated together in one batch.

One step of ``PUCTSearch``: ``select()`` descends each searched game's tree by PUCT ``leaves_per_game`` times,
putting a virtual loss on every path so that the next descent of the same step avoids it, replays the paths from
copies of the roots and returns the input planes and legal moves of the leaves that need the network (a leaf where
the game has ended takes its true result instead); the caller evaluates them in one batch, and
``expand_and_backup(priors, values)`` expands those leaves and backs every path up, removing its virtual loss. After
``simulations`` selections per game (the first expands the root), ``choose()`` gives each game's move, the policy
target π (the root's visit distribution) and the value the search sees for the player to move (for resignation).
``SelfPlay`` steps whole self-play games with it the same way (what an env rank runs: ``hpc_rl.roles.go``), with
AlphaGo Zero's calibrated resignation (``calibrated_resign_threshold``), and ``play_games`` drives those to their
ends in one process; ``Match`` steps games between two networks (gating, on an inference rank). The settings
(``PUCTConfig``) live in ``go_config.py``, which imports no numba, so a run's config composes without it.

The maths are pure functions (``puct_score``, ``first_play_value``, ``add_virtual_loss``, ``backup``, ``mix_noise``,
``visit_policy``, ``calibrated_resign_threshold``). A node's statistics are its visit count N and value sum W, both
for the player who moved into it, and its prior P.

numba caches each file's kernels and notices edits of that file only; the kernels here therefore call nothing of
``go.py``: positions are built through ``GoGames``' own methods (``copy_from``, ``play_sequences``, ``terminal``,
``legal_mask``), and the tree is plain arrays.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, replace

import numpy as np
from numba import njit

from hpc_rl.envs.go import NUM_PLANES, TO_PLAY, GoGames, input_planes, passes_held_back
from hpc_rl.envs.go_config import PUCTConfig


# ---------------------------------------------------------------------------------------------------------------------
# The maths, as pure functions (compiled; callable from Python).

# Columns of the node arrays ``ni`` (int64) and ``nf`` (float64). A node's children are ``ni[node, FIRST]`` ...
# ``+ ni[node, COUNT] - 1``; COUNT 0: not expanded (an expanded node has a child at least: pass).
ACTION, FIRST, COUNT = range(3)
PRIOR, VISITS, VALUE_SUM = range(3)


@njit(cache=True)
def puct_score(value_sum, visits, prior, parent_visits, c_puct, first_play):
    """AlphaGo Zero's PUCT: Q + c_puct P sqrt(N_parent) / (1 + N), Q = W / N and ``first_play`` for an unvisited
    child (AlphaGo Zero's 0, or ``first_play_value``); N_parent is the parent's own count (1 + its children's,
    in-flight paths included)."""
    q = value_sum / visits if visits > 0 else first_play
    return q + c_puct * prior * np.sqrt(parent_visits) / (1.0 + visits)


@njit(cache=True)
def first_play_value(parent_value, visited_prior, reduction):
    """Leela Zero's and KataGo's first-play urgency: an unvisited child is valued at its parent's value for the player
    to move, less ``reduction`` times the square root of the prior mass already visited. With AlphaGo Zero's 0 a
    player whose search sees the position lost (every visited child below 0) tries every unvisited move before
    revisiting any, and spreads a large search over moves its prior rules out; the reduction keeps it on the moves
    the prior favours, and widens it only as the visited moves' prior mass grows."""
    return parent_value - reduction * np.sqrt(visited_prior)


@njit(cache=True)
def add_virtual_loss(nf, node, virtual_loss):
    """An in-flight path's node counts ``virtual_loss`` more visits, all lost (ELF's constant 1: one lost visit)."""
    nf[node, VISITS] += virtual_loss
    nf[node, VALUE_SUM] -= virtual_loss


@njit(cache=True)
def backup(nf, path, depth, value, virtual_loss):
    """Back ``value`` (the leaf's value for its player to move) up ``path[0..depth]`` (root first), replacing the
    path's virtual loss by one visit: each node's W is for the player who moved into it, so the sign alternates."""
    v = -value
    for i in range(depth, -1, -1):
        node = path[i]
        nf[node, VISITS] += 1.0 - virtual_loss
        nf[node, VALUE_SUM] += v + virtual_loss
        v = -v


@njit(cache=True)
def mix_noise(prior, noise, weight):
    """AlphaGo Zero's root exploration: (1 - epsilon) p + epsilon eta, eta ~ Dir(alpha) over the legal moves."""
    return (1.0 - weight) * prior + weight * noise


def visit_policy(visits: np.ndarray, temperature: float) -> np.ndarray:
    """pi(a) proportional to N(a)^(1 / temperature) over the last axis; temperature 0: one-hot on the most visited
    (the first of equals)."""
    visits = np.asarray(visits, dtype=np.float64)
    if temperature == 0:
        out = np.zeros_like(visits)
        np.put_along_axis(out, visits.argmax(-1)[..., None], 1.0, -1)
        return out
    top = visits.max(-1, keepdims=True)
    scaled = (visits / np.where(top > 0, top, 1.0)) ** (1.0 / temperature)  # scaled first: N^(1/T) overflows
    return scaled / scaled.sum(-1, keepdims=True)


def calibrated_resign_threshold(survivor_min_values, target: float) -> float:
    """AlphaGo Zero's resignation threshold from calibration games (played out, nobody resigning): the highest
    threshold t at which at most a share ``target`` of them would have seen a player who did not go on to lose resign,
    i.e. had a search value below t. ``survivor_min_values``: per calibration game, the lowest value the search gave
    the player who did not lose (the winner; in a draw, either). A player resigns when its value is below t, so with
    the values sorted, t is the (floor(target n) + 1)-th lowest: below it lie at most floor(target n) games."""
    values = np.sort(np.asarray(survivor_min_values, dtype=np.float64))
    if values.size == 0:
        raise ValueError("no calibration games to choose a resignation threshold from")
    return float(values[int(np.floor(target * values.size))])


# ---------------------------------------------------------------------------------------------------------------------
# Tree kernels.

@njit(cache=True)
def _select_child(ni, nf, node, c_puct, fpu_reduction):
    """The child of highest PUCT score, the first of equals (children are in action order). ``fpu_reduction`` < 0:
    an unvisited child's Q is 0 (AlphaGo Zero); otherwise ``first_play_value`` from the node's mean value."""
    best, best_score = -1, -np.inf
    parent_visits = nf[node, VISITS]
    first_play = 0.0
    if fpu_reduction >= 0:
        visited_prior = 0.0
        for c in range(ni[node, FIRST], ni[node, FIRST] + ni[node, COUNT]):
            if nf[c, VISITS] > 0:
                visited_prior += nf[c, PRIOR]
        # The node's W is for the player who moved into it: its mover's value is the negated mean.
        first_play = first_play_value(-nf[node, VALUE_SUM] / parent_visits, visited_prior, fpu_reduction)
    for c in range(ni[node, FIRST], ni[node, FIRST] + ni[node, COUNT]):
        score = puct_score(nf[c, VALUE_SUM], nf[c, VISITS], nf[c, PRIOR], parent_visits, c_puct, first_play)
        if score > best_score:
            best, best_score = c, score
    return best


@njit(cache=True)
def _select_paths(ni, nf, roots, games, counts, c_puct, fpu_reduction, virtual_loss, paths, actions, depths,
                  leaf_game):
    """``counts[i]`` paths from the root of game ``games[i]``, each to an unexpanded node, with a virtual loss on
    each path before the next descent; returns the number of paths written."""
    n = 0
    for i in range(games.shape[0]):
        g = games[i]
        for _ in range(counts[i]):
            node, d = roots[g], 0
            paths[n, 0] = node
            while ni[node, COUNT] > 0:
                node = _select_child(ni, nf, node, c_puct, fpu_reduction)
                actions[n, d] = ni[node, ACTION]
                d += 1
                paths[n, d] = node
            for j in range(d + 1):
                add_virtual_loss(nf, paths[n, j], virtual_loss)
            depths[n] = d
            leaf_game[n] = g
            n += 1
    return n


@njit(cache=True)
def _expand(ni, nf, node, used, legal, prior, noise, weight):
    """Give ``node`` a child per legal action (action order) from ``used`` on; returns the next free node. The priors
    are renormalised over the legal actions (uniform where they sum to 0), then mixed with ``noise`` by ``weight``."""
    total, k = 0.0, 0
    for a in range(legal.shape[0]):
        if legal[a]:
            total += prior[a]
            k += 1
    ni[node, FIRST] = used
    ni[node, COUNT] = k
    c = used
    for a in range(legal.shape[0]):
        if legal[a]:
            p = prior[a] / total if total > 0 else 1.0 / k
            ni[c, ACTION] = a
            ni[c, FIRST] = -1
            ni[c, COUNT] = 0
            nf[c, PRIOR] = mix_noise(p, noise[a], weight)
            nf[c, VISITS] = 0.0
            nf[c, VALUE_SUM] = 0.0
            c += 1
    return c


@njit(cache=True)
def _expand_and_backup(ni, nf, used, paths, depths, n, values, eval_row, legal, priors, noise, noise_rows, weight,
                       virtual_loss):
    """Expand each evaluated leaf (``eval_row[i] >= 0``) not yet expanded (two paths of a step may end on one leaf),
    the roots with their noise row, then back path ``i`` up with ``values[i]``, in path order; returns next free."""
    for i in range(n):
        leaf = paths[i, depths[i]]
        r = eval_row[i]
        if r >= 0 and ni[leaf, COUNT] == 0:
            if noise_rows[r] >= 0:
                used = _expand(ni, nf, leaf, used, legal[r], priors[r], noise[noise_rows[r]], weight)
            else:
                used = _expand(ni, nf, leaf, used, legal[r], priors[r], priors[r], 0.0)
        backup(nf, paths[i], depths[i], values[i], virtual_loss)
    return used


@njit(cache=True)
def _copy_subtree(ni, nf, node, out_ni, out_nf, source):
    """The subtree under ``node`` into ``out_ni`` / ``out_nf`` breadth first, ``node`` at 0 and each node's children
    contiguous in action order as before; ``source``: scratch of the same length. Returns the nodes copied."""
    out_ni[0, :] = ni[node, :]
    out_nf[0, :] = nf[node, :]
    source[0] = node
    n, i = 1, 0
    while i < n:
        first, count = ni[source[i], FIRST], ni[source[i], COUNT]
        if count > 0:
            out_ni[i, FIRST] = n
            for j in range(count):
                out_ni[n + j, :] = ni[first + j, :]
                out_nf[n + j, :] = nf[first + j, :]
                source[n + j] = first + j
            n += count
        i += 1
    return n


@njit(cache=True)
def _root_stats(ni, nf, roots, games, visits, values):
    """Per game ``games[i]``: its root children's visits by action into ``visits[i]``, and into ``values[i]`` the
    larger of the root's value and its most visited child's, for the player to move (AlphaGo Zero's resignation)."""
    for i in range(games.shape[0]):
        root = roots[games[i]]
        visits[i, :] = 0.0
        best = ni[root, FIRST]
        for c in range(ni[root, FIRST], ni[root, FIRST] + ni[root, COUNT]):
            visits[i, ni[c, ACTION]] = nf[c, VISITS]
            if nf[c, VISITS] > nf[best, VISITS]:
                best = c
        value = -nf[root, VALUE_SUM] / nf[root, VISITS]
        if nf[best, VISITS] > 0:
            value = max(value, nf[best, VALUE_SUM] / nf[best, VISITS])
        values[i] = value


# ---------------------------------------------------------------------------------------------------------------------

@dataclass
class MoveChoice:
    """What a move's search gave, one row per searched game (``PUCTSearch.start``'s rows, in order)."""

    rows: np.ndarray  # (R,) the games
    actions: np.ndarray  # (R,) the moves chosen
    pi: np.ndarray  # (R, size^2 + 1) float32: the root's visit distribution, the policy's training target
    values: np.ndarray  # (R,) the search's value for the player to move: max(root, most visited child)


class PUCTSearch:
    """The search of one move in many games at once, stepped: ``start``, then ``select`` / ``expand_and_backup``
    until ``done``, then ``choose``. Game ``g`` of the ``GoGames`` searched draws its root noise and its sampled
    moves from ``np.random.default_rng(seeds[g])``, so a game's moves do not depend on which games share its batch.
    The trees of one move share a pool of nodes, freed at the next ``start``."""

    def __init__(self, config: PUCTConfig, seeds, board_size: int = 9, komi: float = 7.5,
                 max_game_length: int | None = None):
        self.config = config
        self.num_games = len(seeds)
        self.rngs = [np.random.default_rng(s) for s in seeds]
        k = config.leaves_per_game
        self.leaves = GoGames(self.num_games * k, board_size, komi, max_game_length)  # scratch copies for replays
        self.num_actions = self.leaves.num_actions
        width = self.leaves.max_game_length + 1  # a path's nodes: root to a leaf at most at the game's end
        self._paths = np.zeros((self.num_games * k, width), dtype=np.int64)
        self._actions = np.zeros((self.num_games * k, width), dtype=np.int64)
        self._depths = np.zeros(self.num_games * k, dtype=np.int64)
        self._leaf_game = np.zeros(self.num_games * k, dtype=np.int64)
        capacity = self.num_games * max(64, self.num_actions * 4)
        self._ni = np.zeros((capacity, 3), dtype=np.int64)
        self._nf = np.zeros((capacity, 3), dtype=np.float64)
        self._used = 0
        self.roots = np.zeros(self.num_games, dtype=np.int64)
        self.simulations = np.zeros(self.num_games, dtype=np.int64)  # selections this move
        self.budget = config.simulations  # this move's simulations per game (``start``)
        self.noise = True  # whether this move's roots get Dirichlet noise
        self.rows = np.zeros(0, dtype=np.int64)
        self.games: GoGames | None = None
        self.leaf_games = np.zeros(0, dtype=np.int64)  # the game of each leaf the last select() returned
        self._pending = None
        self._kept = False  # descend() kept a subtree for the next start(keep_tree=True)

    def start(self, games: GoGames, rows, simulations: int | None = None, noise: bool = True,
              keep_tree: bool = False) -> None:
        """Begin a move's search in games ``rows`` (unfinished) of ``games``, which stays unchanged until ``choose``:
        ``simulations`` per game (default the config's), root noise as the config says or, with ``noise`` False,
        none (playout cap randomisation's fast searches). ``keep_tree``: a search of one game goes on from the tree
        ``descend`` kept (the caller's ``games`` must hold that node's position), adding ``simulations`` to its
        visits; without a kept tree it starts afresh."""
        rows = np.atleast_1d(np.asarray(rows, dtype=np.int64))
        if keep_tree and (self.num_games != 1 or noise and self.config.dirichlet_weight > 0):
            raise ValueError("keep_tree is for the search of one game without root noise (a kept root was expanded "
                             "without it)")
        if (games.num_games, games.size, games.komi, games.max_game_length) != (
                self.num_games, self.leaves.size, self.leaves.komi, self.leaves.max_game_length):
            raise ValueError("the games must match the search's number of games (seeds), board size, komi and "
                             "max_game_length")
        if self._pending is not None:
            raise RuntimeError("start() while a step is in flight: expand_and_backup() first")
        if len(np.unique(rows)) != len(rows) or games.terminal[rows].any():
            raise ValueError("start() needs distinct rows of unfinished games")
        self.games, self.rows = games, rows
        self.budget = self.config.simulations if simulations is None else int(simulations)
        if self.budget < 2:
            raise ValueError(f"a search needs >= 2 simulations (the first expands the root), got {self.budget}")
        self.noise = noise
        self.simulations[rows] = 0
        if keep_tree and self._kept:
            self._kept = False
            return
        self.roots[rows] = np.arange(len(rows))
        self._used = len(rows)
        self._ni[:len(rows)] = (-1, -1, 0)
        self._nf[:len(rows)] = 0.0
        self._kept = False

    def descend(self, actions) -> int:
        """Keep, for the next ``start(..., keep_tree=True)``, the subtree of the position that ``actions`` (the moves
        played since the last search's root, in order) lead to, and free the rest of the tree (a search of one game).
        Returns the visits kept at the new root: 0 when the search never expanded that position, and the next search
        then starts afresh. Keeping the tree between moves (AlphaGo Zero, Leela Zero, KataGo) carries the visits the
        last search spent below the moves since played into the next one."""
        if self.num_games != 1 or self._pending is not None or self.games is None:
            raise RuntimeError("descend() after a finished search of one game")
        node = self.roots[0]
        for a in actions:
            first, count = self._ni[node, FIRST], self._ni[node, COUNT]
            children = np.flatnonzero(self._ni[first:first + count, ACTION] == a) if count > 0 else []
            if len(children) == 0:
                self._kept = False
                return 0
            node = first + int(children[0])
        if self._ni[node, COUNT] == 0:
            self._kept = False
            return 0
        out_ni, out_nf = np.empty_like(self._ni[:self._used]), np.empty_like(self._nf[:self._used])
        n = _copy_subtree(self._ni, self._nf, node, out_ni, out_nf, np.empty(self._used, dtype=np.int64))
        self._ni[:n], self._nf[:n] = out_ni[:n], out_nf[:n]
        self._used, self.roots[0], self._kept = n, 0, True
        return int(self._nf[0, VISITS])

    @property
    def done(self) -> bool:
        return self._pending is None and bool((self.simulations[self.rows] >= self.budget).all())

    def select(self) -> tuple[np.ndarray, np.ndarray]:
        """One step's leaves: (planes (E, NUM_PLANES, size, size) float32, legal (E, size^2 + 1) bool) of the E
        leaves to evaluate (none where every path ended a game); answer with ``expand_and_backup``."""
        if self._pending is not None:
            raise RuntimeError("select() twice: expand_and_backup() the last step's leaves first")
        if self.games is None or self.done:
            raise RuntimeError("select() with no search under way: start() a move first")
        cfg = self.config
        sims = self.simulations[self.rows]
        games = self.rows[sims < self.budget]
        left = self.budget - self.simulations[games]
        expanded = self._ni[self.roots[games], COUNT] > 0
        counts = np.where(expanded, np.minimum(cfg.leaves_per_game, left), 1)  # the root is expanded alone first
        fpu = -1.0 if cfg.fpu_reduction is None else cfg.fpu_reduction
        n = _select_paths(self._ni, self._nf, self.roots, games, counts, cfg.c_puct, fpu, cfg.virtual_loss,
                          self._paths, self._actions, self._depths, self._leaf_game)
        self.simulations[games] += counts
        rows = np.arange(n)
        self.leaves.copy_from(rows, self.games, self._leaf_game[:n])
        self.leaves.play_sequences(rows, self._actions[:n], self._depths[:n])
        terminal = self.leaves.terminal[:n]
        values = np.zeros(n)
        ended = np.flatnonzero(terminal)
        values[ended] = self.leaves.returns()[ended, self.leaves.meta[ended, TO_PLAY]]  # for the player to move
        evaluate = np.flatnonzero(~terminal)
        eval_row = np.full(n, -1, dtype=np.int64)
        eval_row[evaluate] = np.arange(len(evaluate))
        legal = self.leaves.legal_mask()[evaluate]
        if cfg.restrict_passes:
            legal[passes_held_back(self.leaves, evaluate, legal), -1] = False
        self.leaf_games = self._leaf_game[evaluate]
        self._pending = (n, values, eval_row, evaluate, legal)
        return input_planes(self.leaves, evaluate, legal), legal

    def expand_and_backup(self, priors, values) -> None:
        """Answer the last ``select``: ``priors`` (E, size^2 + 1), >= 0, used over the legal moves (renormalised), and
        ``values`` (E,), each leaf's value for its player to move, in [-1, 1]."""
        if self._pending is None:
            raise RuntimeError("expand_and_backup() without select()")
        n, leaf_values, eval_row, evaluate, legal = self._pending
        priors = np.ascontiguousarray(priors, dtype=np.float64)
        values = np.asarray(values, dtype=np.float64).reshape(-1)
        e = len(evaluate)
        if priors.shape != (e, self.num_actions) or values.shape != (e,):
            raise ValueError(f"expand_and_backup needs priors ({e}, {self.num_actions}) and values ({e},), got "
                             f"{priors.shape} and {values.shape}")
        if not (np.isfinite(priors).all() and (priors >= 0).all() and np.isfinite(values).all()
                and (np.abs(values) <= 1).all()):
            raise ValueError("priors must be finite and >= 0, values finite in [-1, 1]")
        leaf_values[evaluate] = values
        cfg = self.config
        roots = evaluate[self._depths[evaluate] == 0]  # leaves expanding a root: noise (AlphaGo Zero), per game
        noise_rows = np.full(e, -1, dtype=np.int64)
        noise = np.zeros((len(roots), self.num_actions))
        weight = cfg.dirichlet_weight if self.noise else 0.0
        if weight > 0:
            for j, leaf in enumerate(roots):
                moves = np.flatnonzero(legal[eval_row[leaf]])
                noise[j, moves] = self.rngs[self._leaf_game[leaf]].dirichlet(np.full(len(moves), cfg.dirichlet_alpha))
                noise_rows[eval_row[leaf]] = j
        self._grow(self._used + e * self.num_actions)
        self._used = _expand_and_backup(self._ni, self._nf, self._used, self._paths, self._depths, n, leaf_values,
                                        eval_row, legal, priors, noise, noise_rows, weight, cfg.virtual_loss)
        self._pending = None

    def choose(self) -> MoveChoice:
        """Each searched game's move: drawn from the visits at the temperature (the most visited from
        ``greedy_after`` on), with π the visit distribution; the games themselves are not changed."""
        if not self.done:
            raise RuntimeError("choose() before the search is done")
        cfg = self.config
        visits = np.zeros((len(self.rows), self.num_actions))
        values = np.zeros(len(self.rows))
        _root_stats(self._ni, self._nf, self.roots, self.rows, visits, values)
        moves = self.games.move_number[self.rows]
        actions = np.zeros(len(self.rows), dtype=np.int64)
        for i, g in enumerate(self.rows):
            greedy = cfg.temperature == 0 or (cfg.greedy_after is not None and moves[i] >= cfg.greedy_after)
            if greedy:
                actions[i] = visits[i].argmax()
            else:
                actions[i] = self.rngs[g].choice(self.num_actions, p=visit_policy(visits[i], cfg.temperature))
        pi = visit_policy(visits, 1.0).astype(np.float32)
        return MoveChoice(self.rows.copy(), actions, pi, values)

    def search(self, games: GoGames, rows, evaluate, keep_tree: bool = False) -> MoveChoice:
        """A whole move's search in one process: ``evaluate(planes, legal) -> (priors, values)`` answers each step's
        batch (a step whose paths all ended games has none to answer); ``keep_tree`` as for ``start``."""
        self.start(games, rows, keep_tree=keep_tree)
        while not self.done:
            planes, legal = self.select()
            if len(planes):
                self.expand_and_backup(*evaluate(planes, legal))
            else:
                self.expand_and_backup(np.zeros((0, self.num_actions)), np.zeros(0))
        return self.choose()

    def _grow(self, need: int) -> None:
        cap = self._ni.shape[0]
        if need > cap:
            while cap < need:
                cap *= 2
            self._ni = np.concatenate([self._ni, np.zeros((cap - self._ni.shape[0], 3), dtype=np.int64)])
            self._nf = np.concatenate([self._nf, np.zeros((cap - self._nf.shape[0], 3))])


# ---------------------------------------------------------------------------------------------------------------------
# Self-play: the games of many rows, stepped like the search (an env rank's), or driven in one process.

@dataclass
class GameRecord:
    """One self-play game: per move searched, what the learner trains on, and how the game ended."""

    planes: np.ndarray  # (T, NUM_PLANES, size, size) float32: the network's input at each searched position
    pi: np.ndarray  # (T, size^2 + 1) float32: the search's visit distribution there
    to_play: np.ndarray  # (T,) 0 black, 1 white
    actions: np.ndarray  # (T,) the moves chosen (a resigned game's last one was not played)
    z: np.ndarray  # (T,) float32: the outcome for the player to move, +1 / -1 / 0
    winner: int  # 0 black, 1 white, -1 a draw
    resigned: bool  # the loser resigned
    playout: bool  # a calibration game: nobody could resign
    would_resign: int  # in a calibration game, the first player whose value fell below the threshold, else -1
    versions: np.ndarray  # (T,) int64: the network version that answered each move's last evaluations (0 in one
    #                       process): how stale the position is when a learner trains on it
    moves: int  # moves searched in the game (a resignation counts as one): T, or more where fast searches (playout
    #             cap randomisation) recorded nothing; T may then be 0
    ownership: np.ndarray  # (size^2,) int8: the last board's area owner of every point, black's view (+1 black, -1
    #                        white, 0 neither; GoGames.area_owners): KataGo's ownership target where the game was
    #                        played out, the board at the resignation where it was resigned (not a target)


def outcome_targets(to_play: np.ndarray, winner: int) -> np.ndarray:
    """z of every position: +1 where the player to move went on to win, -1 where they lost, 0 in a draw."""
    return np.where(winner < 0, 0.0, np.where(to_play == winner, 1.0, -1.0)).astype(np.float32)


def ownership_targets(to_play: np.ndarray, ownership: np.ndarray) -> np.ndarray:
    """(T, size^2) int8: a game's final ``ownership`` (black's view) from the view of each position's player to move,
    as the network's input planes see the board (+1 the player's, -1 the opponent's)."""
    sign = np.where(np.asarray(to_play) == 0, 1, -1).astype(np.int8)
    return sign[:, None] * np.asarray(ownership, np.int8)[None, :]


class SelfPlay:
    """Self-play games in ``len(seeds)`` rows, every move searched by ``PUCTSearch``, stepped as the search is:

        planes, legal = selfplay.select()                       # one batch: the leaves of every row's search
        finished = selfplay.expand_and_backup(priors, values)   # [(row, GameRecord)] of the games that ended

    When a step completes the move's search in every row, the moves are played (or resigned) and the games that
    ended come back as records. With ``restart`` a finished row starts a new game at once, so an env rank's batch
    stays full; without it the row stays finished (``done`` once every row is).

    With ``config.fast_simulations`` (KataGo's playout cap randomisation) each move is a full search, recorded, with
    probability ``full_search_share``, else a fast one without root noise whose position is played but not recorded.
    The draw is one per move for all rows, from ``[seeds[0], 2]``'s stream: the rows search in lockstep, so a draw per
    row would make nearly every move as long as a full search.

    Row ``i`` searches with ``seeds[i]``'s stream (``PUCTSearch``) and draws whether its k-th game is a calibration
    game (no resignation; share ``resign_playout_share``) from ``np.random.default_rng([seeds[i], 1])`` for its first
    game, ``[seeds[i], 1, k]`` after. A player resigns when the search's value for it is below ``threshold``; the
    opponent wins. The threshold is ``resign_threshold``, or with ``resign_false_positives`` the calibrated one
    (``calibrated_resign_threshold`` over the last ``resign_calibration_games`` calibration games, capped at
    ``resign_threshold``), None until that many are in: a game that starts without a threshold is played out and
    is a calibration game."""

    def __init__(self, config: PUCTConfig, seeds, board_size: int = 9, komi: float = 7.5,
                 max_game_length: int | None = None, restart: bool = False):
        self.config, self.restart = config, restart
        self.seeds = list(seeds)
        n = len(self.seeds)
        self.games = GoGames(n, board_size, komi, max_game_length)
        self.search = PUCTSearch(config, self.seeds, board_size, komi, max_game_length)
        self.started = np.zeros(n, dtype=np.int64)  # games started in each row
        # Per calibration game ended, the lowest search value of the player who did not lose, the newest last.
        self.survivor_min_values: deque[float] = deque(maxlen=config.resign_calibration_games)
        self.threshold = self._threshold()
        self.playout = np.array([self._calibration(r) for r in range(n)])
        self.min_value = np.full((n, 2), np.inf)  # each player's lowest search value in the row's game so far
        self.would_resign = np.full(n, -1)
        self.history: list[list[tuple]] = [[] for _ in range(n)]
        self.game_moves = np.zeros(n, dtype=np.int64)  # moves searched in each row's game so far
        self.active = np.arange(n)
        self.moves = 0  # moves searched so far, over every row (a resignation counts as its row's last)
        self._cap_rng = np.random.default_rng([self.seeds[0], 2])
        self._start_move()

    def _start_move(self) -> None:
        """Start the search of the active rows' next move: full and recorded, or fast (playout cap randomisation)."""
        cfg = self.config
        self.full = cfg.fast_simulations is None or bool(self._cap_rng.random() < cfg.full_search_share)
        self.search.start(self.games, self.active, cfg.simulations if self.full else cfg.fast_simulations,
                          noise=self.full)

    def _threshold(self) -> float | None:
        """The resignation threshold in force: fixed, or calibrated once enough calibration games are in."""
        cfg = self.config
        if cfg.resign_threshold is None or cfg.resign_false_positives is None:
            return cfg.resign_threshold
        if len(self.survivor_min_values) < cfg.resign_calibration_games:
            return None
        return min(calibrated_resign_threshold(self.survivor_min_values, cfg.resign_false_positives),
                   cfg.resign_threshold)

    def _calibration(self, row: int) -> bool:
        """Whether the row's next game is played out (the draw is made even when no threshold is in force, so a
        row's stream does not depend on when calibration ends)."""
        key = [self.seeds[row], 1] + ([int(self.started[row])] if self.started[row] else [])
        drawn = np.random.default_rng(key).random() < self.config.resign_playout_share
        return self.threshold is None or drawn

    @property
    def done(self) -> bool:
        return self.active.size == 0

    def select(self) -> tuple[np.ndarray, np.ndarray]:
        """The step's leaves to evaluate (``PUCTSearch.select``; none where every path ended a game)."""
        return self.search.select()

    def expand_and_backup(self, priors, values, version: int = 0) -> list[tuple[int, GameRecord]]:
        """Answer the last ``select`` (``version``: the network's that answered it); once every row's search is
        done, play the moves and return the games that ended, with their rows."""
        self.search.expand_and_backup(priors, values)
        if not self.search.done:
            return []
        return self._move(self.search.choose(), version)

    def _move(self, choice: MoveChoice, version: int) -> list[tuple[int, GameRecord]]:
        config, games, active = self.config, self.games, self.active
        self.moves += len(active)
        self.game_moves[active] += 1
        to_play = games.meta[active, TO_PLAY]
        if self.full:
            planes = input_planes(games, active)
            for i, g in enumerate(active):
                self.history[g].append((planes[i], choice.pi[i], to_play[i], choice.actions[i], version))
        np.minimum.at(self.min_value, (active, to_play), choice.values)
        losing = (choice.values < self.threshold if self.threshold is not None
                  else np.zeros(len(active), dtype=bool))
        first = losing & self.playout[active] & (self.would_resign[active] < 0)
        self.would_resign[active[first]] = to_play[first]
        resign = losing & ~self.playout[active]
        winner = np.full(len(self.seeds), -1)
        winner[active[resign]] = 1 - to_play[resign]
        move = active[~resign]
        games.play_sequences(move, choice.actions[~resign, None], np.ones(len(move), dtype=np.int64))
        ended = move[games.terminal[move]]
        black = games.returns()[ended, 0]
        winner[ended] = np.where(black > 0, 0, np.where(black < 0, 1, -1))
        finished = np.sort(np.concatenate([active[resign], ended]))
        owners = games.area_owners() if finished.size else None
        records = [(int(g), self._record(g, int(winner[g]), bool(np.isin(g, active[resign])), owners[g]))
                   for g in finished]
        for g in finished[self.playout[finished]]:  # the player who did not lose: the winner; in a draw, either
            self.survivor_min_values.append(float(self.min_value[g].min() if winner[g] < 0
                                                  else self.min_value[g, winner[g]]))
        self.threshold = self._threshold()
        if self.restart and finished.size:
            games.reset(finished)
            self.started[finished] += 1
            for g in finished:
                self.playout[g] = self._calibration(g)
                self.would_resign[g] = -1
                self.min_value[g] = np.inf
                self.history[g] = []
                self.game_moves[g] = 0
            self.active = active
        else:
            self.active = move[~games.terminal[move]]
        if self.active.size:
            self._start_move()
        return records

    def _record(self, g: int, winner: int, resigned: bool, ownership: np.ndarray) -> GameRecord:
        if self.history[g]:
            planes, pi, to_play, actions, versions = (np.stack(x) for x in zip(*self.history[g]))
        else:  # every move of the game was a fast search
            size = self.games.size
            planes = np.zeros((0, NUM_PLANES, size, size), np.float32)
            pi = np.zeros((0, self.search.num_actions), np.float32)
            to_play, actions, versions = (np.zeros(0, np.int64) for _ in range(3))
        return GameRecord(planes, pi, to_play, actions, outcome_targets(to_play, winner), winner, resigned,
                          bool(self.playout[g]), int(self.would_resign[g]), versions.astype(np.int64),
                          int(self.game_moves[g]), ownership)


def play_games(evaluate, seeds, board_size: int = 9, komi: float = 7.5, config: PUCTConfig = PUCTConfig(),
               max_game_length: int | None = None) -> list[GameRecord]:
    """Play ``len(seeds)`` self-play games together to their ends in one process (``SelfPlay``), the leaves of all
    games evaluated by ``evaluate(planes, legal) -> (priors, values)`` in one batch per step; a record per game."""
    selfplay = SelfPlay(config, seeds, board_size, komi, max_game_length)
    records: list[GameRecord | None] = [None] * len(selfplay.seeds)
    while not selfplay.done:
        planes, legal = selfplay.select()
        answer = (evaluate(planes, legal) if len(planes)
                  else (np.zeros((0, selfplay.search.num_actions)), np.zeros(0)))
        for row, record in selfplay.expand_and_backup(*answer):
            records[row] = record
    return records


def evaluation_config(config: PUCTConfig, opening: int = 0) -> PUCTConfig:
    """``config``'s search at evaluation play (a ladder's network player, a gating match): no root noise, the most
    visited move, except that a game's first ``opening`` moves are drawn from the visit counts at temperature 1;
    every move a full search (playout cap randomisation is self-play's)."""
    return replace(config, dirichlet_weight=0.0, temperature=1.0 if opening else 0.0, greedy_after=opening or None,
                   fast_simulations=None)


class Match:
    """Games between two networks, player 0 (the candidate) and player 1, stepped as ``SelfPlay`` is, so that an
    inference rank can play them between its self-play batches (AlphaGo Zero's gating):

        match.step((evaluate_0, evaluate_1))     # one search step of every game: each leaf by its mover's network
        match.done, match.score()                # player 0's points per game (a draw half) once every game ended

    Player 0 plays black in the even games. A move's tree belongs to the player to move at its root, so every leaf
    of it is evaluated by that player's network. Game ``g`` draws its sampled moves from ``[seed, g]``'s stream."""

    def __init__(self, config: PUCTConfig, num_games: int, seed: int, board_size: int = 9, komi: float = 7.5,
                 max_game_length: int | None = None):
        self.games = GoGames(num_games, board_size, komi, max_game_length)
        self.search = PUCTSearch(config, [[seed, g] for g in range(num_games)], board_size, komi, max_game_length)
        self.colour = np.arange(num_games) % 2  # player 0's colour in each game
        self.active = np.arange(num_games)
        self.search.start(self.games, self.active)

    @property
    def done(self) -> bool:
        return self.active.size == 0

    def step(self, evaluators) -> None:
        """One search step of every unfinished game, ``evaluators[p](planes, legal) -> (priors, values)`` answering
        the leaves of player ``p``'s trees; the moves are played once every game's search of this move is done."""
        planes, legal = self.search.select()
        games = self.search.leaf_games
        mover = (self.games.to_play[games] != self.colour[games]).astype(np.int64)  # 0 where player 0 is to move
        priors, values = np.zeros(legal.shape), np.zeros(len(legal))
        for p in (0, 1):
            mine = mover == p
            if mine.any():
                priors[mine], values[mine] = evaluators[p](planes[mine], legal[mine])
        self.search.expand_and_backup(priors, values)
        if self.search.done:
            choice = self.search.choose()
            self.games.play_sequences(self.active, choice.actions[:, None], np.ones(len(self.active), np.int64))
            self.active = self.active[~self.games.terminal[self.active]]
            if self.active.size:
                self.search.start(self.games, self.active)

    def score(self) -> float:
        """Player 0's points per game: a win 1, a draw 1/2."""
        if not self.done:
            raise RuntimeError("score() before every game of the match has ended")
        black = self.games.returns()[:, 0]
        mine = np.where(self.colour == 0, black, -black)
        return float(((mine + 1) / 2).mean())


def resign_false_positives(records: list[GameRecord]) -> tuple[int, int]:
    """(calibration games in which a player would have resigned and went on to win or draw, calibration games in
    which one would have resigned), at the threshold in force during each game: the wrong resignations among those
    the threshold would have made, which the calibration (``calibrated_resign_threshold``) keeps rare."""
    would = [r for r in records if r.playout and r.would_resign >= 0]
    return sum(r.winner != 1 - r.would_resign for r in would), len(would)


def warm_up() -> None:
    """Compile (or load from numba's cache) the search's kernels with one tiny search."""
    search = PUCTSearch(PUCTConfig(simulations=2), [0], board_size=5)
    search.search(GoGames(1, 5), [0], lambda planes, legal: (np.ones(legal.shape), np.zeros(len(legal))))
