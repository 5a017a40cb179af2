"""Go's self-play on the ranks (``env.name=go``): AlphaZero as ELF OpenGo runs it, on the roles and channels of the
MOBA's job.

    env rank:       SelfPlay of env.num_envs games and their search trees; every search step: send the leaves'
                    planes and legal moves, receive priors and values, back them up; when a move's search is done in
                    every game, play the moves; put every finished game's record into a learner's ring (round-robin)
    inference rank: one batch of the leaves of all its env ranks through the self-play GoNet (the latest published,
                    or with gating the last candidate that won its match); reply with the priors (softmax over the
                    legal moves) and values, and the network's version; with gating, one search step of the match
                    of a candidate against it between batches
    learner rank:   take whole games from its ring into a FIFO replay buffer of positions; in lockstep with the other
                    learners (the allreduced control vector), one AlphaZero update on a minibatch drawn uniformly
                    from it; learner 0 publishes, sends metrics and checkpoints to the controller

The env rank writes the rings itself: the trees, the games and their records live there (ELF: the trainer receives
whole games from the self-play clients), a game's outcome z is known only there and only at its end, and the
inference rank's step stays a stateless batch evaluation. Passing the records through the inference rank would copy
every position once more and make it track games it does not otherwise know.
"""

from __future__ import annotations

import logging
import time

import numpy as np
import torch

from hpc_rl import metric_names as M
from hpc_rl.algo.alphazero import AlphaZeroLearner, ReplayBuffer
from hpc_rl.config import TrainConfig
from hpc_rl.data.batch import GameSchema, SegmentError
from hpc_rl.envs.go import NUM_PLANES
from hpc_rl.envs.go_search import GameRecord, Match, SelfPlay, evaluation_config, ownership_targets
from hpc_rl.model.device import select_device
from hpc_rl.model.go_net import GoNet, NetEvaluator
from hpc_rl.roles.allreduce import Allreduce
from hpc_rl.roles.common import patiently, pull_parameters, seed_for, wait_requests
from hpc_rl.roles.control import ControlLink
from hpc_rl.roles.learner import LockstepLearner, may_update
from hpc_rl.roles.protocol import (TAG_CHECKPOINT, TAG_METRICS, TAG_STOP, encode_parameters, go_reply_layout,
                                   go_request_layout)
from hpc_rl.storage.hdf5 import DamagedFileError, set_aside
from hpc_rl.storage.layout import RunLayout
from hpc_rl.storage.replay_buffer import read_replay_buffer, write_replay_buffer
from hpc_rl.transport import ExperienceRing, ParameterChannel, StepExchange

log = logging.getLogger(__name__)


def game_seeds(seed: int, rank: int, version: int, num_games: int) -> list[int]:
    """The search streams of an env rank's games: from (seed, rank, version), as env ranks are seeded."""
    base = seed_for(seed, rank, version)
    return [(base + i) % 2**63 for i in range(num_games)]


class GoEnvWorker:
    """An env rank's self-play: ``env.num_envs`` games searched together, their leaves evaluated by its inference
    rank one batch per step; finished games' records go to the learners' rings."""

    def __init__(self, config: TrainConfig, rank: int, exchange: StepExchange, rings: list[ExperienceRing],
                 link: ControlLink, version: int):
        self.config, self.rank, self.exchange, self.rings, self.link = config, rank, exchange, rings, link
        go, n = config.env.go, config.env.num_envs
        self.selfplay = SelfPlay(go.search, game_seeds(config.seed, rank, version, n), go.board_size, go.komi,
                                 go.max_game_length or None, restart=True)
        leaves = n * go.search.leaves_per_game
        self.requests = go_request_layout(leaves, go.board_size)
        self.replies = go_reply_layout(leaves, go.board_size)
        self.request = {k: np.zeros(f.shape, f.dtype) for k, f in self.requests.fields.items()}
        self.buffer = np.empty(self.requests.nbytes, np.uint8)
        self.schema = GameSchema(go.board_size, go.game_length)
        self.slot = np.empty(self.schema.layout.nbytes, np.uint8)
        self.count = 0
        self.next_ring = 0
        self.produced_ids: list[tuple[int, int, int]] = []  # (this rank, this rank, game number) of every game put
        self.stats = dict.fromkeys(("env_steps", "games", "game_moves", "resigned", "black_wins",
                                    "calibration_would_resign", "calibration_false_positives", "request_bytes",
                                    "segment_bytes"), 0)

    def run(self) -> None:
        self.start()
        while self.send():
            self.receive()

    def start(self) -> None:
        self.started = time.monotonic()

    def send(self) -> bool:
        """Send this search step's leaves; False if it was the last message (the controller said stop)."""
        stop = self.link.receive(TAG_STOP) is not None
        if stop:
            self.count = 0
        else:
            planes, legal = self.selfplay.select()
            self.count = len(planes)
            self.request["planes"][:self.count] = planes
            self.request["legal"][:self.count] = legal
        self.request["count"][0], self.request["stop"][0] = self.count, stop
        payload = self.requests.pack(self.request, self.buffer)
        self.exchange.send_request(payload)
        self.stats["request_bytes"] += payload.nbytes
        return not stop

    def receive(self) -> None:
        """The priors and values of the leaves just sent: back them up; ship the games that ended."""
        reply = self.replies.unpack(patiently(self.exchange.wait_reply, self.link, self.config.transport.timeout_s))
        finished = self.selfplay.expand_and_backup(reply["priors"][:self.count], reply["values"][:self.count],
                                                   int(reply["version"][0]))
        self.stats["env_steps"] = self.selfplay.moves
        for _, record in finished:
            self._ship(record)
        # resign_threshold None: nobody may resign now (calibrating, or never)
        self.link.beat({**self.stats, "resign_threshold": self.selfplay.threshold,
                        "seconds": time.monotonic() - self.started})

    def _ship(self, record: GameRecord) -> None:
        """Count a finished game and put its record into a learner's ring; a game with no position recorded (every
        move a fast search under playout cap randomisation) is counted and not put: it holds nothing to train on."""
        if len(record.z):
            seq = len(self.produced_ids) + 1
            payload = self.schema.pack(record, self.rank, seq, self.slot)
            ring = self.rings[self.next_ring]  # round-robin, so every learner's buffer fills at the same rate
            patiently(lambda timeout: ring.put(payload, timeout), self.link, self.config.transport.timeout_s)
            self.next_ring = (self.next_ring + 1) % len(self.rings)
            self.produced_ids.append((self.rank, self.rank, seq))
            self.stats["segment_bytes"] += payload.nbytes
        self.stats["games"] += 1
        self.stats["game_moves"] += record.moves
        self.stats["resigned"] += int(record.resigned)
        self.stats["black_wins"] += int(record.winner == 0)
        if record.playout and record.would_resign >= 0:
            self.stats["calibration_would_resign"] += 1
            self.stats["calibration_false_positives"] += int(record.winner != 1 - record.would_resign)


class GoInferenceWorker:
    """An inference rank's evaluations: every step, the leaves of all its env ranks in one batch through the
    self-play network: the latest published one, or with gating (``env.go.gating.games``, AlphaGo Zero) the last
    candidate that scored ``win_rate`` in its match against the one before. A match is played here, one search step
    of all its games after each batch, so that self-play never waits for it; the candidate is the newest version
    published when the last match ended (those published during a match are not played). Every inference rank
    plays the same seeded matches between the same networks, so they agree on the self-play network."""

    def __init__(self, config: TrainConfig, env_ranks: list[int], exchange: StepExchange, params: ParameterChannel,
                 link: ControlLink, gpu_slot: int = 0):
        self.config, self.env_ranks, self.exchange, self.params, self.link = config, env_ranks, exchange, params, link
        go = config.env.go
        self.device = select_device(config.pipeline.inference_device, gpu_slot)
        self.net = GoNet(go.net, go.board_size).to(self.device)
        self.evaluate = NetEvaluator(self.net, self.device)
        leaves = config.env.num_envs * go.search.leaves_per_game
        self.requests = go_request_layout(leaves, go.board_size)
        self.replies = go_reply_layout(leaves, go.board_size)
        self.reply = {k: np.zeros(f.shape, f.dtype) for k, f in self.replies.fields.items()}
        self.reply_buffer = np.empty(self.replies.nbytes, np.uint8)
        self.version = -1
        self.batches = self.leaves = 0
        self.infer_seconds = 0.0
        self.gating = go.gating
        if self.gating.games:
            self.candidate = GoNet(go.net, go.board_size).to(self.device)
            self.evaluate_candidate = NetEvaluator(self.candidate, self.device)
        self.match: Match | None = None
        self.candidate_version = -1
        self.gate_stats = {"gate_matches": 0, "gate_promoted": 0, "gate_score": None}

    def run(self) -> None:
        self.start()
        while self.live:
            self.serve(wait_requests(self.exchange, self.link, self.config, self.live))

    def start(self) -> None:
        """Wait for the learners' first parameters."""
        self.version = pull_parameters(self.params, self.link, self.config, self.net, wait=True)
        self.live = set(self.env_ranks)
        self.started = time.monotonic()

    def serve(self, requests: dict[int, np.ndarray]) -> None:
        if self.gating.games:
            self.gate()
        else:
            newer = pull_parameters(self.params, self.link, self.config, self.net, wait=False)
            self.version = self.version if newer is None else newer
        messages = {e: self.requests.unpack(p) for e, p in requests.items()}
        for e, m in messages.items():
            if m["stop"][0]:
                self.live.discard(e)
        active = [e for e in sorted(messages) if e in self.live]
        counts = [int(messages[e]["count"][0]) for e in active]
        if sum(counts):
            t0 = time.perf_counter()
            priors, values = self.evaluate(np.concatenate([messages[e]["planes"][:c] for e, c in zip(active, counts)]),
                                           np.concatenate([messages[e]["legal"][:c] for e, c in zip(active, counts)]))
            self.infer_seconds += time.perf_counter() - t0
            self.batches += 1
            self.leaves += sum(counts)
        offset = 0
        for e, c in zip(active, counts):
            self.reply["priors"][:c] = priors[offset:offset + c] if c else 0.0
            self.reply["values"][:c] = values[offset:offset + c] if c else 0.0
            self.reply["version"][0] = self.version
            offset += c
            self.exchange.send_reply(e, self.replies.pack(self.reply, self.reply_buffer))
        self.link.beat({"version": self.version, "mean_batch": self.leaves / max(self.batches, 1), "passes": 1.0,
                        "infer_ms": 1e3 * self.infer_seconds / max(self.batches, 1),
                        "seconds": time.monotonic() - self.started, "device": str(self.device), **self.gate_stats},
                       force=not self.live)  # the last counts (and the device) reach the summary

    def gate(self) -> None:
        """AlphaGo Zero's gating, a step at a time: start a match when a newer candidate is published, else play one
        search step of the match under way; once it ends, the candidate becomes the self-play network if it scored
        ``win_rate``."""
        go = self.config.env.go
        if self.match is None:
            newer = pull_parameters(self.params, self.link, self.config, self.candidate, wait=False)
            if newer is not None and newer > self.version:
                self.candidate_version = newer
                self.match = Match(evaluation_config(go.search, self.gating.opening), self.gating.games,
                                   seed_for(self.config.seed, 0, newer), go.board_size, go.komi,
                                   go.max_game_length or None)
            return
        self.match.step((self.evaluate_candidate, self.evaluate))
        if not self.match.done:
            return
        score = self.match.score()
        promoted = score >= self.gating.win_rate
        log.info("gating: version %d scored %.2f against version %d: %s", self.candidate_version, score,
                 self.version, "now plays self-play" if promoted else "rejected")
        if promoted:
            self.net.load_state_dict(self.candidate.state_dict())
            self.version = self.candidate_version
        self.gate_stats = {"gate_matches": self.gate_stats["gate_matches"] + 1,
                           "gate_promoted": self.gate_stats["gate_promoted"] + promoted, "gate_score": score}
        self.match = None


class GoLearnerWorker(LockstepLearner):
    """A learner rank: games from its ring into its replay buffer, AlphaZero updates in lockstep with the other
    learners (every decision from the allreduced control vector, as the PPO learners take theirs)."""

    def __init__(self, config: TrainConfig, allreduce: Allreduce, ring: ExperienceRing, params: ParameterChannel,
                 link: ControlLink, resume: tuple[int, dict] | None, gpu_slot: int = 0):
        super().__init__(config, allreduce, link)
        self.ring, self.params = ring, params
        go, az = config.env.go, config.alphazero
        self.device = select_device(config.pipeline.learner_device, gpu_slot)
        torch.manual_seed(config.seed)
        self.net = GoNet(go.net, go.board_size).to(self.device)
        self.learner = AlphaZeroLearner(self.net, az, allreduce.sum, allreduce.size, self.device)
        if resume is not None:
            self.learner.load_checkpoint_sections(resume[1])
        # Learners start from learner 0's network.
        self.allreduce.broadcast_([t for t in self.net.state_dict().values() if t.is_floating_point()])
        self.buffer = ReplayBuffer(az.replay_positions, go.board_size, NUM_PLANES)
        self.buffer_path = RunLayout.of(config.runs_dir, config.run_name).replay_buffer(self.index)
        if resume is not None:
            self.restore_buffer(resume[0])
        self.schema = GameSchema(go.board_size, go.game_length)
        self.rng = np.random.default_rng([config.seed, self.index, self.learner.version])
        self.target_reuse = float("inf") if az.target_reuse is None else az.target_reuse
        # produced: positions received; consumed: positions sampled by updates
        self.consumed_ids: list[tuple[int, int, int]] = []  # games taken into the replay buffer
        self.left: list[tuple[int, int, int]] = []  # games taken after the learners stopped

    def publish(self) -> None:
        self.params.publish(encode_parameters(self.learner.version, self.net))

    def save_buffer(self) -> None:
        """This learner's replay buffer to its file (``hpc_rl.storage.replay_buffer``), with the version it is at.
        The file is a cache, not committed state: a failed write (a full filesystem) is logged and training goes on,
        the earlier file left whole."""
        started = time.monotonic()
        try:
            write_replay_buffer(self.buffer_path, self.buffer.state(), version=self.learner.version)
        except OSError as err:
            log.error("replay buffer not written to %s at version %d (a resume takes an older one or none): %s",
                      self.buffer_path, self.learner.version, err)
            return
        log.info("replay buffer: %d positions written to %s at version %d in %.1f s", self.buffer.size,
                 self.buffer_path, self.learner.version, time.monotonic() - started)

    def restore_buffer(self, version: int) -> None:
        """On resume: the positions of this learner's buffer file played by versions up to ``version``. A file
        that cannot be trusted is set aside (the learners start from an empty buffer, as a new run does)."""
        try:
            found = read_replay_buffer(self.buffer_path)
        except DamagedFileError as err:
            log.warning("replay buffer not restored, set aside as %s: %s", set_aside(self.buffer_path), err)
            return
        if found is None:
            log.warning("replay buffer: no %s to restore; the learners start from an empty buffer", self.buffer_path)
            return
        arrays, attrs = found
        try:
            held = self.buffer.restore(arrays, version)
        except ValueError as err:  # other input planes (the board size is a network shape: refused earlier)
            log.warning("replay buffer %s not restored: %s", self.buffer_path, err)
            return
        log.info("replay buffer: %d of the %d positions of %s (written at version %s) restored", held,
                 len(arrays["z"]), self.buffer_path, attrs.get("version"))

    def final_checkpoint(self) -> None:
        super().final_checkpoint()
        self.save_buffer()

    def take_games(self) -> list[tuple[int, int, int]]:
        """Every game in the ring into the replay buffer, oldest first; their ids."""
        views = self.ring.take_view()
        taken = []
        try:
            for seg in views:
                try:
                    record, env_rank, seq = self.schema.unpack(seg.payload)
                except SegmentError as err:
                    self.rejected += 1
                    log.warning("game from rank %d seq %d rejected: %s", seg.writer, seg.seq, err)
                    continue
                self.buffer.add(record.planes, record.pi, record.z, record.versions, record.winner,
                                ownership=ownership_targets(record.to_play, record.ownership),
                                scored=not record.resigned)
                self.produced += len(record.z)
                taken.append((seg.writer, env_rank, seq))
        finally:
            self.ring.release(views)
        return taken

    def step(self) -> bool:
        """Take the games that arrived; if every learner holds ``min_positions`` and the reuse target allows it, make
        one update together. True if an update was made."""
        if self.done or self.halted is not None:
            return False
        az, pipeline = self.config.alphazero, self.config.pipeline
        self.consumed_ids += self.take_games()
        control = self._control(self.buffer.size >= az.min_positions, float(az.batch_size))
        stop = control["stop_version"]
        # While a learner's buffer is still filling to min_positions, the next version may be minutes away: a stop
        # (a signal, the time limit) then ends the sitting at this version, its positions kept in the buffer files.
        filling = control["not_ready"] > 0
        if self.learner.version >= pipeline.max_versions or (stop and (self.learner.version >= stop or filling)):
            if stop and filling and self.first:
                log.warning("stopping at version %d before the learners' next update: the replay buffers hold fewer "
                            "than alphazero.min_positions=%d positions (this one %d); they are saved for a resume",
                            self.learner.version, az.min_positions, self.buffer.size)
            self._finish()
            return False
        self.link.beat(self._stats())
        if not may_update(control, 1, self.target_reuse):
            return False
        batch = self.buffer.sample(az.batch_size, self.rng, az.even_wins, az.symmetries)
        metrics = self.learner.update(batch["planes"], batch["pi"], batch["z"], batch["ownership"], batch["scored"])
        self.consumed += az.batch_size
        version = self.learner.version
        skipped = metrics[M.NONFINITE_SKIPPED] > 0
        self.nonfinite_streak = self.nonfinite_streak + 1 if skipped else 0
        checkpointing = version % pipeline.checkpoint_every == 0 and not self.nonfinite_streak
        staleness = np.maximum(version - 1 - batch["version"], 0)
        summed = self.allreduce.sum(torch.tensor([staleness.sum(), staleness.size], dtype=torch.float64)).numpy()
        if self.index == 0:
            if version % pipeline.publish_every == 0:
                self.publish()
            consumed = control["consumed"] + control["next_batch"]
            metrics.update({M.STALENESS_MEAN: summed[0] / max(summed[1], 1.0),
                            M.REUSE: consumed / max(control["produced"], 1.0),
                            M.REJECTED_SEGMENTS: control["rejected"], M.LEARNER_SAMPLES: consumed,
                            M.LEARNER_SAMPLES_PER_S: consumed / max(time.monotonic() - self.started, 1e-9),
                            M.REPLAY_POSITIONS: float(self.buffer.size),
                            M.BLACK_WIN_SHARE: self.buffer.black_win_share()})
            self.link.send((version, metrics), TAG_METRICS)
            if checkpointing:
                self.link.send((version, self.learner.checkpoint_sections()), TAG_CHECKPOINT)
        if checkpointing:  # every learner, its own buffer
            self.save_buffer()
        if self.nonfinite_streak >= pipeline.max_nonfinite:
            self._halt(version)
        return True

    def drain(self) -> list[tuple[int, int, int]]:
        """Games that arrive after the learners stopped: never trained on (the accounting's "left")."""
        self.left += self.take_games()
        return self.left

    def _stats(self) -> dict:
        return {"version": self.learner.version, "produced": self.produced, "consumed": self.consumed,
                "held": self.buffer.size, "seconds": time.monotonic() - self.started, "device": str(self.device)}
