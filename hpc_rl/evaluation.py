"""Evaluating a trained run: load a checkpoint's policy and play it (no MPI).

    policy, config, version = load_policy("runs/my_run")    # the latest good checkpoint
    evaluate_return(policy, config, episodes=20, seed=0)    # Gymnasium: mean return of greedy play
    play_vs_bot(policy, config, "scripted", games=400, seed=0)   # MOBA: wins, draws, losses against a reference bot
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
import yaml

from hpc_rl.analysis import wilson_interval
from hpc_rl.config import TrainConfig, build_config
from hpc_rl.model.device import to_device
from hpc_rl.model.policy import Policy, hero_indices
from hpc_rl.runner import act, evaluate
from hpc_rl.storage import open_run


def load_policy(run_dir: str | Path, version: int | None = None) -> tuple[Policy, TrainConfig, int]:
    """The policy of a run's checkpoint (latest good one by default), its config and its version."""
    run = open_run(run_dir)
    config = build_config(yaml.safe_load((Path(run_dir) / "config.yaml").read_text()))
    ckpt = run.load_checkpoint(version)
    if ckpt is None:
        raise FileNotFoundError(f"{run_dir} has no checkpoint")
    policy = Policy(config.env.make(num_envs=1).spec, config.model)
    policy.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in ckpt.sections["params"].items()})
    policy.eval()
    return policy, config, ckpt.version


def evaluate_return(policy: Policy, config: TrainConfig, episodes: int, seed: int) -> np.ndarray:
    """Returns of ``episodes`` greedy episodes, one per environment copy."""
    return evaluate(policy, config.env.make(num_envs=episodes), seed, deterministic=True)


@torch.no_grad()
def play_vs_bot(policy: Policy, config: TrainConfig, bot: str, games: int, seed: int,
                deterministic: bool = False) -> dict:
    """MOBA: the policy against a reference bot, sides alternating (the policy is team 0 in even copies, team 1 in
    odd ones); every copy plays one game. Draws (time limit) are counted apart: callers count them as losses."""
    from hpc_rl.envs.moba import MobaEnv
    from hpc_rl.envs.scripted import make_bot, scripted_bot_hash

    if not config.env.is_moba:
        raise ValueError("play_vs_bot needs a MOBA run")
    env = MobaEnv(config.env.moba, games)
    spec = env.spec
    opponent = make_bot(bot, config.env.moba, seed=seed + 1)
    policy_team = np.arange(games) % 2
    team = np.asarray(spec.agent_team)
    is_bot = team[None, :] != policy_team[:, None]  # (E, A)
    n = games * spec.num_agents
    hero = torch.from_numpy(np.tile(hero_indices(spec), games))
    obs = env.reset(seed)
    starts = torch.ones(n, dtype=torch.bool)
    state = policy.initial_state(n)
    outcome = np.full(games, -2, dtype=np.int64)
    torch.manual_seed(seed)
    while (outcome == -2).any():
        flat = {k: v.reshape(n, *v.shape[2:]) for k, v in obs.items()}
        step = act(policy, to_device(flat, torch.device("cpu")), hero, starts, state, deterministic)
        state = step.state
        actions = {k: v.numpy().reshape(games, spec.num_agents) for k, v in step.actions.items()}
        scripted = opponent.act(obs)
        for head in actions:
            actions[head] = np.where(is_bot, scripted[head], actions[head])
        obs, _, dones, infos = env.step(actions)
        first = dones & (outcome == -2)
        outcome[first] = infos["winner"][first]
        starts = torch.from_numpy(np.repeat(dones, spec.num_agents))
    wins = int((outcome == policy_team).sum())
    draws = int((outcome == -1).sum())
    low, high = wilson_interval(wins, games)
    return {"games": games, "wins": wins, "draws": draws, "losses": games - wins - draws,
            "win_rate": wins / games, "win_rate_ci95": [low, high], "bot": bot,
            "bot_hash": scripted_bot_hash() if bot == "scripted" else None}

