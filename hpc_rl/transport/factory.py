"""``Transport``: the backend chosen for one communicator at start-up, and the factory of its channels."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from hpc_rl.transport.channels import ExperienceRing, ParameterChannel, StepExchange
from hpc_rl.transport.config import RingConfig, TransportConfig
from hpc_rl.transport.local import LocalComm

if TYPE_CHECKING:
    from hpc_rl.transport.probe import ProbeResult

# Each backend's module and its step exchange, ring and parameter channel classes. Modules are imported when a
# Transport picks them: rma and twosided import mpi4py.MPI, which initialises MPI, and the local backend runs in
# processes that never do.
_IMPLEMENTATIONS = {
    "rma": ("rma", ("RmaStepExchange", "RmaExperienceRing", "RmaParameterChannel")),
    "twosided": ("twosided", ("TwoSidedStepExchange", "TwoSidedExperienceRing", "TwoSidedParameterChannel")),
    "local": ("local", ("LocalStepExchange", "LocalExperienceRing", "LocalParameterChannel")),
}


class Transport:
    """The backend for one communicator, chosen once at start-up; makes channels (each creation is collective).

    ``comm`` is an MPI communicator, or for ``backend="local"`` a ``LocalWorld.comm(rank)``: the local backend runs
    no probe and never imports mpi4py.
    """

    def __init__(self, comm, config: TransportConfig | None = None, probe: ProbeResult | None = None):
        self.comm = comm
        self.config = config or TransportConfig()
        if isinstance(comm, LocalComm) != (self.config.backend == "local"):
            raise ValueError(f"backend {self.config.backend!r} on a communicator of type {type(comm).__name__}: the "
                             f"local backend, and only it, runs on a LocalWorld's communicators "
                             f"(LocalWorld.comm(rank))")
        if self.config.backend == "local":
            self.probe = None
            self.backend = "local"
        else:
            from hpc_rl.transport.probe import probe_backend  # imports mpi4py.MPI

            self.probe = probe if probe is not None else probe_backend(comm, self.config)
            self.backend = self.probe.backend
        module, classes = _IMPLEMENTATIONS[self.backend]
        module = importlib.import_module(f"hpc_rl.transport.{module}")
        self._step, self._ring, self._params = (getattr(module, name) for name in classes)

    def step_exchange(self, clients: Mapping[int, int], request_bytes: int, reply_bytes: int) -> StepExchange:
        """``clients`` maps every env rank to the inference rank serving it."""
        return self._step(self.comm, self.config, clients, request_bytes, reply_bytes)

    def experience_ring(self, owner: int, ring: RingConfig) -> ExperienceRing:
        return self._ring(self.comm, self.config, owner, ring)

    def parameter_channel(self, publisher: int, max_bytes: int) -> ParameterChannel:
        return self._params(self.comm, self.config, publisher, max_bytes)

    def meta(self) -> dict:
        """What meta.json records about the transport: the backend, and the probe's result (None for local)."""
        return {"backend": self.backend, "probe": None if self.probe is None else self.probe.as_dict()}
