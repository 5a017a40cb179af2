"""PPO losses: dual-clip policy loss (Honor of Kings, Ye et al. 2020), value loss, entropy bonus.

Every loss is returned as a quantity to *minimise* and averaged over the samples whose ``weights`` are 1 (steps
played by past-version opponents or padding carry weight 0).
"""

from __future__ import annotations

import torch

from hpc_rl.algo.reduce import Reduce, identity_reduce


def dual_clip_policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor,
                          clip_eps: float = 0.2, dual_clip: float | None = 3.0,
                          weights: torch.Tensor | None = None) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """The negated dual-clip PPO objective, Honor of Kings eq. (5).

    ``logp`` and ``old_logp`` are log π(a|s) of the whole decoupled action, i.e. the sum of the per-head
    log-probabilities of the heads the primary action uses (eq. 3 treats the heads as independent), so
    r = exp(logp − old_logp) is the joint ratio. For Â ≥ 0 the objective is PPO's
    min(r Â, clip(r, 1−ε, 1+ε) Â); for Â < 0 it is further bounded below by c Â, so a huge ratio on a stale
    sample cannot produce an unbounded loss. ``dual_clip=None`` gives plain PPO.
    """
    if dual_clip is not None and dual_clip <= 1.0:
        raise ValueError(f"dual_clip must be > 1 (the paper's c), got {dual_clip}")
    if clip_eps <= 0.0:
        raise ValueError(f"clip_eps must be > 0, got {clip_eps}")
    log_ratio = logp - old_logp
    ratio = torch.exp(log_ratio)
    clipped = torch.min(ratio * advantages, torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages)
    objective = clipped
    if dual_clip is not None:
        objective = torch.where(advantages < 0, torch.max(clipped, dual_clip * advantages), clipped)
    loss = -weighted_mean(objective, weights)
    with torch.no_grad():
        stats = {
            "clip_fraction": weighted_mean(((ratio - 1.0).abs() > clip_eps).to(ratio.dtype), weights),
            # Schulman's low-variance estimator of KL(old || new).
            "approx_kl": weighted_mean((ratio - 1.0) - log_ratio, weights),
        }
    return loss, stats


def value_loss(values: torch.Tensor, old_values: torch.Tensor, returns: torch.Tensor, clip_eps: float | None = None,
               weights: torch.Tensor | None = None) -> torch.Tensor:
    """½ (V − R)²; with ``clip_eps`` the pessimistic max with the value clipped to old ± ε (PPO2's value clip)."""
    unclipped = (values - returns) ** 2
    if clip_eps is not None:
        if clip_eps <= 0.0:
            raise ValueError(f"value clip_eps must be > 0 or None, got {clip_eps}")
        clipped_values = old_values + torch.clamp(values - old_values, -clip_eps, clip_eps)
        unclipped = torch.max(unclipped, (clipped_values - returns) ** 2)
    return 0.5 * weighted_mean(unclipped, weights)


def entropy_bonus(entropy: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Mean entropy of the decoupled action (the sum of the used heads' entropies); the loss subtracts coef × this."""
    return weighted_mean(entropy, weights)


def kickstart_loss(teacher_logp: torch.Tensor, weights: torch.Tensor | None = None) -> torch.Tensor:
    """Kickstarting's distillation term (Schmitt et al. 2018) for a teacher that plays one action: the cross-entropy
    H(π_teacher, π) = −log π(a_teacher | s), averaged over the samples whose teacher action is legal for the policy
    (a teacher the masks forbid would give −log 0 = ∞; such samples are left out)."""
    legal = torch.isfinite(teacher_logp)
    w = legal.to(teacher_logp.dtype) if weights is None else weights * legal
    return weighted_mean(torch.where(legal, -teacher_logp, 0.0), w)


def weighted_mean(x: torch.Tensor, weights: torch.Tensor | None) -> torch.Tensor:
    if weights is None:
        return x.mean()
    return (x * weights).sum() / weights.sum().clamp_min(1.0)


def normalize_advantages(advantages: torch.Tensor, weights: torch.Tensor | None = None,
                         reduce: Reduce = identity_reduce, eps: float = 1e-8) -> torch.Tensor:
    """(Â − mean) / (std + eps) with mean and std over the samples of *every* learner.

    ``reduce`` sums a tensor over the learners (identity for one), so each learner normalises by the statistics of
    the global batch and the averaged gradient is the gradient of the global loss.
    """
    w = torch.ones_like(advantages) if weights is None else weights.to(advantages.dtype)
    with torch.no_grad():
        moments = reduce(torch.stack([w.sum(), (w * advantages).sum(), (w * advantages ** 2).sum()]).double())
        count = moments[0].clamp_min(1.0)
        mean = moments[1] / count
        var = (moments[2] / count - mean ** 2).clamp_min(0.0)
    return (advantages - mean.to(advantages.dtype)) / (var.sqrt().to(advantages.dtype) + eps)
