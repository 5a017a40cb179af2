"""The policy on a synthetic spec with entities, masks and targets, and on a flat Gymnasium-like spec."""

import math

import numpy as np
import pytest
import torch

from hpc_rl.envs.api import EntitySpec, EnvSpec
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.device import select_device, to_device
from hpc_rl.model.policy import Policy
from hpc_rl.model.heads import masked_entropy, masked_log_softmax
from hpc_rl.model.policy import hero_indices

SPEC = EnvSpec(num_agents=4, agent_team=(0, 0, 1, 1), global_features=6, num_actions=4, num_moves=8,
               entities=(EntitySpec("heroes", 4, 5), EntitySpec("creeps", 3, 2)),
               action_uses_move=(False, True, False, False), action_uses_target=(False, False, True, True),
               reward_events=("gold", "win"))
FLAT = EnvSpec(num_agents=1, agent_team=(0,), global_features=4, num_actions=2)


def random_obs(spec, n, seed=0):
    """(1, n, ...) observations with random features and random masks (each mask row has a legal choice)."""
    rng = np.random.default_rng(seed)
    obs = {}
    for key, (shape, dtype) in spec.observation_shapes(n).items():
        shape = (1, n) + shape[2:]
        if dtype == bool:
            mask = rng.random(shape) < 0.5
            if shape[-1]:
                mask[..., 0] = True
            obs[key] = mask
        else:
            obs[key] = rng.normal(size=shape).astype(np.float32)
    return {k: torch.from_numpy(v) for k, v in obs.items()}


def run(policy, obs, actions=None, deterministic=False, hero=None):
    n = obs["action_mask"].shape[1]
    hero = torch.zeros(1, n, dtype=torch.long) if hero is None else hero
    return policy(obs, hero, torch.ones(1, n, dtype=torch.bool), policy.initial_state(n), actions, deterministic)


@pytest.mark.parametrize("pooling", ["attention", "max"])
def test_sampled_actions_respect_every_mask(pooling):
    torch.manual_seed(0)
    policy = Policy(SPEC, ModelConfig(core="lstm", lstm_size=16, embed_size=8, entity_pooling=pooling))
    obs = random_obs(SPEC, 512)
    step = run(policy, obs)
    a, m, t = step.actions["action"][0], step.actions["move"][0], step.actions["target"][0]
    assert obs["action_mask"][0].gather(1, a[:, None]).all()
    uses_move = torch.tensor(SPEC.action_uses_move)[a]
    uses_target = torch.tensor(SPEC.action_uses_target)[a]
    assert uses_move.any() and uses_target.any()
    assert obs["move_mask"][0].gather(1, m[:, None])[uses_move].all()
    assert obs["target_mask"][0].gather(1, t[:, None])[uses_target].all()
    assert torch.isfinite(step.logp).all() and torch.isfinite(step.value).all()


def test_logp_is_sum_of_the_heads_the_action_uses():
    torch.manual_seed(1)
    policy = Policy(SPEC, ModelConfig(core="lstm", lstm_size=16, embed_size=8))
    obs = random_obs(SPEC, 3)
    actions = {"action": torch.tensor([[1, 2, 0]]), "move": torch.tensor([[0, 0, 0]]),
               "target": torch.tensor([[0, 0, 0]])}
    step = run(policy, obs, actions)
    h, units, _ = policy.core(obs, torch.zeros(1, 3, dtype=torch.long), torch.ones(1, 3, dtype=torch.bool),
                              policy.initial_state(3))
    lp_action, _, _ = masked_log_softmax(policy.action_head(h), obs["action_mask"][0])
    lp_move, _, _ = masked_log_softmax(policy.move_head(h), obs["move_mask"][0])
    # Target logits by the formula: q · (u ∘ σ(e_a)) / √d.
    q = policy.target_query(h)
    gate = torch.sigmoid(policy.action_embed(actions["action"][0]))
    scores = torch.stack([(units[i] * gate[i]) @ q[i] for i in range(3)]) / math.sqrt(8)
    lp_target, _, _ = masked_log_softmax(scores, obs["target_mask"][0])
    expected = [lp_action[0, 1] + lp_move[0, 0], lp_action[1, 2] + lp_target[1, 0], lp_action[2, 0]]
    torch.testing.assert_close(step.logp[0], torch.stack(expected))


def test_target_distribution_is_gated_by_the_chosen_action():
    torch.manual_seed(2)
    policy = Policy(SPEC, ModelConfig(core="lstm", lstm_size=16, embed_size=8))
    obs = random_obs(SPEC, 1)
    obs["action_mask"][:] = True
    obs["target_mask"][:] = True
    scores = []
    for action in (2, 3):
        step = run(policy, obs, {"action": torch.tensor([[action]]), "move": torch.zeros(1, 1, dtype=torch.long),
                                 "target": torch.zeros(1, 1, dtype=torch.long)})
        lp_action, _, _ = masked_log_softmax(policy.action_head(policy.core(
            obs, torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1, dtype=torch.bool), policy.initial_state(1))[0]),
            obs["action_mask"][0])
        scores.append((step.logp[0, 0] - lp_action[0, action]).item())
    assert scores[0] != pytest.approx(scores[1], abs=1e-6)


def test_all_masked_rows_give_no_nan_and_no_contribution():
    torch.manual_seed(3)
    policy = Policy(SPEC, ModelConfig(core="lstm", lstm_size=16, embed_size=8))
    obs = random_obs(SPEC, 2)
    obs["target_mask"][:] = False
    obs["move_mask"][:] = False
    for key in ("entities/heroes/mask", "entities/creeps/mask"):
        obs[key][:] = False
    actions = {"action": torch.tensor([[2, 1]]), "move": torch.zeros(1, 2, dtype=torch.long),
               "target": torch.zeros(1, 2, dtype=torch.long)}
    step = run(policy, obs, actions)
    h = policy.core(obs, torch.zeros(1, 2, dtype=torch.long), torch.ones(1, 2, dtype=torch.bool),
                    policy.initial_state(2))[0]
    lp_action, _, _ = masked_log_softmax(policy.action_head(h), obs["action_mask"][0])
    torch.testing.assert_close(step.logp[0], lp_action[[0, 1], [2, 1]])
    (step.logp.sum() + step.entropy.sum() + step.value.sum()).backward()
    assert all(torch.isfinite(p.grad).all() for p in policy.parameters() if p.grad is not None)
    logp, applied, usable = masked_log_softmax(torch.zeros(2, 3), torch.tensor([[False] * 3, [True, False, False]]))
    assert usable.tolist() == [False, True]
    assert torch.isfinite(masked_entropy(logp, applied)).all()
    assert masked_entropy(logp, applied)[1].item() == 0.0


@pytest.mark.parametrize("pooling", ["attention", "max"])
def test_absent_units_do_not_change_the_output(pooling):
    torch.manual_seed(4)
    policy = Policy(SPEC, ModelConfig(core="lstm", lstm_size=16, embed_size=8, entity_pooling=pooling))
    obs = random_obs(SPEC, 4)
    before = run(policy, obs, deterministic=True)
    changed = {k: v.clone() for k, v in obs.items()}
    absent = ~changed["entities/creeps/mask"]
    assert absent.any()
    changed["entities/creeps"][absent] = 1e3
    after = run(policy, changed, deterministic=True)
    torch.testing.assert_close(after.value, before.value)
    changed["entities/creeps"][~absent] += 1.0
    assert not torch.allclose(run(policy, changed, deterministic=True).value, before.value)


def test_hero_index_is_an_input():
    assert hero_indices(SPEC).tolist() == [0, 1, 0, 1]
    torch.manual_seed(5)
    policy = Policy(SPEC, ModelConfig(core="lstm", lstm_size=16, embed_size=8))
    obs = random_obs(SPEC, 1)
    v0 = run(policy, obs, deterministic=True, hero=torch.tensor([[0]])).value
    v1 = run(policy, obs, deterministic=True, hero=torch.tensor([[1]])).value
    assert v0.item() != pytest.approx(v1.item(), abs=1e-7)


def test_flat_spec_has_only_action_and_value_heads():
    policy = Policy(FLAT, ModelConfig(core="lstm", lstm_size=8, embed_size=8))
    assert policy.move_head is None and policy.target_query is None and len(policy.entity_nets) == 0
    assert policy.type_embed is None and policy.pool_query is None
    obs = random_obs(FLAT, 5)
    obs["action_mask"][:] = True
    step = run(policy, obs)
    assert step.actions["move"].abs().sum() == 0 and step.actions["target"].abs().sum() == 0
    assert set(step.actions["action"].flatten().tolist()) <= {0, 1}
    # Near-uniform initial policy: log π ≈ log ½.
    assert step.logp.mean().item() == pytest.approx(math.log(0.5), abs=0.05)


def test_lstm_state_carries_and_resets():
    torch.manual_seed(6)
    policy = Policy(FLAT, ModelConfig(core="lstm", lstm_size=8, embed_size=8))
    obs = {k: v.expand(3, *v.shape[1:]).clone() for k, v in random_obs(FLAT, 2).items()}
    starts = torch.tensor([[True, True], [False, True], [False, True]])
    step = policy(obs, torch.zeros(3, 2, dtype=torch.long), starts, policy.initial_state(2))
    # Column 1 restarts every step on the same observation: the same value each time; column 0 carries state.
    assert step.value[0, 1].item() == pytest.approx(step.value[2, 1].item())
    assert step.value[0, 0].item() != pytest.approx(step.value[2, 0].item(), abs=1e-7)


def test_feed_forward_core_decides_each_step_from_its_observation():
    torch.manual_seed(6)
    policy = Policy(FLAT, ModelConfig(core="mlp", lstm_size=8, embed_size=8))
    assert policy.lstm is None
    obs = {k: v.expand(3, *v.shape[1:]).clone() for k, v in random_obs(FLAT, 2).items()}
    starts = torch.tensor([[True, True], [False, True], [False, True]])
    state = policy.initial_state(2)
    step = policy(obs, torch.zeros(3, 2, dtype=torch.long), starts, state)
    # No memory: the same observation gives the same value whether or not a game started; the state stays zero.
    assert step.value[0, 0].item() == pytest.approx(step.value[2, 0].item())
    assert all(torch.equal(s, torch.zeros_like(s)) for s in step.state)
    with pytest.raises(ValueError, match="core 'gru' is not one of"):
        ModelConfig(core="gru")


def test_value_head_predicts_standardised_returns_reported_in_reward_units():
    torch.manual_seed(7)
    policy = Policy(FLAT, ModelConfig(lstm_size=8, embed_size=8))
    obs = random_obs(FLAT, 4)
    raw = run(policy, obs).value
    policy.set_value_normalizer(50.0, 10.0)
    scaled = run(policy, obs).value
    assert torch.allclose(scaled, raw * 10.0 + 50.0, atol=1e-5)
    assert torch.allclose(policy.normalized_value(scaled), raw, atol=1e-5)
    # The statistics travel with the parameters (inference ranks report values in reward units too).
    assert policy.state_dict()["value_mean"].item() == 50.0 and policy.state_dict()["value_std"].item() == 10.0


def test_device_selection_runs_on_cpu_here():
    device = select_device()
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert device.type == expected
    tensors = to_device({"x": np.arange(3, dtype=np.float32)}, torch.device("cpu"))
    assert tensors["x"].tolist() == [0.0, 1.0, 2.0] and not tensors["x"].is_pinned()
    with pytest.raises(ValueError, match="ModelConfig|entity_pooling"):
        ModelConfig(entity_pooling="mean")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA"):
            select_device("cuda")
