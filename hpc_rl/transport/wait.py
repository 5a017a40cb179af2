"""Waiting without spinning and without hanging: backoff polling under a deadline, and the errors it raises."""

from __future__ import annotations

import os
import time

from hpc_rl.transport.config import PollConfig


class TransportError(RuntimeError):
    """A protocol violation seen in the data (bad checksum, wrong sequence number): never retried, never ignored."""


class TransportTimeout(TransportError):
    """A peer did not answer within the deadline. Names the peer rank and the channel so the job log says who hung."""

    def __init__(self, channel: str, peer: int | None, what: str, waited_s: float):
        self.channel = channel
        self.peer = peer
        self.what = what
        self.waited_s = waited_s
        who = "no peer" if peer is None else f"rank {peer}"
        super().__init__(f"transport channel {channel!r}: {who} did not answer within {waited_s:.3f} s "
                         f"(waiting for {what})")


class Waiter:
    """One wait: call ``step()`` after every unsuccessful poll.

    For the first ``spin_s`` seconds a step only yields the core (``os.sched_yield``) and returns: an answer often
    arrives within microseconds. Later steps sleep, doubling from ``min_sleep_s`` to ``max_sleep_s``, so a rank
    waiting for seconds uses a few percent of a core. Past the deadline ``step()`` raises TransportTimeout.
    """

    __slots__ = ("_poll", "_deadline", "_start", "_spin_until", "_sleep", "channel", "peer", "what")

    def __init__(self, poll: PollConfig, timeout_s: float, channel: str, peer: int | None, what: str):
        self._poll = poll
        self._start = time.monotonic()
        self._deadline = self._start + timeout_s
        self._spin_until = self._start + poll.spin_s
        self._sleep = poll.min_sleep_s
        self.channel = channel
        self.peer = peer
        self.what = what

    def step(self) -> None:
        now = time.monotonic()
        if now >= self._deadline:
            raise TransportTimeout(self.channel, self.peer, self.what, now - self._start)
        if now < self._spin_until:
            os.sched_yield()
            return
        time.sleep(min(self._sleep, self._deadline - now))
        self._sleep = min(self._sleep * 2, self._poll.max_sleep_s)
