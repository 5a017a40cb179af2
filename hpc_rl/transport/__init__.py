"""Transport: moves byte buffers with headers between MPI ranks, or between ranks in one process. Knows no policy,
no learning.

Three channels, one interface each (``channels.py``), three backends: two over MPI (``rma.py``: passive-target
windows, the default; ``twosided.py``: ``Isend``/``Irecv`` polled with ``Test``), chosen by
``TransportConfig.backend`` and a start-up probe (``probe.py``), and ``local.py`` for ranks that live in one
process (threads, or roles stepped by one thread) with no MPI at all::

    transport = Transport(comm, TransportConfig())          # collective; runs the probe
    steps  = transport.step_exchange({env: inference, ...}, request_bytes, reply_bytes)
    ring   = transport.experience_ring(owner=learner, ring=RingConfig(slots=8, slot_bytes=segment_bytes))
    params = transport.parameter_channel(publisher=learner0, max_bytes=param_bytes)
    meta["transport"] = transport.meta()                     # backend and probe result, for meta.json

    world = LocalWorld(4)                                    # or: 4 ranks of this process, the same channels
    transport = Transport(world.comm(rank), TransportConfig(backend="local"))

The protocol, in short (``docs/transport.md`` is the full specification: window layouts, header words, state
machines, which MPI call guarantees what):

- Publishing into another rank's window: ``Put`` payload and header words → ``Flush`` → ``Accumulate(REPLACE)``
  of the one commit word → ``Flush``. MPI does not order two operations to one target; completing the payload
  before the commit word is written is what makes "commit word seen ⇒ payload complete" true.
- Owners read their own windows under ``Lock_all(MODE_NOCHECK)``, calling ``Win.Sync`` before loading a commit
  word and again before loading what it guards.
- Step exchange: one request slot per env on its inference rank, one reply slot on each env; commit word = step
  sequence number. Experience ring: a ticket counter (``Fetch_and_op``) orders puts, ticket t going to slot
  t mod N; slot state words FREE(t) → READY(t) (→ TAKEN(t) under ``drop_oldest``) → FREE(t + N). FREE(t) admits
  only the writer holding ticket t, so claiming a slot is a read (``Get_accumulate``), and a batch of segments
  (``put_many``) costs one ticket call, one ``Flush`` of its payloads and one READY store per run of slots;
  ``Compare_and_swap`` serves ``drop_oldest`` (a writer stealing READY(t − N), the owner's take). The owner reads
  READY slots in place (``take_view``/``release``) or copies them out (``poll``), taking a segment only once the
  one its writer put before it (named in its header) was handed out, so each writer's order holds; tickets a put
  gave up on are filled with void rows by the writer's next put. The ring's MPI calls (a
  writer's batch, an owner's take and free) are issued from C, by ``_ring.c``. Parameters: a double buffer under
  a seqlock.
- Local: each channel's state is shared by its ranks under one lock; payloads are copied in, the ring lends
  read-only views of its slots, creation matches the ranks' channels by their order without waiting.
- Every wait polls with backoff under a deadline (``wait.py``) and raises ``TransportTimeout`` naming the peer
  rank and the channel.
"""

from __future__ import annotations

import importlib

# Names are loaded on first use (PEP 562): importing the configuration (``hpc_rl.transport.config``) must not import
# mpi4py.MPI, which initialises MPI; a process that only builds configs (a Hydra sweep's submitter), or only uses
# the local backend, stays MPI-free.
_EXPORTS = {
    "ArrayLayout": "layout", "checksum": "layout",
    "LocalWorld": "local",
    "ExperienceRing": "channels", "ParameterChannel": "channels", "Segment": "channels", "StepExchange": "channels",
    "PollConfig": "config", "RingConfig": "config", "TransportConfig": "config",
    "ProbeResult": "probe", "probe_backend": "probe",
    "Transport": "factory",
    "TransportError": "wait", "TransportTimeout": "wait",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
