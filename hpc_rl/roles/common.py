"""What every role shares: waiting with backoff and heartbeats, seeding, logging, stop signals."""

from __future__ import annotations

import hashlib
import logging
import math
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hpc_rl.config import TrainConfig
from hpc_rl.data.batch import SegmentSchema
from hpc_rl.envs.api import EnvSpec
from hpc_rl.launch import STOP_SIGNALS, take_held_stop_signals
from hpc_rl.model.policy import Policy
from hpc_rl.populations import population_learners
from hpc_rl.roles.control import ControlLink
from hpc_rl.roles.protocol import decode_parameters, parameter_bytes, reply_layout, request_layout
from hpc_rl.storage.layout import RunLayout
from hpc_rl.topology import Role, Topology
from hpc_rl.transport import ExperienceRing, ParameterChannel, RingConfig, StepExchange, Transport
from hpc_rl.transport.config import PollConfig
from hpc_rl.transport.wait import TransportTimeout, Waiter


@dataclass
class Channels:
    """A rank's ends of a run's channels."""

    rings: list[ExperienceRing]  # every learner's experience ring, in learner order
    params: list[ParameterChannel]  # one per population (hpc_rl.populations), published by its first learner
    steps: StepExchange  # every env rank with the inference rank serving it

    def close(self) -> list:
        """Collectively, in the same order on every rank (rings first). Returns the segments this rank's ring took
        while closing: they arrived after the stop and are not trained on."""
        extra = [segment for ring in self.rings for segment in ring.close()]
        for params in self.params:
            params.close()
        self.steps.close()
        return extra


def open_channels(transport: Transport, config: TrainConfig, spec: EnvSpec | None, topology: Topology) -> Channels:
    """Every channel of a run; creation is collective, so every rank calls this with the same arguments. Go
    (``env.name=go``, no ``spec``): a ring slot holds one game's record, the step messages a search step's leaves."""
    learners, env_ranks = topology.ranks(Role.LEARNER), topology.ranks(Role.ENV)
    n, fp16 = config.env.num_envs, config.transport.fp16_observations
    if config.env.is_go:
        from hpc_rl.data.batch import GameSchema
        from hpc_rl.model.go_net import GoNet
        from hpc_rl.roles.protocol import go_reply_layout, go_request_layout

        go = config.env.go
        leaves = n * go.search.leaves_per_game
        slot_bytes = GameSchema(go.board_size, go.game_length).layout.nbytes
        param_bytes = parameter_bytes(GoNet(go.net, go.board_size))
        step_bytes = (go_request_layout(leaves, go.board_size).nbytes, go_reply_layout(leaves, go.board_size).nbytes)
    else:
        slot_bytes = SegmentSchema.of_run(config, spec).layout.nbytes
        param_bytes = parameter_bytes(Policy(spec, config.model))
        step_bytes = (request_layout(spec, n, fp16).nbytes, reply_layout(spec, n).nbytes)
    ring = RingConfig(slots=config.pipeline.ring_slots, slot_bytes=slot_bytes, full_policy=config.pipeline.full_policy)
    rings = [transport.experience_ring(owner=r, ring=ring) for r in learners]
    params = [transport.parameter_channel(publisher=learners[group[0]], max_bytes=param_bytes)
              for group in population_learners(len(learners), config.populations)]
    clients = {e: topology.inference_for_env(i) for i, e in enumerate(env_ranks)}
    steps = transport.step_exchange(clients, *step_bytes)
    return Channels(rings, params, steps)


def wait_requests(exchange: StepExchange, link: ControlLink, config: TrainConfig,
                  env_ranks: set[int]) -> dict[int, np.ndarray]:
    """An inference rank's wait for one request from every live env rank; beats while waiting; names a silent env
    rank past the deadline."""
    got: dict[int, np.ndarray] = {}
    waiter = Waiter(config.transport.poll, config.transport.timeout_s, "step", None, "requests")
    while True:
        got.update(exchange.poll_requests())
        missing = env_ranks - set(got)
        if not missing:
            return got
        waiter.peer = min(missing)
        link.beat()
        waiter.step()


def pull_parameters(params: ParameterChannel, link: ControlLink, config: TrainConfig, module, wait: bool) -> int | None:
    """Load newer published parameters into ``module`` (waiting for the first ones with ``wait``); their version,
    or None if none were newer."""
    if wait:
        got = patiently(lambda timeout: params.wait_version(1, timeout), link, config.transport.timeout_s)
    else:
        got = params.poll()
    return None if got is None else decode_parameters(got[1], module)


def seed_for(seed: int, rank: int, version: int) -> int:
    """Env ranks are reseeded from (seed, rank, version), so a resumed run does not replay its first games."""
    digest = hashlib.sha256(f"{seed}/{rank}/{version}".encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


class Backoff:
    """Between polls of a role's main loop: the transport's backoff (yield, then doubling sleeps), no deadline."""

    def __init__(self, poll: PollConfig):
        self.poll = poll
        self.reset()

    def reset(self) -> None:
        self._waiter = Waiter(self.poll, math.inf, "control", None, "work")

    def wait(self) -> None:
        self._waiter.step()


def patiently(call, link: ControlLink, timeout_s: float):
    """``call(timeout)`` in slices of one heartbeat period, beating between them, for at most ``timeout_s``.

    A rank waiting on a peer is alive: it keeps beating, so the controller names the silent peer, not the waiter.
    ``call`` must be safe to repeat after a TransportTimeout (the transport's waits are).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return call(min(link.heartbeat_s, max(deadline - time.monotonic(), 1e-3)))
        except TransportTimeout:
            if time.monotonic() >= deadline:
                raise
            link.beat()


def setup_logging(run_dir: Path, rank: int, role: str) -> logging.Logger:
    """One log file per rank (``logs/rank_<k>.log``); the controller also logs to stdout."""
    layout = RunLayout(run_dir)
    layout.logs.mkdir(parents=True, exist_ok=True)
    fmt = logging.Formatter(f"%(asctime)s {role} r{rank} %(levelname)s %(name)s: %(message)s")
    root = logging.getLogger()
    root.setLevel(logging.INFO)
    for handler in list(root.handlers):
        root.removeHandler(handler)
    file_handler = logging.FileHandler(layout.rank_log(rank))
    file_handler.setFormatter(fmt)
    root.addHandler(file_handler)
    return logging.getLogger(f"hpc_rl.{role}")


class StopFlag:
    """Signal handlers only set this flag (a handler cannot run while the rank is inside an MPI call).

    The signals mean different stops:
    - SIGUSR2, "preempted, come back": Slurm's warning before the time limit (``--signal=B:USR2@N`` in the sbatch
      scripts) or ``scancel --batch --signal=USR2``. Stop at the next version, commit it, requeue the job.
    - SIGTERM, "stop": a plain ``scancel``, or Slurm's notice that it preempts the job (under
      ``PreemptMode=REQUEUE`` Slurm requeues the job itself; under ``CANCEL`` it ends). Stop at the next version
      and commit it if Slurm's KillWait leaves time, but never requeue. A TERM overrides an earlier USR2: a user
      who cancels a job that was about to requeue itself means the cancel.
    - SIGUSR1, "stop" as TERM: where only USR1 and USR2 reach the ranks (mpirun forwards those two and ends the job
      on a TERM), e.g. Ctrl-C under ``python -m hpc_rl.launch``.
    Installed after submitit's own handlers (submitit ignores SIGTERM and exits from its USR2 handler on rank 0
    only): the controller polls the flag and turns it into "stop at version V".
    """

    def __init__(self, signals=STOP_SIGNALS):
        # What arrived while the rank was starting (jobs/train.py holds the signals from its first line) counts.
        self.received: list[int] = [s for s in take_held_stop_signals() if s in signals]
        for s in signals:
            signal.signal(s, self._handle)

    def _handle(self, signum, _frame) -> None:
        self.received.append(signum)

    @property
    def raised(self) -> bool:
        return bool(self.received)

    @property
    def signum(self) -> int | None:
        """The first signal received (what started the stop), or None."""
        return self.received[0] if self.received else None

    @property
    def come_back(self) -> bool:
        """The stop asks for a requeue: USR2 was received and neither TERM nor USR1 was."""
        return signal.SIGUSR2 in self.received and not {signal.SIGTERM, signal.SIGUSR1} & set(self.received)
