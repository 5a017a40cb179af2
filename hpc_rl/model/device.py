"""Where the policy runs: a GPU if the process has one, else the CPU."""

from __future__ import annotations

import numpy as np
import torch


def select_device(prefer: str = "auto", gpu_slot: int = 0) -> torch.device:
    """``auto``: the rank's GPU where CUDA is available, else ``cpu``; ``cuda``: the rank's GPU, or an error without
    one; ``cpu`` or ``cuda:N``: that device. The rank's GPU is ``cuda:<gpu_slot mod #GPUs>``, ``gpu_slot`` being its
    place among the GPU-using ranks of its node (``hpc_rl.topology.gpu_slots``), so they spread over its GPUs."""
    if prefer == "auto" and not torch.cuda.is_available():
        return torch.device("cpu")
    if prefer.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {prefer!r} requested but CUDA is not available")
    if prefer in ("auto", "cuda"):
        return torch.device("cuda", gpu_slot % torch.cuda.device_count())
    return torch.device(prefer)


def to_device(arrays: dict[str, np.ndarray], device: torch.device, pin: bool = True) -> dict[str, torch.Tensor]:
    """Numpy arrays to tensors on ``device``; to a GPU through pinned memory and asynchronous copies (``pin``), or
    plain copies from pageable memory (``pin=False``; ``python -m hpc_rl.bench gpu --parts inference`` times both)."""
    out = {}
    for key, value in arrays.items():
        tensor = torch.from_numpy(np.ascontiguousarray(value))
        if device.type == "cuda":
            tensor = tensor.pin_memory().to(device, non_blocking=True) if pin else tensor.to(device)
        out[key] = tensor
    return out
