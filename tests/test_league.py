"""Opponent pool (OpenAI Five appendix H) and ratings (TrueSkill, Elo, Nash averaging)."""

import numpy as np
import pytest
from scipy.stats import chisquare

from hpc_rl.league.pool import LATEST, OpponentPool, VersionsInPlay, admit, quality_after_win, softmax
from hpc_rl.league.ratings import TrueSkillTable, elo_from_results, nash_average, nash_equilibrium


def test_quality_update_matches_formula():
    q = np.array([0.0, 1.0, 0.5])
    p = np.exp(q) / np.exp(q).sum()
    out = quality_after_win(q, 1, eta=0.01)
    assert out[1] == pytest.approx(1.0 - 0.01 / (3 * p[1]))
    assert out[0] == q[0] and out[2] == q[2]


def test_new_version_enters_at_max_quality():
    pool = OpponentPool()
    for v in (10, 20, 30):
        pool.add(v)
    pool.record_win(30)
    pool.record_win(30)
    pool.add(40)
    assert pool.qualities[-1] == max(pool.qualities[:-1]) == 0.0
    with pytest.raises(ValueError):
        pool.add(40)
    with pytest.raises(ValueError):
        OpponentPool(latest_fraction=1.5)


def test_sampling_frequencies_match_80_20_and_softmax():
    pool = OpponentPool(versions=[1, 2, 3, 4], qualities=[0.0, -0.5, 0.3, -2.0])
    rng = np.random.default_rng(0)
    draws = np.array([pool.sample(rng) for _ in range(60_000)])
    labels = [LATEST, 1, 2, 3, 4]
    observed = np.array([(draws == v).sum() for v in labels])
    expected = np.r_[0.8, 0.2 * softmax(np.array(pool.qualities))] * len(draws)
    assert chisquare(observed, expected).pvalue > 1e-3
    # Sensitivity: a 75/25 split is rejected by the same test.
    wrong = np.r_[0.75, 0.25 * softmax(np.array(pool.qualities))] * len(draws)
    assert chisquare(observed, wrong).pvalue < 1e-6


def test_quality_tracks_win_rate_not_draw_frequency():
    """Versions the current policy always beats lose quality; one it never beats keeps it, whatever p_i."""
    rng = np.random.default_rng(1)
    pool = OpponentPool(latest_fraction=0.0, versions=[1, 2, 3], qualities=[0.0, 0.0, 0.0])
    for _ in range(3000):
        opponent = pool.sample(rng)
        if opponent != 3:  # version 3 is never beaten
            pool.record_win(opponent)
    q = dict(zip(pool.versions, pool.qualities))
    assert q[3] == 0.0 and q[1] < -1.0 and q[2] < -1.0
    assert pool.probabilities()[2] > 0.9


def test_trueskill_orders_scripted_above_random():
    rng = np.random.default_rng(2)
    table = TrueSkillTable(anchor="random")
    strength = {"random": 0.0, "scripted": 2.0, "past_v10": 1.0}
    names = list(strength)
    for _ in range(600):
        a, b = rng.choice(names, size=2, replace=False)
        p_a = 1.0 / (1.0 + np.exp(-(strength[a] - strength[b])))
        table.record(a, b, float(rng.random() < p_a))
    order = [row[0] for row in table.table()]
    assert order == ["scripted", "past_v10", "random"]
    assert table.mu("random") == 0.0
    assert table.games["scripted"] > 300
    with pytest.raises(ValueError):
        table.record("a", "b", 0.3)


def test_elo_recovers_known_ratings():
    true_elo = np.array([0.0, 200.0, -150.0, 400.0])
    rng = np.random.default_rng(3)
    n = len(true_elo)
    scores, games = np.zeros((n, n)), np.zeros((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            p = 1.0 / (1.0 + 10 ** (-(true_elo[i] - true_elo[j]) / 400))
            wins = rng.binomial(4000, p)
            scores[i, j], scores[j, i] = wins, 4000 - wins
            games[i, j] = games[j, i] = 4000
    elo = elo_from_results(scores, games, anchor=0)
    assert elo[0] == 0.0
    assert np.abs(elo - true_elo).max() < 25


def test_nash_of_rock_paper_scissors_is_uniform_and_dominated_strategy_gets_zero():
    rps = np.array([[0, -1, 1], [1, 0, -1], [-1, 1, 0]], dtype=float)
    assert np.allclose(nash_equilibrium(rps), 1 / 3, atol=1e-6)
    # A fourth strategy that loses to everything gets no weight, and RPS stays uniform.
    ext = np.zeros((4, 4))
    ext[:3, :3] = rps
    ext[:3, 3], ext[3, :3] = 1.0, -1.0
    p = nash_equilibrium(ext)
    assert p[3] < 1e-6 and np.allclose(p[:3], 1 / 3, atol=1e-5)


def test_nash_average_is_not_inflated_by_copies_of_a_weak_player():
    # strong beats weak 90%; medium beats weak 70%, strong beats medium 60%.
    base = np.array([[0.5, 0.6, 0.9], [0.4, 0.5, 0.7], [0.1, 0.3, 0.5]])
    ratings, p = nash_average(base)
    assert p[0] > 0.99  # strong dominates: the equilibrium is pure
    copies = np.full((5, 5), 0.5)
    copies[:3, :3] = base
    copies[:2, 3:] = base[:2, 2:3]
    copies[3:, :2] = base[2:3, :2]
    ratings_with_copies, _ = nash_average(copies)
    assert np.allclose(ratings_with_copies[:3], ratings, atol=1e-4)
    with pytest.raises(ValueError):
        nash_average(np.array([[0.5, 0.9], [0.9, 0.5]]))


def test_admit_keeps_a_draw_within_the_bound_and_joins_the_newest_version_beyond_it():
    assert admit(LATEST, [3, 5], bound=2) == LATEST
    assert admit(5, [3, 5], bound=2) == 5  # already in play
    assert admit(7, [3], bound=2) == 7  # room for one more
    assert admit(7, [3, 5], bound=2) == 5  # full: the version admitted last
    with pytest.raises(ValueError):
        admit(7, [], bound=0)


def test_versions_in_play_stay_bounded_and_are_played_in_proportion_to_the_pool():
    """Twelve copies of one inference rank play games of random length; each new game draws from a pool of six
    versions. At most two versions are ever in play (each one more forward pass per step), yet over many games the
    past versions are played in the pool's proportions and a fifth of the games are against them."""
    rng = np.random.default_rng(0)
    pool = OpponentPool(versions=[1, 2, 3, 4, 5, 6], qualities=[0.0, -0.5, 0.3, -1.0, 0.1, -0.2])
    in_play = VersionsInPlay(bound=2)
    opponent = np.full(12, LATEST)
    left = rng.integers(1, 50, 12)
    games, most = [], 0
    for _ in range(60_000):
        left -= 1
        for c in np.flatnonzero(left == 0):
            opponent[c] = LATEST
            opponent[c] = in_play.opponent(pool.sample(rng), {int(v) for v in opponent[opponent != LATEST]})
            games.append(int(opponent[c]))
            left[c] = rng.integers(20, 60)
        most = max(most, len(set(opponent[opponent != LATEST].tolist())))
    assert most == 2
    games = np.array(games)
    past = games[games != LATEST]
    assert abs(len(past) / len(games) - 0.2) < 0.01
    observed = np.array([(past == v).sum() for v in pool.versions])
    expected = pool.probabilities() * len(past)
    # Consecutive games share versions, so the counts are overdispersed: compare shares, not a chi-square.
    assert np.abs(observed / len(past) - expected / len(past)).max() < 0.03, (observed, expected)
    # Sensitivity: without the pool's probabilities (uniform over versions) the shares would be off by more.
    assert np.abs(np.full(6, 1 / 6) - pool.probabilities()).max() > 0.06
