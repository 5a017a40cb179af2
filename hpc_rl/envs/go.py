"""``go``: the game of Go on boards of 5x5 to 19x19, many games stepped together, and a random-rollout UCT search.

The rules are OpenSpiel's ``go`` (``pyspiel.load_game("go", {"board_size": 9, "komi": 7.5})``), move for move:

- actions: the points row-major (``row * size + col``, row 0 first), then pass (``size * size``); black moves first;
- a stone is legal on an empty point that is not the ko point and that has an empty neighbour, or joins a chain of
  its colour that keeps another liberty, or takes the last liberty of an enemy chain (so suicide is illegal);
- simple ko: a stone played where every neighbour is an enemy stone or the edge and that captures exactly one stone
  makes the captured point illegal for the next move only (a pass clears it);
- positional superko ends the game: a move other than a pass that recreates a board seen earlier in the game (any
  player to move; passes count as positions seen) ends it at once as a draw, as OpenSpiel treats it;
- the game ends after two consecutive passes, or after ``max_game_length`` moves (passes included; OpenSpiel's
  default, twice the number of points), and not before move 2;
- area scoring (Tromp-Taylor): stones plus empty regions that reach stones of one colour only, minus komi for
  black; returns +1 / -1 to the winner / loser, 0 for each on a draw (superko or a zero score).

``GoGames`` holds the games in numpy arrays, one row per game (``pts``: per-point planes, ``meta``: per-game
counters, ``hashes``: the Zobrist hash of the board after every move); the rules run in numba-compiled kernels on one
row at a time. A chain keeps OpenSpiel's pseudo-liberty counts (liberty-stone adjacencies, with the sum and the sum
of squares of the liberty points: a chain is in atari when those say every pseudo-liberty is the same point), so a
legality test is O(1) and a move costs the size of the chains it merges or captures.

``uct_search`` is OpenSpiel's ``MCTSBot`` (``open_spiel/python/algorithms/mcts.py``) with its
``RandomRolloutEvaluator``, compiled, on one thread: UCT with constant ``uct_c``, children shuffled at expansion,
unvisited children first, ``n_rollouts`` uniformly random playouts to the end of the game per leaf, solved subtrees
backed up (MCTS-Solver), ``max_simulations`` simulations unless the root is solved first, and the most visited child
played (proven results first, then visits, then summed reward). The search state is a copy of one game's row.

numba's cache (``__pycache__/go.*.nbi``, ``.nbc``) is refreshed when this file changes, and only then: a kernel in
another file that calls these functions is not recompiled when this one changes, which is why the search lives here.
"""

from __future__ import annotations

import numpy as np
from numba import njit

MIN_SIZE, MAX_SIZE = 5, 19
EMPTY, BLACK, WHITE, GUARD = 0, 1, 2, 3  # point colours; player p (0 black, 1 white) plays colour p + 1

# Planes of ``pts[g, plane, point]`` over the points of the board with a one-point guard border, (size + 2)^2 of them.
# Chain statistics live at the chain's head point and are meaningful for stones only.
COLOR, HEAD, NEXT, SIZE, LIBS, LSUM, LSQ = range(7)
NPLANES = 7
# Columns of ``meta[g, :]``.
TO_PLAY, KO, MOVES, PASSES, SUPERKO = range(5)  # KO: the point illegal for the next move, -1 for none
NMETA = 5


def _zobrist_table() -> np.ndarray:
    """One random 64-bit word per (point of the largest guarded board, stone colour), from a fixed seed."""
    return np.random.default_rng(0x60).integers(0, 2**64, size=((MAX_SIZE + 2) ** 2, 2), dtype=np.uint64)


ZOBRIST = _zobrist_table()


def default_max_game_length(size: int) -> int:
    """OpenSpiel's: twice the number of points (only random games last that long)."""
    return 2 * size * size


def action_to_point(action: int, size: int) -> int:
    """The guarded-board point of a board action (not pass)."""
    return (action // size + 1) * (size + 2) + action % size + 1


# ---------------------------------------------------------------------------------------------------------------------
# Rules kernels: one game (row ``g``) at a time.

@njit(cache=True, inline="always")
def _offsets(size):
    w = size + 2
    return (-w, -1, 1, w)


@njit(cache=True, inline="always")
def _in_atari(pts, g, head):
    """The chain has exactly one liberty: all its pseudo-liberties are one point (sum^2 == n * sum of squares)."""
    n = np.int64(pts[g, LIBS, head])
    s = np.int64(pts[g, LSUM, head])
    return n > 0 and s * s == n * np.int64(pts[g, LSQ, head])


@njit(cache=True)
def _is_legal(pts, meta, g, point, size):
    """Whether the player to move may play a stone on ``point`` (OpenSpiel's ``GoBoard::IsLegalMove``)."""
    if pts[g, COLOR, point] != EMPTY or point == meta[g, KO]:
        return False
    c = meta[g, TO_PLAY] + 1
    offs = _offsets(size)
    for d in offs:
        if pts[g, COLOR, point + d] == EMPTY:
            return True
    for d in offs:  # joins a chain that keeps another liberty
        n = point + d
        if pts[g, COLOR, n] == c and not _in_atari(pts, g, pts[g, HEAD, n]):
            return True
    for d in offs:  # captures
        n = point + d
        if pts[g, COLOR, n] == 3 - c and _in_atari(pts, g, pts[g, HEAD, n]):
            return True
    return False


@njit(cache=True)
def _is_terminal(meta, g, max_len):
    m = meta[g, MOVES]
    return m >= 2 and (m >= max_len or meta[g, SUPERKO] != 0 or meta[g, PASSES] >= 2)


@njit(cache=True)
def _add_liberty(pts, g, head, point, sign):
    pts[g, LIBS, head] += sign
    pts[g, LSUM, head] += sign * point
    pts[g, LSQ, head] += sign * point * point


@njit(cache=True)
def _merge(pts, g, a, b):
    """Merge the chains headed by ``a`` and ``b``; returns the head of the result (the larger chain's)."""
    if pts[g, SIZE, a] < pts[g, SIZE, b]:
        a, b = b, a
    cur = b
    while True:
        pts[g, HEAD, cur] = a
        cur = pts[g, NEXT, cur]
        if cur == b:
            break
    nb = pts[g, NEXT, b]  # splice the two circular lists
    pts[g, NEXT, b] = pts[g, NEXT, a]
    pts[g, NEXT, a] = nb
    for plane in (SIZE, LIBS, LSUM, LSQ):
        pts[g, plane, a] += pts[g, plane, b]
    return a


@njit(cache=True)
def _capture(pts, g, head, size, zob):
    """Remove the chain headed by ``head``; its points become liberties of the enemy chains beside them. Returns
    (stones removed, the change of the Zobrist hash)."""
    offs = _offsets(size)
    c = pts[g, COLOR, head]
    flip = np.uint64(0)
    removed = 0
    cur = head
    while True:
        pts[g, COLOR, cur] = EMPTY
        flip ^= zob[cur, c - 1]
        removed += 1
        cur = pts[g, NEXT, cur]
        if cur == head:
            break
    while True:
        for d in offs:
            n = cur + d
            if pts[g, COLOR, n] == 3 - c:
                _add_liberty(pts, g, pts[g, HEAD, n], cur, 1)
        cur = pts[g, NEXT, cur]
        if cur == head:
            break
    return removed, flip


@njit(cache=True)
def _play(pts, meta, hashes, g, action, size, zob):
    """Play a legal ``action`` for the player to move (OpenSpiel's ``GoBoard::PlayMove`` and its superko check)."""
    m = meta[g, MOVES]
    if action == size * size:
        meta[g, KO] = -1
        meta[g, PASSES] += 1
        hashes[g, m + 1] = hashes[g, m]
    else:
        point = (action // size + 1) * (size + 2) + action % size + 1
        c = meta[g, TO_PLAY] + 1
        offs = _offsets(size)
        in_enemy_eye = True
        for d in offs:
            col = pts[g, COLOR, point + d]
            if col == c or col == EMPTY:
                in_enemy_eye = False
        for d in offs:  # the point stops being a liberty of every chain beside it, once per adjacency
            n = point + d
            col = pts[g, COLOR, n]
            if col == BLACK or col == WHITE:
                _add_liberty(pts, g, pts[g, HEAD, n], point, -1)
        pts[g, COLOR, point] = c
        pts[g, HEAD, point] = point
        pts[g, NEXT, point] = point
        pts[g, SIZE, point] = 1
        pts[g, LIBS, point] = 0
        pts[g, LSUM, point] = 0
        pts[g, LSQ, point] = 0
        for d in offs:
            if pts[g, COLOR, point + d] == EMPTY:
                _add_liberty(pts, g, point, point + d, 1)
        h = hashes[g, m] ^ zob[point, c - 1]
        for d in offs:
            n = point + d
            if pts[g, COLOR, n] == c and pts[g, HEAD, n] != pts[g, HEAD, point]:
                _merge(pts, g, pts[g, HEAD, n], pts[g, HEAD, point])
        captured, ko = 0, -1
        for d in offs:
            n = point + d
            if pts[g, COLOR, n] == 3 - c and pts[g, LIBS, pts[g, HEAD, n]] == 0:
                removed, flip = _capture(pts, g, pts[g, HEAD, n], size, zob)
                captured += removed
                h ^= flip
                ko = n
        meta[g, KO] = ko if in_enemy_eye and captured == 1 else -1
        meta[g, PASSES] = 0
        repeated = False
        for i in range(m + 1):
            repeated |= hashes[g, i] == h
        if repeated:
            meta[g, SUPERKO] = 1
        hashes[g, m + 1] = h
    meta[g, MOVES] = m + 1
    meta[g, TO_PLAY] = 1 - meta[g, TO_PLAY]


@njit(cache=True)
def _area_owners(pts, g, size, owner):
    """Tromp-Taylor area of game ``g`` into ``owner`` (size^2,) int8, row-major as the actions: +1 where black's
    (its stones and the empty regions reaching black only), -1 where white's, 0 elsewhere (empty regions reaching
    both colours or neither)."""
    w = size + 2
    offs = _offsets(size)
    seen = np.zeros(w * w, dtype=np.bool_)
    stack = np.empty(size * size, dtype=np.int64)
    region = np.empty(size * size, dtype=np.int64)
    for r in range(size):
        for col in range(size):
            p = (r + 1) * w + col + 1
            colour = pts[g, COLOR, p]
            if colour == BLACK:
                owner[r * size + col] = 1
            elif colour == WHITE:
                owner[r * size + col] = -1
            elif not seen[p]:
                seen[p] = True
                stack[0] = p
                top, count, reach = 1, 0, 0  # reach: bit 1 black, bit 2 white
                while top > 0:
                    top -= 1
                    q = stack[top]
                    region[count] = q
                    count += 1
                    for d in offs:
                        n = q + d
                        cn = pts[g, COLOR, n]
                        if cn == EMPTY:
                            if not seen[n]:
                                seen[n] = True
                                stack[top] = n
                                top += 1
                        elif cn != GUARD:
                            reach |= cn
                mark = 1 if reach == BLACK else (-1 if reach == WHITE else 0)
                for i in range(count):
                    owner[(region[i] // w - 1) * size + region[i] % w - 1] = mark


@njit(cache=True)
def _black_score(pts, g, size, komi):
    """Tromp-Taylor: black's area minus white's (``_area_owners``), minus komi (float32 as OpenSpiel computes it)."""
    owner = np.empty(size * size, dtype=np.int8)
    _area_owners(pts, g, size, owner)
    delta = 0
    for i in range(size * size):
        delta += owner[i]
    return np.float32(delta) - np.float32(komi)


@njit(cache=True)
def _returns(pts, meta, g, size, komi, out):
    """Black's and white's returns of a finished game into ``out[0:2]``."""
    score = 0.0 if meta[g, SUPERKO] != 0 else _black_score(pts, g, size, komi)
    out[0] = 1.0 if score > 0 else (-1.0 if score < 0 else 0.0)
    out[1] = -out[0]


@njit(cache=True)
def _reset_rows(pts, meta, hashes, rows, size):
    w = size + 2
    for g in rows:
        pts[g, :, :] = 0
        pts[g, COLOR, :] = GUARD
        for r in range(size):
            for col in range(size):
                pts[g, COLOR, (r + 1) * w + col + 1] = EMPTY
        meta[g, :] = 0
        meta[g, KO] = -1
        hashes[g, 0] = 0


@njit(cache=True)
def _legal_mask_all(pts, meta, size, max_len, mask):
    for g in range(pts.shape[0]):
        mask[g, :] = False
        if _is_terminal(meta, g, max_len):
            continue
        for a in range(size * size):
            mask[g, a] = _is_legal(pts, meta, g, (a // size + 1) * (size + 2) + a % size + 1, size)
        mask[g, size * size] = True


@njit(cache=True)
def _first_illegal(pts, meta, actions, size, max_len):
    """The first game whose action is illegal (-1: none); finished games take no action."""
    for g in range(pts.shape[0]):
        if _is_terminal(meta, g, max_len):
            continue
        a = actions[g]
        if a < 0 or a > size * size:
            return g
        if a < size * size and not _is_legal(pts, meta, g, (a // size + 1) * (size + 2) + a % size + 1, size):
            return g
    return -1


@njit(cache=True)
def _step_all(pts, meta, hashes, actions, size, max_len, zob, terminal):
    for g in range(pts.shape[0]):
        if not _is_terminal(meta, g, max_len):
            _play(pts, meta, hashes, g, actions[g], size, zob)
        terminal[g] = _is_terminal(meta, g, max_len)


@njit(cache=True)
def _play_sequences(pts, meta, hashes, rows, actions, lengths, size, max_len, zob):
    """Play ``actions[i, :lengths[i]]`` in game ``rows[i]``; returns the first ``i`` whose next action is illegal or
    comes after the game's end (-1: none), having played that row's actions before it and every earlier row's."""
    for i in range(rows.shape[0]):
        g = rows[i]
        for j in range(lengths[i]):
            a = actions[i, j]
            if _is_terminal(meta, g, max_len) or a < 0 or a > size * size:
                return i
            if a < size * size and not _is_legal(pts, meta, g, (a // size + 1) * (size + 2) + a % size + 1, size):
                return i
            _play(pts, meta, hashes, g, a, size, zob)
    return -1


@njit(cache=True)
def _terminal_all(meta, max_len, out):
    for g in range(meta.shape[0]):
        out[g] = _is_terminal(meta, g, max_len)


@njit(cache=True)
def _returns_all(pts, meta, size, komi, max_len, out):
    for g in range(pts.shape[0]):
        if _is_terminal(meta, g, max_len):
            _returns(pts, meta, g, size, komi, out[g])
        else:
            out[g, :] = 0.0


@njit(cache=True)
def _area_owners_all(pts, size, out):
    for g in range(pts.shape[0]):
        _area_owners(pts, g, size, out[g])


@njit(cache=True)
def _scores_all(pts, size, komi, out):
    for g in range(pts.shape[0]):
        out[g] = _black_score(pts, g, size, komi)


class GoGames:
    """``num_games`` games of Go on one board size, stepped together; row ``g`` of every array is game ``g``.

    ``step(actions)`` plays one action (``legal_mask()``'s column) in every unfinished game; finished games stay as
    they are until ``reset(rows)``. ``returns()`` gives (black, white) of finished games. ``copy_from`` and ``clone``
    copy games between sets of the same size (a search starts from a copy).
    """

    def __init__(self, num_games: int, board_size: int = 9, komi: float = 7.5, max_game_length: int | None = None):
        if num_games < 1:
            raise ValueError(f"num_games must be >= 1, got {num_games}")
        if not MIN_SIZE <= board_size <= MAX_SIZE:
            raise ValueError(f"board_size must lie in [{MIN_SIZE}, {MAX_SIZE}], got {board_size}")
        max_len = default_max_game_length(board_size) if max_game_length is None else max_game_length
        if max_len < 2:
            raise ValueError(f"max_game_length must be >= 2, got {max_len}")
        self.num_games, self.size, self.komi, self.max_game_length = num_games, board_size, float(komi), max_len
        self.num_actions = board_size * board_size + 1
        self.pass_action = board_size * board_size
        points = (board_size + 2) ** 2
        self.pts = np.zeros((num_games, NPLANES, points), dtype=np.int32)
        self.meta = np.zeros((num_games, NMETA), dtype=np.int64)
        self.hashes = np.zeros((num_games, max_len + 1), dtype=np.uint64)
        self.reset()

    def reset(self, rows=None) -> None:
        """Empty boards, black to play, in ``rows`` (default: every game)."""
        rows = np.arange(self.num_games) if rows is None else np.atleast_1d(np.asarray(rows, dtype=np.int64))
        _reset_rows(self.pts, self.meta, self.hashes, rows, self.size)

    @property
    def to_play(self) -> np.ndarray:
        """(G,) the player to move: 0 black, 1 white."""
        return self.meta[:, TO_PLAY].copy()

    @property
    def move_number(self) -> np.ndarray:
        return self.meta[:, MOVES].copy()

    @property
    def terminal(self) -> np.ndarray:
        """(G,) bool: the games that have ended."""
        out = np.empty(self.num_games, dtype=bool)
        _terminal_all(self.meta, self.max_game_length, out)
        return out

    @property
    def superko(self) -> np.ndarray:
        """(G,) games ended by a repeated position (drawn)."""
        return self.meta[:, SUPERKO] != 0

    def legal_mask(self) -> np.ndarray:
        """(G, size^2 + 1) bool; all False in a finished game, pass always legal otherwise."""
        mask = np.empty((self.num_games, self.num_actions), dtype=bool)
        _legal_mask_all(self.pts, self.meta, self.size, self.max_game_length, mask)
        return mask

    def step(self, actions) -> np.ndarray:
        """Play ``actions`` (G,) in the unfinished games (finished games ignore theirs); returns the terminal flags.
        An illegal action raises ``ValueError`` before any game moves."""
        actions = np.ascontiguousarray(actions, dtype=np.int64)
        if actions.shape != (self.num_games,):
            raise ValueError(f"actions has shape {actions.shape}, expected ({self.num_games},)")
        bad = _first_illegal(self.pts, self.meta, actions, self.size, self.max_game_length)
        if bad >= 0:
            raise ValueError(f"action {actions[bad]} is illegal in game {bad} (move {self.meta[bad, MOVES]})")
        terminal = np.empty(self.num_games, dtype=bool)
        _step_all(self.pts, self.meta, self.hashes, actions, self.size, self.max_game_length, ZOBRIST, terminal)
        return terminal

    def play_sequences(self, rows, actions, lengths) -> None:
        """Play ``actions[i, :lengths[i]]`` in game ``rows[i]``, for every ``i`` (a search replaying its paths from
        copies of the root). An illegal action, or one after the game's end, raises ``ValueError``; the rows before
        it have moved."""
        rows = np.ascontiguousarray(rows, dtype=np.int64)
        actions = np.ascontiguousarray(actions, dtype=np.int64)
        lengths = np.ascontiguousarray(lengths, dtype=np.int64)
        if actions.ndim != 2 or actions.shape[0] != rows.shape[0] or lengths.shape != rows.shape:
            raise ValueError(f"play_sequences needs actions (R, L) and lengths (R,) for R rows, got {actions.shape}, "
                             f"{lengths.shape} for {rows.shape}")
        if rows.size and (lengths.min() < 0 or lengths.max() > actions.shape[1]):
            raise ValueError(f"lengths must lie in [0, {actions.shape[1]}]")
        bad = _play_sequences(self.pts, self.meta, self.hashes, rows, actions, lengths, self.size,
                              self.max_game_length, ZOBRIST)
        if bad >= 0:
            raise ValueError(f"game {rows[bad]}: the sequence {actions[bad, :lengths[bad]].tolist()} has an illegal "
                             f"action or goes past the game's end (move {self.meta[rows[bad], MOVES]})")

    def returns(self) -> np.ndarray:
        """(G, 2) float64: black's and white's returns, +1 win, -1 loss, 0 draw; 0 in unfinished games."""
        out = np.empty((self.num_games, 2))
        _returns_all(self.pts, self.meta, self.size, self.komi, self.max_game_length, out)
        return out

    def scores(self) -> np.ndarray:
        """(G,) black's Tromp-Taylor area minus white's minus komi, on the boards as they stand."""
        out = np.empty(self.num_games, dtype=np.float32)
        _scores_all(self.pts, self.size, self.komi, out)
        return out

    def area_owners(self) -> np.ndarray:
        """(G, size^2) int8: who owns each point under Tromp-Taylor area scoring, on the boards as they stand: +1
        black, -1 white, 0 neither (``scores()`` is their sum minus komi). At a game's end, KataGo's ownership
        target."""
        out = np.empty((self.num_games, self.size * self.size), dtype=np.int8)
        _area_owners_all(self.pts, self.size, out)
        return out

    def boards(self) -> np.ndarray:
        """(G, size, size) int8: EMPTY, BLACK or WHITE per point, row-major as the actions."""
        w = self.size + 2
        return self.pts[:, COLOR, :].reshape(-1, w, w)[:, 1:-1, 1:-1].astype(np.int8)

    def copy_from(self, rows, src: GoGames, src_rows) -> None:
        """Make games ``rows`` copies of ``src``'s games ``src_rows``."""
        if (src.size, src.komi, src.max_game_length) != (self.size, self.komi, self.max_game_length):
            raise ValueError("copy_from needs games of the same board size, komi and max_game_length")
        self.pts[rows] = src.pts[src_rows]
        self.meta[rows] = src.meta[src_rows]
        self.hashes[rows] = src.hashes[src_rows]

    def clone(self, rows=None) -> GoGames:
        """A new set holding copies of games ``rows`` (default: all)."""
        rows = np.arange(self.num_games) if rows is None else np.atleast_1d(np.asarray(rows, dtype=np.int64))
        out = GoGames(len(rows), self.size, self.komi, self.max_game_length)
        out.copy_from(slice(None), self, rows)
        return out


# ---------------------------------------------------------------------------------------------------------------------
# The network's input (``hpc_rl.model.go_net``): planes of the board seen by the player to move, as AlphaGo Zero's
# (its stones, the opponent's, a colour plane) with the legal points in place of its 7 past positions (the engine keeps
# past boards as hashes only; the legal points carry what history told AlphaGo Zero's net about ko), a plane of
# ones, which marks the board's edge inside the convolutions' zero padding, and a plane of ones where the opponent's
# last move was a pass. That plane is what history told AlphaGo Zero's net about passes (two equal boards in a row):
# after a pass, passing ends the game and scores the board, so the same board with the same player to move has
# other values and other best moves. Without it the net cannot tell the two apart and learns one policy for both:
# a pass that wins by komi after the opponent's pass is learned as a pass anywhere (docs/go.md, "Passes").

PLANES = ("own stones", "opponent stones", "legal points", "black to play", "ones", "opponent passed")
NUM_PLANES = len(PLANES)


def input_planes(games: GoGames, rows, legal: np.ndarray | None = None) -> np.ndarray:
    """(R, NUM_PLANES, size, size) float32, the ``PLANES`` of games ``rows`` for their player to move; ``legal``:
    their ``legal_mask()`` rows (R, size^2 + 1) where the caller has them."""
    rows = np.asarray(rows, dtype=np.int64)
    s, w = games.size, games.size + 2
    if legal is None:
        legal = games.legal_mask()[rows]
    colors = games.pts[rows, COLOR, :].reshape(-1, w, w)[:, 1:-1, 1:-1]
    to_play = games.meta[rows, TO_PLAY]
    own = (to_play + 1)[:, None, None]
    out = np.empty((len(rows), NUM_PLANES, s, s), dtype=np.float32)
    out[:, 0] = colors == own
    out[:, 1] = (colors != own) & (colors != EMPTY)
    out[:, 2] = legal[:, :s * s].reshape(-1, s, s)
    out[:, 3] = (to_play == 0)[:, None, None]
    out[:, 4] = 1.0
    out[:, 5] = (games.meta[rows, PASSES] > 0)[:, None, None]  # a pass now ends the game
    return out


def passes_held_back(games: GoGames, rows, legal: np.ndarray) -> np.ndarray:
    """(R,) bool: the games ``rows`` (``legal``: their ``legal_mask()`` rows) in which a searching player holds its pass
    back (``PUCTConfig.restrict_passes``): the opponent did not just pass, and some legal stone does not fill one of
    the player's own one-point eyes (an empty point whose neighbours on the board are all the player's stones). A
    player that may pass at any time learns to pass once its value head calls every move lost, and then loses by
    passing: go9's self-play drifted into white passing from about move 34 (docs/go.md, "Passes"). Passing stays
    legal; it is the search's choice that is narrowed, as a rollout policy's (OpenSpiel's random rollouts play on
    until only passes are legal)."""
    rows = np.asarray(rows, dtype=np.int64)
    s, w = games.size, games.size + 2
    colors = games.pts[rows, COLOR, :].reshape(-1, w, w)
    own = (games.meta[rows, TO_PLAY] + 1)[:, None, None]
    walled = (colors == own) | (colors == GUARD)  # a neighbour that closes an eye of the player to move
    eye = ((colors[:, 1:-1, 1:-1] == EMPTY) & walled[:, :-2, 1:-1] & walled[:, 2:, 1:-1] & walled[:, 1:-1, :-2]
           & walled[:, 1:-1, 2:])
    stones = legal[:, :s * s] & ~eye.reshape(len(rows), s * s)
    return stones.any(axis=1) & (games.meta[rows, PASSES] == 0)


# ---------------------------------------------------------------------------------------------------------------------
# The board's 8 symmetries, the dihedral group of the square. The rules (and komi, and area scoring) do not change
# under them, and every one of the ``PLANES`` moves with the board, so a position seen in a symmetry is another
# position with the same value and the same best moves moved the same way: AlphaGo Zero trained each sampled position
# in one of the 8 drawn at random ("Training", the learners' ``alphazero.symmetries``).

NUM_SYMMETRIES = 8


def symmetry_boards(boards: np.ndarray, k: int) -> np.ndarray:
    """``boards`` (..., size, size) seen in symmetry ``k`` in [0, 8): ``k % 4`` quarter turns (numpy's ``rot90``,
    counter-clockwise), then transposed when ``k >= 4``; k = 0 is the identity."""
    if not 0 <= k < NUM_SYMMETRIES:
        raise ValueError(f"a symmetry is an integer in [0, {NUM_SYMMETRIES}), got {k}")
    turned = np.rot90(boards, k % 4, axes=(-2, -1))
    return np.swapaxes(turned, -2, -1) if k >= 4 else turned


def symmetry_points(values: np.ndarray, size: int, k: int) -> np.ndarray:
    """``values`` (..., size^2) or (..., size^2 + 1) over the points in row-major order (then the pass, which stays
    last) seen in symmetry ``k``: a point's value moves where ``symmetry_boards`` moves the point."""
    points = size * size
    if values.shape[-1] not in (points, points + 1):
        raise ValueError(f"values over {size}x{size} points hold {points} or {points + 1} entries, "
                         f"got {values.shape[-1]}")
    lead = values.shape[:-1]
    moved = symmetry_boards(values[..., :points].reshape(*lead, size, size), k).reshape(*lead, points)
    return np.concatenate([moved, values[..., points:]], axis=-1)


# ---------------------------------------------------------------------------------------------------------------------
# Random-rollout UCT search (OpenSpiel's MCTSBot with RandomRolloutEvaluator).

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


@njit(cache=True)
def _next_random(rng):
    """SplitMix64: the next 64-bit word of the stream held in ``rng[0]``."""
    rng[0] = rng[0] + _GOLDEN
    x = rng[0]
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


@njit(cache=True)
def _below(rng, k):
    """A uniform integer in [0, k)."""
    return np.int64(((_next_random(rng) >> np.uint64(11)) * np.uint64(k)) >> np.uint64(53))


@njit(cache=True)
def _copy_row(pts, meta, hashes, src, dst):
    pts[dst, :, :] = pts[src, :, :]
    meta[dst, :] = meta[src, :]
    hashes[dst, :meta[src, MOVES] + 1] = hashes[src, :meta[src, MOVES] + 1]


@njit(cache=True)
def _random_legal_action(pts, meta, g, size, rng):
    """A uniformly random legal action: draws over every action until a legal one (uniform over the legal set),
    and after 4 * (size^2 + 1) misses picks among the legal actions listed."""
    n_actions = size * size + 1
    w = size + 2
    for _ in range(4 * n_actions):
        a = _below(rng, n_actions)
        if a == size * size or _is_legal(pts, meta, g, (a // size + 1) * w + a % size + 1, size):
            return a
    legal = np.empty(n_actions, dtype=np.int64)
    k = 0
    for a in range(size * size):
        if _is_legal(pts, meta, g, (a // size + 1) * w + a % size + 1, size):
            legal[k] = a
            k += 1
    legal[k] = size * size
    return legal[_below(rng, k + 1)]


@njit(cache=True)
def _rollout(pts, meta, hashes, g, size, komi, max_len, zob, rng, out):
    """Play uniformly random legal actions in game ``g`` to its end; its returns into ``out``."""
    while not _is_terminal(meta, g, max_len):
        _play(pts, meta, hashes, g, _random_legal_action(pts, meta, g, size, rng), size, zob)
    _returns(pts, meta, g, size, komi, out)


# Columns of the search tree's node arrays: ``ni[node, :]`` int64 and ``nf[node, :]`` float64. A node's children are
# ``ni[node, N_FIRST] ... + ni[node, N_CHILDREN] - 1``; N_PLAYER is the player who chose the node's action.
N_ACTION, N_PLAYER, N_VISITS, N_FIRST, N_CHILDREN, N_SOLVED = range(6)
F_REWARD, F_OUTCOME = 0, 1  # F_OUTCOME, F_OUTCOME + 1: the proven returns of black and white


@njit(cache=True)
def _grow(ni, nf, need):
    """The node arrays, doubled until they hold ``need`` nodes."""
    cap = ni.shape[0]
    if need <= cap:
        return ni, nf
    while cap < need:
        cap *= 2
    ni2 = np.empty((cap, ni.shape[1]), dtype=np.int64)
    nf2 = np.empty((cap, nf.shape[1]), dtype=np.float64)
    ni2[:ni.shape[0]] = ni
    nf2[:nf.shape[0]] = nf
    return ni2, nf2


@njit(cache=True)
def _uct_value(ni, nf, c, log_parent_visits, uct_c):
    """OpenSpiel's ``SearchNode.uct_value``: a proven child's outcome, unvisited children first, else UCT."""
    if ni[c, N_SOLVED]:
        return nf[c, F_OUTCOME + ni[c, N_PLAYER]]
    if ni[c, N_VISITS] == 0:
        return np.inf
    n = ni[c, N_VISITS]
    return nf[c, F_REWARD] / n + uct_c * np.sqrt(log_parent_visits / n)


@njit(cache=True)
def _uct_search(pts, meta, hashes, size, komi, max_len, zob, uct_c, max_simulations, n_rollouts, solve, rng,
                root_visits):
    """The search from game row 0 (rows 1 and 2 are scratch); returns (chosen action, simulations run) and writes
    the root children's visit counts by action into ``root_visits``."""
    n_actions = size * size + 1
    ni = np.zeros((max(64, min(1 + max_simulations * n_actions, 1 << 16)), 6), dtype=np.int64)
    nf = np.zeros((ni.shape[0], 3), dtype=np.float64)
    ni[0, N_ACTION] = -1
    ni[0, N_PLAYER] = meta[0, TO_PLAY]
    ni[0, N_FIRST] = -1
    used = 1
    path = np.empty(max_len + 2, dtype=np.int64)
    legal = np.empty(n_actions, dtype=np.int64)
    returns = np.zeros(2)
    one = np.zeros(2)
    w = size + 2
    sims = 0
    for _ in range(max_simulations):
        _copy_row(pts, meta, hashes, 0, 1)
        node, depth = 0, 0
        path[0] = 0
        while not _is_terminal(meta, 1, max_len) and ni[node, N_VISITS] > 0:
            if ni[node, N_FIRST] < 0:  # expand: the legal actions, shuffled (OpenSpiel: "reduce bias from move order")
                k = 0
                for a in range(size * size):
                    if _is_legal(pts, meta, 1, (a // size + 1) * w + a % size + 1, size):
                        legal[k] = a
                        k += 1
                legal[k] = size * size
                k += 1
                for i in range(k - 1, 0, -1):
                    j = _below(rng, i + 1)
                    legal[i], legal[j] = legal[j], legal[i]
                ni, nf = _grow(ni, nf, used + k)
                ni[node, N_FIRST] = used
                ni[node, N_CHILDREN] = k
                for i in range(k):
                    c = used + i
                    ni[c, N_ACTION] = legal[i]
                    ni[c, N_PLAYER] = meta[1, TO_PLAY]
                    ni[c, N_VISITS] = 0
                    ni[c, N_FIRST] = -1
                    ni[c, N_CHILDREN] = 0
                    ni[c, N_SOLVED] = 0
                    nf[c, :] = 0.0
                used += k
            best, best_value = -1, -np.inf
            log_n = np.log(ni[node, N_VISITS])
            for c in range(ni[node, N_FIRST], ni[node, N_FIRST] + ni[node, N_CHILDREN]):
                value = _uct_value(ni, nf, c, log_n, uct_c)
                if value > best_value:  # the first of equals, as Python's max
                    best, best_value = c, value
            _play(pts, meta, hashes, 1, ni[best, N_ACTION], size, zob)
            node = best
            depth += 1
            path[depth] = node
        solved = False
        if _is_terminal(meta, 1, max_len):
            _returns(pts, meta, 1, size, komi, returns)
            nf[node, F_OUTCOME], nf[node, F_OUTCOME + 1] = returns[0], returns[1]
            ni[node, N_SOLVED] = 1
            solved = solve
        else:
            returns[:] = 0.0
            for _r in range(n_rollouts):
                _copy_row(pts, meta, hashes, 1, 2)
                _rollout(pts, meta, hashes, 2, size, komi, max_len, zob, rng, one)
                returns += one
            returns /= n_rollouts
        for i in range(depth, -1, -1):  # back up; with solve, proven results too (MCTS-Solver, max^n)
            nd = path[i]
            nf[nd, F_REWARD] += returns[ni[nd, N_PLAYER]]
            ni[nd, N_VISITS] += 1
            if solved and ni[nd, N_CHILDREN] > 0:
                start = ni[nd, N_FIRST]
                p = ni[start, N_PLAYER]
                best, all_solved = -1, True
                for c in range(start, start + ni[nd, N_CHILDREN]):
                    if not ni[c, N_SOLVED]:
                        all_solved = False
                    elif best < 0 or nf[c, F_OUTCOME + p] > nf[best, F_OUTCOME + p]:
                        best = c
                if best >= 0 and (all_solved or nf[best, F_OUTCOME + p] == 1.0):  # 1.0: the game's max utility
                    ni[nd, N_SOLVED] = 1
                    nf[nd, F_OUTCOME], nf[nd, F_OUTCOME + 1] = nf[best, F_OUTCOME], nf[best, F_OUTCOME + 1]
                else:
                    solved = False
        sims += 1
        if ni[0, N_SOLVED]:
            break
    # The most visited child, proven results first (OpenSpiel's SearchNode.sort_key: outcome, visits, reward).
    start = ni[0, N_FIRST]
    chosen = start
    for c in range(start, start + ni[0, N_CHILDREN]):
        root_visits[ni[c, N_ACTION]] = ni[c, N_VISITS]
        key_c = nf[c, F_OUTCOME + ni[c, N_PLAYER]] if ni[c, N_SOLVED] else 0.0
        key_b = nf[chosen, F_OUTCOME + ni[chosen, N_PLAYER]] if ni[chosen, N_SOLVED] else 0.0
        if key_c > key_b or (key_c == key_b and (ni[c, N_VISITS] > ni[chosen, N_VISITS] or (
                ni[c, N_VISITS] == ni[chosen, N_VISITS] and nf[c, F_REWARD] > nf[chosen, F_REWARD]))):
            chosen = c
    return ni[chosen, N_ACTION], sims


class RolloutMCTS:
    """UCT with random rollouts on one game at a time (OpenSpiel's ``MCTSBot(game, uct_c, max_simulations,
    RandomRolloutEvaluator(n_rollouts), solve=True)``), compiled, one thread, seeded."""

    def __init__(self, uct_c: float = 2.0, max_simulations: int = 1000, n_rollouts: int = 1, solve: bool = True,
                 seed: int = 0):
        if max_simulations < 2 or n_rollouts < 1:  # the root is expanded by the second simulation
            raise ValueError(f"max_simulations must be >= 2 and n_rollouts >= 1, got {max_simulations}, {n_rollouts}")
        if not 0 <= seed < 2**64:
            raise ValueError(f"seed must be in [0, 2**64), got {seed}")
        self.uct_c, self.max_simulations, self.n_rollouts, self.solve = float(uct_c), max_simulations, n_rollouts, solve
        self.rng = np.array([seed], dtype=np.uint64)
        self.simulations = 0  # run so far, over every search
        self.root_visits: np.ndarray | None = None  # the last search's visit count per root action

    def step(self, games: GoGames, row: int = 0) -> int:
        """The action the search chooses in game ``row`` of ``games`` (unfinished); the game is not changed."""
        if games.terminal[row]:
            raise ValueError(f"game {row} is finished: nothing to search")
        work = GoGames(3, games.size, games.komi, games.max_game_length)
        work.copy_from(0, games, row)
        self.root_visits = np.zeros(games.num_actions, dtype=np.int64)
        action, sims = _uct_search(work.pts, work.meta, work.hashes, games.size, games.komi, games.max_game_length,
                                   ZOBRIST, self.uct_c, self.max_simulations, self.n_rollouts, self.solve, self.rng,
                                   self.root_visits)
        self.simulations += int(sims)
        return int(action)


def warm_up() -> None:
    """Compile (or load from numba's cache) every kernel with one tiny game and search: about 17 CPU-seconds the
    first time, which ``make setup`` spends once so that tests and ranks load the cached code."""
    games = GoGames(1, MIN_SIZE)
    games.legal_mask()
    games.step([0])
    games.returns()
    games.scores()
    RolloutMCTS(max_simulations=2).step(games)
