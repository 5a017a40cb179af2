"""Speed of the embedded environments on one core: ``moba`` in whole games (1v1 and 5v5), and ``nmmo`` worlds of 128
and 1,024 agents (``nmmo_128``, ``nmmo_1024``, below).

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
reward event is negative (the copy has already been reset).

``early_game_replay`` is the previous measure beside it, on as many copies: the first 64 legal random actions of a
game replayed in a loop over steps 164 to 1,164 of the game (``--warmup``, ``--replay-window``), where the heroes
mostly walk out of base, no game ends and no copy resets; then its copies start over, untimed. Its steps are
interleaved with the whole games (one every ``--replay-every`` steps) so that both see the same load on a shared
machine; it reports its own ``combat_step_share`` (creep waves meet from step ~100 on) and ``episodes_finished`` (0),
and ``full_games_vs_replay`` divides the two agent-step rates.

``nmmo_<agents>``: copies of a Neural MMO world (``hpc_rl.envs.nmmo``) stepped by the forager bot
(``hpc_rl.envs.nmmo_bots``, attacking on 2% of its ticks), ``--nmmo-steps`` timed ticks after untimed ones that let
the population reach the cap (the cap + 100 ticks). The worlds drain no food or water (``drain`` 0): with the paper's
drain the forager's agents starve within ~30 ticks, so that a world holds about as many agents as it spawns in a
lifetime (~20% of 128 slots, ~5% of 1,024), and the measure would be one of empty slots. ``paper_drain`` beside it
is the same world with the paper's drain, for comparison. ``env.step`` (rules, observations and masks) is timed by
the wall clock (``agent_steps_per_s``: agent slots × ticks per second, the rows a learner gets) and by the thread's
CPU time (``agent_steps_per_cpu_s``: what one core does, whatever else runs on it); ``live_agent_steps_per_s``
counts the living agents only, ``mean_alive`` their share of the slots, ``deaths_per_tick`` one copy's. 128 agents
on the default 80-tile map, 8 copies; 1,024 on a 160-tile map (144 x 144 inside the lava), one copy.
``load_average`` is the machine's one-minute load before and after.

Defaults: 256 copies in 1v1 (as the replay measured before) and 16 in 5v5, 5 games per copy, a replay step every 4th
step. Games last ~2,600 steps in 1v1 and ~1,800 in 5v5, and the copy with the longest games sets the run's length
(~23,000 steps in 1v1, ~12,500 in 5v5): about 60-65 CPU-seconds in all, 1-2 minutes on a core shared with other work
(68 s at 87% of a core, 116 s at 56%). More 5v5 copies lengthen the run (the longest of more copies' games) for
little change of the rates.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one core, before numpy and numba start their pools

import dataclasses  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from hpc_rl.envs.moba import GT, HHURT, IALIVE, UHP, MobaConfig, MobaEnv  # noqa: E402
from hpc_rl.envs.moba_config import EV_HP, EV_TOWER_HP  # noqa: E402
from hpc_rl.envs.nmmo import NmmoEnv  # noqa: E402
from hpc_rl.envs.nmmo_bots import Forager  # noqa: E402
from hpc_rl.envs.nmmo_config import NmmoConfig  # noqa: E402
from hpc_rl.envs.scripted import RandomBot, ScriptedBot, warm_up  # noqa: E402
from hpc_rl.play import team_agents  # noqa: E402

REPLAYED_ACTIONS = 64  # steps of a game's beginning that the early-game replay loops over
NMMO_AGGRESSION = 0.02  # the forager's chance to attack per tick: combat without emptying the world


def add_arguments(parser) -> None:
    parser.add_argument("--copies-1v1", type=int, default=256, help="1v1 copies stepped together")
    parser.add_argument("--copies-5v5", type=int, default=16, help="5v5 copies stepped together")
    parser.add_argument("--games", type=int, default=5, help="games every copy finishes (at least)")
    parser.add_argument("--replay-every", type=int, default=4, help="one early-game replay step every this many steps")
    parser.add_argument("--replay-window", type=int, default=1000, help="timed replay steps before its copies restart")
    parser.add_argument("--warmup", type=int, default=100, help="untimed replay steps before each window")
    parser.add_argument("--seed", type=int, default=0, help="seed of the games and the random bot")
    parser.add_argument("--nmmo-copies", type=int, default=8, help="copies of the 128-agent Neural MMO world")
    parser.add_argument("--nmmo-steps", type=int, default=300, help="timed ticks of each Neural MMO world")


def non_hero_state(env: MobaEnv) -> tuple[np.ndarray, np.ndarray]:
    """The hp and alive flags of every creep, tower and base, (E, U - A) each: ``took_damage``'s before-step state."""
    H = env.spec.num_agents
    return env.uf[:, H:, UHP].copy(), env.ui[:, H:, IALIVE] == 1


def took_damage(env: MobaEnv, hp0: np.ndarray, alive0: np.ndarray, events: np.ndarray, dones: np.ndarray,
                winners: np.ndarray) -> np.ndarray:
    """(E,) bool: the copies in which some unit took damage in the step just played; ``hp0``, ``alive0``: the
    ``non_hero_state`` before the step.

    Heroes record the step they were last hurt; the other units never regain hp, so a change of hp (a replacement
    creep in the slot of a killed one included) or a death is damage. A copy whose game ended has been reset: its
    step counts when a base fell (``winners`` >= 0) or a hero's or structure's hp event is negative."""
    H = env.spec.num_agents
    heroes_hit = (env.hf[:, :, HHURT] == env.gi[:, GT, None]).any(axis=1)
    hp1, alive1 = env.uf[:, H:, UHP], env.ui[:, H:, IALIVE] == 1
    others_hit = (alive0 & ((hp1 != hp0) | ~alive1)).any(axis=1)
    ended_hit = (winners >= 0) | (events[:, :, [EV_HP, EV_TOWER_HP]] < 0).any(axis=(1, 2))
    return np.where(dones, ended_hit, heroes_hit | others_hit)


def play_whole_games(config: MobaConfig, num_envs: int, games: int, seed: int, replay: EarlyGameReplay | None = None,
                     replay_every: int = 1) -> dict:
    """Scripted against random in ``num_envs`` copies until every copy has finished ``games`` games; env and bots
    timed apart (see the module docstring). ``replay`` steps after the first step and every ``replay_every`` steps
    from there, in the same minutes."""
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
        hp0, alive0 = non_hero_state(env)
        start = time.perf_counter()
        obs, events, dones, infos = env.step(actions)
        env_seconds += time.perf_counter() - start
        if replay is not None and steps % replay_every == 0:
            replay.step()
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


class EarlyGameReplay:
    """The benchmark's earlier measure: the first ``REPLAYED_ACTIONS`` legal random actions of a game replayed in a
    loop (the env plays those no longer legal as noop) for steps ``REPLAYED_ACTIONS + warmup`` to ``... + window`` of
    the game, after which the copies start over (untimed). Observations and masks are built every step; no opponent's
    cost, and the heroes mostly walk out of base. ``step`` plays and times one step; ``result`` gives the rates."""

    def __init__(self, config: MobaConfig, num_envs: int, window: int, warmup: int, seed: int):
        self.env = MobaEnv(config, num_envs)
        self.window, self.warmup, self.seed = window, warmup, seed
        self.steps, self.seconds, self.combat, self.episodes = 0, 0.0, 0, 0
        self._start()

    def _start(self) -> None:
        bot = RandomBot(self.seed)
        obs = self.env.reset(self.seed)
        self.actions = []
        for _ in range(REPLAYED_ACTIONS):
            self.actions.append(bot.act(obs))
            obs = self.env.step(self.actions[-1])[0]
        for i in range(self.warmup):
            self.env.step(self.actions[i % REPLAYED_ACTIONS])
        self.in_window = 0

    def step(self) -> None:
        if self.in_window == self.window:
            self._start()
        hp0, alive0 = non_hero_state(self.env)
        start = time.perf_counter()
        _, events, dones, infos = self.env.step(self.actions[self.in_window % REPLAYED_ACTIONS])
        self.seconds += time.perf_counter() - start
        self.steps += 1
        self.in_window += 1
        self.combat += int(took_damage(self.env, hp0, alive0, events, dones, infos["winner"]).sum())
        self.episodes += int(dones.sum())

    def result(self) -> dict:
        env_steps = self.steps * self.env.num_envs
        return {"agent_steps_per_s": env_steps * self.env.spec.num_agents / self.seconds,
                "env_steps_per_s": env_steps / self.seconds, "steps": self.steps, "window": self.window,
                "replayed_actions": REPLAYED_ACTIONS, "episodes_finished": self.episodes,
                "combat_step_share": self.combat / env_steps}


def measure(config: MobaConfig, num_envs: int, games: int, replay_every: int, replay_window: int, warmup: int,
            seed: int) -> dict:
    """Whole games and, interleaved with them on as many copies, the early-game replay of one game variant."""
    replay = EarlyGameReplay(config, num_envs, replay_window, warmup, seed)
    full = play_whole_games(config, num_envs, games, seed, replay, replay_every)
    early = replay.result()
    return {**full, "num_envs": num_envs, "agents_per_env": config.spec().num_agents, "games_per_copy": games,
            "early_game_replay": early, "full_games_vs_replay": full["agent_steps_per_s"] / early["agent_steps_per_s"]}


def nmmo_worlds(copies_128: int) -> tuple[tuple[str, NmmoConfig, int], ...]:
    """(entry, world, copies) of the Neural MMO measures."""
    return (("nmmo_128", NmmoConfig(drain=0), copies_128),
            ("nmmo_1024", NmmoConfig(num_agents=1024, map_size=160, drain=0), 1))


def step_nmmo(config: NmmoConfig, num_envs: int, steps: int, seed: int) -> dict:
    """The forager in ``num_envs`` copies: the cap + 100 untimed ticks, then ``steps`` timed ones."""
    env = NmmoEnv(config, num_envs)
    bot = Forager(config, seed, aggression=NMMO_AGGRESSION)
    obs = env.reset(seed)
    for _ in range(config.num_agents + 100):
        obs = env.step(bot.act(obs))[0]
    wall = cpu = bot_seconds = 0.0
    alive = deaths = 0
    for _ in range(steps):
        start = time.perf_counter()
        actions = bot.act(obs)
        bot_seconds += time.perf_counter() - start
        start, start_cpu = time.perf_counter(), time.thread_time()
        obs, _, _, infos = env.step(actions)
        cpu += time.thread_time() - start_cpu
        wall += time.perf_counter() - start
        alive += int(env.alive.sum())
        deaths += int(infos["agent_done"].sum())
    slots = steps * num_envs * config.num_agents
    return {"agent_steps_per_s": slots / wall, "agent_steps_per_cpu_s": slots / cpu,
            "live_agent_steps_per_s": alive / wall, "mean_alive": alive / slots,
            "deaths_per_tick": deaths / (steps * num_envs), "env_seconds_per_step": wall / steps,
            "bot_seconds_per_step": bot_seconds / steps, "steps": steps}


def measure_nmmo(config: NmmoConfig, num_envs: int, steps: int, seed: int) -> dict:
    """A world without drain (the population at its cap) and, as ``paper_drain``, with the paper's."""
    load = os.getloadavg()[0]
    full = step_nmmo(config, num_envs, steps, seed)
    paper = step_nmmo(dataclasses.replace(config, drain=NmmoConfig().drain), num_envs, steps, seed)
    return {**full, "num_envs": num_envs, "agents_per_env": config.num_agents, "map_size": config.map_size,
            "drain": config.drain, "bot": f"forager, aggression {NMMO_AGGRESSION}",
            "paper_drain": {k: paper[k] for k in ("agent_steps_per_s", "agent_steps_per_cpu_s",
                                                  "live_agent_steps_per_s", "mean_alive", "deaths_per_tick")},
            "load_average": [load, os.getloadavg()[0]]}


def check_arguments(args) -> None:
    for name in ("copies_1v1", "copies_5v5", "games", "replay_every", "replay_window", "nmmo_copies", "nmmo_steps"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    if not 0 <= args.seed < 2**63:
        raise ValueError(f"--seed must be in [0, 2**63), got {args.seed}")


def run(args) -> dict:
    check_arguments(args)
    warm_up()  # compiled (or loaded from numba's cache) before any timing
    result = {name: measure(config, copies, args.games, args.replay_every, args.replay_window, args.warmup,
                            args.seed)
              for name, config, copies in (("1v1", MobaConfig(), args.copies_1v1),
                                           ("5v5", MobaConfig.five_v_five(), args.copies_5v5))}
    NmmoEnv(NmmoConfig(num_agents=2, map_size=16, border=2), 1).reset(0)  # compiled before any timing
    for name, config, copies in nmmo_worlds(args.nmmo_copies):
        result[name] = measure_nmmo(config, copies, args.nmmo_steps, args.seed)
    return result
