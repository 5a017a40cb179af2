"""Evaluating a trained run: load a checkpoint's policy and play it (``hpc_rl.play``; no MPI).

    policy, config, version = load_policy("runs/my_run")    # the latest good checkpoint
    evaluate_return(policy, config.env.make(num_envs=20), seed=0)   # Gymnasium: returns of greedy play
    play_vs_bot(policy, config, "scripted", games=400, seed=0)   # MOBA: wins, draws, losses against a reference bot
    play_match(policy, older_policy, config, games=64, seed=0)  # MOBA: two policies (or a policy and a bot), any pair
    nmmo_rollout(policy, config, copies=4, seed=0)   # Neural MMO: the first agent of every slot: lifetimes, visits
    nmmo_exploration(rollout), nmmo_niches(rollout, seed=0)   # Neural MMO: what the agents did (docs/nmmo.md)
    final_evaluation(policy, config, games=100)    # the end-of-run evaluation of summary.json (jobs/evaluate.py)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import yaml

from hpc_rl.actors import Actor, MaskedActor, PolicyActor, PopulationActors
from hpc_rl.config import TrainConfig, build_config
from hpc_rl.envs.api import VecEnv
from hpc_rl.model.policy import Policy
from hpc_rl.model.tree import to_torch_tree
from hpc_rl.play import play, team_agents
from hpc_rl.populations import population_sections
from hpc_rl.stats import mean_ci95, ratio_ci95, wilson_interval
from hpc_rl.storage import Checkpoint, open_run

# The end-of-run evaluation's seed: fixed, so that every run (and jobs/evaluate.py) plays the same games.
FINAL_EVAL_SEED = 12345
# Neural MMO: the ticks a lifetime evaluation plays at most; an agent still alive then counts the ticks it lived.
NMMO_EVAL_TICKS = 1000

Player = Policy | str  # a policy, or the name of a reference bot ("random", "scripted")


def policy_from_checkpoint(ckpt: Checkpoint, config: TrainConfig, population: int = 0) -> Policy:
    """The policy (parameters and observation normaliser) of a loaded checkpoint, in eval mode: with populations
    (``hpc_rl.populations``), population ``population``'s."""
    policy = Policy(config.env.make(num_envs=1).spec, config.model)
    try:
        sections = population_sections(ckpt.sections, population, config.populations)
    except ValueError as err:
        raise ValueError(f"{ckpt.path}: {err}") from None
    params = to_torch_tree(sections["params"])
    # Checkpoints from before value normalisation hold no value statistics: their heads predicted raw returns.
    params.setdefault("value_mean", torch.zeros(()))
    params.setdefault("value_std", torch.ones(()))
    policy.load_state_dict(params)
    return policy.eval()


def checkpoint_policies(ckpt: Checkpoint, config: TrainConfig) -> list[Policy]:
    """Every population's policy of a loaded checkpoint (one where the run has no populations)."""
    return [policy_from_checkpoint(ckpt, config, k) for k in range(config.populations)]


def load_policy(run_dir: str | Path, version: int | None = None) -> tuple[Policy, TrainConfig, int]:
    """The policy of a run's checkpoint (latest good one by default; population 0's where the run has populations),
    its config and its version."""
    ckpt, config = load_checkpoint_of_run(run_dir, version)
    return policy_from_checkpoint(ckpt, config), config, ckpt.version


def load_checkpoint_of_run(run_dir: str | Path, version: int | None = None) -> tuple[Checkpoint, TrainConfig]:
    """A run's checkpoint (latest good one by default) and the run's config."""
    run = open_run(run_dir)
    if not run.layout.config.exists():
        raise FileNotFoundError(f"{run_dir} has no {run.layout.config.name}: not a training run's directory")
    raw = yaml.safe_load(run.layout.config.read_text())
    # A run written before the core and value normalisation were settings trained an LSTM with unnormalised values.
    raw.setdefault("model", {}).setdefault("core", "lstm")
    raw.setdefault("ppo", {}).setdefault("value_norm", False)
    config = build_config(raw)
    if version is not None and version not in (committed := run.checkpoint_versions):
        shown = committed if len(committed) <= 6 else [*committed[:3], "...", *committed[-3:]]
        raise FileNotFoundError(f"{run_dir} has no checkpoint of version {version} (committed: "
                                f"{', '.join(map(str, shown)) or 'none'})")
    ckpt = run.load_checkpoint(version)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint")
    return ckpt, config


def evaluate_return(policy: Policy, env: VecEnv, seed: int, deterministic: bool = True) -> np.ndarray:
    """The policy plays one game in every copy of ``env`` (greedy unless not ``deterministic``, then sampling from
    torch's global generator): every learning agent's return, copy by copy."""
    everyone = np.ones((env.num_envs, env.spec.num_agents), dtype=bool)
    games = play(env, [(PolicyActor(policy, everyone, deterministic), everyone)], seed)
    return games.returns[:, list(env.spec.learning_agents or range(env.spec.num_agents))].ravel()


def player_actor(player: Player, agents: np.ndarray, config: TrainConfig, seed: int, deterministic: bool) -> Actor:
    """The actor of ``player`` on ``agents``: the named reference bot (seeded with ``seed``) or the policy."""
    if isinstance(player, str):
        from hpc_rl.envs.scripted import make_bot

        return make_bot(player, config.env.moba, seed=seed)
    return PolicyActor(player, agents, deterministic)


def play_match(first: Player, second: Player, config: TrainConfig, games: int, seed: int,
               deterministic: bool = False, mirrored: bool = True,
               on_step: Callable[[], None] | None = None) -> dict:
    """MOBA: ``games`` games of ``first`` against ``second`` (each a policy or a reference bot's name), one per env
    copy, sides alternating: ``first`` plays team 0 in even copies and team 1 in odd ones.

    ``mirrored`` (OpenAI Five-style fair evaluation): copies 2k and 2k+1 draw the same lineups and starting state, so
    each draw is played from both sides; it needs an even number of games. Policies sample their actions (greedy with
    ``deterministic``) from torch's generator seeded with ``seed``; bot k (0 for ``first``, 1 for ``second``) is seeded
    with ``seed + 1 + k``: the result is a function of the players and ``seed``. Each policy runs on its own agents
    only, with its own LSTM state per agent. ``on_step`` is called before the first env step and after every one (a
    rank keeps heartbeating there; it may raise to abandon the match).

    Every game is played under the run's game version (``env.game_version``; version 2: all of them under version 2's
    rules, whatever share training mixes). Returns the tally from ``first``'s side, draws (time limit) apart, and
    ``scores``: its score in each game (1 win, 0.5 draw, 0 loss), in copy order.
    """
    if not config.env.is_moba:
        raise ValueError("play_match needs a MOBA run")
    if games < 1 or (mirrored and games % 2):
        raise ValueError(f"games must be >= 1{' and even (mirrored pairs)' if mirrored else ''}, got {games}")
    env = config.env.moba_env(dataclasses.replace(config.env.moba, mirrored_pairs=mirrored), games)
    first_team = np.arange(games) % 2
    first_side = team_agents(env.spec, first_team)
    actors = [(player_actor(player, side, config, seed + 1 + k, deterministic), side)
              for k, (player, side) in enumerate(((first, first_side), (second, ~first_side)))]
    torch.manual_seed(seed)
    outcome = play(env, actors, seed, on_step=None if on_step is None else lambda t, finished: on_step()).winner
    scores = np.where(outcome == first_team, 1.0, np.where(outcome == -1, 0.5, 0.0))
    wins, draws = int((scores == 1.0).sum()), int((scores == 0.5).sum())
    low, high = wilson_interval(wins, games)
    return {"games": games, "wins": wins, "draws": draws, "losses": games - wins - draws, "win_rate": wins / games,
            "win_rate_ci95": [low, high], "scores": scores.tolist()}


def play_vs_bot(policy: Policy, config: TrainConfig, bot: str, games: int, seed: int,
                deterministic: bool = False) -> dict:
    """MOBA: the policy against a reference bot, sides alternating (the policy is team 0 in even copies, team 1 in
    odd ones); every copy plays one game. Draws (time limit) are counted apart: callers count them as losses."""
    from hpc_rl.envs.scripted import scripted_bot_hash

    if not config.env.is_moba:
        raise ValueError("play_vs_bot needs a MOBA run")
    result = play_match(policy, bot, config, games, seed, deterministic, mirrored=False)
    del result["scores"]
    return {**result, "bot": bot, "bot_hash": scripted_bot_hash() if bot == "scripted" else None}


AGENT_STRIDE = 1 << 32  # agent numbers of ``NmmoRollout``: spawn indices of different worlds never meet


@dataclasses.dataclass
class NmmoRollout:
    """What ``nmmo_rollout`` saw. Agents are numbered ``world · AGENT_STRIDE + spawn index`` (the cohort: spawn index
    below ``num_agents``), cells ``world · map_size² + row · map_size + column``; a visit is a living agent on its
    tile after a reset or a tick, an attack a style other than ``none`` that the action mask allowed."""

    lifetimes: np.ndarray  # (cohort,) float64 ticks
    population: np.ndarray  # (cohort,) int64: each cohort agent's population (its slot's)
    world: np.ndarray  # (cohort,) int64: each cohort agent's world (agents of one world are not independent draws)
    alive_at_end: int  # cohort agents still alive at the end (their lifetimes are lower bounds)
    ticks: int
    visit_agent: np.ndarray  # (V,) int64
    visit_population: np.ndarray  # (V,) int64: the slot's population (EnvSpec.agent_team)
    visit_cell: np.ndarray  # (V,) int64
    attack_agent: np.ndarray  # (K,) int64
    attack_population: np.ndarray  # (K,) int64
    attack_style: np.ndarray  # (K,) int64: 1 melee, 2 range, 3 mage
    passable: np.ndarray  # (worlds · map_size²,) bool: grass or forest when the worlds were made
    num_agents: int  # the cohort per world

    def in_cohort(self, agent: np.ndarray) -> np.ndarray:
        return agent % AGENT_STRIDE < self.num_agents


def nmmo_rollout(player: Policy | list[Policy | str] | str, config: TrainConfig, copies: int, seed: int,
                 max_ticks: int = NMMO_EVAL_TICKS, teams: np.ndarray | None = None) -> NmmoRollout:
    """Neural MMO: ``player`` (a policy, or one per population, sampling as in training, or "random", uniform over
    the legal actions) plays
    every agent of ``copies`` worlds of the run's settings from ``seed``, until the first ``num_agents`` agents to
    spawn in each world have died, or ``max_ticks`` ticks. Returns their lifetimes (ticks), how many of them were
    still alive at the end (they count the ticks they had lived: a lower bound), and every agent's visits and attacks
    (``NmmoRollout``). A cohort of the first spawns has the same size for every player, unlike the deaths within a
    window of ticks, which favour short lives. ``teams`` ((num_agents,) int, 0..k-1) puts the slots in k groups in
    place of the run's populations, ``player`` then one policy or "random" per group, all in the same worlds
    (``head_to_head_teams``); ``NmmoRollout.population`` holds the groups."""
    from hpc_rl.envs.nmmo_config import FOREST, GRASS
    from hpc_rl.envs.scripted import RandomBot

    if not config.env.is_nmmo:
        raise ValueError("nmmo_rollout needs a Neural MMO run (env.name=nmmo)")
    env = config.env.make(num_envs=copies)
    spec = env.spec
    n, size = spec.num_agents, config.env.nmmo.map_size
    groups = np.asarray(spec.agent_team if teams is None else teams, np.int64)
    if groups.shape != (n,):
        raise ValueError(f"teams must give each of the {n} slots a group, got shape {groups.shape}")
    team = np.broadcast_to(groups, (copies, n))
    world = np.broadcast_to(np.arange(copies)[:, None], (copies, n))
    players = [player] if isinstance(player, (Policy, str)) else list(player)
    for p in players:
        if isinstance(p, str) and p != "random":
            raise ValueError(f"unknown player {p!r}: a policy or 'random'")
    wanted = config.populations if teams is None else int(groups.max()) + 1
    if players != ["random"] and len(players) != wanted:
        raise ValueError(f"{len(players)} players for {wanted} " +
                         ("populations of the run" if teams is None else "groups of slots"))
    actor = RandomBot(seed + 1) if players == ["random"] else PopulationActors(
        [MaskedActor(RandomBot(seed + 1 + k), team == k) if isinstance(p, str) else PolicyActor(p, team == k)
         for k, p in enumerate(players)])
    torch.manual_seed(seed)
    obs = env.reset(seed)
    passable = np.isin(env.tiles, (GRASS, FOREST)).ravel()  # no forest is eaten (scrub) yet
    occupied = spec.occupied(obs["global"])
    who = np.where(occupied, 0, -1)  # the spawn index of every slot's agent (-1: empty); reset spawns one agent
    population = np.zeros((copies, n), dtype=np.int64)  # of each world's first n agents: their slot's
    population[:, 0] = team[np.arange(copies), np.argmax(occupied, axis=1)]
    spawns = occupied.sum(axis=1)  # agents spawned so far, per world
    spawn_tick = np.zeros((copies, n), dtype=np.int64)  # per world, of its first n agents
    lifetime = np.zeros((copies, n), dtype=np.int64)
    died = np.zeros((copies, n), dtype=bool)
    visits, attacks = [], []

    def visit() -> None:
        yx = env.positions[occupied]
        visits.append((world[occupied] * AGENT_STRIDE + who[occupied], team[occupied],
                       world[occupied] * size * size + yx[:, 0] * size + yx[:, 1]))

    visit()
    tick = 0
    while not ((spawns >= n).all() and died.all()) and tick < max_ticks:
        actions = actor.act(obs)
        style = actions["action"]
        attacked = occupied & (style > 0) & np.take_along_axis(obs["action_mask"], style[..., None], -1)[..., 0]
        attacks.append((world[attacked] * AGENT_STRIDE + who[attacked], team[attacked], style[attacked]))
        obs, _, dones, infos = env.step(actions)
        tick += 1
        now = spec.occupied(obs["global"])
        for e, a in zip(*np.nonzero(infos["agent_done"])):
            if 0 <= who[e, a] < n:
                lifetime[e, who[e, a]], died[e, who[e, a]] = infos["lifetime"][e, a], True
            who[e, a] = -1
        for e, a in zip(*np.nonzero(now & (who < 0))):  # a spawn (one per world and tick at most)
            who[e, a] = spawns[e]
            if spawns[e] < n:
                spawn_tick[e, spawns[e]] = tick
                population[e, spawns[e]] = team[e, a]
            spawns[e] += 1
        occupied = now
        visit()
        if isinstance(actor, PopulationActors):  # as inference ranks: a fresh state after a death and in an empty slot
            actor.reset_agents(spec.episode_ends(dones, infos["agent_done"]) | ~occupied)
    cohort = np.arange(n)[None, :] < spawns[:, None]
    alive = cohort & ~died
    lifetime[alive] = tick - spawn_tick[alive]
    v = [np.concatenate(column).astype(np.int64) for column in zip(*visits)]
    k = [np.concatenate(column).astype(np.int64) for column in zip(*attacks)]
    return NmmoRollout(lifetime[cohort].astype(np.float64), population[cohort], world[cohort], int(alive.sum()), tick,
                       *v, *k, passable, n)


def head_to_head_teams(num_agents: int, populations: int) -> np.ndarray:
    """The slots' groups of a head-to-head rollout: blocks of ``populations`` slots alternate between the run's
    policies (slot a in group a mod K, its population's) and the random bot (group K), so that every population and
    the bot hold about half the slots each. Agents spawn into the lowest free slot, so both meet from the start."""
    slot = np.arange(num_agents)
    return np.where((slot // populations) % 2 == 0, slot % populations, populations)


def nmmo_exploration(rollout: NmmoRollout) -> dict:
    """``tiles_per_life``: the cohort's distinct tiles per lifetime (the mean, and ``tiles_per_life_ci95``), and
    ``coverage``: the share of the passable tiles that some agent of the rollout stood on (docs/nmmo.md,
    "Behaviour")."""
    from hpc_rl.envs.nmmo_measures import coverage, distinct_tiles

    agents, tiles = distinct_tiles(rollout.visit_agent, rollout.visit_cell)
    mean, low, high = mean_ci95(tiles[rollout.in_cohort(agents)].astype(np.float64))
    return {"tiles_per_life": mean, "tiles_per_life_ci95": [low, high],
            "coverage": coverage(rollout.visit_cell, rollout.passable)}


def nmmo_niches(rollout: NmmoRollout, seed: int) -> dict:
    """The niche measures (``hpc_rl.envs.nmmo_measures.niche_measures``) of the rollout's tile visits (``tiles``)
    and attack styles (``styles``): ``between`` populations (None with one), the ``split_half`` baseline and the
    ``shuffled`` one (groups of the populations' sizes, labels permuted within each world) with its permutation
    test's ``shuffled_p`` (None with one)."""
    from hpc_rl.envs.nmmo_config import STYLES
    from hpc_rl.envs.nmmo_measures import niche_measures

    return {"tiles": niche_measures(rollout.visit_population, rollout.visit_agent, rollout.visit_cell,
                                    rollout.passable.size, seed, rollout.visit_agent // AGENT_STRIDE),
            "styles": niche_measures(rollout.attack_population, rollout.attack_agent, rollout.attack_style,
                                     len(STYLES), seed, rollout.attack_agent // AGENT_STRIDE)}


def final_evaluation(policy: Policy | list[Policy], config: TrainConfig, games: int, seed: int = FINAL_EVAL_SEED
                     ) -> dict:
    """The evaluation a training job ends with (``final_eval`` of summary.json), timed in ``seconds``.

    MOBA: ``games`` games against the frozen scripted bot, half on each side, the policy sampling its actions as in
    training; draws (time limit) count as losses in ``win_rate`` and its 95% Wilson interval ``ci95``. Gymnasium and
    PettingZoo: the greedy return of one episode in each of ``games`` env copies (``mean_return``, ``std_return``;
    PettingZoo: per agent, the mean of the agents' returns in each episode). Neural MMO: the mean lifetime of the
    first agents of ``games`` worlds' slots (``nmmo_rollout``) played by the policy and, in the same worlds, by
    the random bot, each with its 95% interval, and their ratio; for each player its exploration
    (``nmmo_exploration``: distinct tiles per lifetime with their interval, and map coverage); with populations
    (``policy``: one per population) also each population's agents' (``population_<k>_mean_lifetime``, ``_ci95``,
    ``_agents``)."""
    if games < 2 or games % 2:
        raise ValueError(f"the final evaluation needs an even number of games >= 2 (half on each side), got {games}")
    started = time.monotonic()
    policies = policy if isinstance(policy, list) else [policy]
    if len(policies) != config.populations:
        raise ValueError(f"{len(policies)} policies for the run's {config.populations} populations")
    policy = policies[0]  # the one policy, where there are no populations
    if config.env.is_nmmo:
        result = {"worlds": games}
        rollouts = {}
        for name, player in (("policy", policies), ("random", "random")):
            rollout = rollouts[name] = nmmo_rollout(player, config, games, seed)
            mean, low, high = mean_ci95(rollout.lifetimes)
            result.update({f"{name}_agents": int(rollout.lifetimes.size), f"{name}_mean_lifetime": mean,
                           f"{name}_ci95": [low, high], f"{name}_alive_at_end": rollout.alive_at_end})
            result.update({f"{name}_{key}": value for key, value in nmmo_exploration(rollout).items()})
            if name == "policy" and config.populations > 1:
                for k in range(config.populations):
                    mean, low, high = mean_ci95(rollout.lifetimes[rollout.population == k])
                    result.update({f"population_{k}_agents": int((rollout.population == k).sum()),
                                   f"population_{k}_mean_lifetime": mean, f"population_{k}_ci95": [low, high]})
        # The ratios' intervals by world (the same worlds for both players): its agents' lifetimes move together.
        trained, bot = rollouts["policy"], rollouts["random"]
        result["lifetime_ratio"], *ci95 = ratio_ci95(trained.lifetimes, bot.lifetimes, trained.world, bot.world)
        result["lifetime_ratio_ci95"] = ci95
        # Head to head (Neural MMO's tournaments put agents of different training in one world): the policies and
        # the random bot in the same worlds, about half the slots each.
        k = config.populations
        mixed = nmmo_rollout([*policies, "random"], config, games, seed,
                             teams=head_to_head_teams(config.env.nmmo.num_agents, k))
        for name, group in (("policy", mixed.population < k), ("random", mixed.population == k)):
            mean, low, high = mean_ci95(mixed.lifetimes[group])
            result.update({f"head_to_head_{name}_agents": int(group.sum()),
                           f"head_to_head_{name}_mean_lifetime": mean, f"head_to_head_{name}_ci95": [low, high]})
        ours, bots = mixed.population < k, mixed.population == k
        result["head_to_head_ratio"], *ci95 = ratio_ci95(mixed.lifetimes[ours], mixed.lifetimes[bots],
                                                          mixed.world[ours], mixed.world[bots])
        result["head_to_head_ratio_ci95"] = ci95
    elif config.env.is_moba:
        r = play_vs_bot(policy, config, "scripted", games, seed)
        result = {"games": r["games"], "wins": r["wins"], "draws": r["draws"], "win_rate": r["win_rate"],
                  "ci95": r["win_rate_ci95"], "bot": r["bot"], "bot_hash": r["bot_hash"]}
    else:
        # An episode's return per agent, as in training's stats/episode_return (one agent in Gymnasium).
        returns = evaluate_return(policy, config.env.make(num_envs=games), seed).reshape(games, -1).mean(axis=1)
        result = {"episodes": games, "mean_return": float(returns.mean()),
                  "std_return": float(returns.std())}
    return {**result, "seed": seed, "seconds": time.monotonic() - started}
