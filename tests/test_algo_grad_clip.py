"""OpenAI Five's per-parameter clip to ±5√v̂ against values computed by hand from the recurrence."""

import math

import pytest
import torch

from hpc_rl.algo.grad_clip import SecondMomentClip, second_moment_clip


def test_first_step_never_clips():
    # v̂_1 = g², so the bound is 5|g|.
    g = torch.tensor([3.0, -0.01])
    clipped, v = second_moment_clip(g, torch.zeros(2), step=1, beta=0.999)
    assert clipped.tolist() == g.tolist()
    assert v.tolist() == pytest.approx([0.001 * 9, 0.001 * 1e-4])


def test_spike_after_steady_gradient_is_clipped_to_hand_computed_bound():
    beta, n, spike = 0.99, 50, 20.0
    # n steps of g = 1: v_n = 1 − β^n; then g = spike: v = β v_n + (1 − β) spike², v̂ = v / (1 − β^(n+1)).
    v_hat = (beta * (1 - beta ** n) + (1 - beta) * spike ** 2) / (1 - beta ** (n + 1))
    bound = 5 * math.sqrt(v_hat)
    assert bound == pytest.approx(16.55, abs=0.01) and bound < spike

    v = torch.zeros(3)
    for step in range(1, n + 1):
        _, v = second_moment_clip(torch.ones(3), v, step, beta)
    clipped, v = second_moment_clip(torch.tensor([spike, -spike, 1.0]), v, n + 1, beta)
    assert clipped[0].item() == pytest.approx(bound, rel=1e-5)
    assert clipped[1].item() == pytest.approx(-bound, rel=1e-5)
    assert clipped[2].item() == 1.0
    assert v[0].item() == pytest.approx(beta * (1 - beta ** n) + (1 - beta) * spike ** 2, rel=1e-5)


def test_clip_keeps_its_own_moment_apart_from_adam_and_clips_the_averaged_gradient():
    param = torch.nn.Parameter(torch.zeros(2))
    other_learner_grad = torch.tensor([1.0, 3.0])
    clip = SecondMomentClip([param], beta=0.99, allreduce_mean=lambda g: (g + other_learner_grad) / 2)
    adam = torch.optim.Adam([param], lr=0.1)
    for step in range(1, 61):
        param.grad = torch.tensor([1.0, 1.0 if step < 60 else 101.0])
        clip()
        if step < 60:
            assert param.grad.tolist() == [1.0, 2.0]  # the average of the two learners' gradients
        adam.step()
    # On the spike the averaged gradient is (101 + 3) / 2 = 52; v saw 52 unclipped, Adam saw the clipped value.
    v_hat = clip.v[1].item() / (1 - 0.99 ** 60)
    assert param.grad[1].item() == pytest.approx(5 * math.sqrt(v_hat), rel=1e-5)
    assert param.grad[1].item() < 52.0
    expected_v = sum(0.01 * 0.99 ** (60 - s) * (4.0 if s < 60 else 52.0 ** 2) for s in range(1, 61))
    assert clip.v[1].item() == pytest.approx(expected_v, rel=1e-5)
    assert adam.state[param]["exp_avg_sq"][1].item() < expected_v


def test_state_round_trip_and_bad_arguments():
    p = torch.nn.Parameter(torch.zeros(1))
    clip = SecondMomentClip([p])
    p.grad = torch.ones(1)
    clip()
    again = SecondMomentClip([p])
    again.load_state_dict(clip.state_dict())
    assert again.step == 1 and torch.equal(again.v, clip.v)
    with pytest.raises(ValueError, match="step"):
        second_moment_clip(torch.ones(1), torch.zeros(1), step=0)
    with pytest.raises(ValueError, match="beta"):
        SecondMomentClip([p], beta=1.0)


def test_gradients_accumulate_into_the_flat_buffer():
    model = torch.nn.Linear(3, 2)
    clip = SecondMomentClip(model.parameters())
    optimizer = torch.optim.Adam(model.parameters())
    for _ in range(2):
        optimizer.zero_grad(set_to_none=False)
        model(torch.ones(1, 3)).sum().backward()
        clip()
        optimizer.step()
    assert all(p.grad is view for p, view in zip(model.parameters(), clip.views))
    # d(sum of outputs)/d(weight) = 1 for every weight entry and bias: the flat buffer holds exactly that.
    assert clip.flat.tolist() == [1.0] * 8
