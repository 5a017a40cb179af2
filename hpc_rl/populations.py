"""Populations (Neural MMO v1.3, ``env.nmmo.populations`` = K): K policies with unshared weights over one world.

The world assigns every agent slot to a population (slot a to a mod K: ``NmmoConfig.spec().agent_team``), so every
agent that spawns into a slot belongs to that slot's population. Every inference rank runs each population's policy
on that population's agents and ships their segments to that population's learners; each population learns on its
own learner ranks (learner i to i mod K), summing its gradients on a communicator of its own; one checkpoint per
version holds every population's state. This module is the one home of those rules; it imports no torch or MPI.

K = 1 (every world but Neural MMO, and Neural MMO's default) is the single policy of every other run, with its
checkpoints, metrics and messages unchanged.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def slot_population(num_agents: int, populations: int) -> tuple[int, ...]:
    """The population of every agent slot of a world: slot a belongs to population a mod K, so the slots of each
    population are spread evenly over the slot numbers (the world spawns into the lowest free slot)."""
    return tuple(a % populations for a in range(num_agents))


def population_rows(agent_population: np.ndarray, copies: int) -> list[np.ndarray]:
    """The flat rows (copy-major, as ``copies`` × agents are flattened) of each population's agents, in order."""
    flat = np.tile(np.asarray(agent_population), copies)
    return [np.flatnonzero(flat == k) for k in range(int(flat.max()) + 1)]


def learner_population(learner_index: int, populations: int) -> int:
    """The population learner number ``learner_index`` trains: learner i trains population i mod K, so learners
    0 .. K-1 are the populations' first learners (learner 0, population 0's, also speaks for all of them)."""
    return learner_index % populations


def population_learners(num_learners: int, populations: int) -> list[list[int]]:
    """The learner indices of every population; each population needs at least one learner."""
    if num_learners < populations:
        raise ValueError(f"topology.learner ({num_learners}) must be >= env.nmmo.populations ({populations}): each "
                         "population learns on learner ranks of its own")
    return [[i for i in range(num_learners) if learner_population(i, populations) == k] for k in range(populations)]


def section_name(population: int) -> str:
    """The checkpoint group holding one population's state (``/population_<k>/params``, ...) when K > 1."""
    return f"population_{population}"


def join_sections(per_population: list[dict[str, Any]]) -> dict[str, Any]:
    """One checkpoint's sections from every population's: K = 1 is that population's own (the layout of every run
    without populations), K > 1 one group per population."""
    if len(per_population) == 1:
        return per_population[0]
    return {section_name(k): sections for k, sections in enumerate(per_population)}


def population_sections(sections: dict[str, Any], population: int, populations: int) -> dict[str, Any]:
    """One population's state from a checkpoint's sections (``join_sections``' inverse); raises ValueError naming
    what is missing when the checkpoint holds another number of populations."""
    if populations == 1:
        if "params" not in sections:
            raise ValueError(f"the checkpoint holds no single policy (its groups: {sorted(sections)}): it was trained "
                             "with populations; set env.nmmo.populations to its number")
        return sections
    name = section_name(population)
    if name not in sections:
        raise ValueError(f"the checkpoint holds no {name} (its groups: {sorted(sections)}): it was trained with "
                         f"another number of populations than env.nmmo.populations={populations}")
    return sections[name]


def metric_name(population: int, name: str) -> str:
    """A population's own figure in metrics.h5 (K > 1): ``population_<k>/<name>``, e.g. population_1/train/entropy."""
    return f"{section_name(population)}/{name}"


def merge_metrics(per_population: list[dict[str, float]]) -> dict[str, float]:
    """One version's row from every population's learner metrics: K = 1 is that population's own; K > 1 every
    figure once per population (``metric_name``) and, under its own name, its mean over the populations (what the
    progress line and the analysis read)."""
    if len(per_population) == 1:
        return dict(per_population[0])
    merged: dict[str, float] = {}
    for name in sorted(set().union(*per_population)):
        values = [m[name] for m in per_population if name in m]
        merged[name] = float(np.mean(values))
        for k, m in enumerate(per_population):
            if name in m:
                merged[metric_name(k, name)] = float(m[name])
    return merged
