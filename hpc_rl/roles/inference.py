"""Inference rank: batches every agent of its env ranks, runs the latest policy and the opponents' past versions,
assembles segments for learners.

    start(): wait for the first parameters
    while envs run: serve(wait_requests()): complete step t-1 with its rewards; pick opponents of new games;
                    act on step t (latest policy, then past versions for their agents); reply;
                    ship full segments round-robin to learners; pull newer parameters

Per env rank it keeps one ``SegmentBuffer`` (the runner's) and the LSTM state of every agent. A step is stored when
the next request brings its reward and done; a segment is shipped when its ``segment_len`` steps are complete, with
the value of the following observation as its bootstrap value. Every step records the behaviour policy version.
Agents the latest policy does not play get training weight 0: the scripted bot's side (the env overrides its
actions) and, in games against a past version drawn from the opponent pool (OpenAI Five's 20%), that version's side;
so do empty agent slots (``EnvSpec.occupied``). A step's ``done`` is per agent (``EnvSpec.episode_ends``): the whole
copy's agents where the game ended, and in a world that ends episodes per agent (Neural MMO) the agents that died.
The pool's versions and qualities come from the controller; the results of those games go back to it.

With populations (``hpc_rl.populations``, Neural MMO) it holds every population's latest policy, each published by
that population's learners: each policy acts for its population's agents of the whole batch (one forward pass per
population), and every env rank's segments are assembled per population (its agents' rows) and shipped round-robin
to that population's learners.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from hpc_rl.algo.rewards import shape_rewards
from hpc_rl.config import TrainConfig
from hpc_rl.data.batch import SegmentSchema, policy_step_fields
from hpc_rl.envs.api import AGENT_DONE, EnvSpec
from hpc_rl.evaluation import policy_from_checkpoint
from hpc_rl.league.pool import LATEST, OpponentPool, VersionsInPlay
from hpc_rl.model.device import select_device, to_device
from hpc_rl.model.policy import Policy, PolicyStep, act, hero_indices
from hpc_rl.populations import population_learners, population_rows
from hpc_rl.roles.common import patiently, seed_for, wait_requests
from hpc_rl.roles.control import ControlLink
from hpc_rl.roles.protocol import TAG_POOL, TAG_POOL_RESULT, decode_parameters, reply_layout, request_layout
from hpc_rl.storage import load_checkpoint
from hpc_rl.storage.layout import RunLayout
from hpc_rl.storage.checkpoint import checkpoint_name
from hpc_rl.transport import ExperienceRing, ParameterChannel, StepExchange

AGENT_DONE_FIELD = f"info/{AGENT_DONE}"  # where a step request carries the agents' episode ends (spec.agent_episodes)


@dataclass
class _Pending:
    """Step t of one env rank, waiting for its reward and done (they arrive with step t+1)."""

    obs: dict[str, np.ndarray]
    starts: np.ndarray
    fields: dict[str, np.ndarray]  # what the policy computed (``policy_step_fields``)
    versions: list[int]  # the behaviour version of each population's policy
    weight: np.ndarray  # training weight of every agent's step (0 for the sides the latest policy did not play)


class PastPolicies:
    """Past versions of the policy, loaded read-only from their checkpoint files; the least recently used is
    dropped beyond ``capacity``."""

    def __init__(self, config: TrainConfig, directory: Path, capacity: int, device: torch.device):
        self.config, self.directory, self.capacity, self.device = config, directory, capacity, device
        self.loaded: OrderedDict[int, Policy] = OrderedDict()

    def get(self, version: int) -> Policy:
        if version in self.loaded:
            self.loaded.move_to_end(version)
            return self.loaded[version]
        ckpt = load_checkpoint(self.directory / checkpoint_name(version))  # raises naming the file if it is bad
        self.loaded[version] = policy_from_checkpoint(ckpt, self.config).to(self.device)
        if len(self.loaded) > self.capacity:
            self.loaded.popitem(last=False)
        return self.loaded[version]


def join_steps(parts: list[tuple[torch.Tensor, PolicyStep]], size: int) -> PolicyStep:
    """One step of ``size`` agents from the steps of disjoint groups of them (``(rows, step)``: each population's
    policy on its agents)."""
    def joined(pick):
        first = pick(parts[0][1])
        out = first.new_empty((size, *first.shape[1:]))
        for rows, step in parts:
            out[rows] = pick(step)
        return out

    heads = parts[0][1].actions
    return PolicyStep({head: joined(lambda s, h=head: s.actions[h]) for head in heads}, joined(lambda s: s.logp),
                      joined(lambda s: s.entropy), joined(lambda s: s.value),
                      (joined(lambda s: s.state[0]), joined(lambda s: s.state[1])))


class InferenceWorker:
    def __init__(self, config: TrainConfig, spec: EnvSpec, env_ranks: list[int], exchange: StepExchange,
                 rings: list[ExperienceRing], params: list[ParameterChannel], link: ControlLink, gpu_slot: int = 0):
        """``rings``: every learner's, in learner order; ``params``: every population's parameter channel."""
        self.config = config
        self.env_ranks = env_ranks
        self.exchange, self.params, self.link = exchange, params, link
        self.spec = spec
        self.device = select_device(config.pipeline.inference_device, gpu_slot)
        self.populations = config.populations
        self.policies = [Policy(self.spec, config.model).to(self.device).eval() for _ in range(self.populations)]
        self.policy = self.policies[0]  # the policy, where there are no populations (the league plays against it)
        self.versions = [-1] * self.populations
        n, agents = config.env.num_envs, self.spec.num_agents
        self.per_env = n * agents
        # Each population's rows of an env rank's copies × agents (None: one population, every row), and the rings of
        # its learners.
        self.rows = population_rows(np.asarray(self.spec.agent_team), n) if self.populations > 1 else None
        self.rows_t = None if self.rows is None else [torch.from_numpy(r).to(self.device) for r in self.rows]
        self.population_rings = [[rings[i] for i in group]
                                 for group in population_learners(len(rings), self.populations)]
        self.batch_rows: dict[int, list[torch.Tensor]] = {}
        fp16 = config.transport.fp16_observations
        self.requests = request_layout(self.spec, n, fp16)
        self.obs_keys = tuple(self.spec.observation_shapes(1))
        self.obs_fields = {k: f"obs/{k}" for k in self.obs_keys}  # observation key -> batch field
        self.info_fields = tuple(f"info/{info.name}" for info in self.spec.step_infos)
        self.replies = reply_layout(self.spec, n)
        self.reply_buffer = np.empty(self.replies.nbytes, np.uint8)
        self.schema = SegmentSchema.of_run(config, self.spec)
        self.segment_buffer = np.empty(self.schema.layout.nbytes, np.uint8)
        self.segment_observation_nbytes = self.schema.layout.wire_nbytes(self.obs_fields.values())  # per segment
        self.buffers = {e: [self.schema.buffer() for _ in range(self.populations)] for e in env_ranks}
        self.state = {e: self.policy.initial_state(self.per_env, self.device) for e in env_ranks}
        self.t = {e: 0 for e in env_ranks}
        self.pending: dict[int, _Pending | None] = {e: None for e in env_ranks}
        self.segments_sent = {e: 0 for e in env_ranks}
        self.hero = np.tile(hero_indices(self.spec), n)
        self.hero_t: dict[int, torch.Tensor] = {}
        self.weight = self._weights()
        self.reward_config = config.env.reward_config()
        self.next_ring = [0] * self.populations  # round-robin over each population's learners
        self.batches = 0
        self.batch_agents = 0
        self.infer_seconds = 0.0
        self.segments = 0
        self.samples = 0
        self.segment_bytes = 0  # bytes of the segments put into the rings, and of the observations among them
        self.segment_observation_bytes = 0
        self.produced_ids: list[tuple[int, int, int]] = []  # (this rank, env rank, segment number) of every segment
        # The opponent pool: in self-play copies, the side ``past_side`` of every game is played by the version
        # ``opponent[e][copy]`` (LATEST: the latest policy, which then plays and learns both sides).
        self.league = config.uses_league
        self.pool = OpponentPool(latest_fraction=1.0 - config.league.past_fraction, eta=config.league.eta)
        self.past = PastPolicies(config, RunLayout.of(config.runs_dir, config.run_name).checkpoints,
                                 config.league.cached_policies, self.device)
        self.opponent = {e: np.full(n, LATEST, np.int64) for e in env_ranks}
        self.self_play = np.arange(n) >= config.env.scripted_copies()
        # The past version plays team 1 in even copies and team 0 in odd ones, so the latest policy learns both sides.
        self.past_side = self.spec.opponent_side(n)  # (copies, agents)
        self.learner_team = 1 - self.spec.opponent_team(n)  # (copies,): the team the latest policy plays
        self.in_play = VersionsInPlay(config.league.versions_in_play)
        self.results: list[tuple[int, float]] = []
        self.rng: np.random.Generator | None = None
        self.past_games = 0
        self.passes = 0  # forward passes: one per batch for the latest policy, one per past version in play

    def _weights(self) -> np.ndarray:
        """1 for steps of learning agents the policy controls, 0 for the scripted bot's side."""
        n, agents = self.config.env.num_envs, self.spec.num_agents
        learning = self.spec.learning_agents or tuple(range(agents))
        w = np.tile(np.isin(np.arange(agents), learning), (n, 1)).astype(np.float32)
        scripted = self.config.env.scripted_copies()
        if scripted:
            w[:scripted][self.spec.opponent_side(scripted)] = 0.0
        return w.reshape(-1)

    @property
    def version(self) -> int:
        """The latest policy's version (population 0's, with populations: they advance in lockstep)."""
        return self.versions[0]

    def _pull_parameters(self, wait: bool) -> None:
        for k, (params, policy) in enumerate(zip(self.params, self.policies)):
            if wait:
                got = patiently(lambda timeout, p=params: p.wait_version(1, timeout), self.link,
                                self.config.transport.timeout_s)
            else:
                got = params.poll()
            if got is not None:
                self.versions[k] = decode_parameters(got[1], policy)
        if self.rng is None:  # seeded from (seed, rank, version) like env ranks, so a resumed run draws afresh
            self.rng = np.random.default_rng(seed_for(self.config.seed, self.exchange.rank, self.version))

    def receive_pool(self) -> None:
        while (message := self.link.receive(TAG_POOL)) is not None:
            self.pool.versions, self.pool.qualities = list(message["versions"]), list(message["qualities"])

    def _next_games(self, e: int, message: dict[str, np.ndarray], first: bool) -> None:
        """Score the finished games against past versions and draw the opponents of the games starting now."""
        starting = self.self_play.copy() if first else self.self_play & message["done"]
        for c in np.flatnonzero(starting):
            past = int(self.opponent[e][c])
            if past != LATEST and not first:
                winner = int(message["winner"][c])  # -1: a draw (time limit)
                self.results.append((past, 0.5 if winner < 0 else float(winner == self.learner_team[c])))
            self.opponent[e][c] = LATEST  # its game is over
            playing = {int(v) for o in self.opponent.values() for v in o[o != LATEST]}
            self.opponent[e][c] = self.in_play.opponent(self.pool.sample(self.rng), playing)
            self.past_games += int(self.opponent[e][c] != LATEST)

    def _play_past_versions(self, env_ranks: list[int], obs: dict[str, torch.Tensor], hero: torch.Tensor,
                            starts: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor], step: PolicyStep
                            ) -> dict[int, np.ndarray]:
        """Overwrite the actions and LSTM states of the agents past versions play; their training weights."""
        agents = self.spec.num_agents
        weights, played = {}, {}
        for i, e in enumerate(env_ranks):
            past = (self.opponent[e][:, None] != LATEST) & self.past_side  # (copies, agents)
            weights[e] = np.where(past.reshape(-1), 0.0, self.weight).astype(np.float32)
            for c, a in zip(*np.nonzero(past)):
                played.setdefault(int(self.opponent[e][c]), []).append(i * self.per_env + c * agents + a)
        for version, rows in played.items():
            idx = torch.as_tensor(rows, device=self.device)
            theirs = act(self.past.get(version), {k: v[idx] for k, v in obs.items()}, hero[idx], starts[idx],
                         (state[0][idx], state[1][idx]))
            for head, chosen in theirs.actions.items():
                step.actions[head][idx] = chosen
            step.state[0][idx], step.state[1][idx] = theirs.state
        self.passes += len(played)
        return weights

    def run(self) -> None:
        self.start()
        while self.live:
            self.serve(wait_requests(self.exchange, self.link, self.config, self.live))

    def start(self) -> None:
        """Wait for the learners' first parameters."""
        self._pull_parameters(wait=True)
        self.live = set(self.env_ranks)
        self.started = time.monotonic()

    def serve(self, requests: dict[int, np.ndarray]) -> None:
        """Take newer parameters if the learners published some, then act on one request of each env rank in
        ``requests`` in one batch, reply and ship full segments."""
        self._pull_parameters(wait=False)
        messages = {e: self.requests.unpack(p) for e, p in requests.items()}
        for e, m in messages.items():
            if m["stop"][0]:
                self.live.discard(e)
        active = [e for e in sorted(messages) if e in self.live]
        if active:
            self._step(active, {e: messages[e] for e in active})
        if self.results:
            self.link.send(self.results, TAG_POOL_RESULT)
            self.results = []
        self.link.beat({"segments": self.segments, "samples": self.samples, "version": self.version,
                        "past_games": self.past_games, "segment_bytes": self.segment_bytes,
                        "segment_observation_bytes": self.segment_observation_bytes,
                        "mean_batch": self.batch_agents / max(self.batches, 1),
                        "passes": self.passes / max(self.batches, 1),
                        "infer_ms": 1e3 * self.infer_seconds / max(self.batches, 1),
                        "seconds": time.monotonic() - self.started, "device": str(self.device)},
                       force=not self.live)  # the last counts and the device reach the summary, however short the run

    def _step(self, env_ranks: list[int], messages: dict[int, dict[str, np.ndarray]]) -> None:
        """One policy step for every agent of ``env_ranks`` in one batch."""
        flat = {e: {k: messages[e][k].reshape(self.per_env, *messages[e][k].shape[2:]) for k in self.obs_keys}
                for e in env_ranks}
        # The step after an episode's end starts the next with a fresh LSTM state: per copy, or per agent where the
        # env ends episodes per agent. An empty slot starts afresh at every step, so each new agent begins from the
        # same state whatever its slot held before.
        ends = {e: self.spec.episode_ends(messages[e]["done"], messages[e].get(AGENT_DONE_FIELD)).reshape(-1)
                for e in env_ranks}
        occupied = {e: self.spec.occupied(flat[e]["global"]) for e in env_ranks}
        starts = {e: ends[e] | ~occupied[e] for e in env_ranks}
        before = {e: self.state[e] for e in env_ranks}
        if len(env_ranks) == 1:  # the serial runner's case: nothing to join
            obs, state, starts_np = flat[env_ranks[0]], self.state[env_ranks[0]], starts[env_ranks[0]]
        else:
            obs = {k: np.concatenate([flat[e][k] for e in env_ranks]) for k in self.obs_keys}
            state = tuple(torch.cat([self.state[e][i] for e in env_ranks]) for i in range(2))
            starts_np = np.concatenate([starts[e] for e in env_ranks])
        hero = self._hero(len(env_ranks))
        t0 = time.perf_counter()
        obs_t = to_device(obs, self.device)
        starts_t = torch.from_numpy(starts_np).to(self.device)
        step = self._act(obs_t, hero, starts_t, state, len(env_ranks))
        weights = {e: self.weight for e in env_ranks}
        if self.league:
            if any(self.pending[e] is None or messages[e]["done"].any() for e in env_ranks):
                self.receive_pool()  # read only to draw the opponents of games starting now (a probe per step costs)
            for e in env_ranks:
                self._next_games(e, messages[e], first=self.pending[e] is None)
            weights = self._play_past_versions(env_ranks, obs_t, hero, starts_t, state, step)
        if self.spec.occupied_feature is not None:  # an empty slot's step is not trained on
            weights = {e: weights[e] * occupied[e] for e in env_ranks}
        # The copy back waits for a GPU's kernels: the step's time runs from the observations' copy to the actions'.
        # Copied once: the reply takes the actions, the segment (when the step's reward arrives) every field.
        computed = policy_step_fields(step)
        self.infer_seconds += time.perf_counter() - t0
        self.batches += 1
        self.passes += self.populations
        self.batch_agents += len(env_ranks) * self.per_env
        for i, e in enumerate(env_ranks):
            part = slice(i * self.per_env, (i + 1) * self.per_env)
            if len(env_ranks) == 1:
                mine, fields = step, computed
            else:
                mine = PolicyStep({k: v[part] for k, v in step.actions.items()}, step.logp[part], step.entropy[part],
                                  step.value[part], (step.state[0][part], step.state[1][part]))
                fields = {k: v[part] for k, v in computed.items()}
            reply = {head: fields[f"actions/{head}"].reshape(self.config.env.num_envs, self.spec.num_agents)
                     for head in step.actions}
            self.exchange.send_reply(e, self.replies.pack(reply, self.reply_buffer))
            self._complete(e, messages[e], ends[e], mine)
            for k, buffer in enumerate(self.buffers[e]):
                buffer.store_state(self.t[e], self._rows_of(before[e], k))
            self.pending[e] = _Pending(flat[e], starts[e], fields, list(self.versions), weights[e])
            self.state[e] = mine.state

    def _act(self, obs: dict[str, torch.Tensor], hero: torch.Tensor, starts: torch.Tensor,
             state: tuple[torch.Tensor, torch.Tensor], num_env_ranks: int) -> PolicyStep:
        """The step of every agent of ``num_env_ranks`` env ranks: the policy's, or each population's policy on its
        population's agents."""
        if self.populations == 1:
            return act(self.policy, obs, hero, starts, state)
        if num_env_ranks not in self.batch_rows:  # each population's rows of the batch (made once per count)
            self.batch_rows[num_env_ranks] = [
                torch.from_numpy(np.concatenate([i * self.per_env + rows for i in range(num_env_ranks)]))
                .to(self.device) for rows in self.rows]
        parts = [(idx, act(policy, {k: v[idx] for k, v in obs.items()}, hero[idx], starts[idx],
                           (state[0][idx], state[1][idx])))
                 for policy, idx in zip(self.policies, self.batch_rows[num_env_ranks])]
        return join_steps(parts, hero.shape[0])

    def _rows_of(self, value, k: int):
        """Population ``k``'s rows of one env rank's per-agent ``value`` (an array, a tensor or an LSTM state); the
        whole of it without populations."""
        if self.rows is None:
            return value
        if isinstance(value, tuple):
            return tuple(self._rows_of(v, k) for v in value)
        return value[self.rows_t[k]] if isinstance(value, torch.Tensor) else value[self.rows[k]]

    def _hero(self, num_env_ranks: int) -> torch.Tensor:
        """The hero index of every agent of ``num_env_ranks`` env ranks, on the device (made once per count)."""
        if num_env_ranks not in self.hero_t:
            self.hero_t[num_env_ranks] = torch.from_numpy(np.tile(self.hero, num_env_ranks)).to(self.device)
        return self.hero_t[num_env_ranks]

    def _complete(self, e: int, message: dict[str, np.ndarray], done: np.ndarray, now: PolicyStep) -> None:
        """Store the pending step of env rank ``e`` with the reward ``message`` brings and ``done``, the episode ends
        of its agents; ship a full segment."""
        pending = self.pending[e]
        if pending is None:
            return
        tau = self.config.ppo.team_spirit(max(self.version, 0))
        reward = shape_rewards(message["events"], self.spec.agent_team, self.reward_config, tau,
                               message["game_time"]).reshape(-1)
        t = self.t[e]
        rows = {**{name: pending.obs[k] for k, name in self.obs_fields.items()}, "hero": self.hero,
                "starts": pending.starts, **pending.fields, "reward": reward, "done": done, "weight": pending.weight,
                **{k: message[k].reshape(self.per_env, *message[k].shape[2:]) for k in self.info_fields}}
        for k, buffer in enumerate(self.buffers[e]):
            buffer.store(t, {**{name: self._rows_of(value, k) for name, value in rows.items()},
                             "version": pending.versions[k]})
        self.t[e] = t + 1
        if self.t[e] == self.config.pipeline.segment_len:
            for k in range(self.populations):
                self._ship(e, k, self._rows_of(now.value, k))
            self.t[e] = 0

    def _ship(self, e: int, population: int, bootstrap_value: torch.Tensor) -> None:
        segment = self.buffers[e][population].finish(bootstrap_value)
        self.segments_sent[e] += 1
        payload = self.schema.pack(segment, e, self.segments_sent[e], self.segment_buffer)
        # Round-robin over the population's learners, so every learner's buffer fills at the same rate.
        rings, turn = self.population_rings[population], self.next_ring[population]
        ring = rings[turn]
        patiently(lambda timeout: ring.put(payload, timeout), self.link, self.config.transport.timeout_s)
        self.produced_ids.append((self.exchange.rank, e, self.segments_sent[e]))
        self.next_ring[population] = (turn + 1) % len(rings)
        self.segments += 1
        self.samples += int(segment["weight"].sum())
        self.segment_bytes += payload.nbytes
        self.segment_observation_bytes += self.segment_observation_nbytes
