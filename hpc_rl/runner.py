"""The serial runner: a vectorised environment, the policy and the PPO learner in one process.

    runner = SerialRunner(env, RunnerConfig(...), PPOConfig(...), ModelConfig(...))
    while runner.env_steps < total: batch = runner.collect(); metrics = runner.learner.update(batch)

It is built from the pieces the distributed roles reuse: ``act`` (one policy step for a batch of agents, as an
inference rank runs it), ``SegmentBuffer`` (segments of ``segment_len`` steps with the LSTM state at every BPTT
chunk start, as an inference rank assembles them) and ``Learner`` (``update(batch) -> metrics``, as a learner rank
runs it, with seams for the allreduce of gradients and of statistics).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import torch

from hpc_rl.algo import Reduce, identity_reduce
from hpc_rl.algo.bptt import LSTMState, to_chunks
from hpc_rl.algo.gae import gae
from hpc_rl.algo.grad_clip import SecondMomentClip
from hpc_rl.algo.normalizer import RunningNormalizer
from hpc_rl.algo.ppo import (
    dual_clip_policy_loss,
    entropy_bonus,
    normalize_advantages,
    value_loss,
)
from hpc_rl.algo.rewards import RewardConfig, shape_rewards
from hpc_rl.algo.schedules import Schedule, constant
from hpc_rl.envs.api import Actions, EnvSpec, Obs, VecEnv
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.device import select_device, to_device
from hpc_rl.model.policy import HEADS, Policy, PolicyStep, hero_indices

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PPOConfig:
    """The learner's hyperparameters; schedules are functions of the policy version."""

    lr: Schedule = field(default_factory=lambda: constant(3e-4))  # Adam learning rate
    entropy_coef: Schedule = field(default_factory=lambda: constant(0.0))  # weight of the entropy bonus
    gamma: Schedule = field(default_factory=lambda: constant(0.99))  # discount
    team_spirit: Schedule = field(default_factory=lambda: constant(0.0))  # τ: share of the team's mean reward
    lam: float = 0.95  # GAE λ
    clip_eps: float = 0.2  # PPO ratio clip ε
    dual_clip: float | None = 3.0  # Honor of Kings' lower bound c for negative advantages; None: plain PPO
    value_coef: float = 0.5  # weight of the value loss
    value_clip: float | None = None  # PPO2's value clip around the behaviour value; None: unclipped
    epochs: int = 4  # passes over each batch
    num_minibatches: int = 4  # minibatches per pass, split along BPTT chunks
    normalize_advantages: bool = True  # z-score advantages over the whole batch (of every learner)
    clip_k: float = 5.0  # OpenAI Five's per-parameter clip to ±k√v
    clip_beta: float = 0.999  # decay of the clip's running second moment v
    max_grad_norm: float | None = None  # an optional global-norm clip after the per-parameter one
    adam_eps: float = 1e-5

    def __post_init__(self) -> None:
        if not 0.0 <= self.lam <= 1.0:
            raise ValueError(f"lam must lie in [0, 1], got {self.lam}")
        if self.epochs < 1 or self.num_minibatches < 1:
            raise ValueError(f"epochs ({self.epochs}) and num_minibatches ({self.num_minibatches}) must be >= 1")
        if self.value_coef < 0:
            raise ValueError(f"value_coef must be >= 0, got {self.value_coef}")
        if self.max_grad_norm is not None and self.max_grad_norm <= 0:
            raise ValueError(f"max_grad_norm must be > 0 or None, got {self.max_grad_norm}")
        if self.clip_k <= 0:
            raise ValueError(f"clip_k must be > 0, got {self.clip_k}")


@dataclass(frozen=True)
class RunnerConfig:
    """How the serial runner collects experience."""

    num_envs: int = 8  # environment copies stepped together
    segment_len: int = 64  # steps per segment (a multiple of the BPTT chunk length)
    seed: int = 0  # seeds torch, the environments (seed + copy) and sampling
    step_seconds: float = 1 / 7.5  # game seconds per step (Honor of Kings acts every 133 ms), for the reward's
    # game-time decay when the env's infos lack ``game_time``
    log_every: int = 10  # updates between progress lines (0: none)
    device: str = "auto"  # "auto": CUDA if available, else CPU

    def __post_init__(self) -> None:
        if self.num_envs < 1:
            raise ValueError(f"num_envs must be >= 1, got {self.num_envs}")
        if self.segment_len < 1:
            raise ValueError(f"segment_len must be >= 1, got {self.segment_len}")
        if self.step_seconds <= 0:
            raise ValueError(f"step_seconds must be > 0, got {self.step_seconds}")


@dataclass
class Batch:
    """Segments of T steps for B agents, time-major; what an inference rank ships to a learner."""

    obs: dict[str, torch.Tensor]  # (T, B, ...) per observation key
    hero: torch.Tensor  # (T, B) hero index
    starts: torch.Tensor  # (T, B) bool: the step is the first of a game (reset the LSTM state before it)
    actions: dict[str, torch.Tensor]  # (T, B) per head
    logp: torch.Tensor  # (T, B) behaviour log-probability of the whole action
    value: torch.Tensor  # (T, B) behaviour value
    reward: torch.Tensor  # (T, B) shaped reward
    done: torch.Tensor  # (T, B) bool: the step ended the game
    weight: torch.Tensor  # (T, B) 1 for steps to train on, 0 for others (opponents' steps)
    version: torch.Tensor  # (T, B) behaviour policy version
    chunk_h: torch.Tensor  # (T / chunk_len, B, H) LSTM state before the first step of every chunk
    chunk_c: torch.Tensor
    bootstrap_value: torch.Tensor  # (B,) value of the observation after the last step

    @property
    def num_samples(self) -> int:
        return int(self.weight.sum())


@torch.no_grad()
def act(policy: Policy, obs: dict[str, torch.Tensor], hero: torch.Tensor, starts: torch.Tensor, state: LSTMState,
        deterministic: bool = False) -> PolicyStep:
    """One policy step for N agents: ``obs`` etc. lead with (N,), the result's fields with (N,)."""
    step = policy({k: v.unsqueeze(0) for k, v in obs.items()}, hero.unsqueeze(0), starts.unsqueeze(0), state,
                  deterministic=deterministic)
    return PolicyStep({k: v.squeeze(0) for k, v in step.actions.items()}, step.logp.squeeze(0),
                      step.entropy.squeeze(0), step.value.squeeze(0), step.state)


class SegmentBuffer:
    """Fills one segment of ``segment_len`` steps for N agents, then hands it out as a ``Batch``."""

    def __init__(self, spec: EnvSpec, num_agents: int, segment_len: int, chunk_len: int, lstm_size: int):
        if segment_len % chunk_len:
            raise ValueError(f"segment_len {segment_len} is not a multiple of the BPTT chunk length {chunk_len}")
        self.segment_len, self.chunk_len = segment_len, chunk_len
        lead = (segment_len, num_agents)
        self.obs = {key: np.zeros(lead + shape[2:], dtype=dtype)
                    for key, (shape, dtype) in spec.observation_shapes(1).items()}
        self.hero = np.zeros(lead, dtype=np.int64)
        self.starts = np.zeros(lead, dtype=bool)
        self.actions = {head: np.zeros(lead, dtype=np.int64) for head in HEADS}
        self.logp = np.zeros(lead, dtype=np.float32)
        self.value = np.zeros(lead, dtype=np.float32)
        self.reward = np.zeros(lead, dtype=np.float32)
        self.done = np.zeros(lead, dtype=bool)
        self.weight = np.zeros(lead, dtype=np.float32)
        self.version = np.zeros(lead, dtype=np.int64)
        self.chunk_h = torch.zeros(segment_len // chunk_len, num_agents, lstm_size)
        self.chunk_c = torch.zeros_like(self.chunk_h)

    def store_state(self, t: int, state: LSTMState) -> None:
        """Record the LSTM state before step ``t`` if ``t`` starts a chunk."""
        if t % self.chunk_len == 0:
            self.chunk_h[t // self.chunk_len] = state[0].cpu()
            self.chunk_c[t // self.chunk_len] = state[1].cpu()

    def store(self, t: int, obs: dict[str, np.ndarray], hero: np.ndarray, starts: np.ndarray, step: PolicyStep,
              reward: np.ndarray, done: np.ndarray, weight: np.ndarray, version: int) -> None:
        for key, value in obs.items():
            self.obs[key][t] = value
        self.hero[t], self.starts[t] = hero, starts
        for head in HEADS:
            self.actions[head][t] = step.actions[head].cpu().numpy()
        self.logp[t] = step.logp.cpu().numpy()
        self.value[t] = step.value.cpu().numpy()
        self.reward[t], self.done[t], self.weight[t], self.version[t] = reward, done, weight, version

    def batch(self, bootstrap_value: torch.Tensor) -> Batch:
        t = torch.from_numpy
        return Batch({k: t(v.copy()) for k, v in self.obs.items()}, t(self.hero.copy()), t(self.starts.copy()),
                     {k: t(v.copy()) for k, v in self.actions.items()}, t(self.logp.copy()), t(self.value.copy()),
                     t(self.reward.copy()), t(self.done.copy()), t(self.weight.copy()), t(self.version.copy()),
                     self.chunk_h.clone(), self.chunk_c.clone(), bootstrap_value.cpu().float())


class Learner:
    """PPO on batches of segments: ``update(batch) -> metrics``, one policy version per call.

    With several learners in lockstep, ``allreduce_sum`` sums a tensor over them (identity for one) and
    ``world_size`` is their number: gradients are averaged before OpenAI Five's clip, advantages are normalised by
    the global batch's statistics and the observation normaliser folds in every learner's batch, so all learners
    hold identical parameters after every step.
    """

    def __init__(self, policy: Policy, config: PPOConfig, allreduce_sum: Reduce = identity_reduce,
                 world_size: int = 1, device: torch.device | str = "cpu", seed: int = 0):
        if world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        self.policy, self.config = policy, config
        self.allreduce_sum, self.world_size = allreduce_sum, world_size
        self.device = torch.device(device)
        self.optimizer = torch.optim.Adam(policy.parameters(), lr=config.lr(0), eps=config.adam_eps,
                                          fused=True)
        mean = None if world_size == 1 else (lambda g: allreduce_sum(g) / world_size)
        self.clip = SecondMomentClip(policy.parameters(), beta=config.clip_beta, k=config.clip_k, allreduce_mean=mean)
        widths = {"global": policy.spec.global_features, **{f"entities/{e.name}": e.num_features
                                                            for e in policy.spec.entities}}
        self.normalizers = {key: RunningNormalizer(widths[key]) for key in policy.norm_keys}
        self.version = 0
        self.generator = torch.Generator().manual_seed(seed)

    def update(self, batch: Batch) -> dict[str, float]:
        cfg = self.config
        started = time.perf_counter()
        advantages, returns = gae(batch.reward, batch.value, batch.done.float(), batch.bootstrap_value,
                                  cfg.gamma(self.version), cfg.lam)
        if cfg.normalize_advantages:
            advantages = normalize_advantages(advantages, batch.weight, self.allreduce_sum)

        chunk_len = self.policy.config.chunk_len
        chunked = {
            "adv": to_chunks(advantages, chunk_len), "ret": to_chunks(returns, chunk_len),
            "logp": to_chunks(batch.logp, chunk_len), "value": to_chunks(batch.value, chunk_len),
            "weight": to_chunks(batch.weight, chunk_len), "hero": to_chunks(batch.hero, chunk_len),
            "starts": to_chunks(batch.starts, chunk_len),
        }
        chunked = {k: v.to(self.device) for k, v in chunked.items()}
        obs = {k: to_chunks(v, chunk_len).to(self.device) for k, v in batch.obs.items()}
        actions = {k: to_chunks(v, chunk_len).to(self.device) for k, v in batch.actions.items()}
        h0 = batch.chunk_h.reshape(-1, batch.chunk_h.shape[-1]).to(self.device)
        c0 = batch.chunk_c.reshape(-1, batch.chunk_c.shape[-1]).to(self.device)
        columns = h0.shape[0]
        if columns < cfg.num_minibatches:
            raise ValueError(f"{columns} BPTT chunks cannot fill {cfg.num_minibatches} minibatches")

        lr = cfg.lr(self.version)
        entropy_coef = cfg.entropy_coef(self.version)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        sums = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip_fraction": 0.0,
                "grad_clipped_fraction": 0.0}
        steps = skipped = 0
        for _ in range(cfg.epochs):
            order = torch.randperm(columns, generator=self.generator).to(self.device)
            for idx in order.chunk(cfg.num_minibatches):
                out = self.policy({k: v[:, idx] for k, v in obs.items()}, chunked["hero"][:, idx],
                                  chunked["starts"][:, idx], (h0[idx], c0[idx]),
                                  actions={k: v[:, idx] for k, v in actions.items()})
                w = chunked["weight"][:, idx]
                pl, stats = dual_clip_policy_loss(out.logp, chunked["logp"][:, idx], chunked["adv"][:, idx],
                                                  cfg.clip_eps, cfg.dual_clip, w)
                vl = value_loss(out.value, chunked["value"][:, idx], chunked["ret"][:, idx], cfg.value_clip, w)
                ent = entropy_bonus(out.entropy, w)
                loss = pl + cfg.value_coef * vl - entropy_coef * ent
                self.optimizer.zero_grad(set_to_none=False)
                loss.backward()
                # Every learner must take the same decision, so the non-finite test is on the summed flag.
                finite = self.allreduce_sum(torch.tensor([0.0 if torch.isfinite(loss) else 1.0]))
                if finite.item() > 0:
                    skipped += 1
                    continue
                clipped = self.clip()
                if cfg.max_grad_norm is not None:
                    torch.nn.utils.clip_grad_norm_(self.policy.parameters(), cfg.max_grad_norm)
                self.optimizer.step()
                steps += 1
                for key, value in (("policy_loss", pl), ("value_loss", vl), ("entropy", ent),
                                   ("approx_kl", stats["approx_kl"]), ("clip_fraction", stats["clip_fraction"])):
                    sums[key] += float(value.detach())
                sums["grad_clipped_fraction"] += clipped
        self.version += 1
        self._update_normalizers(batch)

        metrics = {f"train/{k}": v / max(steps, 1) for k, v in sums.items()}
        w = batch.weight > 0
        residual = (returns - batch.value)[w]
        metrics.update({
            "train/lr": lr, "train/entropy_coef": entropy_coef, "train/nonfinite_skipped": float(skipped),
            "train/explained_variance": float(1.0 - residual.var() / returns[w].var().clamp_min(1e-8)),
            "train/staleness": float((self.version - 1 - batch.version.float())[w].mean()),
            "perf/update_seconds": time.perf_counter() - started, "perf/samples": float(batch.num_samples),
        })
        return metrics

    def _update_normalizers(self, batch: Batch) -> None:
        """Fold the batch's trained observations into the normaliser and ship it inside the policy."""
        trained = batch.weight.numpy() > 0
        for key, normalizer in self.normalizers.items():
            x = batch.obs[key].numpy()
            rows = x[trained] if key == "global" else x[trained][batch.obs[f"{key}/mask"].numpy()[trained]]
            normalizer.update(rows, self.allreduce_sum)
            mean, std = normalizer.mean_std()
            self.policy.set_normalizer(key, torch.from_numpy(mean), torch.from_numpy(std))

    def state_dict(self) -> dict:
        """Everything a resumed learner needs to continue exactly: parameters, optimiser and clip moments, version,
        normaliser statistics and the minibatch shuffling generator."""
        return {"policy": self.policy.state_dict(), "optimizer": self.optimizer.state_dict(),
                "clip": self.clip.state_dict(), "version": self.version,
                "normalizers": {k: n.state_dict() for k, n in self.normalizers.items()},
                "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.clip.load_state_dict(state["clip"])
        self.version = int(state["version"])
        for key, normalizer in self.normalizers.items():
            normalizer.load_state_dict(state["normalizers"][key])
        self.generator.set_state(state["generator"])

    def checkpoint_sections(self) -> dict:
        """The state as the checkpoint file's sections (numpy trees): what ``hpc_rl.storage`` commits."""
        state = self.state_dict()
        return {"params": to_numpy_tree(state["policy"]), "optimizer": to_numpy_tree(state["optimizer"]),
                "clip": to_numpy_tree(state["clip"]), "normalizers": to_numpy_tree(state["normalizers"]),
                "learner": {"version": self.version, "rng": state["generator"].numpy()}}

    def load_checkpoint_sections(self, sections: dict) -> None:
        self.load_state_dict({"policy": to_torch_tree(sections["params"]),
                              "optimizer": to_torch_tree(sections["optimizer"]),
                              "clip": to_torch_tree(sections["clip"]),
                              "normalizers": sections["normalizers"],
                              "version": sections["learner"]["version"],
                              "generator": torch.from_numpy(np.array(sections["learner"]["rng"]))})


def to_numpy_tree(obj):
    """Tensors in a nested state (state_dicts) to numpy arrays, for storage."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: to_numpy_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_numpy_tree(v) for v in obj)
    return obj


def to_torch_tree(obj):
    """The inverse of ``to_numpy_tree``."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj))
    if isinstance(obj, dict):
        return {k: to_torch_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_torch_tree(v) for v in obj)
    return obj


class SerialRunner:
    """Collects segments from ``env`` with the current policy and trains on each as it fills."""

    def __init__(self, env: VecEnv, config: RunnerConfig | None = None, ppo: PPOConfig | None = None,
                 model: ModelConfig | None = None, reward: RewardConfig | None = None,
                 opponent: Callable[[Obs], Actions] | None = None, learning_agents: tuple[int, ...] | None = None,
                 alternate_sides: bool = False):
        """``opponent`` (e.g. a scripted bot's ``act``) plays every agent outside ``learning_agents`` (default:
        ``spec.learning_agents``, or all); without it the policy plays every agent (self-play) and is trained on the
        learning agents' steps only. ``alternate_sides`` (two teams, with an opponent) swaps the sides in odd copies,
        so that the policy learns to play both (the map is not symmetric in absolute coordinates)."""
        config = config or RunnerConfig(num_envs=env.num_envs)
        ppo = ppo or PPOConfig()
        model = model or ModelConfig()
        if env.num_envs != config.num_envs:
            raise ValueError(f"env has {env.num_envs} copies, config.num_envs is {config.num_envs}")
        spec = env.spec
        self.env, self.config, self.spec = env, config, spec
        self.reward = reward or RewardConfig(weights=(1.0,) * len(spec.reward_events),
                                             decayed=(False,) * len(spec.reward_events))
        if len(self.reward.weights) != len(spec.reward_events):
            raise ValueError(f"reward weights has {len(self.reward.weights)} entries for events {spec.reward_events}")
        torch.manual_seed(config.seed)
        self.device = select_device(config.device)
        self.policy = Policy(spec, model).to(self.device)
        self.learner = Learner(self.policy, ppo, device=self.device, seed=config.seed)
        agents = spec.num_agents
        self.num_agents = config.num_envs * agents
        self.hero = np.tile(hero_indices(spec), config.num_envs)
        learning = learning_agents if learning_agents is not None else (spec.learning_agents or tuple(range(agents)))
        if not learning or not set(learning) <= set(range(agents)):
            raise ValueError(f"learning_agents {learning} must be a non-empty subset of 0..{agents - 1}")
        self.learning_agents = tuple(learning)
        self.opponent = opponent
        if alternate_sides and (opponent is None or spec.num_teams != 2):
            raise ValueError("alternate_sides needs an opponent and a two-team environment")
        controlled = np.isin(np.arange(agents), learning)
        self.controlled = np.tile(controlled, (config.num_envs, 1))  # (E, A): the agents this policy plays
        if alternate_sides:
            self.controlled[1::2] = ~controlled
        self.weight = self.controlled.reshape(-1).astype(np.float32)
        self.buffer = SegmentBuffer(spec, self.num_agents, config.segment_len, model.chunk_len, model.lstm_size)
        self.obs = env.reset(config.seed)
        self.starts = np.ones(self.num_agents, dtype=bool)
        self.state = self.policy.initial_state(self.num_agents, self.device)
        self.game_steps = np.zeros(config.num_envs)
        self.env_steps = 0
        self.episode_returns: deque[float] = deque(maxlen=100)
        self.episode_returns_sum = np.zeros(self.num_agents)
        self.wins: deque[float] = deque(maxlen=100)

    def _flat(self, obs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {k: v.reshape(self.num_agents, *v.shape[2:]) for k, v in obs.items()}

    def collect(self) -> Batch:
        """Play one segment of ``segment_len`` steps in every copy; returns it as a batch."""
        agents = self.spec.num_agents
        hero = torch.from_numpy(self.hero).to(self.device)
        tau = self.learner.config.team_spirit(self.learner.version)
        for t in range(self.config.segment_len):
            self.buffer.store_state(t, self.state)
            flat = self._flat(self.obs)
            step = act(self.policy, to_device(flat, self.device), hero,
                       torch.from_numpy(self.starts).to(self.device), self.state)
            self.state = step.state
            actions = {k: v.cpu().numpy().reshape(self.config.num_envs, agents) for k, v in step.actions.items()}
            if self.opponent is not None:
                theirs = self.opponent(self.obs)
                actions = {k: np.where(self.controlled, v, theirs[k]) for k, v in actions.items()}
            obs, events, dones, infos = self.env.step(actions)
            self.game_steps += 1
            game_time = infos.get("game_time", self.game_steps * self.config.step_seconds)
            reward = shape_rewards(events, self.spec.agent_team, self.reward, tau, game_time).reshape(-1)
            done = np.repeat(dones, agents)
            self.buffer.store(t, flat, self.hero, self.starts, step, reward, done, self.weight,
                              self.learner.version)
            self._record_episodes(events, dones, infos)
            self.game_steps[dones] = 0
            self.obs, self.starts = obs, done
            self.env_steps += self.config.num_envs
        bootstrap = act(self.policy, to_device(self._flat(self.obs), self.device), hero,
                        torch.from_numpy(self.starts).to(self.device), self.state)
        return self.buffer.batch(bootstrap.value)

    def _record_episodes(self, events: np.ndarray, dones: np.ndarray, infos: dict[str, np.ndarray]) -> None:
        self.episode_returns_sum += events.sum(axis=2).reshape(-1)
        ended = np.repeat(dones, self.spec.num_agents) & (self.weight > 0)
        self.episode_returns.extend(self.episode_returns_sum[ended].tolist())
        self.episode_returns_sum[np.repeat(dones, self.spec.num_agents)] = 0.0
        if self.spec.num_teams > 1:
            first = self.controlled.argmax(axis=1)  # one agent this policy plays in every copy
            learner_team = np.asarray(self.spec.agent_team)[first]
            self.wins.extend((infos["winner"][dones] == learner_team[dones]).astype(float).tolist())

    def run(self, total_steps: int, on_update: Callable[[SerialRunner, dict[str, float]], bool] | None = None
            ) -> dict[str, float]:
        """Collect and train until ``total_steps`` env steps (or ``on_update`` returns True); the last metrics."""
        metrics: dict[str, float] = {}
        started = time.perf_counter()
        updates = 0
        while self.env_steps < total_steps:
            batch = self.collect()
            metrics = self.learner.update(batch)
            updates += 1
            metrics.update(self.stats(started))
            if self.config.log_every and updates % self.config.log_every == 0:
                log.info("version %d  steps %d  %.0f steps/s  return %.1f  policy_loss %.3f  value_loss %.3f  "
                         "entropy %.3f", self.learner.version, self.env_steps, metrics["perf/steps_per_s"],
                         metrics["stats/episode_return"], metrics["train/policy_loss"],
                         metrics["train/value_loss"], metrics["train/entropy"])
            if on_update is not None and on_update(self, metrics):
                break
        return metrics

    def stats(self, started: float) -> dict[str, float]:
        out = {"perf/env_steps": float(self.env_steps), "perf/version": float(self.learner.version),
               "perf/steps_per_s": self.env_steps / max(time.perf_counter() - started, 1e-9),
               "stats/episode_return": float(np.mean(self.episode_returns)) if self.episode_returns else float("nan")}
        if self.wins:
            out["stats/win_rate"] = float(np.mean(self.wins))
        return out


@torch.no_grad()
def evaluate(policy: Policy, env: VecEnv, seed: int, deterministic: bool = True) -> np.ndarray:
    """Play one game in every copy of ``env`` (its num_envs games) and return each learning agent's return."""
    spec = env.spec
    n = env.num_envs * spec.num_agents
    device = next(policy.parameters()).device
    hero = torch.from_numpy(np.tile(hero_indices(spec), env.num_envs)).to(device)
    obs = env.reset(seed)
    starts = torch.ones(n, dtype=torch.bool, device=device)
    state = policy.initial_state(n, device)
    returns = np.zeros((env.num_envs, spec.num_agents))
    finished = np.zeros(env.num_envs, dtype=bool)
    while not finished.all():
        flat = {k: v.reshape(n, *v.shape[2:]) for k, v in obs.items()}
        step = act(policy, to_device(flat, device), hero, starts, state, deterministic)
        state = step.state
        actions = {k: v.cpu().numpy().reshape(env.num_envs, spec.num_agents) for k, v in step.actions.items()}
        obs, events, dones, _ = env.step(actions)
        returns[~finished] += events.sum(axis=2)[~finished]
        finished |= dones
        starts = torch.from_numpy(np.repeat(dones, spec.num_agents)).to(device)
    learning = list(spec.learning_agents or range(spec.num_agents))
    return returns[:, learning].ravel()
