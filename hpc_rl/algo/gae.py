"""Generalised advantage estimation, GAE(λ) (Schulman et al. 2015), over segments with a bootstrap value.

Step ``t`` of a segment holds the observation ``s_t``, the action taken, the reward ``r_t`` that followed and
``done_t``, true when that step ended the game (the next observation is then the first of a new game, so nothing
flows back across it). The value of the observation after the last step, ``V(s_T)``, bootstraps the tail:

    δ_t = r_t + γ (1 − done_t) V(s_{t+1}) − V(s_t)
    Â_t = δ_t + γλ (1 − done_t) Â_{t+1},    Â_T = 0
    R_t = Â_t + V(s_t)                        (the value target)
"""

from __future__ import annotations

import torch


def gae(rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor, bootstrap_value: torch.Tensor,
        gamma: float, lam: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Advantages and value targets for time-major segments.

    ``rewards``, ``values``, ``dones``: (T, ...); ``bootstrap_value``: (...), the value of the observation after the
    last step. Returns ``(advantages, returns)``, both (T, ...), computed without gradient.
    """
    if rewards.shape != values.shape or rewards.shape != dones.shape:
        raise ValueError(f"rewards {tuple(rewards.shape)}, values {tuple(values.shape)} and dones "
                         f"{tuple(dones.shape)} must have one shape")
    if bootstrap_value.shape != rewards.shape[1:]:
        raise ValueError(f"bootstrap_value has shape {tuple(bootstrap_value.shape)}, expected {tuple(rewards.shape[1:])}")
    if not 0.0 <= gamma <= 1.0 or not 0.0 <= lam <= 1.0:
        raise ValueError(f"gamma ({gamma}) and lam ({lam}) must lie in [0, 1]")
    with torch.no_grad():
        not_done = 1.0 - dones.to(values.dtype)
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = rewards + gamma * not_done * next_values - values
        advantages = torch.empty_like(values)
        running = torch.zeros_like(bootstrap_value)
        for t in range(rewards.shape[0] - 1, -1, -1):
            running = deltas[t] + gamma * lam * not_done[t] * running
            advantages[t] = running
        return advantages, advantages + values
