"""Nested states (state_dicts, optimiser states) between torch tensors and numpy arrays, for storage."""

from __future__ import annotations

import numpy as np
import torch


def to_numpy_tree(obj):
    """Tensors in a nested state (state_dicts) to numpy arrays, for storage."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().cpu().numpy()
    if isinstance(obj, dict):
        return {k: to_numpy_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_numpy_tree(v) for v in obj)
    return obj


def to_torch_tree(obj):
    """The inverse of ``to_numpy_tree``."""
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.array(obj))
    if isinstance(obj, dict):
        return {k: to_torch_tree(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(to_torch_tree(v) for v in obj)
    return obj
