"""Every metric a run writes to ``metrics.h5`` (one row per policy version), named once.

The writers (the PPO learner, the learner role, the controller, evaluator ranks and the offline tournament) and the
readers (``hpc_rl.study``, ``analysis/``, the benchmarks, jobs) import these names.
"""

from __future__ import annotations

# The PPO update (hpc_rl.algo.learner): means over the version's gradient steps ...
POLICY_LOSS = "train/policy_loss"
VALUE_LOSS = "train/value_loss"
ENTROPY = "train/entropy"
APPROX_KL = "train/approx_kl"
CLIP_FRACTION = "train/clip_fraction"
GRAD_CLIPPED_FRACTION = "train/grad_clipped_fraction"  # parameters OpenAI Five's per-parameter clip clipped
KICKSTART_LOSS = "train/kickstart_loss"  # −log π(teacher's action): 0 where kickstarting is off
LOSS = "train/loss"  # Go (hpc_rl.algo.alphazero): (z - v)^2 - pi . log p + w_o ownership, its parts
OWNERSHIP_LOSS = "train/ownership_loss"  # Go: the ownership head's loss (unweighted) over games played out
# ... and figures of the whole update
LR = "train/lr"
ENTROPY_COEF = "train/entropy_coef"
KICKSTART_COEF = "train/kickstart_coef"
NONFINITE_SKIPPED = "train/nonfinite_skipped"  # gradient steps skipped on a non-finite loss
EXPLAINED_VARIANCE = "train/explained_variance"
TRAIN_STALENESS = "train/staleness"  # mean of (learner version - 1 - behaviour version) over the batch
UPDATE_SECONDS = "perf/update_seconds"
SAMPLES = "perf/samples"  # trained samples (weight > 0) in the batch

# The learner role (hpc_rl.roles.learner): data quality and throughput over every learner
STALENESS_MEAN = "data/staleness_mean"
STALENESS_BINS = 16  # data/staleness_hist/00 .. 15; the last bin counts staleness >= 15
REUSE = "data/reuse"  # samples consumed by gradient steps (every epoch counts) / produced
REJECTED_SEGMENTS = "data/rejected_segments"
DROPPED_SEGMENTS = "data/dropped_segments"  # learner 0's, dropped from a full buffer before any use (only a reuse
#                                              target below ppo.epochs drops: producers otherwise wait on the ring)
LEARNER_SAMPLES = "perf/learner_samples"  # trained samples (weight > 0) consumed so far, once per sample
LEARNER_SAMPLES_PER_S = "perf/learner_samples_per_s"  # samples consumed per second, once per sample
BUFFER_SEGMENTS = "perf/buffer_segments"
RING_OCCUPANCY = "perf/ring_occupancy"  # fraction of ring slots READY, over the polls since the last update


def staleness_bin(b: int) -> str:
    """The histogram's bin ``b``: samples trained on ``b`` versions after they were played."""
    return f"data/staleness_hist/{b:02d}"


# The controller (hpc_rl.roles.controller), from every rank's heartbeats
ENV_STEPS = "perf/env_steps"
ENV_STEPS_PER_S = "perf/env_steps_per_s"
INFERENCE_BATCH = "perf/inference_batch"  # mean observations per step of an inference rank (all its env ranks)
INFERENCE_PASSES = "perf/inference_passes"  # mean forward passes per step: 1 + the past versions in play
INFERENCE_MS = "perf/inference_ms"  # mean time of a step: observations to the device, passes, actions back
WALL_SECONDS = "perf/wall_seconds"  # since this sitting (job) started
RUN_SECONDS = "perf/run_seconds"  # over the run's sittings: those up to the resumed version, and this one's
# Bytes the transport moved so far, over every env and inference rank: the step requests env ranks sent (each a
# step's observations of all its copies, its rewards and dones), the observation fields among them (float16 on the
# wire with transport.fp16_observations), the segments inference ranks put into the experience rings, and their
# observation fields. Divided by perf/env_steps: bytes per copy-step.
REQUEST_BYTES = "transport/request_bytes"
REQUEST_OBSERVATION_BYTES = "transport/request_observation_bytes"
SEGMENT_BYTES = "transport/segment_bytes"
SEGMENT_OBSERVATION_BYTES = "transport/segment_observation_bytes"
WIN_RATE_VS_SCRIPTED = "eval/win_rate_vs_scripted"  # the learning side's games against the bot, last ten versions
WIN_RATE_WINDOW = 10  # the versions whose finished games each row of the two series above and below counts
GAMES_VS_SCRIPTED = "eval/games_vs_scripted"
# Game version 2 (env.game_version=2): the share of env copy-steps since the last version played under its rules,
# the share env.new_version_share schedules for this version (games draw it as they start, so the played share
# follows it by about a game's length), and the win rate against the bot in version 2 games (last ten versions)
NEW_VERSION_SHARE = "env/new_version_share"
NEW_VERSION_SHARE_TARGET = "env/new_version_share_target"
WIN_RATE_VS_SCRIPTED_NEW_VERSION = "eval/win_rate_vs_scripted_new_version"
GAMES_VS_SCRIPTED_NEW_VERSION = "eval/games_vs_scripted_new_version"
EPISODE_RETURN = "stats/episode_return"  # Gymnasium, PettingZoo (per agent): mean return of the last ten versions' episodes
# Go's self-play (env.name=go), over every env rank since the run started (this job's): finished games, the
# positions searched in them, games and positions per second, the share of games a player resigned, the mean game
# length in moves, the share black won; of the calibration games (no resignation) in which a player would have
# resigned, the share that player went on not to lose; and the resignation threshold in force now (the env ranks'
# mean; absent while none is: calibrating, or resignation off)
GO_GAMES = "selfplay/games"
GO_POSITIONS = "selfplay/positions"
GO_GAMES_PER_S = "selfplay/games_per_s"
GO_POSITIONS_PER_S = "selfplay/positions_per_s"
GO_RESIGNED = "selfplay/resigned_share"
GO_GAME_LENGTH = "selfplay/game_length"
GO_RESIGN_FALSE_POSITIVES = "selfplay/resign_false_positives"
GO_BLACK_WINS = "selfplay/black_win_share"
GO_RESIGN_THRESHOLD = "selfplay/resign_threshold"
REPLAY_POSITIONS = "data/replay_positions"  # positions in learner 0's replay buffer
BLACK_WIN_SHARE = "data/black_win_share"  # of the positions in learner 0's replay buffer, those of games black won
# Go's gating (env.go.gating.games > 0), from the inference ranks: the version self-play uses, the matches of
# candidates ended and won, the last match's score of its candidate
GATE_SELFPLAY_VERSION = "gating/selfplay_version"
GATE_MATCHES = "gating/matches"
GATE_PROMOTED = "gating/promoted"
GATE_SCORE = "gating/score"
EPISODE_LENGTH = "stats/episode_length"  # episodes that end per agent (Neural MMO: lifetimes), last ten versions
POOL_SIZE = "league/pool_size"
GAMES_VS_PAST = "league/games_vs_past"
SCORE_VS_PAST = "league/score_vs_past"

# Ratings (evaluator ranks, the offline tournament): eval/<family>/<player>
TRUESKILL, TRUESKILL_SIGMA, GAMES = "trueskill", "trueskill_sigma", "games"
WIN_RATE, DRAW_RATE, GAMES_VS = "win_rate", "draw_rate", "games_vs"
POLICY = "policy"  # the player name of a rated version; the others are reference agents


def rating(family: str, player: str) -> str:
    return f"eval/{family}/{player}"


def parse_rating(name: str) -> tuple[str, str] | None:
    """(family, player) of a rating series ``eval/<family>/<player>``, or None for any other name."""
    parts = name.split("/")
    return (parts[1], parts[2]) if len(parts) == 3 and parts[0] == "eval" else None
