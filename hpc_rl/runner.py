"""The serial runner: the distributed job's roles wired together in one process, over the local transport.

    runner = SerialRunner(config)              # the TrainConfig jobs/train.py takes; its run directory is the same
    runner.run()                               # until pipeline.max_versions, or until on_update returns True
    batch = runner.collect(); runner.update(batch)   # or one segment and one update at a time

It is not a second implementation: the env worker, the inference worker, the learner and the controller are the
classes the MPI job's ranks run (``hpc_rl.roles``), on the channels of ``TransportConfig(backend="local")`` and the
in-process control path, with the topology of a one-env, one-inference, one-learner job (rank 0 controller, 1 env,
2 inference, 3 learner). One thread steps them in turn, so a run is repeatable:

    env.send()          the step's request: observation, and the previous step's reward events and dones
    inference.serve()   newer parameters if published; act; reply; every segment_len steps a segment into the ring
    env.receive()       step the environments with the reply
    learner.step()      an update when a batch is there and the reuse throttle allows it; publish
    controller.step()   metrics.h5, checkpoints, the stop

Go (``env.name=go``) runs its own roles (``hpc_rl.roles.go``) in the same steps: the env worker sends a search
step's leaves, the inference worker evaluates them, the env worker backs them up and puts finished games into the
ring (``pipeline.ring_slots`` must hold the games one step can finish: ``env.num_envs``).

As in the MPI job, the action of the step that ends a segment comes from the version before the update that
segment feeds (the inference worker acts and ships in one pass); every step records its behaviour version.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

from hpc_rl.config import TrainConfig
from hpc_rl.data.batch import Batch, SegmentSchema
from hpc_rl.envs.api import EnvSpec, VecEnv
from hpc_rl.model.policy import Policy
from hpc_rl.roles.allreduce import SingleAllreduce
from hpc_rl.roles.common import open_channels
from hpc_rl.roles.control import ControlLink, LocalControlHub
from hpc_rl.roles.controller import Controller, open_run_dir
from hpc_rl.roles.env_worker import EnvWorker
from hpc_rl.roles.inference import InferenceWorker
from hpc_rl.roles.learner import LearnerWorker
from hpc_rl.roles.protocol import CONTROLLER, TAG_ACCOUNTING, TAG_STOP
from hpc_rl.storage import write_meta
from hpc_rl.storage.runlock import acquire_run_lock
from hpc_rl.topology import Role, Topology, TopologyConfig
from hpc_rl.transport import Transport
from hpc_rl.transport.local import LocalWorld

TOPOLOGY = TopologyConfig(env=1, inference=1, learner=1, evaluator=0)
# Every role reports to the controller this often (the MPI job's pipeline.heartbeat_s is a second): the env steps,
# games and win rates the controller writes with a version are at most this old.
HEARTBEAT_S = 0.02
ENV, INFERENCE, LEARNER = (Topology(TOPOLOGY).ranks(role)[0] for role in (Role.ENV, Role.INFERENCE, Role.LEARNER))


class SerialRunner:
    """One run of the roles in one process (see the module docstring)."""

    def __init__(self, config: TrainConfig, env: VecEnv | None = None, overrides: tuple[str, ...] = ()):
        """``env`` replaces the environment ``config.env`` would make (its ``num_envs`` copies); ``overrides`` go to
        the runs directory's index as in the MPI job. An existing run directory is resumed from its latest good
        checkpoint."""
        if config.populations > 1:
            raise ValueError(f"env.nmmo.populations={config.populations} needs the MPI job (python -m hpc_rl.launch): "
                             "each population learns on learner ranks of its own, and the serial runner has one")
        config = dataclasses.replace(config, topology=TOPOLOGY,
                                     transport=dataclasses.replace(config.transport, backend="local"))
        self.config = config
        if config.env.is_go and config.pipeline.ring_slots < config.env.num_envs:
            # One thread: a put into a full ring would wait for a learner step that never comes.
            raise ValueError(f"pipeline.ring_slots ({config.pipeline.ring_slots}) must hold the games one step can "
                             f"finish (env.num_envs={config.env.num_envs}) when Go runs in one process")
        topology = Topology(TOPOLOGY)
        run_dir = Path(config.runs_dir) / config.run_name
        acquire_run_lock(run_dir)
        resume = open_run_dir(config, overrides)
        resume_version = resume.version if resume is not None else -1
        go = config.env.is_go  # Go's self-play (hpc_rl.roles.go): no env spec, games instead of segments
        spec = None if go else (env if env is not None else config.env.make(num_envs=1)).spec

        world, hub = LocalWorld(TOPOLOGY.world_size), LocalControlHub(TOPOLOGY.world_size)
        self.schema = None if go else SegmentSchema.of_run(config, spec)
        transports = [Transport(world.comm(rank), config.transport) for rank in range(TOPOLOGY.world_size)]
        # Rank by rank, each rank's channels in the same order, as collective creation asks. The ring's owner (the
        # learner, the last rank) also closes last: its close waits for every writer's.
        channels = [open_channels(transport, config, spec, topology) for transport in transports]
        self.channels = channels
        link = lambda rank: ControlLink(hub.endpoint(rank), heartbeat_s=HEARTBEAT_S)  # noqa: E731
        self.control = hub.endpoint(CONTROLLER)

        write_meta(run_dir, world_size=TOPOLOGY.world_size, roles=topology.role_map(), transport=transports[0].meta(),
                   config_hash=config.config_hash(), resumed_from=resume_version)
        self.controller = Controller(config, topology, self.control, run_dir, resume_version, stop_flag=None)
        resumed = (resume.version, resume.sections) if resume is not None else None
        if go:
            from hpc_rl.roles.go import GoEnvWorker, GoInferenceWorker, GoLearnerWorker

            self.learner_worker = GoLearnerWorker(config, SingleAllreduce(), channels[LEARNER].rings[0],
                                                  channels[LEARNER].params[0], link(LEARNER), resumed)
            self.inference = GoInferenceWorker(config, [ENV], channels[INFERENCE].steps,
                                               channels[INFERENCE].params[0], link(INFERENCE))
            self.env_worker = self.producer = GoEnvWorker(config, ENV, channels[ENV].steps, channels[ENV].rings,
                                                          link(ENV), max(resume_version, 0))
        else:
            self.learner_worker = LearnerWorker(config, spec, SingleAllreduce(), channels[LEARNER].rings[0],
                                                channels[LEARNER].params[0], link(LEARNER), resumed)
            self.inference = self.producer = InferenceWorker(config, spec, [ENV], channels[INFERENCE].steps,
                                                             channels[INFERENCE].rings, channels[INFERENCE].params,
                                                             link(INFERENCE))
            self.env_worker = EnvWorker(config, ENV, 0, channels[ENV].steps, link(ENV), max(resume_version, 0),
                                        env=env)
        self.controller.start()
        self.learner_worker.start()
        self.inference.start()
        self.env_worker.start()
        self.closed = False

    # --- what callers read ------------------------------------------------------------------------------
    @property
    def learner(self):
        """The PPO learner (``hpc_rl.algo.learner.Learner``) of the learner role."""
        return self.learner_worker.learner

    @property
    def policy(self) -> Policy:
        """The learner's policy (the inference worker plays the latest version published from it)."""
        return self.learner_worker.policy

    @property
    def spec(self) -> EnvSpec:
        return self.learner_worker.spec

    @property
    def env_steps(self) -> int:
        return self.env_worker.steps

    @property
    def metrics(self) -> dict[str, float]:
        """The latest version's metrics, as the controller wrote them to metrics.h5."""
        return self.controller.last_metrics

    # --- driving ----------------------------------------------------------------------------------------
    def _play_step(self) -> bool:
        """One env step through the inference worker; False once the env worker has been told to stop."""
        if not self.env_worker.send():
            self.inference.serve(self.channels[INFERENCE].steps.poll_requests())  # the stop request
            return False
        self.inference.serve(self.channels[INFERENCE].steps.poll_requests())
        self.env_worker.receive()
        return True

    def run(self, on_update: Callable[[SerialRunner, dict[str, float]], bool] | None = None) -> dict[str, float]:
        """Play and train until the learners' last version (``pipeline.max_versions``), or until ``on_update``
        (called with the metrics of every version the controller writes) returns True; then shut down as the MPI
        job does. Returns the last version's metrics."""
        seen = self.controller.version
        final_sent = stop_sent = False
        playing = updated = True
        ring, learner_mail = self.channels[LEARNER].rings[0], self.learner_worker.link.endpoint
        while playing:
            playing = self._play_step()
            if self.learner_worker.done:
                self.learner_worker.drain()  # what arrives until the env worker stops is accounted as left
                if not final_sent:
                    self.learner_worker.final_checkpoint()
                    final_sent = True
            elif updated or ring.ready_slots() or learner_mail.has_mail():
                # The learner's decision changes only when segments arrive, after its own update, or when the
                # controller writes to it (a stop): otherwise a step would decide as the last one did.
                updated = self.learner_worker.step()
            if self.control.has_mail():  # a heartbeat at least every HEARTBEAT_S: the controller's clock
                self.controller.step()
            if self.controller.version != seen:
                seen = self.controller.version
                if on_update is not None and not stop_sent and on_update(self, self.metrics):
                    self.control.send(seen, LEARNER, TAG_STOP)  # what the controller sends on a signal
                    stop_sent = True
        self.close()
        return self.metrics

    def collect(self) -> Batch:
        """Play until the next segment is in the learner's ring and take it out (the learner role will not train on
        it): a batch of ``segment_len`` steps of every agent."""
        ring = self.channels[LEARNER].rings[0]
        while ring.ready_slots() == 0:
            self._play_step()
        taken = ring.take_view()
        try:
            batches = [self.schema.unpack(segment.payload)[0] for segment in taken]
        finally:
            ring.release(taken)
        return batches[0] if len(batches) == 1 else self.schema.concat(batches)

    def collect_games(self) -> list:
        """Go: play until finished games are in the learner's ring and take them out (the learner role will not
        train on them): their ``GameRecord``s."""
        ring = self.channels[LEARNER].rings[0]
        while ring.ready_slots() == 0:
            self._play_step()
        taken = ring.take_view()
        try:
            return [self.learner_worker.schema.unpack(segment.payload)[0] for segment in taken]
        finally:
            ring.release(taken)

    def update(self, batch: Batch) -> dict[str, float]:
        """One PPO update on ``batch`` and the new version published to the inference worker."""
        metrics = self.learner.update(batch)
        self.learner_worker.publish()
        return metrics

    def close(self) -> None:
        """Account for every segment as the MPI job does, write the run's status, close the channels."""
        if self.closed:
            return
        self.closed = True
        left = self.learner_worker.drain()
        self.producer.link.send({"produced": self.producer.produced_ids}, TAG_ACCOUNTING)
        self.learner_worker.link.send({"consumed": self.learner_worker.consumed_ids, "left": left}, TAG_ACCOUNTING)
        self.controller.service()
        self.controller.finish()
        for channels in self.channels:
            channels.close()
        self.controller.conclude(evaluate=False)
