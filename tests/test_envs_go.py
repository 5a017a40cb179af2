"""The Go engine (``hpc_rl.envs.go``) against OpenSpiel's ``go`` in lockstep, its rules on hand-made positions, and
the random-rollout search."""

import numpy as np
import pyspiel
import pytest

from hpc_rl.envs.go import (BLACK, EMPTY, NUM_SYMMETRIES, WHITE, GoGames, RolloutMCTS, input_planes, symmetry_boards,
                            symmetry_points)

# A 5x5 game of random moves that ends by positional superko on move 22 (its last stone recreates an earlier board).
SUPERKO_GAME = [8, 24, 0, 25, 7, 19, 22, 1, 16, 10, 12, 6, 3, 9, 2, 13, 11, 18, 23, 4, 14, 9]


def play(games: GoGames, moves, row=None) -> None:
    """Play ``moves`` in every game (or in game ``row``, the others passing)."""
    for move in moves:
        actions = np.full(games.num_games, games.pass_action)
        actions[slice(None) if row is None else row] = move
        games.step(actions)


def a(size, row, col):
    return row * size + col


def openspiel_state(size, moves, komi=7.5):
    state = pyspiel.load_game("go", {"board_size": size, "komi": komi}).new_initial_state()
    for move in moves:
        state.apply_action(move)
    return state


# --- lockstep with OpenSpiel ------------------------------------------------------------------------------------------

# 1,000 random games: most on small boards (short games), 9x9 included; seeded (5x5's seed ends some by superko).
CROSS_CHECK = [(5, 600, 0), (6, 150, 1), (7, 150, 2), (9, 100, 3)]


@pytest.mark.parametrize("size, num_games, seed", CROSS_CHECK)
def test_random_games_match_openspiel_move_for_move(size, num_games, seed):
    """Every position of every game: the same legal actions, board, player to move and end; the same returns."""
    game = pyspiel.load_game("go", {"board_size": size, "komi": 7.5})
    assert game.max_game_length() == 2 * size * size
    games = GoGames(num_games, size, komi=7.5)
    states = [game.new_initial_state() for _ in range(num_games)]
    rng = np.random.default_rng(seed)
    positions = 0
    while True:
        mask, boards, to_play, terminal = games.legal_mask(), games.boards(), games.to_play, games.terminal
        actions = np.full(num_games, -1)
        for g, state in enumerate(states):
            legal = state.legal_actions()
            assert np.flatnonzero(mask[g]).tolist() == legal, (g, str(state))
            planes = np.asarray(state.observation_tensor(0)).reshape(4, size, size)
            assert np.array_equal(planes[0] == 1, boards[g] == BLACK) and np.array_equal(planes[1] == 1,
                                                                                       boards[g] == WHITE), g
            assert terminal[g] == state.is_terminal()
            if not state.is_terminal():
                assert to_play[g] == state.current_player()
                actions[g] = legal[rng.integers(len(legal))]
                state.apply_action(int(actions[g]))
                positions += 1
        if terminal.all():
            break
        games.step(actions)
    assert np.array_equal(games.returns(), np.array([s.returns() for s in states]))
    assert positions > num_games * size * size  # whole games, not a few moves
    if size == 5:
        assert games.superko.any()  # the repetition rule was exercised (about 1 game in 200 ends by it on 5x5)


# --- rules on hand-made positions -------------------------------------------------------------------------------------

def test_capture_removes_a_chain_and_frees_its_points():
    s = 5
    games = GoGames(1, s)
    # White's two stones at (0,1), (0,2) surrounded by black at (0,0), (1,1), (1,2), (0,3).
    play(games, [a(s, 0, 0), a(s, 0, 1), a(s, 1, 1), a(s, 0, 2), a(s, 1, 2), games.pass_action, a(s, 0, 3)])
    board = games.boards()[0]
    assert board[0, 1] == EMPTY and board[0, 2] == EMPTY and board[0, 3] == BLACK
    assert games.legal_mask()[0, a(s, 0, 1)]  # white may play back into the freed points (they have liberties)


def test_ko_forbids_the_immediate_recapture_only():
    s = 5
    games = GoGames(1, s)
    # The classic ko shape around (1,1)/(1,2): black captures at (1,2)... then white may not retake at (1,1) at once.
    moves = [a(s, 0, 1), a(s, 0, 2), a(s, 1, 0), a(s, 1, 3), a(s, 2, 1), a(s, 2, 2), a(s, 4, 4), a(s, 1, 1),
             a(s, 1, 2)]  # black takes the white stone at (1,1)
    play(games, moves)
    assert games.boards()[0, 1, 1] == EMPTY
    assert not games.legal_mask()[0, a(s, 1, 1)]  # ko
    assert not openspiel_state(s, moves).legal_actions().count(a(s, 1, 1))
    play(games, [a(s, 4, 0), a(s, 4, 3)])  # a ko threat and its answer
    assert games.legal_mask()[0, a(s, 1, 1)]
    passed = GoGames(1, s)
    play(passed, moves + [passed.pass_action])  # white passes instead: the pass clears the ko point, so black
    assert passed.legal_mask()[0, a(s, 1, 1)]  # may fill it (OpenSpiel's ko point binds whoever moves next)
    assert a(s, 1, 1) in openspiel_state(s, moves + [passed.pass_action]).legal_actions()



def test_suicide_is_illegal_unless_it_captures():
    s = 5
    games = GoGames(1, s)
    # Black surrounds the corner point (0,0); white may not play there.
    play(games, [a(s, 0, 1), a(s, 4, 4), a(s, 1, 0)])
    mask = games.legal_mask()[0]
    assert not mask[a(s, 0, 0)] and mask[games.pass_action]
    # Multi-stone suicide: white at (0,0) filling its own last liberty is illegal too.
    multi = GoGames(1, s)
    play(multi, [a(s, 0, 1), a(s, 0, 0), a(s, 1, 1), a(s, 4, 4), a(s, 2, 0)])
    assert not multi.legal_mask()[0, a(s, 1, 0)]  # white (0,0)+(1,0) would have no liberty and captures nothing
    # The same shape, but the stone takes the last liberty of black's (0,1): a capture, legal.
    cap = GoGames(1, s)
    play(cap, [a(s, 0, 1), a(s, 0, 2), a(s, 1, 0), a(s, 1, 1), a(s, 4, 4)])
    assert cap.legal_mask()[0, a(s, 0, 0)]
    with pytest.raises(ValueError, match="illegal in game 0"):
        games.step([a(s, 0, 0)])


def test_scoring_is_area_with_komi():
    s = 5
    games = GoGames(2, s, komi=7.5)
    assert games.scores()[0] == -7.5  # an empty board reaches no stone: nobody's
    play(games, [a(s, 2, 2)], row=0)  # one black stone owns the whole board
    assert games.scores()[0] == 25 - 7.5
    # A wall: black column 1, white column 3; column 0 black's, column 4 white's, column 2 touches both.
    play(games, [x for r in range(s) for x in (a(s, r, 1), a(s, r, 3))], row=1)
    assert games.scores()[1] == (10 - 10) - 7.5
    play(games, [games.pass_action, games.pass_action])
    assert games.terminal.all()
    assert games.returns().tolist() == [[1.0, -1.0], [-1.0, 1.0]]
    draw = GoGames(1, s, komi=0.0)  # integer komi, equal areas: a draw
    play(draw, [a(s, r, c) for r in range(s) for c in (1, 3)] + [draw.pass_action] * 2)
    assert draw.returns().tolist() == [[0.0, 0.0]]


def slow_area_owners(board: np.ndarray) -> np.ndarray:
    """Tromp-Taylor ownership point by point: a stone's colour, or for an empty point the colours its empty region
    reaches (a breadth-first walk from that point alone); +1 black, -1 white, 0 both or neither."""
    size = len(board)
    owners = np.zeros((size, size), np.int8)
    for r in range(size):
        for c in range(size):
            if board[r, c] != EMPTY:
                owners[r, c] = 1 if board[r, c] == BLACK else -1
                continue
            seen, frontier, reach = {(r, c)}, [(r, c)], set()
            while frontier:
                y, x = frontier.pop()
                for ny, nx in ((y - 1, x), (y + 1, x), (y, x - 1), (y, x + 1)):
                    if 0 <= ny < size and 0 <= nx < size:
                        if board[ny, nx] == EMPTY and (ny, nx) not in seen:
                            seen.add((ny, nx))
                            frontier.append((ny, nx))
                        elif board[ny, nx] != EMPTY:
                            reach.add(int(board[ny, nx]))
            owners[r, c] = 1 if reach == {BLACK} else (-1 if reach == {WHITE} else 0)
    return owners.reshape(-1)


@pytest.mark.parametrize("size", [5, 9])
def test_area_owners_match_a_slow_reference_and_sum_to_the_score(size):
    """KataGo's ownership target (``GoGames.area_owners``) on the boards of random games at every stage: the slow
    reference's owner for every point, and black's area minus white's is the score before komi."""
    games = GoGames(40, size, komi=7.5)
    rng = np.random.default_rng(size)
    checked = 0
    for _ in range(size * size * 2):
        owners, boards, scores = games.area_owners(), games.boards(), games.scores()
        for g in range(games.num_games):
            assert np.array_equal(owners[g], slow_area_owners(boards[g]))
        assert np.array_equal(owners.sum(1).astype(np.float32) - np.float32(7.5), scores)
        checked += games.num_games
        legal = games.legal_mask()
        games.step([rng.choice(np.flatnonzero(m)) if m.any() else games.pass_action for m in legal])
    assert checked > 0 and {-1, 0, 1} <= set(np.unique(owners))


def test_superko_ends_the_game_as_a_draw_as_in_openspiel():
    games = GoGames(1, 5)
    play(games, SUPERKO_GAME[:-1])
    assert not games.terminal[0]
    play(games, SUPERKO_GAME[-1:])
    state = openspiel_state(5, SUPERKO_GAME)
    assert games.terminal[0] and games.superko[0] and state.is_terminal()
    assert games.returns()[0].tolist() == state.returns() == [0.0, 0.0]
    assert not games.legal_mask().any()


def test_game_ends_at_the_move_limit_and_finished_games_ignore_actions():
    games = GoGames(2, 5, max_game_length=4)
    for actions in ([0, 10], [1, 11], [2, 12]):
        games.step(actions)
    assert not games.terminal.any()
    assert games.step([3, games.pass_action]).tolist() == [True, True]  # 4 moves, one pass in game 1
    before = games.boards().copy()
    games.step([games.pass_action, 13])  # over: ignored
    assert np.array_equal(games.boards(), before) and games.move_number.tolist() == [4, 4]
    with pytest.raises(ValueError, match="max_game_length"):
        GoGames(1, 5, max_game_length=1)
    with pytest.raises(ValueError, match="board_size"):
        GoGames(1, 4)


def test_clone_and_copy_are_independent_games():
    games = GoGames(2, 7)
    play(games, [10, 20, 30], row=1)
    copy = games.clone([1])
    play(copy, [5])
    assert games.boards()[1].ravel()[5] == EMPTY and copy.boards()[0].ravel()[5] != EMPTY
    games.copy_from(0, copy, 0)
    assert np.array_equal(games.boards()[0], copy.boards()[0]) and games.move_number[0] == copy.move_number[0]
    play(games, [6], row=0)
    assert copy.boards()[0].ravel()[6] == EMPTY


# --- the board's symmetries ------------------------------------------------------------------------------------------

def slow_symmetry_point(row: int, col: int, size: int, k: int) -> tuple[int, int]:
    """Where symmetry ``k`` takes the point (row, col): k % 4 counter-clockwise quarter turns of the board (a turn
    takes (r, c) to (size - 1 - c, r)), then the transpose (r, c) -> (c, r) when k >= 4."""
    for _ in range(k % 4):
        row, col = size - 1 - col, row
    return (col, row) if k >= 4 else (row, col)


@pytest.mark.parametrize("size", [5, 9])
def test_symmetries_move_each_point_as_a_slow_reference_and_are_the_eight_of_the_square(size):
    board = np.arange(size * size).reshape(size, size)
    images = set()
    for k in range(NUM_SYMMETRIES):
        expected = np.empty_like(board)
        for r in range(size):
            for c in range(size):
                expected[slow_symmetry_point(r, c, size, k)] = board[r, c]
        assert np.array_equal(symmetry_boards(board, k), expected)
        assert np.array_equal(symmetry_boards(np.stack([board, -board])[:, None], k)[1, 0], -expected)  # leading axes
        with_pass = symmetry_points(np.arange(size * size + 1), size, k)
        assert np.array_equal(with_pass[:-1], expected.ravel()) and with_pass[-1] == size * size  # the pass stays
        images.add(expected.tobytes())
    assert len(images) == NUM_SYMMETRIES
    with pytest.raises(ValueError, match="symmetry"):
        symmetry_boards(board, 8)
    with pytest.raises(ValueError, match="entries"):
        symmetry_points(np.zeros(size * size + 2), size, 0)


def test_a_game_played_in_a_symmetry_is_the_same_game_moved():
    """What the learners' augmentation relies on: 8 random 7x7 games, and each replayed in another set with its
    moves taken through symmetry g: at every move the network's planes and the legal moves are the first game's
    moved, and the final scores and outcomes are equal."""
    size, n = 7, NUM_SYMMETRIES
    games, moved = GoGames(n, size), GoGames(n, size)
    # where symmetry k sends each action: symmetry_points puts the value of action a at the image of a
    images = [np.argsort(symmetry_points(np.arange(size * size + 1), size, k)) for k in range(n)]
    rng = np.random.default_rng(7)
    moves = 0
    while not games.terminal.all():
        planes, moved_planes = input_planes(games, np.arange(n)), input_planes(moved, np.arange(n))
        legal, moved_legal = games.legal_mask(), moved.legal_mask()
        for k in range(n):
            assert np.array_equal(moved_planes[k], symmetry_boards(planes[k], k))
            assert np.array_equal(moved_legal[k], symmetry_points(legal[k], size, k))
        actions = np.array([rng.choice(np.flatnonzero(m)) if m.any() else games.pass_action for m in legal])
        games.step(actions)
        moved.step([images[k][a] for k, a in enumerate(actions)])
        moves += 1
    assert moved.terminal.all() and moves > 20
    assert np.array_equal(games.scores(), moved.scores()) and np.array_equal(games.returns(), moved.returns())


# --- the search -------------------------------------------------------------------------------------------------------

def test_search_proves_a_won_ending_and_stops():
    """White passed; black passing ends the game won (one black stone owns the board): MCTS-Solver proves it at
    the first visit of the pass child, and the search stops there."""
    games = GoGames(1, 5)
    play(games, [a(5, 2, 2), games.pass_action])
    bot = RolloutMCTS(uct_c=2.0, max_simulations=500, seed=3)
    assert bot.step(games) == games.pass_action
    assert bot.simulations <= 26  # the root and at most every child once
    assert games.move_number[0] == 2  # the game itself is not changed


def test_search_is_seeded_legal_and_takes_an_obvious_capture():
    s = 5
    games = GoGames(1, s)
    # White's big chain along the top row is in atari at (0,4): black takes 4 stones and the game.
    play(games, [a(s, 1, 0), a(s, 0, 0), a(s, 1, 1), a(s, 0, 1), a(s, 1, 2), a(s, 0, 2), a(s, 1, 3), a(s, 0, 3),
                 a(s, 1, 4)])
    games.step([a(s, 4, 4)])  # white plays elsewhere (after a white pass, black's pass would win at once)
    choices = [RolloutMCTS(2.0, 300, seed=7).step(games) for _ in range(2)]
    assert choices[0] == choices[1]  # same seed, same search
    assert choices[0] == a(s, 0, 4)
    with pytest.raises(ValueError, match="max_simulations"):
        RolloutMCTS(max_simulations=1)
