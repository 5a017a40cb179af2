"""The configuration of a training run: dataclasses, registered in Hydra's ConfigStore, checked when built.

``TrainConfig`` composes the component configs (environment, model, PPO, topology, transport, pipeline). Every
dataclass validates its fields in ``__post_init__``; ``TrainConfig.__post_init__`` checks what spans components
(segment length against the BPTT chunk, the batch against the minibatches), so a bad value fails when the config is
built, before any rank starts work or any job is submitted.

    cfg = build_config(hydra_cfg)      # DictConfig -> TrainConfig (raises ValueError naming the bad field)

A schedule field (``Schedule``: ppo.lr, ppo.gamma, ...) takes a bare number for a constant: ``ppo.lr=1e-4`` is
``ppo.lr.start=1e-4`` with kind constant, whatever schedule the composed config had there.

A resumed run may change any setting but those that decide the shapes of its saved state (``SHAPE_KEYS``):
``setting_changes`` compares the settings a checkpoint recorded with the new ones.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, is_dataclass, replace
from pathlib import Path
from typing import Any, get_type_hints

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from hpc_rl.algo.rewards import RewardConfig
from hpc_rl.algo.schedules import KINDS, Schedule, constant
from hpc_rl.envs.api import VecEnv
from hpc_rl.envs.go_config import GoConfig
from hpc_rl.envs.moba_config import REWARD_EVENTS, MobaConfig
from hpc_rl.envs.nmmo_config import REWARD_EVENTS as NMMO_REWARD_EVENTS
from hpc_rl.envs.nmmo_config import NmmoConfig
from hpc_rl.model.config import ModelConfig
from hpc_rl.algo.config import AlphaZeroConfig, PPOConfig
from hpc_rl.topology import TopologyConfig
from hpc_rl.transport.config import FULL_POLICIES, TransportConfig

ALLREDUCES = ("horovod", "mpi")
DEVICE_PATTERN = re.compile(r"auto|cpu|cuda(:\d+)?")  # torch.device names a role may run on; auto: a GPU if any
UNDECAYED_EVENTS = ("win", "loss")  # OpenAI Five: the game-time decay spares the outcome
WARMUP_OPPONENTS = ("random", "scripted")  # the bots a MOBA curriculum may start against
GAME_VERSIONS = (1, 2)  # the MOBA's game versions: hpc_rl.envs.moba, and hpc_rl.envs.moba_v2 over it


@dataclass
class EnvConfig:
    """Which environment every env rank simulates, and how many copies of it."""

    # "moba" (the embedded MOBA, settings in ``moba``), "nmmo" (the embedded Neural MMO world, settings in ``nmmo``:
    # every agent learning, in one population or ``nmmo.populations``, an agent's episode its lifetime: docs/nmmo.md),
    # "gym:<Gymnasium id>" (gym:CartPole-v1) or "pettingzoo:<module>", a PettingZoo parallel environment's module
    # (pettingzoo:mpe2.simple_spread_v3): every agent of every copy is played and trained by the one policy
    # (hpc_rl.envs.pettingzoo_adapter), or "go" (AlphaZero's self-play of ``go``: docs/go.md, "Training")
    name: str = "moba"
    num_envs: int = 8  # environment copies per env rank, stepped together (Go: the games each env rank plays)
    moba: MobaConfig = field(default_factory=MobaConfig)
    go: GoConfig = field(default_factory=GoConfig)
    nmmo: NmmoConfig = field(default_factory=NmmoConfig)
    vs_scripted_fraction: float = 0.25  # MOBA: share of copies where the frozen scripted bot plays one side (win rate)
    step_seconds: float = 1.0 / 7.5  # game seconds per step (reward decay over game time)
    # MOBA curriculum: until the policy reaches ``warmup_versions``, the copies where the bot plays face
    # ``warmup_opponent`` ("random" or "scripted") on a map of side ``warmup_map_size`` (0: ``moba``'s; same lanes,
    # towers and units, so the observations keep their shapes); then the scripted bot on ``moba``'s map.
    # Evaluations always play ``moba``'s map against the scripted bot. warmup_versions 0: no warm-up.
    warmup_versions: int = 0
    warmup_opponent: str = "scripted"
    warmup_map_size: float = 0.0
    # MOBA kickstarting: the reference bot whose action on every step's observation is reported to the learner
    # (hpc_rl.envs.teacher), which ppo.kickstart_coef weighs; "": none.
    teacher: str = ""
    # MOBA game version (hpc_rl.envs.moba_v2): 1, the game of hpc_rl.envs.moba; 2, one more hero attribute (its
    # attack timer) and one more action (heal). A run moves from 1 to 2 by a surgery (docs/surgery.md).
    game_version: int = 1
    # Game version 2 only: the share of games played under version 2's rules, a schedule over the policy versions
    # since ``new_version_since`` (OpenAI Five played old and new game versions side by side, "slowly increasing the
    # rate of the new environment"); the others play version 1 in version 2's layout (the new attribute 0, heal never
    # legal). Drawn as each game starts. jobs/surgery.py sets ``new_version_since`` to the surgery's version.
    new_version_share: Schedule = field(default_factory=lambda: constant(1.0))
    new_version_since: int = 0

    def __post_init__(self) -> None:
        kind, _, what = self.name.partition(":")
        if self.name not in ("moba", "nmmo", "go") and not (kind in ("gym", "pettingzoo") and what):
            raise ValueError(f"env.name must be 'moba', 'nmmo', 'go', 'gym:<id>' or 'pettingzoo:<module>', got "
                             f"{self.name!r}")
        if self.is_pettingzoo:
            self._pettingzoo_maker()  # a module that is missing or not a parallel env fails here, before any rank
        if self.num_envs < 1:
            raise ValueError(f"env.num_envs must be >= 1, got {self.num_envs}")
        if not 0.0 <= self.vs_scripted_fraction <= 1.0:
            raise ValueError(f"env.vs_scripted_fraction must be in [0, 1], got {self.vs_scripted_fraction}")
        if self.step_seconds <= 0:
            raise ValueError(f"env.step_seconds must be > 0, got {self.step_seconds}")
        if self.warmup_versions < 0:
            raise ValueError(f"env.warmup_versions must be >= 0, got {self.warmup_versions}")
        if self.warmup_opponent not in WARMUP_OPPONENTS:
            raise ValueError(f"env.warmup_opponent must be one of {WARMUP_OPPONENTS}, got {self.warmup_opponent!r}")
        if self.warmup_versions and self.is_moba:
            self.warmup_moba()  # MobaConfig checks the map size
        if self.teacher and (self.teacher != "scripted" or not self.is_moba):
            raise ValueError(f"env.teacher must be '' or, in MOBA, 'scripted', got {self.teacher!r}")
        if self.game_version not in GAME_VERSIONS or (self.game_version != 1 and not self.is_moba):
            raise ValueError(f"env.game_version must be one of {GAME_VERSIONS} (MOBA; 1 elsewhere), got "
                             f"{self.game_version}")
        share = self.new_version_share
        if not (0.0 <= share(0) <= 1.0 and 0.0 <= share(10**9) <= 1.0):
            raise ValueError(f"env.new_version_share must stay in [0, 1], got schedule {share}")
        if self.game_version == 1 and share != constant(1.0):
            raise ValueError(f"env.new_version_share ({share}) mixes game versions 1 and 2: it needs "
                             "env.game_version=2")
        if self.new_version_since < 0:
            raise ValueError(f"env.new_version_since must be >= 0, got {self.new_version_since}")

    @property
    def is_moba(self) -> bool:
        return self.name == "moba"

    @property
    def is_nmmo(self) -> bool:
        return self.name == "nmmo"

    @property
    def is_go(self) -> bool:
        return self.name == "go"

    @property
    def is_pettingzoo(self) -> bool:
        return self.name.startswith("pettingzoo:")

    def _pettingzoo_maker(self):
        from hpc_rl.envs.pettingzoo_adapter import parallel_env_maker

        try:
            return parallel_env_maker(self.name.removeprefix("pettingzoo:"))
        except ValueError as err:
            raise ValueError(f"env.name={self.name}: {err}") from None

    @property
    def agents_per_copy(self) -> int:
        """Agents in one copy: both teams' heroes in MOBA, the agent slots of a Neural MMO world, the one agent of a
        Gymnasium env (``GymVecEnv``), a PettingZoo env's possible agents."""
        if self.is_moba:
            return self.moba.spec().num_agents
        if self.is_nmmo:
            return self.nmmo.num_agents
        return self.make(num_envs=1).spec.num_agents if self.is_pettingzoo else 1

    def scripted_copies(self) -> int:
        """Copies per env rank in which the scripted bot plays one side (0 outside MOBA): the first ones."""
        return int(round(self.vs_scripted_fraction * self.num_envs)) if self.is_moba else 0

    def warmup_moba(self) -> MobaConfig:
        """The curriculum's first game: ``moba`` on a ``warmup_map_size`` map (if set)."""
        return replace(self.moba, map_size=float(self.warmup_map_size)) if self.warmup_map_size else self.moba

    def warming_up(self, version: int) -> bool:
        """Do env ranks play the curriculum's warm-up while the policy is at ``version``?"""
        return self.is_moba and version < self.warmup_versions

    def bot_at(self, version: int) -> str:
        """The bot env ranks play while the policy is at ``version``."""
        return self.warmup_opponent if self.warming_up(version) else "scripted"

    def moba_at(self, version: int) -> MobaConfig:
        """The game env ranks play while the policy is at ``version`` (the curriculum's stage)."""
        return self.warmup_moba() if self.warming_up(version) else self.moba

    def new_version_share_at(self, version: int) -> float:
        """The share of games starting under game version 2's rules while the policy is at ``version``."""
        return self.new_version_share(max(version - self.new_version_since, 0))

    def share_moves_until(self) -> int:
        """The last policy version at which the new game version's share changes (0: it never does); env ranks
        learn each version up to it from the controller."""
        share = self.new_version_share
        return 0 if self.game_version == 1 or share.kind == "constant" else self.new_version_since + share.versions

    def moba_env(self, moba: MobaConfig, num_envs: int, first_copy: int = 0, new_version_share: float = 1.0):
        """The MOBA of ``game_version`` on ``moba``'s settings: ``MobaEnv``, or for version 2 ``MobaV2Env`` with
        ``new_version_share`` of its games under version 2's rules."""
        from hpc_rl.envs.moba import MobaEnv

        if self.game_version == 1:
            return MobaEnv(moba, num_envs, first_copy=first_copy)
        from hpc_rl.envs.moba_v2 import MobaV2Env

        return MobaV2Env(moba, num_envs, first_copy=first_copy, new_version_share=new_version_share)

    def make(self, num_envs: int | None = None, first_copy: int = 0, version: int | None = None) -> VecEnv:
        """``num_envs`` copies (default ``num_envs``) from global copy ``first_copy``; MOBA: the game of the
        curriculum's stage at policy ``version``, with ``new_version_share_at(version)`` of its games under game
        version 2's rules (None: ``moba``, every game of ``game_version``: the game evaluations play)."""
        n = num_envs or self.num_envs
        if self.is_go:
            raise ValueError("env.name=go has no vectorised env: its env ranks play hpc_rl.envs.go_search.SelfPlay")
        if self.is_moba:
            moba = self.moba if version is None else self.moba_at(version)
            share = 1.0 if version is None else self.new_version_share_at(version)
            env = self.moba_env(moba, n, first_copy, share)
            if not self.teacher:
                return env
            from hpc_rl.envs.scripted import make_bot
            from hpc_rl.envs.teacher import TeacherLabels

            return TeacherLabels(env, make_bot(self.teacher, moba, seed=first_copy))
        if self.is_nmmo:
            from hpc_rl.envs.nmmo import NmmoEnv

            return NmmoEnv(self.nmmo, n, first_copy=first_copy)
        if self.is_pettingzoo:
            from hpc_rl.envs.pettingzoo_adapter import PettingZooVecEnv

            return PettingZooVecEnv(self._pettingzoo_maker(), n, first_copy=first_copy)
        from hpc_rl.envs.gym_adapter import GymVecEnv

        return GymVecEnv(self.name[4:], n)

    def reward_config(self) -> RewardConfig:
        """MOBA: Honor of Kings table 6 weights, decayed over game time except win/loss; Neural MMO: its weights
        (−1 at death), undecayed, and not zero-sum (populations share a world, not a score); Gymnasium and
        PettingZoo: the reward."""
        if self.is_moba:
            return RewardConfig(weights=tuple(float(self.moba.reward_weights[k]) for k in REWARD_EVENTS),
                                decayed=tuple(k not in UNDECAYED_EVENTS for k in REWARD_EVENTS))
        if self.is_nmmo:
            return RewardConfig(weights=tuple(float(self.nmmo.reward_weights[k]) for k in NMMO_REWARD_EVENTS),
                                decayed=(False,) * len(NMMO_REWARD_EVENTS), decay_period_s=None, zero_sum=False)
        return RewardConfig(weights=(1.0,), decayed=(False,), decay_period_s=None)


@dataclass
class PipelineConfig:
    """How the distributed roles cooperate: segments, batches, data quality controls, publishing, stopping."""

    segment_len: int = 64  # steps per segment (64-256: GAE needs far more than 1/(1-λ) steps)
    # Segments in one learner's batch (the global batch is this × learners): 2 of 8 copies × 64 steps, 1,024 env steps
    # per update, as many updates per env step as the learning defaults' 10 epochs need (docs/LEARNING.md).
    segments_per_batch: int = 2
    staleness_queue: int = 0  # hold segments back this many versions (OpenAI Five's queue length ablation)
    # Samples consumed / produced the learners keep to (consumed counts every PPO epoch); None: ppo.epochs, i.e. every
    # sample feeds one update (on-policy PPO), whatever the epochs. A lower value throttles the learners: with
    # epochs > 1 and a target of 1 they would train on one batch in ``epochs`` and waste the others.
    target_reuse: float | None = None
    ring_slots: int = 8  # slots in every learner's experience ring: a learner takes from it only what its next batch
    #                      needs, so when producers outpace the learners it fills and (full_policy block) they wait;
    #                      its segments then wait about ring_slots / segments_per_batch versions (staleness)
    full_policy: str = "block"  # ring full: "block" (exactly-once) or "drop_oldest" (counted)
    publish_every: int = 1  # optimizer updates per published version
    max_versions: int = 50  # stop after this many versions
    max_seconds: float = 0.0  # stop this sitting (this job) after this much wall time (0: no limit)
    max_run_seconds: float = 0.0  # stop once the run has trained this much wall time over all its sittings, up to
    #                               its latest committed version (0: no limit): a sweep member's budget that holds
    #                               when a sitting is cut short and the member resumed
    final_eval_games: int = 100  # a job that ends with a committed checkpoint (finished or its time limit) plays
    #                              this many games of it against the scripted bot, half on each side (Gymnasium:
    #                              greedy episodes; Neural MMO: worlds, for the mean lifetime of the policy's agents
    #                              and the random bot's) for summary.json; even; 0: off
    checkpoint_every: int = 10  # versions between checkpoints (the last version is always checkpointed)
    keep_last: int = 3  # checkpoints kept: the last K ...
    keep_every: int = 50  # ... plus every M-th version
    allreduce: str = "horovod"  # learner gradient/statistics allreduce: "horovod" or "mpi" (mpi4py Allreduce)
    # Where the inference and learner ranks run their networks: "auto" (the rank's GPU where it sees one, else the
    # CPU: cuda:<its place among the inference and learner ranks of its node mod GPUs>, hpc_rl.topology.gpu_slots),
    # "cpu", "cuda" or "cuda:N". Env ranks and the controller never use a GPU.
    inference_device: str = "auto"
    learner_device: str = "auto"
    heartbeat_s: float = 1.0  # every rank reports to the controller this often
    heartbeat_timeout_s: float = 60.0  # a rank silent this long is reported by name and the job aborted
    buffer_batches: int = 2  # a learner holds at most this many batches of segments beyond the staleness queue
    #                          (segments kept for reuse; what a reuse target below the epochs, or the stop, brings
    #                          in); beyond it the oldest are dropped (counted, never trained on)
    max_nonfinite: int = 3  # consecutive skipped updates (non-finite loss) before the run halts
    requeue: bool = True  # under Slurm, a run stopped by a signal (preemption warning) requeues its own job
    # Under slurm/train.sbatch, a job whose ranks failed (a rank killed, crashed or hung; a node lost) is requeued and
    # resumes from the last committed checkpoint, this many times per run in all (hpc_rl/failures.py; 0: never).
    # Three: a lost node or a transient fault seldom strikes one run more often, and a bug that crashes every attempt
    # then costs three more starts before the run is marked failed and waits for a person.
    max_failure_requeues: int = 3
    async_actions: bool = False  # OpenAI Five's asynchronous action offset: env ranks step with the previous action
    #                              while inference computes the next (actions apply one step late; env and inference
    #                              overlap)
    # Fault injection, for tests and drills only (0: off): from this version on the learners' batches get NaN
    # rewards, so every loss is non-finite; the run must skip those updates, commit nothing past the last good
    # version, and halt after max_nonfinite of them in a row.
    fault_nonfinite_from_version: int = 0

    def __post_init__(self) -> None:
        positive = ("segment_len", "segments_per_batch", "ring_slots", "publish_every", "max_versions",
                    "checkpoint_every", "keep_last", "keep_every", "buffer_batches", "max_nonfinite")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"pipeline.{name} must be >= 1, got {getattr(self, name)}")
        if self.staleness_queue < 0:
            raise ValueError(f"pipeline.staleness_queue must be >= 0, got {self.staleness_queue}")
        if self.target_reuse is not None and self.target_reuse < 1.0:
            raise ValueError(f"pipeline.target_reuse must be >= 1 (a sample is consumed at least once), got "
                             f"{self.target_reuse}")
        if self.full_policy not in FULL_POLICIES:
            raise ValueError(f"pipeline.full_policy must be one of {FULL_POLICIES}, got {self.full_policy!r}")
        if self.allreduce not in ALLREDUCES:
            raise ValueError(f"pipeline.allreduce must be one of {ALLREDUCES}, got {self.allreduce!r}")
        for name in ("inference_device", "learner_device"):
            if not DEVICE_PATTERN.fullmatch(getattr(self, name)):
                raise ValueError(f"pipeline.{name} must be 'auto', 'cpu', 'cuda' or 'cuda:N', got "
                                 f"{getattr(self, name)!r}")
        if self.final_eval_games < 0 or self.final_eval_games % 2:
            raise ValueError(f"pipeline.final_eval_games must be even and >= 0 (half the games on each side; 0: "
                             f"off), got {self.final_eval_games}")
        if self.max_seconds < 0 or self.max_run_seconds < 0:
            raise ValueError(f"pipeline.max_seconds and pipeline.max_run_seconds must be >= 0 (0: no limit), got "
                             f"{self.max_seconds} and {self.max_run_seconds}")
        if self.max_failure_requeues < 0:
            raise ValueError(f"pipeline.max_failure_requeues must be >= 0 (0: never), got {self.max_failure_requeues}")
        if self.fault_nonfinite_from_version < 0:
            raise ValueError(f"pipeline.fault_nonfinite_from_version must be >= 0 (0: off), got "
                             f"{self.fault_nonfinite_from_version}")
        if not 0 < self.heartbeat_s < self.heartbeat_timeout_s:
            raise ValueError(f"need 0 < pipeline.heartbeat_s < pipeline.heartbeat_timeout_s, got "
                             f"{self.heartbeat_s}, {self.heartbeat_timeout_s}")


@dataclass
class LeagueConfig:
    """OpenAI Five's opponent pool, for two-team games: in the self-play copies (those without the scripted bot) a
    game is played against the latest policy with probability 1 - ``past_fraction``, else against a past version
    drawn by softmax of its quality. The pool's versions are the checkpoints retention keeps for good (every
    ``pipeline.keep_every``-th version); the opponents' steps are never trained on."""

    past_fraction: float = 0.2  # share of self-play games against past versions (OpenAI Five: 20%; 0: off)
    eta: float = 0.01  # quality learning rate: beating past version i lowers q_i by eta / (N p_i)
    cached_policies: int = 4  # past versions an inference rank keeps loaded at once
    versions_in_play: int = 2  # past versions an inference rank plays at once, each one more forward pass per step
    #                            (a game drawing another joins the newest in play: league.pool.admit)

    def __post_init__(self) -> None:
        if not 0.0 <= self.past_fraction <= 1.0:
            raise ValueError(f"league.past_fraction must be in [0, 1], got {self.past_fraction}")
        if self.eta <= 0:
            raise ValueError(f"league.eta must be > 0, got {self.eta}")
        if self.cached_policies < 1:
            raise ValueError(f"league.cached_policies must be >= 1, got {self.cached_policies}")
        if not 1 <= self.versions_in_play <= self.cached_policies:
            raise ValueError(f"league.versions_in_play must be in [1, league.cached_policies = {self.cached_policies}] "
                             f"(a version in play that is not cached is reloaded from its checkpoint), got "
                             f"{self.versions_in_play}")


@dataclass
class EvaluationConfig:
    """Evaluator ranks (``topology.evaluator``): every new committed checkpoint plays the reference agents (random,
    the frozen scripted bot) and the controller keeps its TrueSkill rating (random = 0)."""

    games: int = 8  # games against each reference per rated version; even (mirrored pairs: both sides of each draw)
    seed: int = 0  # the games of version v against a reference are seeded from (seed, v, reference)
    deterministic: bool = False  # the policy plays greedily instead of sampling its actions

    def __post_init__(self) -> None:
        if self.games < 2 or self.games % 2:
            raise ValueError(f"evaluation.games must be even and >= 2 (each draw is played from both sides), got "
                             f"{self.games}")
        if self.seed < 0:
            raise ValueError(f"evaluation.seed must be >= 0, got {self.seed}")


@dataclass
class TrainConfig:
    """One training run."""

    run_name: str = "default"  # the run directory is ``runs_dir/run_name``; an existing one is resumed
    runs_dir: str = "runs"
    seed: int = 0  # seeds torch on every rank, and env ranks as (seed, rank, version)
    env: EnvConfig = field(default_factory=EnvConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    ppo: PPOConfig = field(default_factory=PPOConfig)
    topology: TopologyConfig = field(default_factory=TopologyConfig)
    transport: TransportConfig = field(default_factory=TransportConfig)
    pipeline: PipelineConfig = field(default_factory=PipelineConfig)
    alphazero: AlphaZeroConfig = field(default_factory=AlphaZeroConfig)  # the learners of env.name=go
    league: LeagueConfig = field(default_factory=LeagueConfig)
    evaluation: EvaluationConfig = field(default_factory=EvaluationConfig)

    def __post_init__(self) -> None:
        if not self.run_name or "/" in self.run_name:
            raise ValueError(f"run_name must be a non-empty name without '/', got {self.run_name!r}")
        if self.seed < 0:
            raise ValueError(f"seed must be >= 0, got {self.seed}")
        if self.env.is_nmmo:
            # Populations in one world, not a game of two teams: no second team for the scripted bot or a past version
            # to play, and a team spirit would share every reward with the whole population.
            for key, value in (("env.vs_scripted_fraction", self.env.vs_scripted_fraction),
                               ("league.past_fraction", self.league.past_fraction),
                               ("ppo.team_spirit", max(self.ppo.team_spirit(0), self.ppo.team_spirit(10**9)))):
                if value:
                    raise ValueError(f"{key} must be 0 for env.name=nmmo (populations, no two-team games), got "
                                     f"{value}")
        if self.populations > self.topology.learner:
            raise ValueError(f"topology.learner ({self.topology.learner}) must be >= env.nmmo.populations "
                             f"({self.populations}): each population learns on learner ranks of its own")
        if self.topology.evaluator and not self.env.is_moba:
            raise ValueError(f"topology.evaluator must be 0 for env.name={self.env.name}: evaluator ranks rate MOBA "
                             "policies against the reference bots; rate a Gymnasium run's greedy return offline with "
                             "hpc_rl.evaluation.evaluate_return")
        if self.env.is_go and self.pipeline.final_eval_games:
            raise ValueError(f"pipeline.final_eval_games must be 0 for env.name=go (no reference player to play yet), "
                             f"got {self.pipeline.final_eval_games}")
        if self.topology.evaluator > 1:
            # One rank rates versions in order, so the controller's TrueSkill table and eval/* rows stay in version
            # order; a few games per checkpoint keep one rank well ahead of the learners.
            raise ValueError(f"topology.evaluator must be 0 or 1, got {self.topology.evaluator}")
        if self.pipeline.segment_len % self.model.chunk_len:
            raise ValueError(f"pipeline.segment_len ({self.pipeline.segment_len}) must be a multiple of "
                             f"model.chunk_len ({self.model.chunk_len})")
        # A segment has (segment_len / chunk_len) chunks for each of its num_envs x agents (>= 1 per copy) columns.
        chunks = (self.pipeline.segments_per_batch * (self.pipeline.segment_len // self.model.chunk_len)
                  * self.env.num_envs)
        if chunks < self.ppo.num_minibatches:
            raise ValueError(f"a batch of {chunks} BPTT chunks cannot fill ppo.num_minibatches="
                             f"{self.ppo.num_minibatches}")
        if self.uses_league and self.pipeline.keep_every % self.pipeline.checkpoint_every:
            raise ValueError(f"pipeline.keep_every ({self.pipeline.keep_every}) must be a multiple of "
                             f"pipeline.checkpoint_every ({self.pipeline.checkpoint_every}): the opponent pool's "
                             "versions are the checkpoints kept every keep_every versions")
        if self.ppo.lr(0) < 0 or self.ppo.lr(10**9) < 0:
            raise ValueError(f"the learning rate must be >= 0, got schedule {self.ppo.lr}")
        kickstart = self.ppo.kickstart_coef
        if min(kickstart(0), kickstart(10**9)) < 0:
            raise ValueError(f"ppo.kickstart_coef must be >= 0, got schedule {kickstart}")
        if max(kickstart(0), kickstart(10**9)) > 0 and not self.env.teacher:
            raise ValueError("ppo.kickstart_coef > 0 needs a teacher: set env.teacher=scripted (MOBA)")

    @property
    def target_reuse(self) -> float:
        """``pipeline.target_reuse``, or ``ppo.epochs`` where it is None (every sample feeds one update)."""
        return self.ppo.epochs if self.pipeline.target_reuse is None else self.pipeline.target_reuse

    @property
    def populations(self) -> int:
        """Policies with unshared weights over the world (``hpc_rl.populations``): ``env.nmmo.populations`` in
        Neural MMO, 1 elsewhere."""
        return self.env.nmmo.populations if self.env.is_nmmo else 1

    @property
    def uses_league(self) -> bool:
        """Past versions play some self-play games: MOBA, league.past_fraction > 0 and copies without the bot."""
        return (self.env.is_moba and self.league.past_fraction > 0
                and self.env.scripted_copies() < self.env.num_envs)

    def settings(self) -> dict[str, Any]:
        """Every field as nested JSON values: what a checkpoint records and a resume compares (``setting_changes``)."""
        return json.loads(json.dumps(asdict(self), default=str))

    def config_hash(self, written: dict | None = None) -> str:
        """Hash of what changes the learning problem (not run_name, runs_dir or stopping limits). ``written``: a
        config.yaml as an older version of this code wrote it; the fields it lacks (added since, so at their defaults
        in a config built from it) are left out, so the hash is the one that version gave its checkpoints."""
        d = asdict(self)
        if written is not None:
            d = _known(d, written)
        for key in ("run_name", "runs_dir"):
            d.pop(key)
        # Evaluator ranks only watch the checkpoints: adding one to a resumed run keeps its learning problem.
        d.pop("evaluation")
        d["topology"].pop("evaluator")
        # Fault injection is a drill run on the same learning problem (and may be turned on for a resumed run); where
        # the networks run neither (a run moves between GPU and CPU nodes, its checkpoints load on both).
        for key in ("max_versions", "max_seconds", "max_run_seconds", "final_eval_games", "heartbeat_timeout_s",
                    "requeue", "max_failure_requeues", "fault_nonfinite_from_version", "inference_device",
                    "learner_device"):
            d["pipeline"].pop(key, None)  # gone already where ``written`` lacks it
        return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


# The settings that decide the shapes of a checkpoint's state (the network's parameters, and with them Adam's and
# the gradient clip's moments; the observation and value normalisers) or the spaces it was trained on (the
# environment: its observations' entities and features, its actions; Neural MMO's populations: how many policies the
# checkpoint holds). A resumed run keeps them; it may change every other setting. tests/test_resume.py holds this
# list against the learner's state and the environment's spec.
GO_SHAPE_KEYS = ("env.go.board_size", "env.go.net.blocks", "env.go.net.filters", "alphazero.optimizer")
SHAPE_KEYS = ("env.name", "env.game_version", "env.moba.team_size", "env.moba.lanes", "env.moba.towers_per_lane",
              "env.moba.wave_melee", "env.moba.wave_ranged", "env.moba.max_waves_alive", "model.core", "model.lstm_size",
              "model.embed_size", "model.entity_pooling", "ppo.value_norm",
              "env.nmmo.populations") + GO_SHAPE_KEYS
# Where a run is and when it stops, not how it learns: never a change (a finished run is continued by raising
# pipeline.max_versions).
UNRECORDED_KEYS = ("run_name", "runs_dir", "pipeline.max_versions", "pipeline.max_seconds",
                   "pipeline.max_run_seconds")


class ResumeError(ValueError):
    """A run directory this run cannot resume: its checkpoint's saved state does not fit the run's settings."""


def flat_settings(settings: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """Nested settings as {dotted key: value} (``topology.env``, ``env.moba.reward_weights.win``); a schedule is one
    setting, its value a dict (``ppo.lr``: {start, end, versions, kind})."""
    flat: dict[str, Any] = {}
    for key, value in settings.items():
        if isinstance(value, dict) and value and f"{prefix}{key}" not in SCHEDULE_KEYS:
            flat.update(flat_settings(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def setting_changes(old: dict[str, Any], new: dict[str, Any]) -> list[tuple[str, Any, Any]]:
    """The settings that differ between ``old`` and ``new`` (``TrainConfig.settings()``), as (dotted key, old value,
    new value) in key order, but for ``UNRECORDED_KEYS``; a key one side lacks (a setting added since) is None there."""
    a, b = flat_settings(old), flat_settings(new)
    return [(key, a.get(key), b.get(key)) for key in sorted(a.keys() | b.keys())
            if key not in UNRECORDED_KEYS and a.get(key) != b.get(key)]


def show_setting(value: Any) -> str:
    """A setting's value as a change is printed: a schedule as ``constant 0.001``, anything else as its repr."""
    return str(Schedule(**value)) if isinstance(value, dict) and value.keys() == asdict(Schedule(0.0)).keys() \
        else repr(value)


def resumable_changes(old: dict[str, Any], new: dict[str, Any], source: str) -> list[tuple[str, Any, Any]]:
    """The changes from the settings ``old`` that checkpoint ``source`` was trained with to a resumed run's ``new``;
    raise ResumeError listing every change of a ``SHAPE_KEYS`` setting, which the saved state cannot take. A shape
    setting added since ``source`` was written (``env.game_version``) held its default then: at the default it is no
    refused change."""
    changes = setting_changes(old, new)
    recorded, defaults = flat_settings(old), flat_settings(TrainConfig().settings())
    refused = [f"{key}: {show_setting(o)} -> {show_setting(n)}" for key, o, n in changes if key in SHAPE_KEYS
               and (key in recorded or n != defaults.get(key))]
    if refused:
        raise ResumeError(f"cannot resume from {source}: these settings decide the shapes of its saved state or the "
                          f"spaces it was trained on, and differ: {'; '.join(refused)}. Shape-changing changes need a "
                          f"new run (another run_name) or a surgery of the checkpoint; every other setting may change "
                          f"on resume")
    return changes


def _if_moba(moba_value, other_value, *, _root_):
    """The ``${moba:A,B}`` resolver of conf/train.yaml: A when the composed job's env.name is "moba", else B. The
    MOBA keeps its own learning settings there while ``env.name=gym:<id>`` on the default job gets the defaults."""
    return moba_value if _root_.env.name == "moba" else other_value


def _register_resolvers() -> None:
    if not OmegaConf.has_resolver("moba"):
        OmegaConf.register_new_resolver("moba", _if_moba)


def _nested(cls: type, prefix: str = "") -> list[tuple[str, type]]:
    """Every dataclass-typed field below ``cls`` as (dotted key, dataclass), deepest first (``ppo.lr`` before
    ``ppo``), read from the type hints: a field added to a config is found without being listed here."""
    found = []
    for name, hint in get_type_hints(cls).items():
        if is_dataclass(hint):
            found += _nested(hint, f"{prefix}{name}.") + [(f"{prefix}{name}", hint)]
    return found


SCHEDULE_KEYS = tuple(key for key, cls in _nested(TrainConfig) if cls is Schedule)  # ppo.lr, ppo.gamma, ...


def _writable(node: DictConfig) -> DictConfig:
    """Structured configs of frozen dataclasses are read-only in OmegaConf, which would refuse the values merged into
    them; validation happens when ``build_config`` instantiates the dataclasses."""
    node._set_flag("readonly", None)
    for key in node.keys():
        child = node._get_node(key)
        if isinstance(child, DictConfig):
            _writable(child)
    return node


def _constant_schedules(cfg: DictConfig) -> None:
    """Make every schedule given as a bare number a constant schedule (in place); refuse any other non-schedule."""
    for key in SCHEDULE_KEYS:
        value = OmegaConf.select(cfg, key, default=None)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            OmegaConf.update(cfg, key, {"start": float(value), "end": None, "versions": 1, "kind": "constant"},
                             merge=False)
        elif value is not None and not isinstance(value, DictConfig):
            raise ValueError(f"{key} must be a number (a constant) or a schedule {{start, end, versions, kind}} "
                             f"with kind one of {KINDS}, got {value!r}")


def register() -> None:
    """Register the schema as ``train_schema`` in Hydra's ConfigStore (conf/train.yaml extends it): TrainConfig's
    keys and defaults, untyped. Hydra refuses an unknown key; the types and every check are ``build_config``'s, whose
    errors are one line naming the key (Hydra's type errors are several), and a bare number may replace a schedule."""
    from hydra.core.config_store import ConfigStore

    _register_resolvers()
    schema = OmegaConf.create(OmegaConf.to_container(OmegaConf.structured(TrainConfig)))
    ConfigStore.instance().store(name="train_schema", node=schema)


def compose_config(overrides: Sequence[str]) -> TrainConfig:
    """The config jobs/train.py composes from the command line's ``overrides`` (conf/train.yaml and its groups)."""
    from hydra import compose, initialize_config_dir

    register()
    with initialize_config_dir(version_base="1.3", config_dir=str(Path(__file__).resolve().parent.parent / "conf")):
        return build_config(compose("train", overrides=list(overrides)))


def _known(d: dict, written: dict) -> dict:
    """``d`` without the keys ``written`` lacks, at every level (a schedule, written whole, stays whole)."""
    return {k: _known(v, written[k]) if isinstance(v, dict) and isinstance(written[k], dict) else v
            for k, v in d.items() if k in written}


def build_config(cfg: DictConfig | dict) -> TrainConfig:
    """A validated TrainConfig from a composed Hydra config (extra keys such as ``hydra`` are ignored). Every error
    is a ValueError of one line naming the key."""
    _register_resolvers()
    if isinstance(cfg, dict):
        cfg = OmegaConf.create(cfg)
    schema = _writable(OmegaConf.structured(TrainConfig))
    given = OmegaConf.create({k: v for k, v in cfg.items() if k in schema})
    _constant_schedules(given)
    try:
        merged = OmegaConf.merge(schema, given)
    except OmegaConfBaseException as e:  # a wrong type or an unknown key
        raise ValueError(f"{e.full_key}: {str(e.msg).splitlines()[0]}") from None
    # The dataclasses' own checks do not all know where they sit: build the nested ones first, deepest first, so
    # that an error names its key (``ppo.lr: a constant schedule ...``, ``ppo: lam must lie in [0, 1]``).
    for key, _cls in _nested(TrainConfig):
        try:
            OmegaConf.to_object(OmegaConf.select(merged, key))
        except ValueError as e:
            raise ValueError(str(e) if str(e).startswith(f"{key}.") else f"{key}: {e}") from None
    return OmegaConf.to_object(merged)


def to_yaml(config: TrainConfig) -> str:
    return OmegaConf.to_yaml(OmegaConf.structured(config))
