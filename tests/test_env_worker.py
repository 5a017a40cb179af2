"""The env rank's loop in one process: with the asynchronous action offset, the env steps with the previous action
before waiting for the next, and the action chosen at observation t is the one applied at step t+1.

The step exchange and the control link are in-process stand-ins here (they record the order of calls); the
pipeline test with real ranks is tests/test_pipeline_features.py::test_async_action_offset_keeps_exactly_once.
"""

import numpy as np
import pytest

from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.envs.moba import MobaConfig
from hpc_rl.roles.env_worker import EnvWorker
from hpc_rl.roles.protocol import reply_layout, request_layout

ROUNDS = 6


class _Exchange:
    """Answers request k with move direction k % 8 for every agent; records the order of events."""

    def __init__(self, spec, num_envs, log):
        self.requests = request_layout(spec, num_envs, fp16=False)
        self.replies = reply_layout(spec, num_envs)
        self.log, self.sent, self.spec, self.num_envs = log, 0, spec, num_envs

    def send_request(self, payload):
        self.log.append(("request", self.sent))
        self.sent += 1

    def wait_reply(self, timeout_s=None):
        k = self.sent - 1
        self.log.append(("reply", k))
        shape = (self.num_envs, self.spec.num_agents)
        return self.replies.pack({"action": np.full(shape, 1, np.int64), "move": np.full(shape, k % 8, np.int64),
                                  "target": np.zeros(shape, np.int64)})


class _Link:
    heartbeat_s = 1.0

    def __init__(self, exchange):
        self.exchange = exchange

    def receive(self, tag):  # the controller's stop arrives before request ROUNDS
        return True if self.exchange.sent >= ROUNDS else None

    def beat(self, stats=None, force=False):
        pass


@pytest.mark.parametrize("offset", [False, True])
def test_actions_apply_at_the_next_step_with_the_offset(offset):
    config = TrainConfig(env=EnvConfig(num_envs=2, vs_scripted_fraction=0.0, moba=MobaConfig()),
                         pipeline=PipelineConfig(async_actions=offset))
    log: list = []
    exchange = _Exchange(config.env.make(num_envs=1).spec, 2, log)
    worker = EnvWorker(config, rank=1, env_index=0, exchange=exchange, link=_Link(exchange), version=0)
    step = worker.env.step

    def recording_step(actions):
        log.append(("step", int(actions["move"][0, 0]), int(actions["action"][0, 0])))
        return step(actions)

    worker.env.step = recording_step
    worker.run()
    steps = [e for e in log if e[0] == "step"]
    assert len(steps) == ROUNDS
    if offset:
        # request k, step (with reply k-1; the first step with action 0 = noop), then wait for reply k
        assert log[:3] == [("request", 0), ("step", 0, 0), ("reply", 0)]
        assert [s[1] for s in steps[1:]] == list(range(ROUNDS - 1))
        assert all(s[2] == 1 for s in steps[1:])
    else:
        assert log[:3] == [("request", 0), ("reply", 0), ("step", 0, 1)]
        assert [s[1] for s in steps] == list(range(ROUNDS))


def test_scripted_bot_plays_team_1_in_even_copies_and_team_0_in_odd_ones():
    config = TrainConfig(env=EnvConfig(num_envs=2, vs_scripted_fraction=1.0, moba=MobaConfig()))
    log: list = []
    exchange = _Exchange(config.env.make(num_envs=1).spec, 2, log)
    worker = EnvWorker(config, rank=1, env_index=0, exchange=exchange, link=_Link(exchange), version=0)
    assert worker.spec.agent_team == (0, 1)
    bot_side = np.array([[False, True], [True, False]])
    np.testing.assert_array_equal(worker.bot_agents, bot_side)
    act, step = worker.bot.act, worker.env.step
    seen = []

    def recording_act(obs):
        seen.append({k: v.copy() for k, v in act(obs).items()})
        return seen[-1]

    def recording_step(actions):
        seen[-1] = (seen[-1], {k: v.copy() for k, v in actions.items()})
        return step(actions)

    worker.bot.act, worker.env.step = recording_act, recording_step
    worker.run()
    assert len(seen) == ROUNDS
    for k, (bot, applied) in enumerate(seen):
        for head in applied:  # the bot's choice on its side, the policy's reply on the other
            np.testing.assert_array_equal(applied[head][bot_side], bot[head][bot_side])
        np.testing.assert_array_equal(applied["move"][~bot_side], k % 8)
        np.testing.assert_array_equal(applied["action"][~bot_side], 1)

    # A game counts as won when the learning side's team (0 in copy 0, 1 in copy 1) is the winner.
    worker.bot_games = worker.bot_wins = 0
    worker._count(np.array([True, True]), np.array([0, 1]))
    worker._count(np.array([True, True]), np.array([1, 0]))
    worker._count(np.array([False, True]), np.array([-1, -1]))
    assert (worker.bot_games, worker.bot_wins) == (5, 2)
