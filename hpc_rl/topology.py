"""Which rank plays which role: the ``topology`` config, checked before any work starts.

Ranks are assigned in role order: rank 0 is the controller, then the env ranks, the inference ranks, the learner
ranks and the evaluator ranks. Every env rank is served by one inference rank (env ranks are spread evenly over
inference ranks), and learners form their own sub-communicator for Horovod. Nothing here assumes one node. On a
cluster, a Slurm heterogeneous job (slurm/train_het.sbatch) numbers its ranks component by component, so with the
controller and env ranks in its first component (CPU nodes) and the inference and learner ranks in the next (GPU
nodes) every role lands on its kind of node; ``check_components`` refuses components that mix the two.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
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


GPU_ROLES = (Role.INFERENCE, Role.LEARNER)  # the roles that run the policy on a GPU where their node has one


def gpu_slots(topology: Topology, rank_hosts: list[str]) -> dict[int, int]:
    """Each inference and learner rank's place among the inference and learner ranks of its host, in rank order
    (``rank_hosts[r]``: rank r's host). Its GPU is ``cuda:<slot mod the host's GPUs>``, so a host's first GPU rank
    takes GPU 0 whatever else runs there. From the hosts, which every MPI reports, rather than a local rank from the
    launcher's environment: no variable to know per launcher, and none missing that would put every rank on GPU 0."""
    if len(rank_hosts) != len(topology.placements):
        raise ValueError(f"{len(rank_hosts)} hosts given for the topology's {len(topology.placements)} ranks")
    seen: dict[str, int] = {}
    slots = {}
    for p in topology.placements:
        if p.role in GPU_ROLES:
            host = rank_hosts[p.rank]
            slots[p.rank] = seen.get(host, 0)
            seen[host] = slots[p.rank] + 1
    return slots


class PlacementError(ValueError):
    """The job's node groups do not match the topology's roles."""


def het_components(environ: Mapping[str, str] = os.environ) -> list[int] | None:
    """The number of ranks in each component of the Slurm heterogeneous job this rank belongs to, in order; None
    outside one."""
    if "SLURM_HET_SIZE" not in environ:
        return None
    return [int(environ[f"SLURM_NTASKS_HET_GROUP_{i}"]) for i in range(int(environ["SLURM_HET_SIZE"]))]


def check_components(topology: Topology, sizes: list[int]) -> None:
    """A heterogeneous job's components are its kinds of nodes: one must not hold both env ranks (CPU work) and
    inference or learner ranks (GPU work), or some rank runs on the other kind's nodes. The components' ranks are
    numbered in order (srun --het-group), as the topology numbers its roles; ``sizes`` sum to its world size
    (``Topology.check`` first)."""
    start = 0
    for i, size in enumerate(sizes):
        ranks = range(start, start + size)
        roles = {topology.placement(r).role for r in ranks}
        if Role.ENV in roles and roles & set(GPU_ROLES):
            c = topology.config
            rest = c.inference + c.learner + c.evaluator
            evaluators = f" + {c.evaluator} evaluator" if c.evaluator else ""
            raise PlacementError(
                f"heterogeneous job component {i} (ranks {ranks.start}-{ranks.stop - 1}) holds env ranks and "
                f"inference/learner ranks: its components of {sizes} tasks must split the topology's roles, "
                f"1 controller + {c.env} env = {1 + c.env} tasks, then {c.inference} inference + {c.learner} "
                f"learner{evaluators} = {rest} (sbatch --ntasks={1 + c.env} : --ntasks={rest} "
                f"slurm/train_het.sbatch ...)")
        start += size
