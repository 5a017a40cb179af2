"""Learner rank: PPO on its share of the experience, in lockstep with the other learners.

    while not stop: take segments from my ring; control = allreduce(flags and counts); if all ready: update;
                    learner 0 publishes every ``publish_every`` updates and ships checkpoints to the controller

Every iteration the learners allreduce a small control vector (not-ready count, the stop version the controller
asked for, samples produced and consumed, rejected segments) and take every decision from it, so no learner decides
alone and no allreduce waits on a learner that left. Data quality is measured on every consumed sample: staleness
(learner version minus behaviour version) and sample reuse (samples consumed by gradient steps / produced). The
staleness queue holds a segment back ``staleness_queue`` versions after it arrives; ``target_reuse`` throttles
updates so that consumed / produced stays at or below it.

With populations (``hpc_rl.populations``) each population's learners sum their gradients on a communicator of their
own (its Horovod instance), and its first learner publishes its parameters and sends its metrics and checkpoints;
the control vector is still summed over every learner, so all populations update, stop and end together, one
version at a time.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch

from hpc_rl import metric_names as M
from hpc_rl.algo.learner import Learner
from hpc_rl.config import PipelineConfig, TrainConfig
from hpc_rl.data.batch import Batch, SegmentError, SegmentSchema, validate
from hpc_rl.envs.api import EnvSpec
from hpc_rl.model.device import select_device
from hpc_rl.model.policy import Policy
from hpc_rl.roles.allreduce import Allreduce
from hpc_rl.roles.common import Backoff
from hpc_rl.roles.control import ControlLink
from hpc_rl.roles.protocol import TAG_CHECKPOINT, TAG_DONE, TAG_HALT, TAG_METRICS, TAG_STOP, encode_parameters
from hpc_rl.transport import ExperienceRing, ParameterChannel

log = logging.getLogger(__name__)


@dataclass
class Held:
    batch: Batch
    ids: tuple[int, int, int]  # (inference rank, env rank, segment number)
    queued: bool = True  # still in the staleness queue
    uses: int = 0


class SegmentStore:
    """A learner's segments between its ring and its updates, in arrival order.

    - OpenAI Five's staleness ablation: the newest ``staleness_queue × segments_per_batch`` segments wait in a FIFO,
      so each is trained on about ``staleness_queue`` versions after it arrived.
    - Intake: the learner moves a segment here from its ring only when its next batch needs it (``wanted``), so
      producers that outpace the learners wait on a full ring instead of producing segments to be dropped. With a
      reuse target above one update per segment, the next batch needs no new segment while a batch of held ones can
      be trained on again within the target: reuse is then the target's whatever the producers' speed (taking
      whatever arrived would train on fresh segments first, and a learner slower than its producers would reach a
      reuse near 1 however high the target).
    - A bound: beyond the queue at most ``buffer_batches`` batches are held (segments kept for reuse, and what
      arrives at the stop); beyond it the oldest are dropped (``evicted_ids`` counts those never trained on).
    - Reuse: a segment feeds at most ceil(target_reuse / epochs) updates; a batch takes the least used first, among
      equals the oldest, so with a target of one update per segment segments are trained on in arrival order and none
      waits behind newer ones.
    """

    def __init__(self, pipeline: PipelineConfig, target_reuse: float, epochs: int):
        self.target_reuse, self.epochs = target_reuse, epochs
        self.per_batch = pipeline.segments_per_batch
        self.queue_capacity = pipeline.staleness_queue * pipeline.segments_per_batch
        self.limit = pipeline.buffer_batches * pipeline.segments_per_batch + self.queue_capacity
        self.max_uses = math.ceil(target_reuse / epochs - 1e-9)
        self.held: deque[Held] = deque()
        self.evicted_ids: list[tuple[int, int, int]] = []

    def add(self, batches: list[Held]) -> None:
        """New segments: the oldest queued ones leave the queue beyond its capacity; the oldest held ones are
        dropped beyond the bound."""
        self.held.extend(batches)
        queued = [h for h in self.held if h.queued]
        for h in queued[:max(0, len(queued) - self.queue_capacity)]:
            h.queued = False
        while len(self.held) > self.limit:
            evicted = self.held.popleft()
            if evicted.uses == 0:
                self.evicted_ids.append(evicted.ids)

    def wanted(self, consumed: float, produced: float) -> int:
        """How many more segments the next batch needs, given the samples this learner has consumed (every epoch
        counted) and produced (taken in) so far: none while a batch of held segments fits the reuse target (as
        ``may_update`` counts it), else the staleness queue's and the batch's, less those held and never trained
        on (a batch of new segments always fits: the target is at least the epochs)."""
        if self.max_uses > 1:
            batch = self.choose()
            samples = sum(float(h.batch.weight.sum()) for h in batch)
            if len(batch) == self.per_batch and fits_reuse(consumed, samples, produced, self.epochs, self.target_reuse):
                return 0
        return max(0, self.queue_capacity + self.per_batch - sum(1 for h in self.held if h.uses == 0))

    def choose(self) -> list[Held]:
        """The next batch's segments (fewer than ``segments_per_batch`` when not enough are available)."""
        available = [h for h in self.held if not h.queued and h.uses < self.max_uses]
        order = sorted(range(len(available)), key=lambda i: (available[i].uses, i))
        return [available[i] for i in order[:self.per_batch]]

    def unused_ids(self) -> list[tuple[int, int, int]]:
        """Segments never trained on: dropped from the bound or still held."""
        return self.evicted_ids + [h.ids for h in self.held if h.uses == 0]

    def __len__(self) -> int:
        return len(self.held)


# The lockstep control vector: every learner contributes its entries, the allreduced sum decides for all of them.
CONTROL = ("not_ready", "stop_version", "produced", "consumed", "next_batch", "rejected")


def may_update(control: dict[str, float], epochs: int, target_reuse: float) -> bool:
    """Whether the learners update now, from the summed control vector: every learner has a batch, samples were
    produced, and the update (which consumes the next batch once per PPO epoch) keeps consumed / produced at or
    below ``target_reuse``."""
    return (control["not_ready"] == 0 and control["produced"] > 0
            and fits_reuse(control["consumed"], control["next_batch"], control["produced"], epochs, target_reuse))


def fits_reuse(consumed: float, batch: float, produced: float, epochs: int, target_reuse: float) -> bool:
    """Whether an update on ``batch`` samples (consumed once per epoch) keeps samples consumed / produced at or below
    ``target_reuse``."""
    return consumed + batch * epochs <= target_reuse * produced + 1e-6


class LockstepLearner:
    """What every learner rank shares, whatever it trains (PPO here, AlphaZero in ``hpc_rl.roles.go``): the loop under
    MPI, the allreduced control vector every decision is taken from, and the ways out (the last version, the
    controller's stop, a non-finite halt, the final checkpoint). A subclass sets ``learner`` (``version``,
    ``checkpoint_sections()``) and defines ``step``, ``publish`` and ``_stats``; it counts what it received
    (``produced``), trained on (``consumed``) and rejected, in its own units (samples, positions)."""

    def __init__(self, config: TrainConfig, allreduce: Allreduce, link: ControlLink, control: Allreduce | None = None,
                 population: int = 0):
        """``allreduce``: over the learners that train this one's parameters (its population's); ``control``: over
        every learner, for the control vector (None: ``allreduce``, there being no populations)."""
        self.config, self.allreduce, self.link = config, allreduce, link
        self.control_allreduce = allreduce if control is None else control
        self.population = population
        self.index = allreduce.rank  # 0: the learner that publishes, reports and checkpoints its parameters
        self.first = self.control_allreduce.rank == 0  # learner 0 of all: hears the stop, reports the end
        self.produced = 0.0
        self.consumed = 0.0
        self.rejected = 0
        self.nonfinite_streak = 0
        self.stop_version = 0
        self.started = time.monotonic()
        self.done = False
        self.halted: str | None = None  # why the learners stopped on non-finite losses

    def step(self) -> bool:
        """Take what arrived and, if the control vector says so, make one update. True if an update was made."""
        raise NotImplementedError

    def publish(self) -> None:
        raise NotImplementedError

    def _stats(self) -> dict:
        raise NotImplementedError

    def start(self) -> None:
        if self.index == 0:
            self.publish()
        self.started = time.monotonic()

    def run(self) -> int:
        """Under MPI: train until the last version, waiting with backoff while no update can be made."""
        self.start()
        backoff = Backoff(self.config.transport.poll)
        while not self.done:
            if self.halted is not None:
                self._await_abort()
            if self.step():
                backoff.reset()
            else:
                backoff.wait()
        return self.learner.version

    def _control(self, ready: bool, batch: float) -> dict[str, float]:
        """The control vector (``CONTROL``) summed over every learner; learner 0 contributes the stop version the
        controller asked for. ``batch``: what the next update would consume, in the units of ``consumed``."""
        stop = self.link.receive(TAG_STOP) if self.first else None
        if stop is not None:
            self.stop_version = int(stop)
        local = {"not_ready": 0.0 if ready else 1.0, "stop_version": float(self.stop_version),
                 "produced": self.produced, "consumed": self.consumed, "next_batch": batch,
                 "rejected": float(self.rejected)}
        summed = self.control_allreduce.sum(torch.tensor([local[k] for k in CONTROL], dtype=torch.float64)).numpy()
        return dict(zip(CONTROL, summed.tolist()))

    def _finish(self) -> None:
        self.done = True
        if self.first:
            self.link.send(self.learner.version, TAG_DONE)
        self.link.beat(self._stats(), force=True)

    def _halt(self, version: int) -> None:
        """After ``max_nonfinite`` skipped updates in a row: learner 0 tells the controller, which writes the
        metrics (this version's included) and status, then ends the run. The learners make no more updates."""
        self.halted = (f"non-finite halt at version {version}: {self.nonfinite_streak} updates in a row had "
                       f"non-finite losses (pipeline.max_nonfinite={self.config.pipeline.max_nonfinite}); they were "
                       "skipped on every learner and none of them was checkpointed")
        log.error(self.halted)
        if self.index == 0:
            self.link.send(self.halted, TAG_HALT)

    def _await_abort(self) -> None:
        """Under MPI every learner waits for the controller's abort, beating, instead of raising: an exception here
        would abort the job before the controller has written what happened. If the controller does not end the
        job within ``heartbeat_timeout_s``, the learner raises."""
        deadline = time.monotonic() + self.config.pipeline.heartbeat_timeout_s
        while time.monotonic() < deadline:
            self.link.beat()
            time.sleep(0.1)
        raise FloatingPointError(f"{self.halted}; the controller did not end the job")

    def final_checkpoint(self) -> None:
        """Learner 0 (of each population) ships the last version's state (the controller commits it unless already
        committed)."""
        if self.index == 0:
            self.link.send((self.learner.version, self.learner.checkpoint_sections(), self.population), TAG_CHECKPOINT)


class LearnerWorker(LockstepLearner):
    def __init__(self, config: TrainConfig, spec: EnvSpec, allreduce: Allreduce, ring: ExperienceRing,
                 params: ParameterChannel, link: ControlLink, resume: tuple[int, dict] | None, gpu_slot: int = 0,
                 control: Allreduce | None = None, population: int = 0):
        """``allreduce`` sums over the learners (``make_allreduce`` on their communicator; ``SingleAllreduce`` for
        the one learner of a run in one process), with populations over the population's and ``control`` over
        every learner; ``params``: the population's parameter channel; ``resume``: (version, the population's
        checkpoint sections); ``gpu_slot`` picks the GPU (``select_device``)."""
        super().__init__(config, allreduce, link, control, population)
        self.ring, self.params = ring, params
        self.spec = spec
        self.device = select_device(config.pipeline.learner_device, gpu_slot)
        torch.manual_seed(config.seed + population)  # each population starts from parameters of its own
        self.policy = Policy(self.spec, config.model).to(self.device)
        self.learner = Learner(self.policy, config.ppo, allreduce_sum=self.allreduce.sum,
                               world_size=self.allreduce.size, device=self.device,
                               seed=config.seed + self.control_allreduce.rank)
        if resume is not None:
            self.load(resume[1])
        # Learners start from learner 0's parameters (constant buffers such as the action-gating masks agree already).
        self.allreduce.broadcast_([t for t in self.policy.state_dict().values() if t.is_floating_point()])
        self.schema = SegmentSchema.of_run(config, self.spec)
        self.store = SegmentStore(config.pipeline, config.target_reuse, config.ppo.epochs)
        # produced: samples received by this learner; consumed: samples used by gradient steps (every PPO epoch counts)
        # Views of segments left in the ring (their slots stay READY to the writers) until the store wants them:
        # under full_policy=block a full ring holds its writers back, which is how producers wait for the learners.
        self.waiting: list = []
        self.throttled = False  # the last control vector had every batch ready but the reuse target held the update
        self.ring_ready, self.ring_polls = 0.0, 0  # READY slots summed over the polls since the last update
        self.staleness_hist = np.zeros(M.STALENESS_BINS)
        self.consumed_ids: list[tuple[int, int, int]] = []

    # --- checkpoints ------------------------------------------------------------------------------------
    def sections(self) -> dict:
        return self.learner.checkpoint_sections()

    def load(self, sections: dict) -> None:
        self.learner.load_checkpoint_sections(sections)

    # --- the loop ---------------------------------------------------------------------------------------
    def publish(self) -> None:
        self.params.publish(encode_parameters(self.learner.version, self.policy))

    def _take_segments(self, everything: bool = False) -> None:
        """Move segments from the ring into the store, oldest first: as many as the next batch wants, or
        ``everything`` (at the stop). While the reuse target holds the update back, every segment is taken: only new
        samples let it through, and the segments it cannot train on are dropped from the bound, as the target asks."""
        self.ring_ready += self.ring.ready_slots() + len(self.waiting)  # ring occupancy, sampled at every poll
        self.ring_polls += 1
        # Segments are read in place, where the writers put them: unpack_segment copies every field into tensors
        # the batch owns, and only then are the slots handed back to the writers (one copy instead of two).
        views = self.waiting + self.ring.take_view()
        count = len(views) if everything or self.throttled else self.store.wanted(self.consumed, self.produced)
        views, self.waiting = views[:count], views[count:]
        arrived = []
        try:
            for seg in views:
                try:
                    batch, env_rank, seq = self.schema.unpack(seg.payload)
                    validate(batch, self.schema, self.learner.version)
                except SegmentError as err:
                    self.rejected += 1
                    log.warning("segment from rank %d seq %d rejected: %s", seg.writer, seg.seq, err)
                    continue
                self.produced += float(batch.weight.sum())
                arrived.append(Held(batch, (seg.writer, env_rank, seq)))
        finally:
            self.ring.release(views)
        self.store.add(arrived)

    def step(self) -> bool:
        """Take the segments that arrived and, if every learner has a batch and the reuse throttle allows it, make
        one update together (the decision is the allreduced control vector's, so every learner takes the same one).
        True if an update was made; ``done`` once the last version is reached."""
        if self.done or self.halted is not None:
            return False
        cfg = self.config.pipeline
        epochs = self.config.ppo.epochs
        self._take_segments()
        chosen = self.store.choose()
        control = self._control(len(chosen) == cfg.segments_per_batch,
                                sum(float(h.batch.weight.sum()) for h in chosen))
        stop = control["stop_version"]
        if self.learner.version >= cfg.max_versions or (stop and self.learner.version >= stop):
            self._finish()
            return False
        self.link.beat(self._stats())
        update = may_update(control, epochs, self.config.target_reuse)
        self.throttled = control["not_ready"] == 0 and not update
        if not update:
            return False
        self._update(chosen, epochs, control)
        return True

    def _update(self, chosen: list[Held], epochs: int, control: dict[str, float]) -> None:
        consumed_after = control["consumed"] + control["next_batch"] * epochs
        batch = self.schema.concat([h.batch for h in chosen])
        for h in chosen:
            h.uses += 1
            self.consumed_ids.append(h.ids)
        trained = batch.weight > 0
        staleness = (self.learner.version - batch.version[trained]).clamp(min=0).numpy()
        hist = np.bincount(np.minimum(staleness, M.STALENESS_BINS - 1), minlength=M.STALENESS_BINS)
        self.staleness_hist += hist
        self.consumed += float(batch.weight.sum()) * epochs
        fault = self.config.pipeline.fault_nonfinite_from_version
        if fault and self.learner.version + 1 >= fault:  # fault injection (tests, drills): NaN flows into the loss
            batch = batch.replace(reward=torch.full_like(batch.reward, float("nan")))
        metrics = self.learner.update(batch)
        skipped = metrics.get(M.NONFINITE_SKIPPED, 0.0)
        # Every learner skips the same steps (the non-finite test is allreduced), so every learner counts the same.
        self.nonfinite_streak = self.nonfinite_streak + 1 if skipped >= self.config.ppo.num_minibatches * epochs else 0
        stale = torch.tensor(np.r_[hist, staleness.sum(), staleness.size, self.ring_ready,
                                   self.ring_polls * self.ring.config.slots], dtype=torch.float64)
        global_stale = self.allreduce.sum(stale).numpy()
        self.ring_ready, self.ring_polls = 0.0, 0
        version = self.learner.version
        if self.index == 0:
            if version % self.config.pipeline.publish_every == 0:
                self.publish()
            metrics.update({
                M.STALENESS_MEAN: global_stale[-4] / max(global_stale[-3], 1.0),
                M.REUSE: consumed_after / max(control["produced"], 1.0),
                M.REJECTED_SEGMENTS: control["rejected"],
                M.LEARNER_SAMPLES: consumed_after / epochs,
                M.LEARNER_SAMPLES_PER_S: (consumed_after / epochs) / max(time.monotonic() - self.started, 1e-9),
                M.BUFFER_SEGMENTS: float(len(self.store)),
                # fraction of ring slots READY (put, not yet taken), over every learner's polls since the last update
                M.RING_OCCUPANCY: global_stale[-2] / max(global_stale[-1], 1.0),
                M.DROPPED_SEGMENTS: float(len(self.store.evicted_ids)),
            })
            for b in range(M.STALENESS_BINS):
                metrics[M.staleness_bin(b)] = float(global_stale[b])
            self.link.send((version, metrics, self.population), TAG_METRICS)
            # A version whose update was skipped is not checkpointed: if the streak ends in a halt, the run resumes
            # from the last version that trained.
            if version % self.config.pipeline.checkpoint_every == 0 and not self.nonfinite_streak:
                self.link.send((version, self.sections(), self.population), TAG_CHECKPOINT)
        if self.nonfinite_streak >= self.config.pipeline.max_nonfinite:
            self._halt(version)

    def drain(self) -> list[tuple[int, int, int]]:
        """Segments never trained on: left at the stop or evicted from a full buffer (exactly-once accounting)."""
        self._take_segments(everything=True)
        return self.store.unused_ids()

    def _stats(self) -> dict:
        return {"version": self.learner.version, "produced": self.produced, "consumed": self.consumed,
                "held": len(self.store), "seconds": time.monotonic() - self.started, "device": str(self.device)}
