"""Masked categorical heads: illegal choices get −inf logits and can never be sampled.

A row whose mask is all False (no legal choice, e.g. no unit to target) would give NaN through a softmax of −inf
only. Such a row is computed as if every choice were legal, and reported unusable so that its log-probability and
entropy are left out of the action's totals (the environment ignores that head then).
"""

from __future__ import annotations

import torch


def masked_log_softmax(logits: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Returns (log-probabilities, the mask applied, whether the row had any legal choice)."""
    if mask.shape != logits.shape:
        raise ValueError(f"mask {tuple(mask.shape)} does not match logits {tuple(logits.shape)}")
    usable = mask.any(dim=-1)
    applied = mask | ~usable.unsqueeze(-1)
    return torch.log_softmax(logits.masked_fill(~applied, float("-inf")), dim=-1), applied, usable


def masked_entropy(logp: torch.Tensor, applied: torch.Tensor) -> torch.Tensor:
    """−Σ p log p over legal choices (an illegal choice has p = 0 and contributes 0, not 0 · −inf)."""
    return -(logp.exp() * logp.masked_fill(~applied, 0.0)).sum(dim=-1)


def sample(logp: torch.Tensor, deterministic: bool) -> torch.Tensor:
    """A choice per row: the most likely one, or a sample drawn by the Gumbel-max trick (−inf stays impossible)."""
    if deterministic:
        return logp.argmax(dim=-1)
    gumbel = -torch.log(-torch.log(torch.rand_like(logp).clamp_(1e-20, 1.0)))
    return (logp + gumbel).argmax(dim=-1)
