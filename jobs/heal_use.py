"""How a game version 2 policy uses ``heal`` (``hpc_rl.envs.moba_v2``): games against the frozen scripted bot under
version 2's rules, sides alternating, the policy sampling as in training (as ``jobs/evaluate.py`` plays them), counted.

    python jobs/heal_use.py runs/my_run_v2 --games 200 --version 400 --seed 4242

Counts, over the policy's hero steps of every game until it ends: the share of its primary actions that are heal
(``heal_share``), the share of steps where heal was legal (alive, not stunned, hurt, off cooldown) and, among them, the
share where the policy chose it (``heal_share_when_legal``; ``actions_when_legal``: the share of each primary action
there), and the heals per game; and the games' result (draws lose, 95% Wilson interval). Prints one line and, last,
the result as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

from hpc_rl.launch import set_torch_threads


def heal_use(policy, config, games: int, seed: int) -> dict:
    """``games`` version 2 games of ``policy`` (of ``config``, a game version 2 run) against the scripted bot, the
    policy on team 0 in even copies: its heal counts and the games' result."""
    import torch

    from hpc_rl.actors import PolicyActor
    from hpc_rl.envs.moba_v2 import A_HEAL, ACTIONS_V2
    from hpc_rl.envs.scripted import make_bot
    from hpc_rl.play import play, team_agents
    from hpc_rl.stats import wilson_interval

    if not config.env.is_moba or config.env.game_version != 2:
        raise ValueError(f"{config.run_name}: heal is an action of the MOBA's game version 2 "
                         f"(env.game_version is {config.env.game_version})")
    if games < 2 or games % 2:
        raise ValueError(f"games must be even and >= 2 (half on each side), got {games}")
    env = config.env.moba_env(dataclasses.replace(config.env.moba, mirrored_pairs=False), games)
    teams = np.arange(games) % 2
    ours = team_agents(env.spec, teams)
    actor = PolicyActor(policy, ours)
    bot = make_bot("scripted", config.env.moba, seed=seed + 2)
    counts = {"steps": 0, "heal": 0, "legal": 0, "heal_when_legal": 0}
    chosen_when_legal = np.zeros(env.spec.num_actions, dtype=np.int64)  # what the policy does instead
    playing = np.ones(games, dtype=bool)  # copies whose first game goes on: the games counted

    class Counted:
        def act(self, obs):
            actions = actor.act(obs)
            counted = ours & playing[:, None]
            chosen = actions["action"] == A_HEAL
            legal = obs["action_mask"][..., A_HEAL]
            counts["steps"] += int(counted.sum())
            counts["heal"] += int((chosen & counted).sum())
            counts["legal"] += int((legal & counted).sum())
            counts["heal_when_legal"] += int((chosen & legal & counted).sum())
            chosen_when_legal[:] += np.bincount(actions["action"][legal & counted], minlength=env.spec.num_actions)
            return actions

        def reset(self, done):
            actor.reset(done)

    def on_step(t, finished):
        playing[:] = ~finished

    torch.manual_seed(seed)
    outcome = play(env, [(Counted(), ours), (bot, ~ours)], seed, on_step=on_step).winner
    wins, draws = int((outcome == teams).sum()), int((outcome == -1).sum())
    low, high = wilson_interval(wins, games)
    steps, legal = max(counts["steps"], 1), max(counts["legal"], 1)
    return {"games": games, "wins": wins, "draws": draws, "win_rate": wins / games, "ci95": [low, high],
            "hero_steps": counts["steps"], "heals": counts["heal"], "heal_share": counts["heal"] / steps,
            "heal_legal_share": counts["legal"] / steps, "heal_share_when_legal": counts["heal_when_legal"] / legal,
            "heals_per_game": counts["heal"] / games,
            "actions_when_legal": dict(zip(ACTIONS_V2, (chosen_when_legal / legal).tolist())), "seed": seed}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dir", type=Path, help="a game version 2 run directory")
    parser.add_argument("--games", type=int, default=100, help="games, even (default 100)")
    parser.add_argument("--version", type=int, help="the checkpoint's version (default: the latest good one)")
    parser.add_argument("--seed", type=int, default=12345, help="seed of the games (default 12345)")
    args = parser.parse_args(argv)
    set_torch_threads()
    from hpc_rl.evaluation import load_policy

    policy, config, version = load_policy(args.run_dir, args.version)
    try:
        result = heal_use(policy, config, args.games, args.seed)
    except ValueError as err:
        parser.error(str(err))
    print(f"version {version}: heal {result['heal_share']:.4f} of hero actions ({result['heals_per_game']:.2f} a "
          f"game; chosen on {result['heal_share_when_legal']:.4f} of the {result['heal_legal_share']:.3f} of steps "
          f"where legal); won {result['wins']}/{result['games']} ({result['draws']} draws)")
    print(json.dumps({"version": version, **result}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
