"""Policy networks: one family for every environment spec (entity encoders, LSTM core, decoupled masked heads)."""

from hpc_rl.model.config import ModelConfig
from hpc_rl.model.device import select_device, to_device
from hpc_rl.model.policy import Policy, PolicyStep

__all__ = ["ModelConfig", "Policy", "PolicyStep", "select_device", "to_device"]
