"""What Neural MMO agents do, measured from a rollout's records (numpy only; docs/nmmo.md, "Behaviour").

A rollout (``hpc_rl.evaluation.nmmo_rollout``) records, for every tick and every living agent, a *visit*: the agent
(a number unique within the rollout), its population and the tile it stands on (a cell number unique within the
rollout: world, row, column), and, for every attack it made, the style. The measures:

- **Exploration.** ``distinct_tiles``: the tiles each agent stood on in its life; ``coverage``: the share of the
  passable tiles (those that may be entered and do not kill: grass, forest, scrub) that some agent stood on.
- **Niches** (the paper's niche formation: populations that spread out over the map and fight differently).
  ``population_distributions``: per population, the share of its visits on each tile (or of its attacks in each
  style); ``js_divergence`` (in bits, 0..1) between two such distributions and ``mean_pairwise_js`` over all pairs of
  populations. A divergence computed from finitely many visits is above 0 even between two samples of one policy, so
  ``split_half_js``, the divergence between random halves of one population's agents, is the baseline it is read
  against: populations form niches when they diverge more than a population does from itself. ``shuffled_js``, the
  divergence between groups of the populations' sizes drawn from all agents together, is the baseline at equal sizes.
"""

from __future__ import annotations

import numpy as np


def distinct_tiles(agent: np.ndarray, cell: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The agents (sorted) and the number of distinct cells each visited, from parallel arrays of visits."""
    pairs = np.unique(np.stack([np.asarray(agent, np.int64), np.asarray(cell, np.int64)]), axis=1)
    agents, counts = np.unique(pairs[0], return_counts=True)
    return agents, counts


def coverage(cell: np.ndarray, passable: np.ndarray) -> float:
    """The share of the passable cells (``passable``: bool, indexed by cell) that some visit stood on."""
    visited = np.zeros(passable.size, dtype=bool)
    visited[np.asarray(cell, np.int64)] = True
    total = int(passable.sum())
    if total == 0:
        raise ValueError("coverage needs at least one passable cell")
    return float((visited & passable).sum() / total)


def population_distributions(population: np.ndarray, value: np.ndarray, num_values: int) -> dict[int, np.ndarray]:
    """Per population (sorted), the share of its records that hold each value in ``range(num_values)``."""
    out = {}
    for p in np.unique(population):
        counts = np.bincount(np.asarray(value, np.int64)[population == p], minlength=num_values).astype(np.float64)
        out[int(p)] = counts / counts.sum()
    return out


def js_divergence(p: np.ndarray, q: np.ndarray) -> float:
    """The Jensen-Shannon divergence of two distributions, in bits: H(m) − (H(p) + H(q)) / 2 with m = (p + q) / 2;
    0 for equal distributions, 1 for disjoint ones."""
    def entropy(x: np.ndarray) -> float:
        x = x[x > 0]
        return float(-(x * np.log2(x)).sum())

    p, q = np.asarray(p, np.float64), np.asarray(q, np.float64)
    return max(entropy((p + q) / 2) - (entropy(p) + entropy(q)) / 2, 0.0)  # max: rounding may leave −1e-16


def mean_pairwise_js(distributions: list[np.ndarray]) -> float | None:
    """The mean divergence over every pair of distributions; None with fewer than two."""
    pairs = [js_divergence(distributions[i], distributions[j])
             for i in range(len(distributions)) for j in range(i + 1, len(distributions))]
    return float(np.mean(pairs)) if pairs else None


def split_half_js(agent: np.ndarray, value: np.ndarray, num_values: int, seed: int, splits: int = 20) -> float | None:
    """The mean, over ``splits`` random splits of the agents into two halves, of the divergence between the halves'
    distributions of ``value`` (records of one population); None with fewer than two agents."""
    agent = np.asarray(agent, np.int64)
    agents = np.unique(agent)
    if agents.size < 2:
        return None
    rng = np.random.default_rng(seed)
    halves = np.zeros(splits)
    for s in range(splits):
        first = np.isin(agent, rng.permutation(agents)[:agents.size // 2])
        halves[s] = js_divergence(*population_distributions(first.astype(np.int64), value, num_values).values())
    return float(halves.mean())


def shuffled_js(population: np.ndarray, agent: np.ndarray, value: np.ndarray, num_values: int, seed: int,
                world: np.ndarray | None = None, shuffles: int = 99) -> np.ndarray | None:
    """The mean pairwise divergence between groups of agents as large as the populations but drawn from all of them
    together (the agents' population labels permuted; each agent keeps its records), for each of ``shuffles``
    permutations; None with fewer than two populations. It is what ``mean_pairwise_js`` of the populations would be
    if they had no niches: unlike the split-half baseline, whose halves hold half a population's agents (and so
    diverge more, by chance alone, the fewer agents a population has), it compares groups of the same sizes.
    ``world`` (per record) permutes the labels within each world only, so that every group keeps each world's share
    of the agents, as the populations do (each world's cells are its own: a group heavier in one world would
    diverge for that alone)."""
    population, agent = np.asarray(population, np.int64), np.asarray(agent, np.int64)
    _, first, index = np.unique(agent, return_index=True, return_inverse=True)
    labels = population[first]  # each agent's population
    if np.unique(labels).size < 2:
        return None
    strata = np.zeros(labels.size, np.int64) if world is None else np.asarray(world, np.int64)[first]
    members = [np.flatnonzero(strata == w) for w in np.unique(strata)]
    rng = np.random.default_rng(seed)
    out = np.zeros(shuffles)
    for s in range(shuffles):
        permuted = labels.copy()
        for idx in members:
            permuted[idx] = labels[idx[rng.permutation(idx.size)]]
        out[s] = mean_pairwise_js(list(population_distributions(permuted[index], value, num_values).values()))
    return out


def niche_measures(population: np.ndarray, agent: np.ndarray, value: np.ndarray, num_values: int,
                   seed: int, world: np.ndarray | None = None) -> dict:
    """``between``: the mean pairwise divergence between the populations' distributions of ``value`` (None with one
    population); ``split_half``: the mean over populations of their split-half divergence, the baseline;
    ``shuffled``: the baseline at the populations' own sizes (the mean of ``shuffled_js``) and ``shuffled_p`` the
    permutation test's p-value, the share of the permutations (the populations' own labels counted among them)
    that diverge at least as much as the populations (None with one population); ``world`` as ``shuffled_js``."""
    populations = population_distributions(population, value, num_values)
    own = [split_half_js(agent[population == p], value[population == p], num_values, seed + p) for p in populations]
    own = [x for x in own if x is not None]
    between = mean_pairwise_js(list(populations.values()))
    shuffled = shuffled_js(population, agent, value, num_values, seed, world)
    return {"between": between, "split_half": float(np.mean(own)) if own else None,
            "shuffled": None if shuffled is None else float(shuffled.mean()),
            "shuffled_p": None if shuffled is None else float((1 + (shuffled >= between).sum()) / (1 + shuffled.size))}
