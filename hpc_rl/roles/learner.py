"""Learner rank: PPO on its share of the experience, in lockstep with the other learners.

    while not stop: take segments from my ring; control = allreduce(flags and counts); if all ready: update;
                    learner 0 publishes every ``publish_every`` updates and ships checkpoints to the controller

Every iteration the learners allreduce a small control vector (not-ready count, the stop version the controller
asked for, samples produced and consumed, rejected segments) and take every decision from it, so no learner decides
alone and no allreduce waits on a learner that left. Data quality is measured on every consumed sample: staleness
(learner version minus behaviour version) and sample reuse (samples consumed by gradient steps / produced). The
staleness queue holds a segment back ``staleness_queue`` versions after it arrives; ``target_reuse`` throttles
updates so that consumed / produced stays at or below it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from dataclasses import dataclass

import numpy as np
import torch
from mpi4py import MPI

from hpc_rl.algo.learner import Learner
from hpc_rl.config import TrainConfig
from hpc_rl.data.batch import Batch, SegmentError, SegmentSchema, validate
from hpc_rl.model.device import select_device
from hpc_rl.model.policy import Policy
from hpc_rl.roles.allreduce import make_allreduce
from hpc_rl.roles.common import Backoff, ControlLink
from hpc_rl.roles.protocol import TAG_CHECKPOINT, TAG_DONE, TAG_HALT, TAG_METRICS, TAG_STOP, encode_parameters
from hpc_rl.topology import local_rank
from hpc_rl.transport import ExperienceRing, ParameterChannel

log = logging.getLogger(__name__)
STALENESS_BINS = 16  # histogram of staleness 0..15, the last bin counts 15 and more


@dataclass
class _Held:
    batch: Batch
    ids: tuple[int, int, int]  # (inference rank, env rank, segment number)
    queued: bool = True  # still in the staleness queue
    uses: int = 0


class LearnerWorker:
    def __init__(self, config: TrainConfig, learner_comm: MPI.Comm, ring: ExperienceRing, params: ParameterChannel,
                 link: ControlLink, resume: tuple[int, dict] | None):
        self.config = config
        self.comm = learner_comm
        self.index = learner_comm.Get_rank()
        self.ring, self.params, self.link = ring, params, link
        self.spec = config.env.make(num_envs=1).spec
        self.device = select_device("auto", local_rank())
        torch.manual_seed(config.seed)
        self.policy = Policy(self.spec, config.model).to(self.device)
        self.allreduce = make_allreduce(config.pipeline.allreduce, learner_comm)
        self.learner = Learner(self.policy, config.ppo, allreduce_sum=self.allreduce.sum,
                               world_size=self.allreduce.size, device=self.device, seed=config.seed + self.index)
        if resume is not None:
            self.load(resume[1])
        # Learners start from learner 0's parameters (constant buffers such as the action-gating masks agree already).
        self.allreduce.broadcast_([t for t in self.policy.state_dict().values() if t.is_floating_point()])
        self.schema = SegmentSchema(self.spec, config.env.num_envs * self.spec.num_agents,
                                    config.pipeline.segment_len, config.model.chunk_len, config.model.lstm_size,
                                    config.transport.fp16_observations)
        self.held: deque[_Held] = deque()
        self.produced = 0.0  # samples received by this learner
        self.consumed = 0.0  # samples used by gradient steps (every PPO epoch counts)
        self.rejected = 0
        self.ring_ready, self.ring_polls = 0.0, 0  # READY slots summed over the polls since the last update
        self.nonfinite_streak = 0
        self.staleness_hist = np.zeros(STALENESS_BINS)
        self.consumed_ids: list[tuple[int, int, int]] = []
        self.evicted_ids: list[tuple[int, int, int]] = []  # dropped from a full buffer before any use
        self.stop_version = 0

    # --- checkpoints ------------------------------------------------------------------------------------
    def sections(self) -> dict:
        return self.learner.checkpoint_sections()

    def load(self, sections: dict) -> None:
        self.learner.load_checkpoint_sections(sections)

    # --- the loop ---------------------------------------------------------------------------------------
    def publish(self) -> None:
        self.params.publish(encode_parameters(self.learner.version, self.policy))

    def _take_segments(self) -> None:
        self.ring_ready += self.ring.ready_slots()  # ring occupancy, sampled at every poll
        self.ring_polls += 1
        # Segments are read in place, where the writers put them: unpack_segment copies every field into tensors
        # the batch owns, and only then are the slots handed back to the writers (one copy instead of two).
        views = self.ring.take_view()
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
                self.held.append(_Held(batch, (seg.writer, env_rank, seq)))
        finally:
            self.ring.release(views)
        # OpenAI Five's staleness ablation: segments pass through a FIFO holding N versions' worth of batches, so
        # each is trained on about N versions after it arrived.
        queued = [h for h in self.held if h.queued]
        capacity = self.config.pipeline.staleness_queue * self.config.pipeline.segments_per_batch
        for h in queued[:max(0, len(queued) - capacity)]:
            h.queued = False
        limit = self.config.pipeline.buffer_batches * self.config.pipeline.segments_per_batch + capacity
        while len(self.held) > limit:
            evicted = self.held.popleft()
            if evicted.uses == 0:
                self.evicted_ids.append(evicted.ids)

    def _available(self) -> list[_Held]:
        """Segments out of the staleness queue and used fewer than ceil(target_reuse) times (with a target of 1,
        each segment feeds exactly one update)."""
        max_uses = math.ceil(self.config.pipeline.target_reuse)
        return [h for h in self.held if not h.queued and h.uses < max_uses]

    def _control(self, ready: bool, batch_samples: float) -> np.ndarray:
        """Sum over learners of: not ready, the requested stop version (learner 0 hears the controller), samples
        produced, consumed and in the next batch, rejected segments."""
        stop = self.link.receive(TAG_STOP) if self.index == 0 else None
        if stop is not None:
            self.stop_version = int(stop)
        local = torch.tensor([0.0 if ready else 1.0, float(self.stop_version), self.produced, self.consumed,
                              batch_samples, float(self.rejected)], dtype=torch.float64)
        return self.allreduce.sum(local).numpy()

    def run(self) -> int:
        cfg = self.config.pipeline
        k = cfg.segments_per_batch
        epochs = self.config.ppo.epochs
        if self.index == 0:
            self.publish()
        backoff = Backoff(self.config.transport.poll)
        started = time.monotonic()
        while True:
            self._take_segments()
            chosen = self._choose(k)
            batch_samples = sum(float(h.batch.weight.sum()) for h in chosen)
            not_ready, stop_version, produced, consumed, next_batch, rejected = self._control(
                len(chosen) == k, batch_samples)
            if self.learner.version >= cfg.max_versions or (stop_version and self.learner.version >= stop_version):
                break
            # Throttle on sample reuse: the update would consume the next batch once per PPO epoch.
            projected = consumed + next_batch * epochs
            self.link.beat(self._stats(started))
            if not_ready or produced <= 0 or projected > cfg.target_reuse * produced + 1e-6:
                backoff.wait()
                continue
            backoff.reset()
            self._update(chosen, epochs, produced, projected, rejected, started)
        if self.index == 0:
            self.link.send(self.learner.version, TAG_DONE)
        self.link.beat(self._stats(started), force=True)
        return self.learner.version

    def _choose(self, k: int) -> list[_Held]:
        """The next batch's segments: fewest uses first, among equals the oldest (``held`` is in arrival order), so
        with a target reuse of 1 segments are trained on in arrival order and none waits behind newer ones."""
        available = self._available()
        order = sorted(range(len(available)), key=lambda i: (available[i].uses, i))
        return [available[i] for i in order[:k]]

    def _update(self, chosen: list[_Held], epochs: int, produced: float, consumed_after: float, rejected: float,
                started: float) -> None:
        batch = self.schema.concat([h.batch for h in chosen])
        for h in chosen:
            h.uses += 1
            self.consumed_ids.append(h.ids)
        trained = batch.weight > 0
        staleness = (self.learner.version - batch.version[trained]).clamp(min=0).numpy()
        hist = np.bincount(np.minimum(staleness, STALENESS_BINS - 1), minlength=STALENESS_BINS)
        self.staleness_hist += hist
        self.consumed += float(batch.weight.sum()) * epochs
        fault = self.config.pipeline.fault_nonfinite_from_version
        if fault and self.learner.version + 1 >= fault:  # fault injection (tests, drills): NaN flows into the loss
            batch = batch.replace(reward=torch.full_like(batch.reward, float("nan")))
        metrics = self.learner.update(batch)
        skipped = metrics.get("train/nonfinite_skipped", 0.0)
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
                "data/staleness_mean": global_stale[-4] / max(global_stale[-3], 1.0),
                "data/reuse": consumed_after / max(produced, 1.0),
                "data/rejected_segments": rejected,
                "perf/learner_samples_per_s": (consumed_after / epochs) / max(time.monotonic() - started, 1e-9),
                "perf/buffer_segments": float(len(self.held)),
                # fraction of ring slots READY (put, not yet taken), over every learner's polls since the last update
                "perf/ring_occupancy": global_stale[-2] / max(global_stale[-1], 1.0),
                "data/dropped_segments": float(len(self.evicted_ids)),  # learner 0's, since the start
            })
            for b in range(STALENESS_BINS):
                metrics[f"data/staleness_hist/{b:02d}"] = float(global_stale[b])
            self.link.send((version, metrics), TAG_METRICS)
            # A version whose update was skipped is not checkpointed: if the streak ends in a halt, the run resumes
            # from the last version that trained.
            if version % self.config.pipeline.checkpoint_every == 0 and not self.nonfinite_streak:
                self.link.send((version, self.sections()), TAG_CHECKPOINT)
        if self.nonfinite_streak >= self.config.pipeline.max_nonfinite:
            self._halt(version)

    def _halt(self, version: int) -> None:
        """After ``max_nonfinite`` skipped updates in a row: learner 0 tells the controller, which writes the
        metrics (this version's included) and status, then aborts the job. Every learner waits for that abort,
        beating, instead of raising: an exception here would abort the job before the controller has written what
        happened. If the controller does not end the job within ``heartbeat_timeout_s``, the learner raises."""
        message = (f"non-finite halt at version {version}: {self.nonfinite_streak} updates in a row had non-finite "
                   f"losses (pipeline.max_nonfinite={self.config.pipeline.max_nonfinite}); they were skipped on "
                   "every learner and none of them was checkpointed")
        log.error(message)
        if self.index == 0:
            self.link.send(message, TAG_HALT)
        deadline = time.monotonic() + self.config.pipeline.heartbeat_timeout_s
        while time.monotonic() < deadline:
            self.link.beat()
            time.sleep(0.1)
        raise FloatingPointError(f"{message}; the controller did not end the job")

    def final_checkpoint(self) -> None:
        """Learner 0 ships the last version's state (the controller commits it unless already committed)."""
        if self.index == 0:
            self.link.send((self.learner.version, self.sections()), TAG_CHECKPOINT)

    def drain(self) -> list[tuple[int, int, int]]:
        """Segments never trained on: left at the stop or evicted from a full buffer (exactly-once accounting)."""
        self._take_segments()
        return self.evicted_ids + [h.ids for h in self.held if h.uses == 0]

    def _stats(self, started: float) -> dict:
        return {"version": self.learner.version, "produced": self.produced, "consumed": self.consumed,
                "held": len(self.held), "seconds": time.monotonic() - started}
