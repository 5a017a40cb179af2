"""The batched PUCT search (``hpc_rl.envs.go_search``): its maths against slow references, its trees against a slow
pure-Python PUCT search, a won ending found, batching that changes no game's moves, and resignation's calibration."""

import math
from dataclasses import replace

import numpy as np
import pytest

from hpc_rl.envs.go import NUM_PLANES, PASSES, GoGames, input_planes, passes_held_back
from hpc_rl.envs.go_search import (ACTION, COUNT, FIRST, PRIOR, VALUE_SUM, VISITS, Match, PUCTConfig, PUCTSearch,
                                   SelfPlay, add_virtual_loss, backup, calibrated_resign_threshold, evaluation_config,
                                   first_play_value, mix_noise, play_games, puct_score, resign_false_positives,
                                   visit_policy)


class LinearEvaluator:
    """A fixed function of each position alone: integer weights on the planes (exact, so a position's priors and value
    do not depend on the rows beside it in a batch); priors unnormalised (the search renormalises over legal moves)."""

    def __init__(self, size, seed=0):
        rng = np.random.default_rng(seed)
        self.w = rng.integers(-3, 4, size=(NUM_PLANES * size * size, size * size + 1))
        self.wv = rng.integers(-3, 4, size=NUM_PLANES * size * size)

    def __call__(self, planes, legal):
        x = planes.reshape(len(planes), -1).astype(np.int64)
        return np.exp((x @ self.w) / 8.0) * legal, np.tanh((x @ self.wv) / 16.0)


def uniform_zero(planes, legal):
    return legal.astype(np.float64), np.zeros(len(planes))


# --- the maths against slow references ------------------------------------------------------------------------------

def test_puct_score_is_agz_formula():
    rng = np.random.default_rng(0)
    for _ in range(50):
        w, n, p, parent, c = rng.normal(), float(rng.integers(0, 9)), rng.random(), float(rng.integers(1, 30)), 1.5
        first = rng.normal()
        q = w / n if n > 0 else first
        assert puct_score(w, n, p, parent, c, first) == pytest.approx(q + c * p * math.sqrt(parent) / (1 + n),
                                                                      abs=1e-12)
    assert puct_score(5.0, 0.0, 0.5, 4.0, 1.0, 0.0) == pytest.approx(0.5 * 2)  # unvisited at AlphaGo Zero's Q = 0
    assert puct_score(5.0, 0.0, 0.5, 4.0, 1.0, -0.3) == pytest.approx(-0.3 + 0.5 * 2)


def test_first_play_value_is_the_parent_value_less_the_reduction():
    assert first_play_value(0.2, 0.0, 0.25) == pytest.approx(0.2)  # nothing visited yet: the parent's value
    assert first_play_value(-0.4, 0.64, 0.25) == pytest.approx(-0.4 - 0.25 * 0.8)
    assert first_play_value(0.1, 1.0, 0.0) == pytest.approx(0.1)


def test_virtual_loss_then_backup_is_one_visit_of_alternating_sign():
    rng = np.random.default_rng(1)
    nf = rng.normal(size=(6, 3))
    nf[:, VISITS] = rng.integers(1, 9, size=6)
    path, depth, value, vl = np.array([0, 2, 3, 5]), 3, 0.4, 1.0
    before, expected = nf.copy(), nf.copy()
    for i, node in enumerate(path):  # the leaf (depth 3) was moved into by the opponent of its player to move
        expected[node, VISITS] += 1
        expected[node, VALUE_SUM] += value * (-1) ** (depth - i + 1)
    for node in path:
        add_virtual_loss(nf, node, vl)
    np.testing.assert_allclose(nf[path], before[path] + [0, vl, -vl])  # in flight: a lost visit on every node
    backup(nf, path, depth, value, vl)
    np.testing.assert_allclose(nf, expected, atol=1e-12)


def test_visit_policy_and_noise_mixing():
    visits = np.array([[0, 3, 1, 6], [2, 2, 0, 0]], dtype=float)
    for t in (1.0, 0.5, 2.0):
        ref = [[n ** (1 / t) / sum(m ** (1 / t) for m in row) for n in row] for row in visits]
        np.testing.assert_allclose(visit_policy(visits, t), ref)
    assert visit_policy(visits, 0).tolist() == [[0, 0, 0, 1], [1, 0, 0, 0]]  # the first of equals
    assert visit_policy(np.array([1e300, 1e300]), 0.1).tolist() == [0.5, 0.5]  # no overflow
    assert mix_noise(0.2, 0.6, 0.25) == pytest.approx(0.75 * 0.2 + 0.25 * 0.6)


def test_root_priors_are_mixed_with_the_games_dirichlet_noise():
    cfg = PUCTConfig(simulations=2, dirichlet_alpha=0.3, dirichlet_weight=0.25)
    games = GoGames(2, 5)
    games.step([12, 0])
    search = PUCTSearch(cfg, [5, 6], board_size=5)
    search.start(games, [0, 1])
    planes, legal = search.select()
    priors, values = LinearEvaluator(5)(planes, legal)
    search.expand_and_backup(priors, values)
    for g, seed in enumerate([5, 6]):
        moves = np.flatnonzero(legal[g])
        noise = np.random.default_rng(seed).dirichlet(np.full(len(moves), 0.3))
        p = priors[g, moves] / priors[g, moves].sum()
        root = search.roots[g]
        first, count = search._ni[root, FIRST], search._ni[root, COUNT]
        np.testing.assert_allclose(search._nf[first:first + count, PRIOR], 0.75 * p + 0.25 * noise)


# --- the search against a slow pure-Python PUCT search ---------------------------------------------------------------

class Node:
    def __init__(self, prior):
        self.prior, self.n, self.w, self.children = prior, 0.0, 0.0, None


def reference_search(evaluate, games, row, sims, k, c_puct, vl, fpu=None):
    """PUCT written out node by node: per step, up to ``k`` descents each under the virtual loss of the ones before,
    then the leaves evaluated and backed up in order; the root's visits by action. ``fpu``: an unvisited child is
    valued at the node's mean value for its player to move less fpu * sqrt(the visited children's prior mass)."""
    root, done = Node(0.0), 0
    while done < sims:
        count = 1 if root.children is None else min(k, sims - done)
        paths = []
        for _ in range(count):
            node, path, acts = root, [root], []
            while node.children:
                best, best_score = None, -math.inf
                first = 0.0
                if fpu is not None:
                    visited = sum(child.prior for child in node.children.values() if child.n > 0)
                    first = -node.w / node.n - fpu * math.sqrt(visited)
                for a, child in node.children.items():
                    q = child.w / child.n if child.n > 0 else first
                    score = q + c_puct * child.prior * math.sqrt(node.n) / (1.0 + child.n)
                    if score > best_score:
                        best, best_score = (a, child), score
                acts.append(best[0])
                node = best[1]
                path.append(node)
            for nd in path:
                nd.n += vl
                nd.w -= vl
            paths.append((path, acts))
        done += count
        results = []
        for path, acts in paths:
            g = games.clone([row])
            for a in acts:
                g.step([a])
            if g.terminal[0]:
                results.append((path, g.returns()[0, g.to_play[0]], None))
            else:
                legal = g.legal_mask()
                p, v = evaluate(input_planes(g, [0], legal), legal)
                results.append((path, float(v[0]), (legal[0], p[0].astype(np.float64))))
        for path, value, ev in results:
            leaf = path[-1]
            if ev is not None and leaf.children is None:
                legal, p = ev
                moves = np.flatnonzero(legal)
                total = 0.0
                for a in moves:
                    total += p[a]
                leaf.children = {int(a): Node(p[a] / total) for a in moves}
            v = -value
            for nd in reversed(path):
                nd.n += 1.0 - vl
                nd.w += v + vl
                v = -v
    visits = np.zeros(games.num_actions)
    for a, child in root.children.items():
        visits[a] = child.n
    return visits


@pytest.mark.parametrize("fpu", [None, 0.25])
@pytest.mark.parametrize("k", [1, 3])
def test_search_trees_match_a_slow_reference(k, fpu):
    """The same root visits as the reference, move after move of a game on 5x5 (deep enough to reach ends), with
    several leaves per game in flight under virtual loss when k > 1, unvisited children at Q = 0 or at the
    first-play urgency value."""
    evaluate = LinearEvaluator(5, seed=k)
    cfg = PUCTConfig(simulations=40, leaves_per_game=k, dirichlet_weight=0.0, temperature=0.0, fpu_reduction=fpu)
    games = GoGames(1, 5, max_game_length=14)
    search = PUCTSearch(cfg, [0], board_size=5, max_game_length=14)
    moves = 0
    while not games.terminal[0]:
        choice = search.search(games, [0], evaluate)
        visits = reference_search(evaluate, games, 0, cfg.simulations, k, cfg.c_puct, cfg.virtual_loss, fpu)
        np.testing.assert_allclose(choice.pi[0], visits / visits.sum(), rtol=1e-6)
        assert choice.actions[0] == visits.argmax()
        games.step(choice.actions)
        moves += 1
    assert moves >= 6


def test_first_play_urgency_keeps_a_losing_search_on_its_prior_moves():
    """Black, the searcher, is lost in every position (value -0.5 to black, +0.5 to white), so every visited move is
    worth -0.5 to it: with AlphaGo Zero's Q = 0 for unvisited moves the search tries every legal move before
    revisiting one; with the first-play urgency reduction it stays on the moves the prior favours."""
    def evaluate(planes, legal):
        priors = legal * np.where(np.arange(legal.shape[1]) < 3, 10.0, 0.1)  # three moves the prior likes
        black_to_move = planes[:, 3, 0, 0] == 1
        return priors, np.where(black_to_move, -0.5, 0.5)

    games = GoGames(1, 5)
    tried = {}
    for fpu in (None, 0.25):
        search = PUCTSearch(PUCTConfig(simulations=40, dirichlet_weight=0.0, temperature=0.0, fpu_reduction=fpu), [0],
                            board_size=5)
        visits = search.search(games, [0], evaluate).pi[0] * 39
        tried[fpu] = int((visits > 0).sum())
        assert visits[:3].sum() > (30 if fpu is not None else 0)
    assert tried[None] == 26  # every legal move (25 points and the pass)
    assert tried[0.25] <= 4


def subtree(search, node, path=()):
    """{actions from ``node``: (N, W, P)} of every node below it, ``node`` itself at ()."""
    out = {path: tuple(search._nf[node])}
    first, count = search._ni[node, FIRST], search._ni[node, COUNT]
    for c in range(first, first + count):
        out.update(subtree(search, c, path + (int(search._ni[c, ACTION]),)))
    return out


def test_a_kept_subtree_carries_its_visits_into_the_next_search():
    """descend() keeps the subtree of the position two moves on exactly (every node's visits, values and priors, by
    its actions from the new root), frees the rest, and the next search adds its simulations to the kept visits."""
    evaluate = LinearEvaluator(5, seed=2)
    cfg = PUCTConfig(simulations=200, dirichlet_weight=0.0, temperature=0.0, leaves_per_game=2)
    games = GoGames(1, 5)
    search = PUCTSearch(cfg, [0], board_size=5)
    first = search.search(games, [0], evaluate).actions[0]
    before = subtree(search, search.roots[0])
    reply = max((k for k in before if len(k) == 2 and k[0] == first), key=lambda k: before[k][1])[1]  # most visited
    kept_before = {k[2:]: v for k, v in before.items() if k[:2] == (first, reply)}
    assert search.descend([first, reply]) == kept_before[()][1] > 1
    assert subtree(search, search.roots[0]) == kept_before and search._used == len(kept_before)
    games.step([first])
    games.step([reply])
    choice = search.search(games, [0], evaluate, keep_tree=True)
    assert search._nf[search.roots[0], VISITS] == kept_before[()][1] + cfg.simulations
    assert choice.pi[0].sum() == pytest.approx(1.0) and games.legal_mask()[0, choice.actions[0]]
    assert search.descend([choice.actions[0], 999]) == 0  # not in the tree: the next search starts afresh
    search.search(games, [0], evaluate, keep_tree=True)
    assert search._nf[search.roots[0], VISITS] == cfg.simulations


def test_keeping_a_tree_is_refused_where_it_cannot_hold():
    with pytest.raises(ValueError, match="keep_tree"):
        PUCTSearch(PUCTConfig(simulations=4, dirichlet_weight=0.0), [0, 1], board_size=5).start(
            GoGames(2, 5), [0, 1], keep_tree=True)
    with pytest.raises(ValueError, match="keep_tree"):  # root noise: a kept root was expanded without it
        PUCTSearch(PUCTConfig(simulations=4), [0], board_size=5).start(GoGames(1, 5), [0], keep_tree=True)
    with pytest.raises(RuntimeError, match="descend"):
        PUCTSearch(PUCTConfig(simulations=4), [0], board_size=5).descend([0])


def test_uniform_prior_zero_value_search_finds_the_one_winning_capture():
    """The move limit ends the game after black's next move; only taking white's four stones in atari wins it."""
    s, limit = 5, 11
    games = GoGames(1, s, max_game_length=limit)
    for move in [5, 0, 6, 1, 7, 2, 8, 3, 9, 24]:  # black row 1, white row 0 in atari at (0, 4), white's last at (4, 4)
        games.step([move])
    winning = []
    for a in np.flatnonzero(games.legal_mask()[0]):
        after = games.clone()
        after.step([a])
        assert after.terminal[0]
        if after.returns()[0, 0] > 0:
            winning.append(a)
    assert winning == [4]
    cfg = PUCTConfig(simulations=60, dirichlet_weight=0.0, temperature=0.0, leaves_per_game=4)
    choice = PUCTSearch(cfg, [0], board_size=s, max_game_length=limit).search(games, [0], uniform_zero)
    assert choice.actions[0] == 4 and choice.pi[0, 4] > 0.5 and choice.values[0] == 1.0
    assert games.move_number[0] == 10  # not changed by the search


# --- batching and self-play -------------------------------------------------------------------------------------------

def test_games_searched_together_play_as_each_alone():
    """Noise, sampled moves (temperature 1) and several leaves in flight: each game's record is the same whether
    it is played in a batch of four or alone with its seed."""
    evaluate = LinearEvaluator(5, seed=3)
    cfg = PUCTConfig(simulations=12, leaves_per_game=2, dirichlet_alpha=0.3, resign_threshold=None)
    seeds = [10, 11, 12, 13]
    together = play_games(evaluate, seeds, board_size=5, config=cfg, max_game_length=16)
    for seed, record in zip(seeds, together):
        alone = play_games(evaluate, [seed], board_size=5, config=cfg, max_game_length=16)[0]
        assert np.array_equal(alone.actions, record.actions) and np.array_equal(alone.pi, record.pi)
        assert np.array_equal(alone.planes, record.planes) and alone.winner == record.winner
    assert len({tuple(r.actions) for r in together}) == len(seeds)  # the seeds made different games
    r = together[0]
    assert r.planes.shape == (len(r.z), NUM_PLANES, 5, 5) and r.pi.shape == (len(r.z), 26)
    np.testing.assert_allclose(r.pi.sum(1), 1.0, rtol=1e-6)
    assert set(r.z.tolist()) <= {-1.0, 0.0, 1.0} and (r.to_play == np.arange(len(r.z)) % 2).all()


def test_playout_cap_randomisation_records_only_full_searches():
    """KataGo's playout cap randomisation: every move is drawn full (recorded, with root noise) or fast (played, not
    recorded, no noise), one draw per move for all rows from [seeds[0], 2]'s stream; each search runs its budget."""
    cfg = PUCTConfig(simulations=12, fast_simulations=3, full_search_share=0.25, dirichlet_alpha=0.3,
                     resign_threshold=None)
    seeds = [20, 21, 22]
    selfplay = SelfPlay(cfg, seeds, board_size=5, max_game_length=24)
    evaluate = LinearEvaluator(5, seed=4)
    draws = np.random.default_rng([seeds[0], 2])
    full_moves, evaluations, records = 0, 0, []
    full = bool(draws.random() < 0.25)  # the first move's draw
    while not selfplay.done:
        assert selfplay.full == full and selfplay.search.noise == full
        assert selfplay.search.budget == (12 if full else 3)
        before = selfplay.moves
        planes, legal = selfplay.select()
        evaluations += len(planes)
        answer = evaluate(planes, legal) if len(planes) else (np.zeros((0, 26)), np.zeros(0))
        records += [r for _, r in selfplay.expand_and_backup(*answer)]
        if selfplay.moves != before:  # the move was played: the next one draws
            full_moves += full
            full = bool(draws.random() < 0.25)
    assert 0 < full_moves < 24  # both kinds occurred
    for r in records:
        assert r.moves == 24 and len(r.z) == full_moves  # every game went the distance, recording its full moves
        assert r.planes.shape == (full_moves, NUM_PLANES, 5, 5)
        np.testing.assert_allclose(r.pi.sum(1), 1.0, rtol=1e-6)
        # the root's children's visits of a 12-simulation search (the first expands the root): elevenths, where a
        # 3-simulation search's would be halves
        np.testing.assert_allclose(r.pi * 11, np.round(r.pi * 11), atol=1e-4)
        assert (np.abs(r.pi * 2 - np.round(r.pi * 2)) > 1e-3).any()
    # fast moves cost fewer evaluations than full ones: at most 3 per row for a fast move, 12 for a full one
    assert evaluations <= len(seeds) * (12 * full_moves + 3 * (24 - full_moves))
    with pytest.raises(ValueError, match="fast_simulations"):
        PUCTConfig(simulations=12, fast_simulations=13)
    with pytest.raises(ValueError, match="full_search_share"):
        PUCTConfig(simulations=12, fast_simulations=3, full_search_share=0.0)


def test_a_game_of_fast_searches_only_has_no_positions():
    """A game that ends before its first full search: counted in moves, with nothing recorded."""
    cfg = PUCTConfig(simulations=4, fast_simulations=2, full_search_share=0.5, resign_threshold=None)
    seed = next(s for s in range(100) if (np.random.default_rng([s, 2]).random(2) >= 0.5).all())
    draws = np.random.default_rng([seed, 2])
    assert draws.random() >= 0.5 and draws.random() >= 0.5  # the two moves of the game are fast
    record = play_games(uniform_zero, [seed], board_size=5, config=cfg, max_game_length=2)[0]
    assert record.moves == 2 and len(record.z) == 0 and record.planes.shape == (0, NUM_PLANES, 5, 5)


def passes_held_back_by_hand(games, row):
    """The definition, point by point: the opponent did not pass last, and a legal stone fills no own one-point eye."""
    board, colour, s = games.boards()[row], games.to_play[row] + 1, games.size
    if games.meta[row, PASSES] > 0:
        return False
    legal = games.legal_mask()[row]
    for r in range(s):
        for c in range(s):
            if not legal[r * s + c]:
                continue
            neighbours = [board[r + dr, c + dc] for dr, dc in ((-1, 0), (1, 0), (0, -1), (0, 1))
                          if 0 <= r + dr < s and 0 <= c + dc < s]
            if not all(n == colour for n in neighbours):
                return True
    return False


def test_passes_held_back_matches_its_definition():
    rng = np.random.default_rng(5)
    games = GoGames(64, 5, 0.5)
    seen = set()
    while not games.terminal.all():
        rows = np.flatnonzero(~games.terminal)
        held = passes_held_back(games, rows, games.legal_mask()[rows])
        for i, g in enumerate(rows):
            assert held[i] == passes_held_back_by_hand(games, g)
            seen.add(bool(held[i]))
        legal = games.legal_mask()
        actions = np.array([rng.choice(np.flatnonzero(m)) if m.any() else 0 for m in legal])
        stones = legal[:, :-1].any(1) & (rng.random(64) < 0.9)  # passes now and then: both cases occur
        actions = np.where(stones, [rng.choice(np.flatnonzero(m[:-1])) if m[:-1].any() else 25 for m in legal], 25)
        games.step(actions)
    assert seen == {True, False}


def test_restricted_passes_are_left_out_of_the_search():
    """With restrict_passes, a pass gets no prior, no visit and is never chosen while a stone outside the player's
    own eyes is legal and the opponent did not pass; after the opponent's pass it is searched again."""
    cfg = PUCTConfig(simulations=16, dirichlet_weight=0.0, temperature=0.0, restrict_passes=True)
    games = GoGames(2, 5)
    games.step(np.array([25, 12]))  # game 0: black passes; game 1: black plays the centre
    search = PUCTSearch(cfg, [0, 1], board_size=5)
    choice = search.search(games, [0, 1], only_passes)  # a network that wants nothing but the pass
    assert choice.actions[0] == 25 and choice.pi[0, 25] == 1.0  # after black's pass white may pass
    assert choice.actions[1] != 25 and choice.pi[1, 25] == 0.0  # otherwise a stone
    free = PUCTSearch(replace(cfg, restrict_passes=False), [0, 1], board_size=5)
    assert free.search(games, [0, 1], only_passes).pi[1, 25] > 0.3  # unrestricted, the pass is searched


def black_is_lost(planes, legal):
    """Uniform priors; every position lost for black (plane 3: black to play)."""
    return legal.astype(np.float64), np.where(planes[:, 3, 0, 0] == 1, -1.0, 1.0)


def test_resignation_and_its_calibration_share():
    """Black resigns at once where it may; the calibration games (their share drawn per game) play on and record
    that black would have resigned."""
    cfg = PUCTConfig(simulations=4, resign_threshold=-0.8, resign_playout_share=0.25, resign_false_positives=None)
    seeds = range(200)
    records = play_games(black_is_lost, seeds, board_size=5, config=cfg, max_game_length=6)
    playout = np.array([r.playout for r in records])
    assert playout.tolist() == [np.random.default_rng([s, 1]).random() < 0.25 for s in seeds]
    assert 30 <= playout.sum() <= 70  # Binomial(200, 0.25): mean 50, sd 6
    for r in records:
        if r.playout:
            assert not r.resigned and r.would_resign == 0 and len(r.z) >= 2
        else:
            assert r.resigned and r.winner == 1 and len(r.z) == 1 and r.z.tolist() == [-1.0]
    false_positives, would = resign_false_positives(records)
    assert would == playout.sum()
    assert false_positives == sum(r.winner != 1 for r in records if r.playout)


def slow_resign_threshold(survivor_min_values, target):
    """The highest threshold, among the values themselves, at which the share of games whose surviving player's
    lowest value lies below it is at most the target (below the lowest value the share is 0)."""
    best = -np.inf
    for t in survivor_min_values:
        if np.mean([v < t for v in survivor_min_values]) <= target:
            best = max(best, t)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_calibrated_resign_threshold_matches_a_slow_reference(seed):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 60))
    values = np.round(rng.uniform(-1, 1, n), 1)  # ties
    for target in (0.0, 0.05, 0.1, 0.5, 0.99):
        t = calibrated_resign_threshold(values, target)
        assert t == slow_resign_threshold(values, target)
        assert np.mean(values < t) <= target
    with pytest.raises(ValueError, match="no calibration games"):
        calibrated_resign_threshold([], 0.05)


def test_resignation_waits_for_calibration_games_then_uses_their_threshold():
    """Every game is played out until resign_calibration_games calibration games are in; then the threshold is the
    calibrated one over the newest of them, capped, and black (always lost) resigns outside the calibration games."""
    cfg = PUCTConfig(simulations=4, resign_threshold=-0.5, resign_playout_share=0.25, resign_false_positives=0.05,
                     resign_calibration_games=10)
    selfplay = SelfPlay(cfg, range(6), board_size=5, max_game_length=6, restart=True)
    records, thresholds = [], []
    while len(records) < 60:
        planes, legal = selfplay.select()
        for _, record in selfplay.expand_and_backup(*black_is_lost(planes, legal)):
            records.append((record, selfplay.threshold))
        thresholds.append(selfplay.threshold)
        calibration = list(selfplay.survivor_min_values)
        if len(calibration) < 10:
            assert selfplay.threshold is None
        else:
            assert selfplay.threshold == min(calibrated_resign_threshold(calibration, 0.05), -0.5)
    assert thresholds[0] is None and thresholds[-1] == -0.5  # white's value is never low: the cap holds
    first = [r for r, _ in records[:10]]
    assert all(r.playout and not r.resigned for r in first)
    resigned = [r for r, _ in records if r.resigned]
    assert resigned and all(r.winner == 1 and len(r.z) == 1 for r in resigned)
    assert all(r.playout for r, _ in records if not r.resigned)


def counts_stones(planes, legal, komi=0.5):
    """Uniform priors; the value the stones on the board give the player to move (white gets the komi)."""
    margin = planes[:, 0].sum((1, 2)) - planes[:, 1].sum((1, 2)) + np.where(planes[:, 3, 0, 0] == 1, -komi, komi)
    return legal.astype(np.float64), np.clip(margin / 4, -1, 1)


def only_passes(planes, legal):
    """All the prior on the pass and no opinion of the position: a player that gives the board away."""
    priors = np.zeros(legal.shape)
    priors[:, -1] = 1.0
    return priors, np.zeros(len(planes))


@pytest.mark.parametrize("opening", [0, 4])
def test_a_gating_match_plays_each_network_in_its_own_seat(opening):
    """A stone-counting network against one that gives the board away, each black in half the games: the first
    wins every game from either seat (mixed-up seats would split them), and scores 0 from the other side."""
    cfg = evaluation_config(PUCTConfig(simulations=8, fast_simulations=4), opening)
    assert (cfg.dirichlet_weight, cfg.temperature, cfg.greedy_after) == (0.0, float(bool(opening)), opening or None)
    assert cfg.fast_simulations is None and replace(cfg, simulations=2).simulations == 2  # any count a player sets
    scores = []
    for players in ((counts_stones, only_passes), (only_passes, counts_stones)):
        match = Match(cfg, 4, seed=3, board_size=5, komi=0.5)
        while not match.done:
            match.step(players)
        scores.append(match.score())
        assert (match.games.move_number > 2).all()
    assert scores == [1.0, 0.0]
    with pytest.raises(RuntimeError, match="before every game"):
        Match(cfg, 2, seed=0, board_size=5).score()


def test_bad_settings_and_calls_are_refused():
    with pytest.raises(ValueError, match="simulations"):
        PUCTConfig(simulations=1)
    with pytest.raises(ValueError, match="dirichlet_weight"):
        PUCTConfig(dirichlet_weight=1.5)
    with pytest.raises(ValueError, match="resign_threshold"):
        PUCTConfig(resign_threshold=-2)
    with pytest.raises(ValueError, match="resign_false_positives"):
        PUCTConfig(resign_false_positives=1.0)
    with pytest.raises(ValueError, match="resign_calibration_games"):
        PUCTConfig(resign_calibration_games=0)
    with pytest.raises(ValueError, match="fpu_reduction"):
        PUCTConfig(fpu_reduction=-0.1)
    search = PUCTSearch(PUCTConfig(simulations=4), [0, 1], board_size=5)
    games = GoGames(2, 5)
    with pytest.raises(RuntimeError, match="start"):
        search.select()
    with pytest.raises(ValueError, match="board size"):
        search.start(GoGames(2, 7), [0])
    search.start(games, [0, 1])
    planes, legal = search.select()
    with pytest.raises(ValueError, match="priors"):
        search.expand_and_backup(np.ones((1, 26)), np.zeros(1))
    with pytest.raises(ValueError, match="values"):
        search.expand_and_backup(np.ones(legal.shape), np.full(2, 2.0))
    with pytest.raises(ValueError, match="illegal"):
        games.play_sequences([0], [[3, 3]], [2])
