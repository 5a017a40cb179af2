"""GAE(λ) against the definition Â_t = Σ_l (γλ)^l δ_{t+l}, summed until the game ends, a time limit's end
bootstrapped."""

import numpy as np
import pytest
import torch

from hpc_rl.algo.gae import gae


def reference_gae(rewards, values, dones, bootstrap, gamma, lam, truncated=None):
    """Written like Schulman et al. eq. (16), one (t, agent) at a time, with the bootstrap V(s_T); a game a time limit
    ended continues, in value, from its last state: the value after it is V(s_t)."""
    steps, agents = rewards.shape
    truncated = np.zeros_like(dones) if truncated is None else truncated
    adv = np.zeros((steps, agents))
    for b in range(agents):
        v_next = [values[t, b] if truncated[t, b] else 0.0 if dones[t, b] else
                  values[t + 1, b] if t + 1 < steps else bootstrap[b] for t in range(steps)]
        delta = [rewards[t, b] + gamma * v_next[t] - values[t, b] for t in range(steps)]
        for t in range(steps):
            total = 0.0
            for l in range(steps - t):
                total += (gamma * lam) ** l * delta[t + l]
                if dones[t + l, b]:
                    break
            adv[t, b] = total
    return adv, adv + values


@pytest.mark.parametrize("steps", [64, 256])
def test_gae_matches_definition(steps):
    rng = np.random.default_rng(steps)
    rewards = rng.normal(size=(steps, 5))
    values = rng.normal(size=(steps, 5))
    dones = (rng.random((steps, 5)) < 0.05).astype(np.float64)
    bootstrap = rng.normal(size=5)
    adv, ret = gae(*(torch.tensor(x) for x in (rewards, values, dones, bootstrap)), gamma=0.99, lam=0.95)
    ref_adv, ref_ret = reference_gae(rewards, values, dones, bootstrap, 0.99, 0.95)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("steps", [64, 256])
def test_gae_with_time_limits_matches_definition(steps):
    rng = np.random.default_rng(1000 + steps)
    rewards, values = rng.normal(size=(steps, 5)), rng.normal(size=(steps, 5))
    dones = (rng.random((steps, 5)) < 0.1).astype(np.float64)
    truncated = dones * (rng.random((steps, 5)) < 0.5)  # half the games' ends are time limits
    assert truncated.sum() > 0 and (dones - truncated).sum() > 0
    bootstrap = rng.normal(size=5)
    args = [torch.tensor(x) for x in (rewards, values, dones, bootstrap)]
    adv, ret = gae(*args, gamma=0.99, lam=0.95, truncated=torch.tensor(truncated).bool())
    ref_adv, ref_ret = reference_gae(rewards, values, dones, bootstrap, 0.99, 0.95, truncated)
    np.testing.assert_allclose(adv.numpy(), ref_adv, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ret.numpy(), ref_ret, rtol=1e-10, atol=1e-10)
    no_limits = gae(*args, gamma=0.99, lam=0.95, truncated=torch.zeros(steps, 5, dtype=torch.bool))[0]
    np.testing.assert_array_equal(no_limits.numpy(), gae(*args, gamma=0.99, lam=0.95)[0].numpy())


def test_a_time_limit_bootstraps_from_the_last_value():
    # A game cut by its limit after step 1: its return there is r + γ V(s_1), not r; a terminal end gives r.
    rewards, values = torch.tensor([[1.0], [1.0]]), torch.tensor([[0.0], [4.0]])
    dones = torch.tensor([[0.0], [1.0]])
    _, ret = gae(rewards, values, dones, torch.tensor([100.0]), gamma=0.5, lam=1.0, truncated=dones.bool())
    assert ret[:, 0].tolist() == [1 + 0.5 * (1 + 0.5 * 4), 1 + 0.5 * 4]
    _, ret = gae(rewards, values, dones, torch.tensor([100.0]), gamma=0.5, lam=1.0)
    assert ret[:, 0].tolist() == [1.5, 1.0]


def test_lambda_one_gives_discounted_return_with_bootstrap():
    rewards = torch.tensor([[1.0], [2.0], [3.0]])
    values = torch.tensor([[0.5], [-1.0], [2.0]])
    ret = gae(rewards, values, torch.zeros(3, 1), torch.tensor([10.0]), gamma=0.5, lam=1.0)[1]
    # R_0 = 1 + .5·2 + .25·3 + .125·10
    assert ret[0, 0].item() == pytest.approx(1 + 1 + 0.75 + 1.25)
    assert ret[2, 0].item() == pytest.approx(3 + 5)


def test_done_stops_bootstrap():
    rewards = torch.tensor([[1.0], [1.0]])
    values = torch.tensor([[0.0], [0.0]])
    dones = torch.tensor([[0.0], [1.0]])
    adv, _ = gae(rewards, values, dones, torch.tensor([100.0]), gamma=1.0, lam=1.0)
    assert adv[:, 0].tolist() == [2.0, 1.0]


def test_bad_shapes_and_parameters_are_rejected():
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="bootstrap_value"):
        gae(x, x, x, torch.zeros(3), 0.9, 0.9)
    with pytest.raises(ValueError, match="one shape"):
        gae(x, torch.zeros(4, 3), x, torch.zeros(2), 0.9, 0.9)
    with pytest.raises(ValueError, match="gamma"):
        gae(x, x, x, torch.zeros(2), 1.5, 0.9)
    with pytest.raises(ValueError, match="truncated"):
        gae(x, x, x, torch.zeros(2), 0.9, 0.9, truncated=torch.zeros(3, 2, dtype=torch.bool))
