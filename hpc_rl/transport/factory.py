"""``Transport``: the backend chosen for one communicator at start-up, and the factory of its channels."""

from __future__ import annotations

from collections.abc import Mapping

from hpc_rl.transport.channels import ExperienceRing, ParameterChannel, StepExchange
from hpc_rl.transport.config import RingConfig, TransportConfig
from hpc_rl.transport.layout import ArrayLayout, step_request_layout
from hpc_rl.transport.probe import ProbeResult, probe_backend
from hpc_rl.transport.rma import RmaExperienceRing, RmaParameterChannel, RmaStepExchange
from hpc_rl.transport.twosided import TwoSidedExperienceRing, TwoSidedParameterChannel, TwoSidedStepExchange

_IMPLEMENTATIONS = {
    "rma": (RmaStepExchange, RmaExperienceRing, RmaParameterChannel),
    "twosided": (TwoSidedStepExchange, TwoSidedExperienceRing, TwoSidedParameterChannel),
}


class Transport:
    """The backend for one communicator, chosen once at start-up; makes channels (each creation is collective)."""

    def __init__(self, comm, config: TransportConfig | None = None, probe: ProbeResult | None = None):
        self.comm = comm
        self.config = config or TransportConfig()
        self.probe = probe if probe is not None else probe_backend(comm, self.config)
        self.backend = self.probe.backend
        self._step, self._ring, self._params = _IMPLEMENTATIONS[self.backend]

    def step_exchange(self, clients: Mapping[int, int], request_bytes: int, reply_bytes: int) -> StepExchange:
        """``clients`` maps every env rank to the inference rank serving it."""
        return self._step(self.comm, self.config, clients, request_bytes, reply_bytes)

    def step_request_layout(self, observation_shapes, num_envs: int, num_agents: int,
                            num_reward_events: int) -> ArrayLayout:
        """The env → inference message layout, observations in FP16 if ``config.fp16_observations``."""
        return step_request_layout(observation_shapes, num_envs, num_agents, num_reward_events,
                                   self.config.fp16_observations)

    def experience_ring(self, owner: int, ring: RingConfig) -> ExperienceRing:
        return self._ring(self.comm, self.config, owner, ring)

    def parameter_channel(self, publisher: int, max_bytes: int) -> ParameterChannel:
        return self._params(self.comm, self.config, publisher, max_bytes)

    def meta(self) -> dict:
        """What meta.json records about the transport."""
        return {"backend": self.backend, "probe": self.probe.as_dict()}
