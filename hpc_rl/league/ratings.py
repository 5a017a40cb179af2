"""Ratings of frozen policies: TrueSkill (OpenAI Five), Elo from pairwise tournaments and Nash averaging (ELF OpenGo).

Self-play Elo inflates: a version rated against its own ancestors gains from beating weaknesses only they have. So
ratings here are taken against fixed references (random, the frozen scripted bot) and summarised over a tournament;
Nash averaging (Balduzzi et al., 2018) weighs each opponent by its mass in the maximum-entropy Nash equilibrium of the
tournament, so adding many copies of a weak opponent cannot inflate a rating.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import trueskill
from scipy.optimize import linprog, minimize

ELO_PER_NAT = 400.0 / math.log(10.0)  # Elo difference d means P(win) = 1 / (1 + 10^(-d/400))


@dataclass
class TrueSkillTable:
    """TrueSkill ratings of named players, reported relative to an anchor player (random = 0, as in OpenAI Five)."""

    anchor: str = "random"
    draw_probability: float = 0.05
    ratings: dict[str, trueskill.Rating] = field(default_factory=dict)
    games: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._env = trueskill.TrueSkill(draw_probability=self.draw_probability)

    def _get(self, name: str) -> trueskill.Rating:
        if name not in self.ratings:
            self.ratings[name] = self._env.create_rating()
            self.games[name] = 0
        return self.ratings[name]

    def record(self, a: str, b: str, score_a: float) -> None:
        """One game between ``a`` and ``b``: score_a 1 (a won), 0 (b won) or 0.5 (draw)."""
        if score_a not in (0.0, 0.5, 1.0):
            raise ValueError(f"score_a must be 0, 0.5 or 1, got {score_a}")
        ranks = [0, 0] if score_a == 0.5 else ([0, 1] if score_a == 1.0 else [1, 0])
        (ra,), (rb,) = self._env.rate([(self._get(a),), (self._get(b),)], ranks=ranks)
        self.ratings[a], self.ratings[b] = ra, rb
        self.games[a] += 1
        self.games[b] += 1

    def mu(self, name: str) -> float:
        """Mean rating relative to the anchor."""
        anchor = self.ratings[self.anchor].mu if self.anchor in self.ratings else 0.0
        return self.ratings[name].mu - anchor

    def table(self) -> list[tuple[str, float, float, int]]:
        """(name, mu relative to anchor, sigma, games), best first."""
        return sorted(((n, self.mu(n), r.sigma, self.games[n]) for n, r in self.ratings.items()),
                      key=lambda row: -row[1])


def elo_from_results(scores: np.ndarray, games: np.ndarray, anchor: int = 0, prior_games: float = 1e-3) -> np.ndarray:
    """Maximum-likelihood Elo ratings (Bradley-Terry) from a tournament.

    ``scores[i, j]``: points of i against j (a win 1, a draw 0.5); ``games[i, j]``: games between them (symmetric).
    A tiny prior (``prior_games`` drawn games against every opponent) keeps an undefeated player's rating finite.
    Ratings are shifted so that ``anchor`` is 0.
    """
    scores, games = np.asarray(scores, dtype=np.float64), np.asarray(games, dtype=np.float64)
    n = scores.shape[0]
    if scores.shape != (n, n) or games.shape != (n, n) or not np.allclose(games, games.T):
        raise ValueError("scores and games must be square and games symmetric")
    if not np.allclose(scores + scores.T, games):
        raise ValueError("scores[i, j] + scores[j, i] must equal games[i, j]")
    off = ~np.eye(n, dtype=bool)
    s = scores + prior_games * 0.5 * off
    g = games + prior_games * off

    def nll(theta: np.ndarray) -> tuple[float, np.ndarray]:
        d = theta[:, None] - theta[None, :]
        logp = -np.logaddexp(0.0, -d)  # log sigmoid(d)
        value = -(s * logp)[off].sum()
        p = 1.0 / (1.0 + np.exp(-d))
        grad = -((s - g * p) * off).sum(axis=1)
        return value, grad

    theta = minimize(nll, np.zeros(n), jac=True, method="L-BFGS-B").x
    return (theta - theta[anchor]) * ELO_PER_NAT


def nash_equilibrium(payoff: np.ndarray, tol: float = 1e-9) -> np.ndarray:
    """The maximum-entropy Nash equilibrium of the symmetric zero-sum game with antisymmetric ``payoff``.

    An LP finds the game's value and one equilibrium; entropy is then maximised over the set of strategies that
    guarantee that value (a convex problem on the equilibrium polytope).
    """
    a = np.asarray(payoff, dtype=np.float64)
    n = a.shape[0]
    if a.shape != (n, n) or not np.allclose(a, -a.T, atol=1e-9):
        raise ValueError("payoff must be a square antisymmetric matrix")
    # maximise v subject to (p^T A)_j >= v for every column j, sum(p) = 1, p >= 0; variables (p, v).
    res = linprog(c=np.r_[np.zeros(n), -1.0],
                  A_ub=np.c_[-a.T, np.ones(n)], b_ub=np.zeros(n),
                  A_eq=np.r_[np.ones(n), 0.0][None, :], b_eq=[1.0],
                  bounds=[(0, None)] * n + [(None, None)], method="highs")
    if not res.success:
        raise RuntimeError(f"Nash LP failed: {res.message}")
    p0, value = res.x[:n], res.x[n]

    def neg_entropy(p: np.ndarray) -> float:
        q = np.clip(p, 1e-12, None)
        return float((q * np.log(q)).sum())

    refined = minimize(neg_entropy, p0, method="SLSQP", bounds=[(0, 1)] * n,
                       constraints=[{"type": "eq", "fun": lambda p: p.sum() - 1.0},
                                    {"type": "ineq", "fun": lambda p: a.T @ p - value + tol}])
    p = refined.x if refined.success and np.all(a.T @ refined.x >= value - 1e-6) else p0
    p = np.clip(p, 0.0, None)
    return p / p.sum()


def nash_average(win_rates: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nash averaging of a tournament: ``(ratings, equilibrium weights)``.

    ``win_rates[i, j]``: i's expected score against j (draws half). The payoff is the log-odds
    ``logit(win_rates)``, antisymmetric by construction; a player's rating is its payoff against the equilibrium
    mixture, so 0 means "as good as the Nash mixture" and negative means exploitable by it.
    """
    w = np.clip(np.asarray(win_rates, dtype=np.float64), 1e-6, 1 - 1e-6)
    if not np.allclose(w + w.T, 1.0, atol=1e-6):
        raise ValueError("win_rates[i, j] + win_rates[j, i] must be 1")
    payoff = np.log(w) - np.log1p(-w)
    np.fill_diagonal(payoff, 0.0)
    p = nash_equilibrium(payoff)
    return payoff @ p, p
