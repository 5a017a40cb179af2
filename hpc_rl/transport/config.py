"""Transport configuration: which backend, how long to wait for a peer, how to poll."""

from __future__ import annotations

from dataclasses import dataclass, field

BACKENDS = ("auto", "rma", "twosided", "local")
FULL_POLICIES = ("block", "drop_oldest")


@dataclass(frozen=True)
class PollConfig:
    """How every waiting loop polls: yield-and-retry for a short while, then sleeps doubling up to a ceiling.

    The spin phase catches the common fast answer (a step reply within ~10-50 us) without paying a sleep: Linux
    sleeps last at least ~50-60 us even when asked for 1 us. Between spin polls the rank yields its core, so on
    an oversubscribed host the ranks it shares the core with still run. The ceiling bounds both the CPU an idle
    rank burns (one poll per ``max_sleep_s``) and the extra latency a message sees once a waiter backed off.
    """

    spin_s: float = 2e-4  # time spent polling with sched_yield before the first sleep
    min_sleep_s: float = 5e-5  # first sleep after the spin phase (about the shortest sleep Linux gives)
    max_sleep_s: float = 1e-3  # sleep ceiling; at 1 ms an idle rank polls ~1000 times a second (a few % of a core)

    def __post_init__(self) -> None:
        if not 0 <= self.spin_s <= 0.01:
            raise ValueError(f"spin_s must be in [0, 0.01] s (longer spins starve ranks sharing a core), "
                             f"got {self.spin_s}")
        if not 0 < self.min_sleep_s <= self.max_sleep_s:
            raise ValueError(f"need 0 < min_sleep_s <= max_sleep_s, got {self.min_sleep_s}, {self.max_sleep_s}")
        if self.max_sleep_s > 0.1:
            raise ValueError(f"max_sleep_s must be <= 0.1 s (it adds to every message's latency), "
                             f"got {self.max_sleep_s}")


@dataclass(frozen=True)
class TransportConfig:
    """Backend choice and the deadline after which a silent peer is an error."""

    backend: str = "auto"  # "auto": probe RMA at start-up and fall back to two-sided; "rma" / "twosided": forced;
    #   "local": ranks that are threads (or roles stepped by one thread) of one process, on a LocalWorld's
    #   communicators, with no MPI at all (local.py)
    timeout_s: float = 60.0  # a wait on one peer longer than this raises TransportTimeout naming the peer
    poll: PollConfig = field(default_factory=PollConfig)  # backoff of every waiting loop
    probe_hold_s: float = 0.3  # the probe's target stays out of MPI this long; RMA must complete well within it
    require_passive_progress: bool = True  # False: "auto" also takes RMA whose operations complete only while the
    #   target is inside MPI (osc/pt2pt across hosts). Every wait here calls MPI, so the protocol stays correct,
    #   but a writer then stalls while its target computes
    fp16_observations: bool = False  # float32 observation fields travel as float16 (the step requests and segments)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {self.backend!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")
        if not 0.01 <= self.probe_hold_s <= 10:
            raise ValueError(f"probe_hold_s must be in [0.01, 10] s, got {self.probe_hold_s}")


@dataclass(frozen=True)
class RingConfig:
    """Shape of one experience ring: ``slots`` fixed-size slots owned by one rank."""

    slots: int = 8  # segments the owner's window holds at once
    slot_bytes: int = 1 << 20  # largest segment payload, in bytes
    full_policy: str = "block"  # "block": writers wait for a free slot (exactly-once); "drop_oldest": counted drops
    checksums: bool = True  # XXH3 per segment, written by the writer and verified by the owner; off saves ~45 us
    #                         per MiB on each side and leaves torn-read protection to the slot protocol alone

    def __post_init__(self) -> None:
        if self.slots < 1:
            raise ValueError(f"slots must be >= 1, got {self.slots}")
        if self.slot_bytes < 1:
            raise ValueError(f"slot_bytes must be >= 1, got {self.slot_bytes}")
        if self.full_policy not in FULL_POLICIES:
            raise ValueError(f"full_policy must be one of {FULL_POLICIES}, got {self.full_policy!r}")
