"""Generalised advantage estimation, GAE(λ) (Schulman et al. 2015), over segments with a bootstrap value.

Step ``t`` of a segment holds the observation ``s_t``, the action taken, the reward ``r_t`` that followed and
``done_t``, true when that step ended the game (the next observation is then the first of a new game, so nothing
flows back across it). The value of the observation after the last step, ``V(s_T)``, bootstraps the tail:

    δ_t = r_t + γ (1 − done_t) V(s_{t+1}) + γ trunc_t V(s_t) − V(s_t)
    Â_t = δ_t + γλ (1 − done_t) Â_{t+1},    Â_T = 0
    R_t = Â_t + V(s_t)                        (the value target)

``trunc_t`` (0 unless given) marks a game that a time limit ended rather than a terminal state (Pardo et al. 2018,
"Time Limits in Reinforcement Learning"): the game would have gone on, so its return past the limit is bootstrapped
rather than taken as 0. The observation after the limit is not kept (the copy was reset in the same step), so its
value is approximated by the last one's, V(s_t), as the massively parallel PPO of rl_games and rsl_rl do. Without
it, a policy that keeps the game alive to the limit is told that the limit's approach is a failure it cannot see
(the observation holds no clock), and a solved CartPole policy can drift off 500.
"""

from __future__ import annotations

import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, bootstrap_value: torch.Tensor,
        gamma: float, lam: float, truncated: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and value targets for time-major segments.

    ``rewards``, ``values``, ``dones`` and ``truncated`` (where a time limit ended the game; a subset of ``dones``):
    (T, ...); ``bootstrap_value``: (...), the value of the observation after the last step. Returns
    ``(advantages, returns)``, both (T, ...), computed without gradient.
    """
    if rewards.shape != values.shape or rewards.shape != dones.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and dones "
                         f"{tuple(dones.shape)} must have one shape")
    if truncated is not None and truncated.shape != dones.shape:
        raise ValueError(f"truncated {tuple(truncated.shape)} must have the shape of dones {tuple(dones.shape)}")
    if bootstrap_value.shape != rewards.shape[1:]:
        raise ValueError(f"bootstrap_value has shape {tuple(bootstrap_value.shape)}, expected {tuple(rewards.shape[1:])}")
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gamma ({gamma}) and lam ({lam}) must lie in [0, 1]")
    with torch.no_grad():
        not_done = 1.0 - dones.to(values.dtype)
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = rewards + gamma * not_done * next_values - values
        if truncated is not None:
            deltas = deltas + gamma * truncated.to(values.dtype) * values
        advantages = torch.empty_like(values)
        running = torch.zeros_like(bootstrap_value)
        for t in range(rewards.shape[0] - 1, -1, -1):
            running = deltas[t] + gamma * lam * not_done[t] * running
            advantages[t] = running
        return advantages, advantages + values
