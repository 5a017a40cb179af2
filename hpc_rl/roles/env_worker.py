"""Env rank: steps a vectorised environment and exchanges every step with its inference rank.

    start(): obs = env.reset(seed)
    while send(): receive()      # send: request(obs, events, dones); receive: actions = reply; obs, ... = step(actions)

Each request carries the events and dones of the previous step beside the new observation, so the inference rank
completes step t-1 of its segments when step t arrives.

With ``pipeline.async_actions`` (OpenAI Five's asynchronous action offset) the env does not wait for the action of
the observation it just sent: it steps with the previous one while the inference rank computes the next, so env
and inference work overlap. The action chosen at observation t is applied at step t+1 (the very first step applies
action 0 of every head, a no-op in MOBA); the policy learns to act one step ahead, as OpenAI Five's did.

In MOBA, the first ``scripted_copies`` copies of every env rank let the frozen scripted bot play one side (team 1 in
even copies, team 0 in odd ones: ``EnvSpec.opponent_side``): the learning side's games there measure its win rate
against the bot from both sides, and the inference rank gives the bot's steps no training weight.

The MOBA curriculum (``env.warmup_*``): a run that starts before ``env.warmup_versions`` plays the warm-up (its bot
``env.warmup_opponent`` on its map) until the controller says the policy reached that version (``TAG_STAGE``); then
every copy's game is cut off (the step is sent as the end of a game, no winner, not counted) and new games start
against the scripted bot on the run's map. Games against a warm-up bot other than the scripted one are not counted in
the win rate against it.

Game versions side by side (``env.game_version=2`` with a rising ``env.new_version_share``): each env rank's games
start under version 2's rules at the share of the policy's version, which the controller sends with ``TAG_STAGE``
each version while the share still changes; the rank counts the copy-steps played under version 2 (the share
actually played) and its games against the scripted bot there.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from hpc_rl.config import TrainConfig
from hpc_rl.envs.api import AGENT_DONE, VecEnv
from hpc_rl.roles.common import patiently, seed_for
from hpc_rl.roles.control import ControlLink
from hpc_rl.roles.protocol import TAG_STAGE, TAG_STOP, reply_layout, request_layout
from hpc_rl.transport import StepExchange

log = logging.getLogger(__name__)


class EnvWorker:
    def __init__(self, config: TrainConfig, rank: int, env_index: int, exchange: StepExchange, link: ControlLink,
                 version: int, env: VecEnv | None = None):
        """``env`` replaces the one ``config.env`` makes (the serial runner's caller may bring its own)."""
        self.config = config
        self.rank = rank
        self.first_copy = env_index * config.env.num_envs
        self.warming_up = env is None and config.env.warming_up(version)
        self.env = env if env is not None else config.env.make(first_copy=self.first_copy, version=version)
        if self.env.num_envs != config.env.num_envs:
            raise ValueError(f"the env has {self.env.num_envs} copies, env.num_envs is {config.env.num_envs}")
        self.spec = self.env.spec
        self.exchange = exchange
        self.link = link
        self.version = version
        n = config.env.num_envs
        self.requests = request_layout(self.spec, n, config.transport.fp16_observations)
        self.replies = reply_layout(self.spec, n)
        self.buffer = np.empty(self.requests.nbytes, np.uint8)
        self.observation_nbytes = self.requests.wire_nbytes(self.spec.observation_shapes(n))  # of every request
        self.scripted = config.env.scripted_copies()
        self.bot = None
        self.counts_bot_games = True
        if self.scripted:
            self.bot = self._make_bot(version)
            self.bot_agents = self.spec.opponent_side(self.scripted)  # (scripted copies, agents)
            # The learning side's team in each scripted copy: a game is won when the winner is that team.
            self.learner_team = 1 - self.spec.opponent_team(self.scripted)
        self.steps = 0
        self.games = 0
        self.bot_games = 0
        self.bot_wins = 0  # games against the scripted bot won by the learning side
        self.new_version_steps = 0  # copy-steps played under game version 2's rules (MOBA, env.game_version=2)
        self.new_bot_games = 0  # ... and its games against the scripted bot, and those won by the learning side
        self.new_bot_wins = 0
        self.returns_sum = 0.0  # sum of finished episodes' returns, where the env reports them (Gymnasium, PettingZoo)
        self.lengths_sum = 0  # ... and of their lengths, where episodes end per agent (Neural MMO: lifetimes)
        if self.spec.agent_episodes:  # every slot's running return (weighted events) and length, since its agent came
            self.reward_weights = np.asarray(config.env.reward_config().weights)
            self.agent_return = np.zeros((config.env.num_envs, self.spec.num_agents))
            self.agent_length = np.zeros((config.env.num_envs, self.spec.num_agents), np.int64)
        # With populations (hpc_rl.populations), the same three counts per population: (games, returns, lengths).
        self.population_counts = np.zeros((config.populations, 3)) if config.populations > 1 else None
        self.request_bytes = 0  # bytes of the step requests sent, and of the observations among them
        self.observation_bytes = 0

    def run(self) -> None:
        self.start()
        while self.send():
            self.receive()

    def start(self) -> None:
        n = self.config.env.num_envs
        self.obs = self.env.reset(seed_for(self.config.seed, self.rank, self.version))
        self.events = np.zeros((n, self.spec.num_agents, len(self.spec.reward_events)), np.float32)
        self.done = np.zeros(n, bool)
        self.winner = np.full(n, -1, np.int64)
        self.infos = {f"info/{i.name}": np.zeros((n, self.spec.num_agents) + i.shape, i.dtype)
                      for i in self.spec.step_infos}
        self.game_steps = np.zeros(n)
        self.started = time.monotonic()
        self.previous = {k: np.zeros(f.shape, f.dtype) for k, f in self.replies.fields.items()}

    def send(self) -> bool:
        """Send this step's request: the observation and what the previous step produced. False if it was the last
        (the controller said stop). With the action offset, step with the previous action while the inference rank
        computes this one."""
        stop = self.link.receive(TAG_STOP) is not None
        # Probed only while the game changes with the version (the warm-up, a rising share of the new game version):
        # under MPI every probe enters the progress loop, which yields the core.
        listening = self.warming_up or self.version < self.config.env.share_moves_until()
        stage = self.link.receive(TAG_STAGE) if listening else None
        if stage is not None:
            self._on_stage(int(stage))
        message = {**self.obs, "events": self.events, "done": self.done, "winner": self.winner,
                   "game_time": (self.game_steps * self.config.env.step_seconds).astype(np.float32),
                   **self.infos, "stop": np.array([stop])}
        payload = self.requests.pack(message, self.buffer)
        self.exchange.send_request(payload)
        self.request_bytes += payload.nbytes
        self.observation_bytes += self.observation_nbytes
        if stop:
            return False
        if self.config.pipeline.async_actions:
            self._step(self.previous)
        return True

    def _make_bot(self, version: int):
        """The bot of the curriculum's stage (the warm-up's while ``warming_up``), on that stage's map."""
        from hpc_rl.envs.scripted import make_bot

        env = self.config.env
        name, moba = (env.bot_at(version), env.moba_at(version)) if self.warming_up else ("scripted", env.moba)
        self.counts_bot_games = name == "scripted"  # the win rate is the one against the scripted bot
        return make_bot(name, moba, seed=seed_for(self.config.seed, self.rank, version))

    def _on_stage(self, version: int) -> None:
        """The policy reached ``version``: the curriculum's next stage, and the new game version's share there."""
        self.version = version
        if self.warming_up and not self.config.env.warming_up(version):
            self._end_warmup(version)
        elif self.config.env.game_version > 1:
            share = self.config.env.new_version_share_at(version)
            self.env.set_new_version_share(share)
            log.info("version %d: games start under game version 2 with probability %.3f", version, share)

    def _end_warmup(self, version: int) -> None:
        """The curriculum's next stage: the scripted bot on the run's map, new games in every copy (the warm-up's
        games end here, as draws nobody counts: the inference rank closes their segments' episodes)."""
        self.warming_up = False
        self.env = self.config.env.make(first_copy=self.first_copy, version=version)
        if self.bot is not None:
            self.bot = self._make_bot(version)
        self.obs = self.env.reset(seed_for(self.config.seed, self.rank, version))
        self.events[:] = 0.0
        self.done[:] = True
        self.winner[:] = -1
        self.game_steps[:] = 0

    def receive(self) -> None:
        """The reply to the request just sent: step with it (with the action offset: keep it for the next step)."""
        reply = patiently(self.exchange.wait_reply, self.link, self.config.transport.timeout_s)
        actions = {k: v.copy() for k, v in self.replies.unpack(reply).items()}
        if self.config.pipeline.async_actions:
            self.previous = actions
        else:
            self._step(actions)

    def _step(self, actions: dict[str, np.ndarray]) -> None:
        if self.bot is not None:  # the scripted bot acts on what it sees now
            bot = self.bot.act(self.obs)
            for head in actions:
                actions[head][:self.scripted][self.bot_agents] = bot[head][:self.scripted][self.bot_agents]
        # The game version of each copy's step, read before the step starts the next games of those that end.
        new_version = self.env.new_version.copy() if self.config.env.game_version > 1 else None
        occupied = self.spec.occupied(self.obs["global"])  # the slots that hold an agent during this step
        self.obs, self.events, self.done, infos = self.env.step(actions)
        if self.bot is not None:
            self.bot.reset(self.done)
        self.game_steps += 1
        self.game_steps[self.done] = 0
        self.winner = np.asarray(infos["winner"], np.int64)
        for info in self.spec.step_infos:
            if info.name not in infos:
                raise KeyError(f"{self.config.env.name}: spec.step_infos declares {info.name!r}, step() did not report it")
            self.infos[f"info/{info.name}"] = infos[info.name]
        self._count(self.done, self.winner, new_version)
        if self.spec.agent_episodes:
            self._count_agent_episodes(occupied, self.events, self.infos[f"info/{AGENT_DONE}"])
        if "episode_return" in infos and self.done.any():
            self.returns_sum += float(np.asarray(infos["episode_return"])[self.done].sum())
        self.link.beat({"env_steps": self.steps, "games": self.games, "bot_games": self.bot_games,
                        "bot_wins": self.bot_wins, "returns_sum": self.returns_sum, "lengths_sum": self.lengths_sum,
                        "new_version_steps": self.new_version_steps, "new_bot_games": self.new_bot_games,
                        "new_bot_wins": self.new_bot_wins,
                        **({} if self.population_counts is None else
                           {"population_counts": self.population_counts.tolist()}),
                        "request_bytes": self.request_bytes, "observation_bytes": self.observation_bytes,
                        "seconds": time.monotonic() - self.started})

    def _count_agent_episodes(self, occupied: np.ndarray, events: np.ndarray, agent_done: np.ndarray) -> None:
        """Where episodes end per agent: every slot's return (its weighted events, as the reward before shaping) and
        length (steps lived) grow while it holds an agent; an ended episode is counted as a game with them."""
        self.agent_return += events @ self.reward_weights
        self.agent_length += occupied
        self.games += int(agent_done.sum())
        self.returns_sum += float(self.agent_return[agent_done].sum())
        self.lengths_sum += int(self.agent_length[agent_done].sum())
        if self.population_counts is not None:
            team = np.broadcast_to(np.asarray(self.spec.agent_team), agent_done.shape)[agent_done]
            k = self.population_counts.shape[0]
            self.population_counts += np.stack([np.bincount(team, minlength=k),
                                                np.bincount(team, self.agent_return[agent_done], minlength=k),
                                                np.bincount(team, self.agent_length[agent_done], minlength=k)], axis=1)
        self.agent_return[agent_done] = 0.0
        self.agent_length[agent_done] = 0

    def _count(self, done: np.ndarray, winner: np.ndarray, new_version: np.ndarray | None = None) -> None:
        """``new_version``: the copies whose step was played under game version 2's rules (None: no such game)."""
        self.steps += self.config.env.num_envs
        self.games += int(done.sum())
        if new_version is not None:
            self.new_version_steps += int(new_version.sum())
        if self.scripted and self.counts_bot_games:
            vs_bot = done[:self.scripted]
            won = winner[:self.scripted] == self.learner_team
            self.bot_games += int(vs_bot.sum())
            self.bot_wins += int((won & vs_bot).sum())
            if new_version is not None:
                new = vs_bot & new_version[:self.scripted]
                self.new_bot_games += int(new.sum())
                self.new_bot_wins += int((won & new).sum())
