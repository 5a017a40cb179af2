"""The roles' decisions in one process, in seconds: the learner's segment store (staleness queue, bound, reuse), the
reuse throttle and the lockstep control vector, the non-finite skip, past versions' steps at weight 0, the
opponent pool's quality updates, a commit on a full filesystem. The 6-rank MPI tests (test_pipeline*.py) prove
the same roles under mpirun."""

import json
import os
import signal
import threading

import numpy as np
import pytest
import torch

from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.schedules import constant
from hpc_rl.config import EnvConfig, LeagueConfig, PipelineConfig, TrainConfig
from hpc_rl.data.batch import Batch
from hpc_rl.envs.moba import MobaConfig
from hpc_rl.league.pool import LATEST
from hpc_rl.model.config import ModelConfig
from hpc_rl.launch import hold_stop_signals
from hpc_rl.roles.common import StopFlag
from hpc_rl.roles.control import RunAborted
from hpc_rl.roles.learner import CONTROL, Held, SegmentStore, may_update
from hpc_rl.roles.protocol import TAG_POOL_RESULT
from hpc_rl.runner import SerialRunner
from hpc_rl.storage import read_metrics

MODEL = ModelConfig(core="lstm", lstm_size=16, embed_size=8)


def held(k: int, samples: float = 4.0) -> Held:
    return Held(Batch({"weight": torch.full((2, 2), samples / 4)}), (2, 1, k))


def ids(segments) -> list[int]:
    return [h.ids[2] for h in segments]


def test_the_staleness_queue_holds_the_newest_segments_back():
    store = SegmentStore(PipelineConfig(segments_per_batch=2, staleness_queue=1, buffer_batches=2), 1.0, 1)
    store.add([held(k) for k in range(3)])
    # 2 (one batch) wait in the queue: only the oldest is out.
    assert [h.queued for h in store.held] == [False, True, True]
    assert ids(store.choose()) == [0]
    store.add([held(3), held(4)])
    assert ids(store.choose()) == [0, 1]


def test_the_store_wants_what_the_queue_and_the_next_batch_lack():
    """The learner leaves the rest in its ring, whose writers then wait instead of producing segments to drop."""
    store = SegmentStore(PipelineConfig(segments_per_batch=2, staleness_queue=1, buffer_batches=2), 1.0, 1)
    assert store.wanted(0.0, 0.0) == 4  # a batch in the queue and a batch out of it
    store.add([held(k) for k in range(3)])
    assert store.wanted(0.0, 0.0) == 1
    store.add([held(3)])
    assert store.wanted(0.0, 0.0) == 0
    for h in store.choose():
        h.uses += 1
    assert store.wanted(0.0, 0.0) == 2  # segments trained on no longer count


def test_the_bound_drops_the_oldest_and_counts_the_unused():
    store = SegmentStore(PipelineConfig(segments_per_batch=2, staleness_queue=0, buffer_batches=2), 1.0, 1)
    store.add([held(k) for k in range(3)])
    for h in store.choose():
        h.uses += 1
    store.add([held(k) for k in range(3, 7)])  # 7 held, bound 4: segments 0, 1 (used) and 2 (unused) dropped
    assert ids(store.held) == [3, 4, 5, 6]
    assert [i[2] for i in store.evicted_ids] == [2]
    assert [i[2] for i in store.unused_ids()] == [2, 3, 4, 5, 6]


def test_segments_feed_at_most_ceil_target_reuse_updates_least_used_first():
    store = SegmentStore(PipelineConfig(segments_per_batch=2, target_reuse=1.5, buffer_batches=4), 1.5, 1)
    store.add([held(k) for k in range(3)])
    first = store.choose()
    assert ids(first) == [0, 1]
    for h in first:
        h.uses += 1
    assert ids(store.choose()) == [2, 0]  # the unused one first, then the oldest of the once-used
    for h in store.choose():
        h.uses += 1
    assert ids(store.choose()) == [1, 2]  # 0 has reached ceil(1.5) = 2 uses
    for h in store.choose():
        h.uses += 1
    assert store.choose() == []


def test_above_one_use_the_store_reuses_held_segments_before_it_takes_new_ones():
    """Reuse 4 reached whatever the producers' speed: new segments are wanted only when no held batch fits the
    target, so a learner slower than its producers does not train on fresh segments alone."""
    store = SegmentStore(PipelineConfig(segments_per_batch=2, target_reuse=4.0, buffer_batches=4), 4.0, 1)
    consumed = produced = 0.0
    assert store.wanted(consumed, produced) == 2
    for version in range(12):
        wanted = store.wanted(consumed, produced)
        # A fast producer: whatever is wanted is there at once.
        store.add([held(100 * version + k) for k in range(wanted)])
        produced += 4.0 * wanted
        batch = store.choose()
        assert len(batch) == 2 and consumed + 8.0 <= 4.0 * produced
        consumed += 8.0
        for h in batch:
            h.uses += 1
        assert wanted == (2 if version % 4 == 0 else 0), version  # two new segments every fourth update
    assert consumed / produced == 4.0
    # The default target (one update per segment) always wants the batch's new segments.
    once = SegmentStore(PipelineConfig(segments_per_batch=2, buffer_batches=4), 1.0, 1)
    once.add([held(0), held(1)])
    for h in once.choose():
        h.uses += 1
    assert once.wanted(8.0, 8.0) == 2


def test_the_default_reuse_target_trains_every_sample_once_whatever_the_epochs():
    """target_reuse None is ppo.epochs: the throttle lets an update of E epochs through for every batch produced
    (a target of 1 would let one in E through and waste the rest), and a segment feeds one update."""
    config = TrainConfig(ppo=PPOConfig(epochs=4), pipeline=PipelineConfig(segments_per_batch=2))
    assert config.pipeline.target_reuse is None and config.target_reuse == 4
    produced_one_batch = {"not_ready": 0, "produced": 512.0, "consumed": 0.0, "next_batch": 512.0}
    assert may_update(produced_one_batch, epochs=4, target_reuse=config.target_reuse)
    assert not may_update(produced_one_batch, epochs=4, target_reuse=1.0)
    store = SegmentStore(config.pipeline, config.target_reuse, config.ppo.epochs)
    store.add([held(k) for k in range(4)])
    for h in store.choose():
        h.uses += 1
    assert ids(store.choose()) == [2, 3]
    for h in store.choose():
        h.uses += 1
    assert store.choose() == []


@pytest.mark.parametrize("consumed, next_batch, produced, ready, expected", [
    (0.0, 100.0, 100.0, True, True),   # 1 epoch: consumed 100 of 100 produced
    (0.0, 100.0, 99.0, True, False),   # would exceed reuse 1
    (100.0, 100.0, 200.0, True, True),
    (0.0, 100.0, 100.0, False, False),  # a learner has no batch
    (0.0, 0.0, 0.0, True, False),       # nothing produced yet
])
def test_the_reuse_throttle(consumed, next_batch, produced, ready, expected):
    control = {"not_ready": 0.0 if ready else 1.0, "stop_version": 0.0, "produced": produced, "consumed": consumed,
               "next_batch": next_batch, "rejected": 0.0}
    assert may_update(control, epochs=1, target_reuse=1.0) is expected


def test_the_reuse_throttle_counts_every_epoch():
    control = {"not_ready": 0.0, "stop_version": 0.0, "produced": 100.0, "consumed": 0.0, "next_batch": 50.0,
               "rejected": 0.0}
    assert may_update(control, epochs=2, target_reuse=1.0)  # 50 x 2 = 100 <= 100
    assert not may_update(control, epochs=3, target_reuse=1.0)  # 150 > 100
    assert may_update(control, epochs=3, target_reuse=1.5)


class ThreadAllreduce:
    """Two learners' sums, between threads."""

    def __init__(self, size: int):
        self.size, self.barrier, self.slots = size, threading.Barrier(size), [None] * size

    def of(self, rank: int):
        outer = self

        class Rank:
            name, size = "threads", outer.size

            def __init__(self):
                self.rank = rank

            def sum(self, tensor):
                outer.slots[rank] = tensor.clone()
                outer.barrier.wait()
                total = sum(outer.slots[1:], outer.slots[0].clone())
                outer.barrier.wait()
                return total
        return Rank()


class Link:
    def __init__(self, stop=None):
        self.stop = stop

    def receive(self, tag, source=0):
        stop, self.stop = self.stop, None
        return stop


def test_the_lockstep_control_vector_is_summed_over_learners():
    """Learner 0 carries the controller's stop; every learner's counts add up; both see the same sums."""
    from hpc_rl.roles.learner import LearnerWorker

    reduce = ThreadAllreduce(2)
    workers = []
    for rank in range(2):
        w = LearnerWorker.__new__(LearnerWorker)  # only the state _control reads
        w.index, w.first, w.link = rank, rank == 0, Link(stop=7 if rank == 0 else None)
        w.allreduce = w.control_allreduce = reduce.of(rank)
        w.stop_version, w.produced, w.consumed, w.rejected = 0, 100.0 * (rank + 1), 10.0 * (rank + 1), rank
        workers.append(w)
    out = [None, None]
    threads = [threading.Thread(target=lambda r=r: out.__setitem__(r, workers[r]._control(r == 0, 5.0)))
               for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert out[0] == out[1] == {"not_ready": 1.0, "stop_version": 7.0, "produced": 300.0, "consumed": 30.0,
                                "next_batch": 10.0, "rejected": 1.0}
    assert tuple(out[0]) == CONTROL


def test_the_mpi_allreduce_keeps_the_shape_of_scalars():
    """A policy's 0-d buffers (the value normaliser's statistics) broadcast and sum as 0-d tensors."""
    from mpi4py import MPI

    from hpc_rl.roles.allreduce import MpiAllreduce

    reduce = MpiAllreduce(MPI.COMM_SELF)
    scalar, vector = torch.tensor(2.5), torch.tensor([1.0, 2.0])
    reduce.broadcast_([scalar, vector])
    assert scalar.shape == () and float(scalar) == 2.5 and vector.tolist() == [1.0, 2.0]
    assert reduce.sum(torch.tensor(3.0)).shape == ()


def moba_config(tmp_path, **kw) -> TrainConfig:
    pipeline = {"segment_len": 16, "segments_per_batch": 1, "checkpoint_every": 2, "keep_every": 2,
                "max_versions": 4, **kw.pop("pipeline", {})}
    return TrainConfig(run_name="roles", runs_dir=str(tmp_path), model=MODEL,
                       ppo=PPOConfig(lr=constant(1e-3), epochs=1, num_minibatches=2),
                       env=EnvConfig(num_envs=4, moba=MobaConfig(), **kw.pop("env", {})),
                       pipeline=PipelineConfig(**pipeline), **kw)


def test_past_versions_play_their_side_at_weight_zero_and_the_pool_learns_from_results(tmp_path):
    config = moba_config(tmp_path, env={"vs_scripted_fraction": 0.0}, league=LeagueConfig(past_fraction=1.0))
    runner = SerialRunner(config)
    runner.run()  # versions 2 and 4 are committed for good and join the pool
    assert runner.controller.pool.versions == [2, 4]

    resumed = SerialRunner(config)  # the same run directory: resumed at version 4 with its pool
    resumed.inference.receive_pool()
    assert resumed.inference.pool.versions == [2, 4]
    batch = resumed.collect()
    opponents = resumed.inference.opponent[1]  # per copy: every game is against a past version
    assert (opponents != LATEST).all() and set(opponents.tolist()) <= {2, 4}
    # The past version plays team 1 in even copies and team 0 in odd ones; its steps get weight 0.
    past_side = np.asarray(resumed.spec.opponent_side(4)).reshape(-1)
    assert (batch.weight[:, past_side] == 0).all() and (batch.weight[:, ~past_side] == 1).all()

    # The controller's quality update (OpenAI Five): beating past version i lowers q_i by eta / (N p_i).
    pool = resumed.controller.pool
    before = list(pool.qualities)
    probabilities = pool.probabilities()
    resumed.inference.link.send([(2, 1.0), (4, 0.5)], TAG_POOL_RESULT)  # a win against 2, a draw against 4
    resumed.controller.service()
    eta, n = config.league.eta, len(pool.versions)
    assert pool.qualities[0] == pytest.approx(before[0] - eta / (n * probabilities[0]))
    assert pool.qualities[1] == before[1]
    assert resumed.controller.past_games == 2 and resumed.controller.past_score == 1.5


def test_a_checkpoint_the_filesystem_cannot_hold_ends_the_run_in_one_line(tmp_path, tiny_tmpfs):
    """The controller's commit of version 2 meets a full filesystem: the run ends naming the file, the cause and the
    bytes needed, and leaves no temporary file."""
    checkpoints = tiny_tmpfs(tmp_path / "roles" / "checkpoints", "4k")
    runner = SerialRunner(moba_config(tmp_path))
    with pytest.raises(RunAborted) as aborted:
        runner.run()
    message = str(aborted.value)
    cause = f"cannot write {checkpoints}/v000002.h5: No space left on device (errno 28); it needs "
    assert "\n" not in message and message.startswith(cause) and " bytes (" in message, message
    assert message.endswith(f" free on {checkpoints}; latest still names no checkpoint. Aborting the job."), message
    assert list(checkpoints.iterdir()) == []


def test_nonfinite_updates_are_skipped_then_the_run_halts_with_its_status(tmp_path):
    """Version 2's and 3's updates see NaN rewards: every minibatch is skipped, neither is committed, and after
    max_nonfinite = 2 of them in a row the controller writes the status and ends the run."""
    config = moba_config(tmp_path, pipeline={"fault_nonfinite_from_version": 2, "max_nonfinite": 2,
                                             "max_versions": 10, "checkpoint_every": 1})
    runner = SerialRunner(config)
    with pytest.raises(RunAborted, match="non-finite halt at version 3"):
        runner.run()
    assert runner.learner_worker.nonfinite_streak == 2 and runner.learner.version == 3
    status = json.loads((tmp_path / "roles" / "status.json").read_text())
    assert status["state"] == "halted_nonfinite" and status["committed"] == 1
    skipped = read_metrics(tmp_path / "roles" / "metrics.h5")["train/nonfinite_skipped"]
    assert skipped["version"].tolist() == [1, 2, 3] and skipped["value"].tolist() == [0, 2, 2]


def test_a_stop_signal_held_while_the_rank_starts_counts_for_the_run():
    """jobs/train.py holds USR2/TERM from its first line; the run's StopFlag takes over what arrived meanwhile."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}
    try:
        hold_stop_signals()
        os.kill(os.getpid(), signal.SIGUSR2)  # the process lives on: the signal is held
        flag = StopFlag()
        assert flag.raised and flag.signum == signal.SIGUSR2 and flag.come_back
        assert StopFlag().received == []  # taken once
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@pytest.mark.parametrize("signals, come_back", [(["SIGUSR2"], True), (["SIGTERM"], False), (["SIGUSR1"], False),
                                                (["SIGUSR2", "SIGTERM"], False), (["SIGTERM", "SIGUSR2"], False),
                                                (["SIGUSR2", "SIGUSR1"], False)])
def test_only_usr2_without_term_asks_for_a_requeue(signals, come_back):
    """USR2 is "preempted, come back"; TERM (a scancel) is "stop", and it overrides a USR2 received before it; USR1
    (Ctrl-C through hpc_rl.launch) is a stop like TERM."""
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGUSR2)}
    try:
        flag = StopFlag()
        assert not flag.raised and flag.signum is None
        for name in signals:
            os.kill(os.getpid(), getattr(signal, name))
        assert flag.raised and flag.signum == getattr(signal, signals[0]) and flag.come_back is come_back
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
