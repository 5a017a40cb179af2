"""Transport: moves byte buffers with headers between MPI ranks. Knows no policy, no learning.

Three channels, one interface each (``channels.py``), two backends (``rma.py``: passive-target windows, the
default; ``twosided.py``: ``Isend``/``Irecv`` polled with ``Test``), chosen by ``TransportConfig.backend`` and a
start-up probe (``probe.py``)::

    transport = Transport(comm, TransportConfig())          # collective; runs the probe
    steps  = transport.step_exchange({env: inference, ...}, request_bytes, reply_bytes)
    ring   = transport.experience_ring(owner=learner, ring=RingConfig(slots=8, slot_bytes=segment_bytes))
    params = transport.parameter_channel(publisher=learner0, max_bytes=param_bytes)
    meta["transport"] = transport.meta()                     # backend and probe result, for meta.json

The protocol, in short (``docs/transport.md`` is the full specification: window layouts, header words, state
machines, which MPI call guarantees what):

- Publishing into another rank's window: ``Put`` payload and header words → ``Flush`` → ``Accumulate(REPLACE)``
  of the one commit word → ``Flush``. MPI does not order two operations to one target; completing the payload
  before the commit word is written is what makes "commit word seen ⇒ payload complete" true.
- Owners read their own windows under ``Lock_all(MODE_NOCHECK)``, calling ``Win.Sync`` before loading a commit
  word and again before loading what it guards.
- Step exchange: one request slot per env on its inference rank, one reply slot on each env; commit word = step
  sequence number. Experience ring: slot state words FREE → WRITING(ticket) → READY(ticket) changed only by
  ``Compare_and_swap`` (claim, steal under ``drop_oldest``, free) or by the claiming writer's ``Accumulate``
  (publish); a ticket counter (``Fetch_and_op``) orders puts. Parameters: a double buffer under a seqlock.
- Every wait polls with backoff under a deadline (``wait.py``) and raises ``TransportTimeout`` naming the peer
  rank and the channel.
"""

from __future__ import annotations

from collections.abc import Mapping

from hpc_rl.transport.channels import ExperienceRing, ParameterChannel, Segment, StepExchange
from hpc_rl.transport.config import PollConfig, RingConfig, TransportConfig
from hpc_rl.transport.layout import ArrayLayout, checksum, step_reply_layout, step_request_layout
from hpc_rl.transport.probe import ProbeResult, probe_backend
from hpc_rl.transport.rma import RmaExperienceRing, RmaParameterChannel, RmaStepExchange
from hpc_rl.transport.twosided import TwoSidedExperienceRing, TwoSidedParameterChannel, TwoSidedStepExchange
from hpc_rl.transport.wait import TransportError, TransportTimeout

__all__ = [
    "ArrayLayout", "ExperienceRing", "ParameterChannel", "PollConfig", "ProbeResult", "RingConfig", "Segment",
    "StepExchange", "Transport", "TransportConfig", "TransportError", "TransportTimeout", "checksum",
    "probe_backend", "step_reply_layout", "step_request_layout",
]

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
