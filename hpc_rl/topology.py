"""Which rank plays which role: the ``topology`` config, checked before any work starts.

Ranks are assigned in role order: rank 0 is the controller, then the env ranks, the inference ranks, the learner
ranks and the evaluator ranks. Every env rank is served by one inference rank (env ranks are spread evenly over
inference ranks), and learners form their own sub-communicator for Horovod. On a cluster, order the node list so
that env ranks land on CPU nodes and inference/learner ranks on GPU nodes; nothing here assumes one node.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from enum import Enum


class Role(str, Enum):
    CONTROLLER = "controller"
    ENV = "env"
    INFERENCE = "inference"
    LEARNER = "learner"
    EVALUATOR = "evaluator"


ROLE_ORDER = (Role.CONTROLLER, Role.ENV, Role.INFERENCE, Role.LEARNER, Role.EVALUATOR)


@dataclass(frozen=True)
class TopologyConfig:
    """How many ranks play each role (one controller always)."""

    env: int = 2  # env ranks: simulate vectorised environments
    inference: int = 1  # inference ranks: batch observations, run the policies, assemble segments
    learner: int = 2  # learner ranks: PPO on a Horovod sub-communicator
    evaluator: int = 0  # evaluator ranks: rate frozen policies against references

    def __post_init__(self) -> None:
        for name in ("env", "inference", "learner"):
            if getattr(self, name) < 1:
                raise ValueError(f"topology.{name} must be >= 1, got {getattr(self, name)}")
        if self.evaluator < 0:
            raise ValueError(f"topology.evaluator must be >= 0, got {self.evaluator}")
        if self.inference > self.env:
            raise ValueError(f"topology.inference ({self.inference}) must not exceed topology.env ({self.env}): "
                             "an inference rank without env ranks has nothing to serve")

    @property
    def world_size(self) -> int:
        return 1 + self.env + self.inference + self.learner + self.evaluator

    def count(self, role: Role) -> int:
        return 1 if role is Role.CONTROLLER else getattr(self, role.value)


class WorldSizeError(ValueError):
    """The job has another number of ranks than the topology needs."""


@dataclass(frozen=True)
class Placement:
    """One rank's place in the topology."""

    rank: int
    role: Role
    index: int  # index among the ranks of its role


class Topology:
    """The rank -> role map of a run; ``check(world_size)`` fails with a clear message before any work."""

    def __init__(self, config: TopologyConfig):
        self.config = config
        self.placements: list[Placement] = []
        for role in ROLE_ORDER:
            for index in range(config.count(role)):
                self.placements.append(Placement(len(self.placements), role, index))

    def check(self, world_size: int) -> None:
        if world_size != self.config.world_size:
            c = self.config
            raise WorldSizeError(
                f"the topology needs {c.world_size} ranks (1 controller + {c.env} env + {c.inference} inference + "
                f"{c.learner} learner + {c.evaluator} evaluator) but the job has {world_size}: launch with "
                f"-np {c.world_size} or change topology.*")

    def placement(self, rank: int) -> Placement:
        return self.placements[rank]

    def ranks(self, role: Role) -> list[int]:
        return [p.rank for p in self.placements if p.role is role]

    def role_map(self) -> dict[int, str]:
        return {p.rank: f"{p.role.value}[{p.index}]" for p in self.placements}

    def inference_for_env(self, env_index: int) -> int:
        """The rank of the inference rank serving env rank number ``env_index`` (contiguous blocks)."""
        per = -(-self.config.env // self.config.inference)
        return self.ranks(Role.INFERENCE)[env_index // per]

    def envs_for_inference(self, inference_index: int) -> list[int]:
        """The ranks of the env ranks served by inference rank number ``inference_index``."""
        env_ranks = self.ranks(Role.ENV)
        inference_rank = self.ranks(Role.INFERENCE)[inference_index]
        return [r for i, r in enumerate(env_ranks) if self.inference_for_env(i) == inference_rank]


def local_rank() -> int:
    """This rank's index on its node, from the launcher's environment (Open MPI, Slurm, or 0)."""
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"):
        if var in os.environ:
            return int(os.environ[var])
    return 0

