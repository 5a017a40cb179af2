"""How much model surgery changes a MOBA policy: the largest absolute difference, over recorded observations, of every
head's log-probabilities (masked as the policy samples; the target head's for every primary action) and of the value,
between the policy and its changed copy (``hpc_rl.model.surgery``).

The observations are recorded by the scripted bot playing both sides, and replayed through both policies as the
sequences they were (the LSTM's state carried from each game's first step). ``exact`` holds the changes that keep the
function (goal ≤ 1e-5 in float32), ``approximate`` those that do not (LSTM widening: new weights at 1e-3 of the usual
scale; a new action copying noop, with the default tolerance, legal on every step here). ``new_action`` holds what that
tolerance bounds: the new action's largest probability (the total variation from the old policy) against the tolerance,
and the largest change of an old action's log-probability against −log(1 − tolerance) (within float32 rounding:
1e-5 relative). The move to game version 2 (``hpc_rl.surgery.
upgrade_game``) is measured on the recorded version 1 games as version 2's layout shows them (the new attribute 0, heal
illegal). A random-initialised policy of the MOBA's model
(LSTM core, default sizes; the feed-forward core for its widening) is measured, and with ``--run`` the run's trained
policy (latest good checkpoint) under ``trained``.

    python -m hpc_rl.bench surgery --json
    python -m hpc_rl.bench surgery --run runs/my_run --json
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch

from hpc_rl.envs.moba_config import MobaConfig
from hpc_rl.envs.moba_v2 import A_HEAL
from hpc_rl.launch import set_torch_threads
from hpc_rl.model import surgery
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy, hero_indices, norm_keys

GOAL = 1e-5
REMOVED_CONSTANT = 0.5  # the raw value a removed feature is held at


def add_arguments(parser) -> None:
    parser.add_argument("--run", help="also measure this run's trained policy (its latest good checkpoint)")
    parser.add_argument("--observations", type=int, default=1000, help="recorded observations (agent steps)")
    parser.add_argument("--copies", type=int, default=4, help="MOBA copies played at once while recording")
    parser.add_argument("--seed", type=int, default=0)


def record(moba: MobaConfig, observations: int, copies: int, seed: int) -> tuple[dict, torch.Tensor, torch.Tensor]:
    """At least ``observations`` agent steps of the scripted bot playing both sides: observations (L, N, ...), hero
    indices (L, N) and game starts (L, N), N = copies × agents."""
    from hpc_rl.envs.moba import MobaEnv
    from hpc_rl.envs.scripted import make_bot

    env, bot = MobaEnv(moba, copies), make_bot("scripted", moba, seed=seed)
    agents = env.spec.num_agents
    steps = -(-observations // (copies * agents))
    obs, start = env.reset(seed), np.ones(copies, dtype=bool)
    frames, starts = [], []
    for _ in range(steps):
        frames.append(obs)
        starts.append(np.repeat(start, agents))
        obs, _, done, _ = env.step(bot.act(obs))
        start = np.asarray(done, dtype=bool)
    n = copies * agents
    recorded = {k: torch.from_numpy(np.stack([f[k] for f in frames]).reshape(steps, n, *frames[0][k].shape[2:]))
                for k in frames[0]}
    hero = torch.from_numpy(np.tile(hero_indices(env.spec), (steps, copies)))
    return recorded, hero, torch.from_numpy(np.stack(starts))


def _changed_policy(params: dict, spec, model: ModelConfig, like: Policy) -> Policy:
    policy = Policy(spec, model).to(next(like.parameters()).dtype)
    policy.load_state_dict(params)
    return policy.eval()


def measure(policy: Policy, obs: dict, hero: torch.Tensor, starts: torch.Tensor, seed: int = 0) -> dict:
    """{"exact": {change: max abs diff}, "approximate": {...}} of every change the policy has a place for."""
    spec, model = policy.spec, policy.config
    generator = torch.Generator().manual_seed(seed)
    before = surgery.head_outputs(policy, obs, hero, starts)
    params = policy.state_dict()
    exact, approximate = {}, {}

    def outputs(new_params, new_spec=spec, new_model=model, new_obs=obs) -> dict:
        return surgery.head_outputs(_changed_policy(new_params, new_spec, new_model, policy), new_obs, hero, starts)

    def diff(new_params, new_spec=spec, new_model=model, new_obs=obs, reference=before) -> float:
        return surgery.max_abs_diff(reference, outputs(new_params, new_spec, new_model, new_obs))

    d = model.embed_size
    exact[f"embed_size {d}->{d + d // 2}"] = diff(surgery.widen_embed(params, spec, d + d // 2, generator),
                                                   new_model=dataclasses.replace(model, embed_size=d + d // 2))
    h, wider = model.lstm_size, model.lstm_size + model.lstm_size // 2
    core = diff(surgery.widen_core(params, model, wider, generator),
                new_model=dataclasses.replace(model, lstm_size=wider))
    (exact if model.core == "mlp" else approximate)[f"lstm_size {h}->{wider} ({model.core} core)"] = core
    for key in norm_keys(spec):
        new_params, _ = surgery.add_feature(params, spec, key)
        extra = torch.randn(*obs[key].shape[:-1], 1, generator=generator, dtype=obs[key].dtype)
        exact[f"add_feature {key}"] = diff(new_params, surgery.spec_with_feature(spec, key, 1),
                                           new_obs={**obs, key: torch.cat([obs[key], extra], dim=-1)})
    key = norm_keys(spec)[0]
    held = obs[key].clone()
    held[..., 0] = REMOVED_CONSTANT
    new_params, _ = surgery.remove_feature(params, spec, key, 0, REMOVED_CONSTANT)
    exact[f"remove_feature {key}[0]"] = diff(new_params, surgery.spec_with_feature(spec, key, -1),
                                             new_obs={**obs, key: held[..., 1:]},
                                             reference=surgery.head_outputs(policy, {**obs, key: held}, hero, starts))
    legal = torch.ones(*obs["action_mask"].shape[:-1], 1, dtype=torch.bool)
    tolerance = surgery.NEW_ACTION_TOLERANCE
    after = outputs(surgery.add_action(params, False, True, generator), surgery.spec_with_action(spec, False, True),
                    new_obs={**obs, "action_mask": torch.cat([obs["action_mask"], legal], dim=-1)})
    approximate[f"add_action (tolerance {tolerance:g}, legal everywhere)"] = surgery.max_abs_diff(before, after)
    largest = float(after["action"][..., -1].exp().max())
    new_action = {"tolerance": tolerance, "largest_probability": largest,
                  "mean_probability": float(after["action"][..., -1].exp().mean()),
                  "largest_log_prob_change": approximate[f"add_action (tolerance {tolerance:g}, legal everywhere)"],
                  "log_prob_bound": -math.log1p(-tolerance),
                  # float32: a policy sure of noop gives the bound itself, give or take a rounding step
                  "within_tolerance": largest <= tolerance * (1 + GOAL)}
    if spec.num_actions == A_HEAL:  # a policy of game version 1: moved to version 2, on version 1's games
        from hpc_rl.surgery import upgrade_game

        heroes, mask = obs["entities/heroes"], obs["action_mask"]
        new_params, _ = upgrade_game(params, spec, 1, 2, generator)
        exact["game_version 1->2 (version 1 games)"] = diff(
            new_params, surgery.spec_with_action(surgery.spec_with_feature(spec, "entities/heroes", 1), False, False),
            new_obs={**obs, "entities/heroes": torch.cat([heroes, torch.zeros_like(heroes[..., :1])], dim=-1),
                     "action_mask": torch.cat([mask, torch.zeros_like(mask[..., :1])], dim=-1)})
    return {"exact": exact, "approximate": approximate, "new_action": new_action}


def run(args) -> dict:
    set_torch_threads()
    torch.manual_seed(args.seed)
    moba = MobaConfig()
    obs, hero, starts = record(moba, args.observations, args.copies, args.seed)
    lstm = Policy(moba.spec(), ModelConfig(core="lstm")).eval()
    result = measure(lstm, obs, hero, starts, args.seed)
    mlp = Policy(moba.spec(), ModelConfig(core="mlp")).eval()
    for name, value in measure(mlp, obs, hero, starts, args.seed)["exact"].items():
        if "lstm_size" in name:
            result["exact"][name] = value
    report = {"observations": int(starts.numel()), "goal_exact": GOAL, **result}
    if args.run:
        from hpc_rl.evaluation import load_policy

        policy, config, version = load_policy(args.run)
        obs, hero, starts = record(config.env.moba, args.observations, args.copies, args.seed)
        report["trained"] = {"run": args.run, "version": version, **measure(policy, obs, hero, starts, args.seed)}
    measured = [report["exact"], *([report["trained"]["exact"]] if args.run else [])]
    report["exact_within_goal"] = all(v <= GOAL for part in measured for v in part.values())
    return report
