"""GAE(λ) against the definition Â_t = Σ_l (γλ)^l δ_{t+l}, summed until the game ends."""

import numpy as np
import pytest
import torch

from hpc_rl.algo.gae import gae


def reference_gae(rewards, values, dones, bootstrap, gamma, lam):
    """Written like Schulman et al. eq. (16), one (t, agent) at a time, with the bootstrap V(s_T)."""
    steps, agents = rewards.shape
    adv = np.zeros((steps, agents))
    for b in range(agents):
        v_next = [values[t + 1, b] if t + 1 < steps else bootstrap[b] for t in range(steps)]
        delta = [rewards[t, b] + gamma * (1 - dones[t, b]) * v_next[t] - values[t, b] for t in range(steps)]
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
