"""Speed of the embedded ``moba`` environment on one core, in whole games: 1v1 and 5v5.

``python -m hpc_rl.bench env --json``. The scripted bot plays random legal actions (team 0 in even copies, team 1 in
odd ones: ``"scripted_team": "copy % 2"``), each choosing every step from the current observation and its masks, as
an env rank's opponent does. Every copy plays until it has finished ``--games`` games (at least 5 by default; copies
that finish first play on, and their extra games count in ``episodes_finished``); the env starts a copy's next game
inside ``step``, so resets are part of the cost.

Timed apart, with ``time.perf_counter`` around each call:

- the env: ``env.step`` (rules, resets, observations and masks) gives ``agent_steps_per_s`` and ``env_steps_per_s``
  (copy-steps) and ``env_seconds_per_step`` (one vectorised step of all copies);
- the bots: each bot's ``act`` gives ``bot_seconds_per_step`` per bot (each answers for every agent of every copy,
  as the actor interface asks) and ``bot_share``, the bots' part of env plus bots.

``combat_step_share`` is the share of copy-steps in which some unit took damage, read from the env's state arrays
outside the timed calls: a hero hit this step (its last-hurt step is now), a creep, tower or base whose hp changed
or that died (only heroes regenerate); the last step of a game counts when a base fell or a hero's or structure's hp
reward event is negative (the copy has already been reset). ``early_game_replay`` is the previous measure beside it:
the same copies replaying the first 64 legal random actions of a game in a loop, where heroes walk out of base and
nobody fights; ``full_games_vs_replay`` divides the two agent-step rates.

Defaults: 64 copies in 1v1 and 16 in 5v5, 5 games per copy, 1,000 replay steps. Whole games take most of the time
(1v1 games last ~2,000-3,000 steps, 5v5 ones ~1,500-6,000, and the slowest copy sets the run's length); with these
copies the bench runs in about a minute on a free core and well within 3 minutes on a loaded one, and 64 or 16
copies are what an env rank steps (the replay's per-copy rate changes little from 64 to 256 copies).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one core, before numpy and numba start their pools

import time  # noqa: E402

import numpy as np  # noqa: E402

from hpc_rl.envs.moba import GT, HHURT, IALIVE, UHP, MobaConfig, MobaEnv  # noqa: E402
from hpc_rl.envs.moba_config import EV_HP, EV_TOWER_HP  # noqa: E402
from hpc_rl.envs.scripted import RandomBot, ScriptedBot, warm_up  # noqa: E402
from hpc_rl.play import team_agents  # noqa: E402

REPLAYED_ACTIONS = 64  # steps of a game's beginning that the early-game replay loops over


def add_arguments(parser) -> None:
    parser.add_argument("--copies-1v1", type=int, default=64, help="1v1 copies stepped together")
    parser.add_argument("--copies-5v5", type=int, default=16, help="5v5 copies stepped together")
    parser.add_argument("--games", type=int, default=5, help="games every copy finishes (at least)")
    parser.add_argument("--replay-steps", type=int, default=1000, help="timed steps of the early-game replay")
    parser.add_argument("--warmup", type=int, default=100, help="untimed replay steps first (caches)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the games and the random bot")


def took_damage(env: MobaEnv, hp0: np.ndarray, alive0: np.ndarray, events: np.ndarray, dones: np.ndarray,
                winners: np.ndarray) -> np.ndarray:
    """(E,) bool: the copies in which some unit took damage in the step just played. ``hp0`` and ``alive0`` are the
    hp and alive flags of every non-hero unit (creeps, towers, bases) before the step.

    Heroes record the step they were last hurt; the other units never regain hp, so a change of hp (a replacement
    creep in the slot of a killed one included) or a death is damage. A copy whose game ended has been reset: its
    step counts when a base fell (``winners`` >= 0) or a hero's or structure's hp event is negative."""
    H = env.spec.num_agents
    heroes_hit = (env.hf[:, :, HHURT] == env.gi[:, GT, None]).any(axis=1)
    hp1, alive1 = env.uf[:, H:, UHP], env.ui[:, H:, IALIVE] == 1
    others_hit = (alive0 & ((hp1 != hp0) | ~alive1)).any(axis=1)
    ended_hit = (winners >= 0) | (events[:, :, [EV_HP, EV_TOWER_HP]] < 0).any(axis=(1, 2))
    return np.where(dones, ended_hit, heroes_hit | others_hit)


def play_whole_games(config: MobaConfig, num_envs: int, games: int, seed: int) -> dict:
    """Scripted against random in ``num_envs`` copies until every copy has finished ``games`` games; env and bots
    timed apart (see the module docstring)."""
    env = MobaEnv(config, num_envs)
    scripted_team = np.arange(num_envs) % 2
    scripted_agents = team_agents(env.spec, scripted_team)
    bots = {"scripted": (ScriptedBot(config), scripted_agents), "random": (RandomBot(seed), ~scripted_agents)}
    bot_seconds = dict.fromkeys(bots, 0.0)
    env_seconds = 0.0
    H = env.spec.num_agents
    obs = env.reset(seed)
    finished = np.zeros(num_envs, dtype=np.int64)
    lengths: list[np.ndarray] = []
    wins = {"scripted": 0, "random": 0, "draw": 0}
    combat = 0
    steps = 0
    while finished.min() < games:
        actions = {}
        for name, (bot, agents) in bots.items():
            start = time.perf_counter()
            chosen = bot.act(obs)
            bot_seconds[name] += time.perf_counter() - start
            for head, values in chosen.items():
                actions[head] = np.where(agents, values, actions.get(head, 0))
        hp0, alive0 = env.uf[:, H:, UHP].copy(), env.ui[:, H:, IALIVE] == 1
        start = time.perf_counter()
        obs, events, dones, infos = env.step(actions)
        env_seconds += time.perf_counter() - start
        steps += 1
        combat += int(took_damage(env, hp0, alive0, events, dones, infos["winner"]).sum())
        if dones.any():
            finished += dones
            lengths.append(infos["episode_length"][dones])
            winner = infos["winner"][dones]
            wins["draw"] += int((winner < 0).sum())
            wins["scripted"] += int((winner == scripted_team[dones]).sum())
            wins["random"] += int(((winner >= 0) & (winner != scripted_team[dones])).sum())
    bot_total = sum(bot_seconds.values())
    return {"agent_steps_per_s": steps * num_envs * H / env_seconds, "env_steps_per_s": steps * num_envs / env_seconds,
            "env_seconds_per_step": env_seconds / steps,
            "bot_seconds_per_step": {name: s / steps for name, s in bot_seconds.items()},
            "bot_share": bot_total / (bot_total + env_seconds),
            "episodes_finished": int(finished.sum()), "min_episodes_per_copy": int(finished.min()),
            "mean_episode_length": float(np.concatenate(lengths).mean()), "outcomes": wins,
            "combat_step_share": combat / (steps * num_envs), "steps": steps,
            "bots": list(bots), "scripted_team": "copy % 2"}


def replay_early_game(config: MobaConfig, num_envs: int, steps: int, warmup: int, seed: int) -> dict:
    """The first ``REPLAYED_ACTIONS`` legal random actions of a game, replayed in a loop (the env plays those no
    longer legal as noop): observations and masks built every step, no opponent's cost, no fighting."""
    env = MobaEnv(config, num_envs)
    bot = RandomBot(seed)
    obs = env.reset(seed)
    actions = []
    for _ in range(REPLAYED_ACTIONS):
        actions.append(bot.act(obs))
        obs = env.step(actions[-1])[0]
    for i in range(warmup):
        env.step(actions[i % len(actions)])
    start = time.perf_counter()
    for i in range(steps):
        env.step(actions[i % len(actions)])
    elapsed = time.perf_counter() - start
    agents = env.spec.num_agents
    return {"agent_steps_per_s": steps * num_envs * agents / elapsed, "env_steps_per_s": steps * num_envs / elapsed,
            "steps": steps, "replayed_actions": REPLAYED_ACTIONS}


def measure(config: MobaConfig, num_envs: int, games: int, replay_steps: int, warmup: int, seed: int) -> dict:
    """Whole games and the early-game replay of one game variant, on the same number of copies."""
    full = play_whole_games(config, num_envs, games, seed)
    replay = replay_early_game(config, num_envs, replay_steps, warmup, seed)
    return {**full, "num_envs": num_envs, "agents_per_env": config.spec().num_agents, "games_per_copy": games,
            "early_game_replay": replay,
            "full_games_vs_replay": full["agent_steps_per_s"] / replay["agent_steps_per_s"]}


def check_arguments(args) -> None:
    for name in ("copies_1v1", "copies_5v5", "games", "replay_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be in [0, 2**63), got {args.seed}")


def run(args) -> dict:
    check_arguments(args)
    warm_up()  # compiled (or loaded from numba's cache) before any timing
    return {name: measure(config, copies, args.games, args.replay_steps, args.warmup, args.seed)
            for name, config, copies in (("1v1", MobaConfig(), args.copies_1v1),
                                         ("5v5", MobaConfig.five_v_five(), args.copies_5v5))}
