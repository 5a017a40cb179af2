"""The actor interface: the bots and a policy answer with legal, (E, A)-shaped actions for their agents only, and a
policy actor starts its LSTM state afresh exactly in the copies it is told ended."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_rl.actors import PolicyActor
from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs.scripted import RandomBot, ScriptedBot
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import HEADS, Policy

COPIES = 3
# The policy plays agent 0 in copy 0, agent 1 in copy 1 and both in copy 2.
POLICY_AGENTS = np.array([[True, False], [False, True], [True, True]])


def _policy(spec, seed: int = 0) -> Policy:
    torch.manual_seed(seed)
    return Policy(spec, ModelConfig(core="lstm", lstm_size=16, embed_size=8)).eval()


def _assert_legal(obs, actions, agents) -> None:
    """Every head an (E, A) int64 array; where ``agents``, the primary action and the heads it uses are legal."""
    assert set(actions) == set(HEADS)
    for head in HEADS:
        assert actions[head].shape == agents.shape and actions[head].dtype == np.int64, head
    e, a = np.nonzero(agents)
    chosen = actions["action"][e, a]
    assert obs["action_mask"][e, a, chosen].all()
    moves = chosen == 1  # A_MOVE uses the move head; attack (2) and skill (3) the target head
    assert obs["move_mask"][e[moves], a[moves], actions["move"][e[moves], a[moves]]].all()
    targets = np.isin(chosen, [2, 3])
    assert obs["target_mask"][e[targets], a[targets], actions["target"][e[targets], a[targets]]].all()


@pytest.mark.parametrize("kind", ["random", "scripted", "policy"])
def test_every_actor_answers_legally_for_its_agents(kind):
    config = MobaConfig(time_limit=60)  # games end inside the 100 steps: actors play on into the next ones
    env = MobaEnv(config, COPIES)
    if kind == "policy":
        actor, agents = PolicyActor(_policy(env.spec), POLICY_AGENTS), POLICY_AGENTS
    else:
        actor = RandomBot(1) if kind == "random" else ScriptedBot(config)
        agents = np.ones((COPIES, env.spec.num_agents), dtype=bool)  # a bot answers for every agent
    obs = env.reset(1)
    chose_non_noop = False
    for _ in range(100):
        actions = actor.act(obs)
        _assert_legal(obs, actions, agents)
        chose_non_noop |= bool((actions["action"][agents] != 0).any())
        for head in HEADS:  # the policy leaves the agents it does not play at 0
            assert not actions[head][~agents].any(), head
        obs, _, dones, _ = env.step(actions)
        actor.reset(dones)
    assert chose_non_noop


def _state_rows(actor: PolicyActor, copy: int) -> torch.Tensor:
    """The LSTM cell state of the actor's agents in ``copy``."""
    return actor.state[1][torch.from_numpy(actor.copy == copy)]


def test_policy_actor_starts_afresh_only_in_the_copies_that_ended():
    env = MobaEnv(MobaConfig(), COPIES)
    policy = _policy(env.spec)
    actor = PolicyActor(policy, POLICY_AGENTS, deterministic=True)
    obs = env.reset(0)
    for _ in range(5):
        actions = actor.act(obs)
        obs = env.step(actions)[0]
        actor.reset(np.zeros(COPIES, dtype=bool))
    actor.reset(np.array([False, True, False]))  # copy 1's game ended: its next observation starts a new one
    actor.act(obs)
    fresh = PolicyActor(policy, POLICY_AGENTS, deterministic=True)  # every copy at the first step of a game
    fresh.act(obs)
    torch.testing.assert_close(_state_rows(actor, 1), _state_rows(fresh, 1), rtol=0, atol=0)
    for copy in (0, 2):  # these carried their state over five steps
        assert not torch.allclose(_state_rows(actor, copy), _state_rows(fresh, copy), atol=1e-3), copy
    # A start is used once: on the next step copy 1 continues from its state, as the fresh actor does, instead of
    # starting over (which would give back its state after the first step).
    first_step = _state_rows(actor, 1).clone()
    actor.act(obs)
    fresh.act(obs)
    torch.testing.assert_close(_state_rows(actor, 1), _state_rows(fresh, 1), rtol=0, atol=0)
    assert not torch.allclose(_state_rows(actor, 1), first_step, atol=1e-3)

def test_policy_actor_refuses_masks_and_dones_of_the_wrong_shape():
    env = MobaEnv(MobaConfig(), COPIES)
    policy = _policy(env.spec)
    with pytest.raises(ValueError, match=r"agents must be a \(copies, 2\) bool array"):
        PolicyActor(policy, np.ones((COPIES, 3), dtype=bool))
    with pytest.raises(ValueError, match="bool"):
        PolicyActor(policy, np.ones((COPIES, 2), dtype=int))
    actor = PolicyActor(policy, POLICY_AGENTS)
    with pytest.raises(ValueError, match=r"one entry per copy \(3\)"):
        actor.reset(np.zeros(2, dtype=bool))
