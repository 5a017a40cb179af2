"""Speed of the embedded ``moba`` environment on one core: agent-steps and env-steps per second, 1v1 and 5v5.

``python -m hpc_rl.bench env --json``. Observations and masks are built every step (they are part of the cost);
the actions are legal random actions drawn beforehand, so no opponent's cost is counted.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one core, before numpy and numba start their pools

import time  # noqa: E402

from hpc_rl.envs.moba import MobaConfig, MobaEnv  # noqa: E402
from hpc_rl.envs.scripted import RandomBot  # noqa: E402


def add_arguments(parser) -> None:
    parser.add_argument("--num-envs", type=int, default=256, help="copies stepped together")
    parser.add_argument("--steps", type=int, default=1000, help="timed steps per game variant")
    parser.add_argument("--warmup", type=int, default=100, help="untimed steps first (compilation, caches)")


def measure(config: MobaConfig, num_envs: int, steps: int, warmup: int) -> dict:
    env = MobaEnv(config, num_envs)
    bot = RandomBot(0)
    obs = env.reset(0)
    actions = []
    for _ in range(64):  # legal actions of a real game, replayed (the env ignores those no longer legal)
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
            "num_envs": num_envs, "agents_per_env": agents}


def run(args) -> dict:
    if args.num_envs < 1 or args.steps < 1 or args.warmup < 0:
        raise ValueError("--num-envs and --steps must be >= 1, --warmup >= 0")
    return {name: measure(config, args.num_envs, args.steps, args.warmup)
            for name, config in (("1v1", MobaConfig()), ("5v5", MobaConfig.five_v_five()))}
