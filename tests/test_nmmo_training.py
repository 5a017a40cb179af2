"""Training Neural MMO: per-agent episodes through the data path (an agent's episode is its lifetime, its world goes
on), empty slots never trained on, the serial runner. The MPI job (two populations, the final evaluation's
lifetimes) is tests/test_populations.py's."""


import numpy as np
import pytest
import torch

from hpc_rl.algo.bptt import from_chunks, to_chunks
from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.gae import gae
from hpc_rl.config import EnvConfig, LeagueConfig, PipelineConfig, TrainConfig
from hpc_rl.envs.api import AGENT_DONE, EnvSpec, StepInfo
from hpc_rl.envs.nmmo_config import NmmoConfig
from hpc_rl.model.config import ModelConfig
from hpc_rl.runner import SerialRunner
from hpc_rl.storage import open_run
from test_algo_gae import reference_gae

MODEL = ModelConfig(core="lstm", lstm_size=16, embed_size=16)
WORLD = NmmoConfig(num_agents=16, map_size=24, border=2, vision=3, max_seen=4)


def nmmo_config(runs_dir, **pipeline) -> TrainConfig:
    return TrainConfig(run_name="nmmo", runs_dir=str(runs_dir),
                       env=EnvConfig(name="nmmo", num_envs=2, vs_scripted_fraction=0.0, nmmo=WORLD),
                       league=LeagueConfig(past_fraction=0.0), model=MODEL,
                       ppo=PPOConfig(epochs=1, num_minibatches=2),
                       pipeline=PipelineConfig(**{"segment_len": 32, "segments_per_batch": 1, **pipeline}))


class LifetimeLog:
    """The run's world, noting the lifetimes the env reports at every death (what the episode lengths must be)."""

    def __init__(self, env):
        self.env, self.spec, self.num_envs = env, env.spec, env.num_envs
        self.lifetimes: list[int] = []

    def reset(self, seed):
        return self.env.reset(seed)

    def step(self, actions):
        obs, events, dones, infos = self.env.step(actions)
        self.lifetimes += infos["lifetime"][infos["agent_done"]].tolist()
        return obs, events, dones, infos


def test_episode_ends_are_per_copy_unless_the_env_ends_them_per_agent():
    copies = EnvSpec(num_agents=3, agent_team=(0, 0, 1), global_features=2, num_actions=1)
    agents = EnvSpec(num_agents=3, agent_team=(0, 0, 0), global_features=2, num_actions=1,
                     step_infos=(StepInfo(AGENT_DONE, (), "bool"),), agent_episodes=True, occupied_feature=0)
    dones = np.array([True, False])
    agent_done = np.array([[False, True, False], [False, True, False]])
    assert copies.episode_ends(dones, None).tolist() == [[True] * 3, [False] * 3]
    assert agents.episode_ends(dones, agent_done).tolist() == [[True] * 3, [False, True, False]]
    assert copies.occupied(np.zeros((2, 3, 2))).all()
    assert agents.occupied(np.array([[1.0, 0.3], [0.0, 0.3]])).tolist() == [True, False]
    with pytest.raises(ValueError, match="agent_episodes needs step_infos to declare 'agent_done'"):
        EnvSpec(num_agents=1, agent_team=(0,), global_features=2, num_actions=1, agent_episodes=True)
    with pytest.raises(ValueError, match="occupied_feature 2 is not a global feature"):
        EnvSpec(num_agents=1, agent_team=(0,), global_features=2, num_actions=1, occupied_feature=2)


def test_segments_end_episodes_per_agent_and_never_train_on_empty_slots(tmp_path):
    world = LifetimeLog(EnvConfig(name="nmmo", num_envs=2, nmmo=WORLD).make())
    runner = SerialRunner(nmmo_config(tmp_path, max_versions=2), env=world)
    runner.collect()  # the second segment starts from carried LSTM states
    batch = runner.collect()
    occupied = batch.obs["global"][..., 0] > 0.5
    # done is the agent's own death, not its copy's (the world never ends): agents of one copy end apart.
    assert torch.equal(batch.done, batch[f"info/{AGENT_DONE}"])
    died = batch.done.view(32, 2, WORLD.num_agents)
    assert (died.any(dim=2) & ~died.all(dim=2)).any()
    # An empty slot (before a spawn, after a death) carries weight 0; every agent's step weight 1.
    assert (~occupied).any() and occupied.any()
    assert torch.equal(batch.weight, occupied.float())
    # The LSTM starts afresh after the agent's death and in an empty slot, and nowhere else.
    assert torch.equal(batch.starts[1:], batch.done[:-1] | ~occupied[1:])

    # The learner's view (every chunk from its stored state, reset where starts) recomputes the behaviour exactly, and
    # so does a slow reference: each agent column alone, one step at a time, its state zeroed where it starts.
    policy, n = runner.policy, batch.chunk_h.shape[0]
    with torch.no_grad():
        step = policy({k: to_chunks(v, 16) for k, v in batch.obs.items()}, to_chunks(batch.hero, 16),
                      to_chunks(batch.starts, 16), (batch.chunk_h.reshape(-1, 16), batch.chunk_c.reshape(-1, 16)),
                      actions={k: to_chunks(v, 16) for k, v in batch.actions.items()})
        torch.testing.assert_close(from_chunks(step.logp, n), batch.logp, rtol=1e-5, atol=1e-5)
        columns = torch.nonzero(batch.done[:-1].any(dim=0)).flatten()[:3]  # agents that died inside the segment
        assert len(columns)
        for b in columns.tolist():
            state = (batch.chunk_h[0, b:b + 1], batch.chunk_c[0, b:b + 1])
            for t in range(32):
                if batch.starts[t, b]:
                    state = policy.initial_state(1, torch.device("cpu"))
                one = policy({k: v[t:t + 1, b:b + 1] for k, v in batch.obs.items()}, batch.hero[t:t + 1, b:b + 1],
                             torch.zeros(1, 1, dtype=torch.bool), state,
                             actions={k: v[t:t + 1, b:b + 1] for k, v in batch.actions.items()})
                torch.testing.assert_close(one.value[0, 0], batch.value[t, b], rtol=1e-5, atol=1e-5)
                state = one.state

    # GAE bootstraps nothing across an agent's death: the learner's advantages are the definition's, per agent.
    adv, ret = gae(batch.reward.double(), batch.value.double(), batch.done.double(), batch.bootstrap_value.double(),
                   0.99, 0.95)
    ref_adv, ref_ret = reference_gae(*(x.double().numpy() for x in (batch.reward, batch.value, batch.done,
                                                                    batch.bootstrap_value)), 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-9, atol=1e-9)
    dead = batch.done.bool()
    torch.testing.assert_close(adv[dead], (batch.reward - batch.value)[dead].double())  # the death ends the sum

    # A few versions: finite losses, metrics.h5 and checkpoints; the episode length is the agents' mean lifetime.
    metrics = runner.run()
    assert np.isfinite([metrics[k] for k in ("train/policy_loss", "train/value_loss", "train/entropy")]).all()
    assert metrics["stats/episode_return"] == -1.0  # the paper's reward: -1 at death, nothing else
    assert runner.env_worker.lengths_sum == sum(world.lifetimes) and runner.env_worker.games == len(world.lifetimes)
    run = open_run(tmp_path / "nmmo")
    assert run.checkpoint_versions[-1] == 2
    lengths = run.metrics["stats/episode_length"]["value"]
    assert len(lengths) and np.isfinite(lengths).all() and (lengths > 1).all()
