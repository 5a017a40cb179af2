"""Dual-clip PPO (Honor of Kings eq. 5), value loss and advantage normalisation against hand computations."""

import math

import pytest
import torch

from hpc_rl.algo.ppo import (
    dual_clip_policy_loss,
    entropy_bonus,
    normalize_advantages,
    value_loss,
)


def reference_objective(ratio, adv, eps, c):
    """Ê_t[max(min(r Â, clip(r, 1−ε, 1+ε) Â), c Â)] for Â < 0, PPO's min(...) otherwise, one sample at a time."""
    clipped = min(ratio * adv, min(max(ratio, 1 - eps), 1 + eps) * adv)
    return max(clipped, c * adv) if adv < 0 else clipped


# (ratio, advantage, the objective worked out by hand with ε = 0.2, c = 3)
CASES = [
    (1.5, 1.0, 1.2),    # A > 0, ratio above 1+ε: clipped to 1.2 A
    (0.5, 1.0, 0.5),    # A > 0, ratio below 1−ε: the unclipped r A is smaller
    (1.1, 2.0, 2.2),    # inside the trust region
    (0.5, -1.0, -0.8),  # A < 0, ratio below 1−ε: clipped to 0.8 A
    (1.5, -1.0, -1.5),  # A < 0, ratio above 1+ε: r A, still above c A
    (5.0, -1.0, -3.0),  # A < 0, huge ratio: bounded below by c A (the dual clip)
    (10.0, -0.5, -1.5),
    (10.0, 2.0, 2.4),   # A > 0: the dual clip does not apply
]


def test_hand_picked_values():
    ratio = torch.tensor([r for r, _, _ in CASES], dtype=torch.float64)
    adv = torch.tensor([a for _, a, _ in CASES], dtype=torch.float64)
    for (r, a, by_hand) in CASES:
        assert reference_objective(r, a, 0.2, 3.0) == pytest.approx(by_hand)
    loss, _ = dual_clip_policy_loss(torch.log(ratio), torch.zeros_like(ratio), adv, 0.2, 3.0)
    assert loss.item() == pytest.approx(-sum(h for _, _, h in CASES) / len(CASES))


def test_matches_reference_on_a_grid_and_plain_ppo_differs_only_below_c():
    for r in (0.1, 0.79, 0.8, 1.0, 1.19, 1.21, 2.0, 2.9, 3.5, 50.0):
        for a in (-2.0, -0.3, 0.0, 0.4, 3.0):
            t = torch.tensor([math.log(r)], dtype=torch.float64)
            adv = torch.tensor([a], dtype=torch.float64)
            dual, _ = dual_clip_policy_loss(t, torch.zeros(1, dtype=torch.float64), adv, 0.2, 3.0)
            plain, _ = dual_clip_policy_loss(t, torch.zeros(1, dtype=torch.float64), adv, 0.2, None)
            assert -dual.item() == pytest.approx(reference_objective(r, a, 0.2, 3.0))
            assert (dual.item() != pytest.approx(plain.item())) == (a < 0 and r * a < 3.0 * a)


def test_ratio_is_of_summed_head_logps_and_clipped_samples_have_no_gradient():
    # Two heads: log π = log π_action + log π_target, so the ratio is the product of the per-head ratios.
    head_new = torch.tensor([[math.log(2.0), math.log(2.5)], [math.log(1.05), 0.0]], requires_grad=True)
    head_old = torch.zeros(2, 2)
    adv = torch.tensor([-1.0, 1.0])
    loss, stats = dual_clip_policy_loss(head_new.sum(dim=1), head_old.sum(dim=1), adv)
    # sample 0: r = 5, Â = −1 → c Â = −3 (constant); sample 1: r = 1.05 → r Â
    assert loss.item() == pytest.approx(-(-3.0 + 1.05) / 2)
    loss.backward()
    assert head_new.grad[0].tolist() == [0.0, 0.0]
    assert head_new.grad[1, 0].item() == pytest.approx(-1.05 / 2)
    assert stats["clip_fraction"].item() == pytest.approx(0.5)


def test_weights_exclude_samples():
    logp = torch.tensor([0.0, math.log(5.0)])
    loss, _ = dual_clip_policy_loss(logp, torch.zeros(2), torch.tensor([1.0, -1.0]), weights=torch.tensor([1.0, 0.0]))
    assert loss.item() == pytest.approx(-1.0)


def test_value_loss_clipped_and_unclipped():
    values = torch.tensor([1.0, 3.0])
    old = torch.tensor([0.0, 0.0])
    returns = torch.tensor([2.0, 0.0])
    assert value_loss(values, old, returns).item() == pytest.approx(0.5 * (1 + 9) / 2)
    # clipped: V clipped to old ± .5 → [.5, .5]; max((V−R)², (Vc−R)²) = [max(1, 2.25), max(9, .25)]
    assert value_loss(values, old, returns, clip_eps=0.5).item() == pytest.approx(0.5 * (2.25 + 9) / 2)


def test_entropy_bonus_is_weighted_mean():
    assert entropy_bonus(torch.tensor([1.0, 3.0, 100.0]), torch.tensor([1.0, 1.0, 0.0])).item() == pytest.approx(2.0)


def test_normalized_advantages_use_global_statistics():
    torch.manual_seed(0)
    adv = torch.randn(64, 4, dtype=torch.float64) * 3 + 1
    whole = normalize_advantages(adv)
    assert whole.mean().item() == pytest.approx(0.0, abs=1e-9)
    assert whole.std(unbiased=False).item() == pytest.approx(1.0, abs=1e-6)

    halves = adv[:, :2], adv[:, 2:]
    sent = []
    normalize_advantages(halves[1], reduce=lambda x: sent.append(x) or x)  # what learner 1 contributes
    as_learner_0 = normalize_advantages(halves[0], reduce=lambda x: x + sent[0])
    torch.testing.assert_close(as_learner_0, whole[:, :2])
    assert not torch.allclose(normalize_advantages(halves[0]), whole[:, :2])


def test_bad_clip_parameters_are_rejected():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="dual_clip"):
        dual_clip_policy_loss(x, x, x, dual_clip=0.5)
    with pytest.raises(ValueError, match="clip_eps"):
        dual_clip_policy_loss(x, x, x, clip_eps=0.0)
