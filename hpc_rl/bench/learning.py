"""The learning suite: this project's defaults against Stable-Baselines3 PPO on Gymnasium discrete-action tasks.

    python -m hpc_rl.bench learning --json                      # every task, 5 report seeds, 2 worker processes
    python -m hpc_rl.bench learning --tasks CartPole-v1 --json  # one task

hpc_rl runs the serial runner with the dataclass defaults (``TrainConfig(env=EnvConfig(name="gym:<id>"))``, no
per-task setting but the step budget); Stable-Baselines3 runs PPO with rl-baselines3-zoo's hyperparameters for each
task (DLR-RM/rl-baselines3-zoo, hyperparams/ppo.yml, copied into ``Task.sb3`` below; "normalize: true" is
``VecNormalize`` of observations and rewards, ``lin_X`` a linear decay to 0 over the zoo's ``n_timesteps``).

Protocol (both systems): one torch thread per process; every ``eval_every`` env steps, ``eval_episodes`` greedy
episodes on separately seeded copies, their time excluded from the clock; a run stops at the first evaluation whose
mean return reaches the task's threshold, or at the task's step budget. A seed that misses counts as infinite steps
and seconds (so the median is null when most miss). This project trains in whole batches of
``num_envs × segment_len × segments_per_batch`` steps, so its evaluations fall on the first update at or after each
mark; SB3's on the marks (its rollouts are smaller than the marks). With ``--jobs 2`` two worker processes run the
(task, seed, system) runs, hpc_rl's and SB3's of one (task, seed) side by side, so both see the same load.

Thresholds are Gymnasium's ``reward_threshold`` (the "solved" score) except where noted in ``TASKS``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import multiprocessing
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field

from hpc_rl.bench import REPORT_SEEDS, add_seed_arguments, seed_report

SYSTEMS = ("hpc_rl", "sb3")


@dataclass(frozen=True)
class Task:
    threshold: float  # mean greedy return that counts as solved
    max_steps: int  # env step budget per seed
    eval_every: int
    eval_episodes: int
    sb3: dict = field(default_factory=dict)  # rl-zoo's hyperparameters (hyperparams/ppo.yml)
    sb3_timesteps: int = 1_000_000  # the zoo's n_timesteps: the horizon of its linear schedules
    sb3_normalize: bool = False


TASKS = {
    # Solved at 475 (reward_threshold); the zoo's budget is 1e5 steps.
    "CartPole-v1": Task(475.0, 100_000, 10_000, 20, sb3_timesteps=100_000, sb3=dict(
        n_envs=8, n_steps=32, batch_size=256, gae_lambda=0.8, gamma=0.98, n_epochs=20, ent_coef=0.0,
        learning_rate="lin_0.001", clip_range="lin_0.2")),
    # Solved at -100 (reward_threshold).
    "Acrobot-v1": Task(-100.0, 200_000, 10_000, 20, sb3_normalize=True, sb3=dict(
        n_envs=16, n_steps=256, gae_lambda=0.94, gamma=0.99, n_epochs=4, ent_coef=0.0)),
    # Solved at -110 (reward_threshold). The budget is a quarter of the zoo's 1e6: what one 40-minute run allows.
    "MountainCar-v0": Task(-110.0, 250_000, 25_000, 10, sb3_normalize=True, sb3=dict(
        n_envs=16, n_steps=16, gae_lambda=0.98, gamma=0.99, n_epochs=4, ent_coef=0.0)),
    # Solved at 200 (reward_threshold); the zoo's LunarLander-v2 entry (v3 is the same task in Gymnasium 1.x). The
    # budget is 40% of the zoo's 1e6.
    "LunarLander-v3": Task(200.0, 400_000, 25_000, 10, sb3=dict(
        n_envs=16, n_steps=1024, batch_size=64, gae_lambda=0.98, gamma=0.999, n_epochs=4, ent_coef=0.01)),
}


def add_arguments(parser) -> None:
    add_seed_arguments(parser)
    parser.set_defaults(seeds=[*REPORT_SEEDS, 6, 7])
    parser.add_argument("--tasks", nargs="+", default=list(TASKS), choices=list(TASKS), metavar="TASK",
                        help=f"Gymnasium ids (default: all of {', '.join(TASKS)})")
    parser.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=SYSTEMS)
    parser.add_argument("--jobs", type=int, default=2, help="worker processes running the runs")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="override every task's step budget (a smoke run)")
    parser.add_argument("--eval-every", type=int, default=None, help="override every task's evaluation interval")
    parser.add_argument("--eval-episodes", type=int, default=None)
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE", dest="overrides",
                        help="change hpc_rl's configuration, as on jobs/train.py's command line (e.g. "
                             "ppo.value_norm=false): how docs/LEARNING.md measures each default")


class Clock:
    """Training wall-clock: total elapsed time minus the time spent evaluating."""

    def __init__(self):
        self.started = time.perf_counter()
        self.excluded = 0.0

    def exclude(self, seconds: float) -> None:
        self.excluded += seconds

    def __call__(self) -> float:
        return time.perf_counter() - self.started - self.excluded


def hpc_rl_config(env_id: str, seed: int, runs_dir: str, max_steps: int, overrides: tuple[str, ...] = ()):
    """The serial runner's run with the defaults (and ``overrides``, ``key=value`` as on jobs/train.py's command
    line, for measuring a change): only the budget (in versions) and one final checkpoint are set."""
    from omegaconf import OmegaConf

    from hpc_rl.config import build_config

    config = build_config(OmegaConf.from_dotlist([f"run_name={env_id}-{seed}", f"runs_dir={runs_dir}", f"seed={seed}",
                                                  f"env.name=gym:{env_id}", *overrides]))
    p = config.pipeline
    versions = max(1, -(-max_steps // (config.env.num_envs * p.segment_len * p.segments_per_batch)))
    return dataclasses.replace(config, pipeline=dataclasses.replace(p, max_versions=versions,
                                                                     checkpoint_every=versions))


def run_hpc_rl(env_id: str, task: Task, seed: int, overrides: tuple[str, ...] = ()) -> dict:
    from hpc_rl.envs.gym_adapter import GymVecEnv
    from hpc_rl.evaluation import evaluate_return
    from hpc_rl.runner import SerialRunner

    eval_env = GymVecEnv(env_id, task.eval_episodes)
    result = {"steps": math.inf, "seconds": math.inf, "returns": []}
    with tempfile.TemporaryDirectory() as runs:
        runner = SerialRunner(hpc_rl_config(env_id, seed, runs, task.max_steps, overrides))
        clock = Clock()
        next_eval = task.eval_every

        def on_update(run, _metrics: dict) -> bool:
            nonlocal next_eval
            if run.env_steps >= next_eval:
                next_eval = (run.env_steps // task.eval_every + 1) * task.eval_every
                seconds = clock()
                t0 = time.perf_counter()
                mean_return = float(evaluate_return(run.policy, eval_env, seed=10_000 + seed).mean())
                clock.exclude(time.perf_counter() - t0)
                result["returns"].append((run.env_steps, round(mean_return, 1)))
                if mean_return >= task.threshold:
                    result.update(steps=run.env_steps, seconds=seconds)
                    return True
            # The budget is in env steps (a reuse target below the epochs plays more than one batch per version).
            return run.env_steps >= task.max_steps

        runner.run(on_update)
        result["total_steps"] = runner.env_steps
        result["train_seconds"] = clock()
    return result


def _zoo_value(value):
    """rl-zoo's ``lin_X``: X decayed linearly to 0 over training (SB3 passes the remaining progress, 1 → 0)."""
    if isinstance(value, str) and value.startswith("lin_"):
        start = float(value[4:])
        return lambda progress_remaining: progress_remaining * start
    return value


def run_sb3(env_id: str, task: Task, seed: int) -> dict:
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecNormalize, sync_envs_normalization

    hyper = {k: _zoo_value(v) for k, v in task.sb3.items()}
    env = make_vec_env(env_id, n_envs=hyper.pop("n_envs"), seed=seed)
    # One copy per evaluation episode, as hpc_rl evaluates: SB3 plays them side by side, one episode each.
    eval_env = make_vec_env(env_id, n_envs=task.eval_episodes, seed=10_000 + seed)
    if task.sb3_normalize:
        env = VecNormalize(env, gamma=hyper.get("gamma", 0.99))
        eval_env = VecNormalize(eval_env, training=False, norm_reward=False)
    model = PPO("MlpPolicy", env, seed=seed, device="cpu", verbose=0, **hyper)
    # A logger with no outputs: SB3's default, even silent, makes a directory in /tmp per model.
    model.set_logger(Logger(folder=None, output_formats=[]))
    result = {"steps": math.inf, "seconds": math.inf, "returns": []}
    clock = Clock()

    class EvalEvery(BaseCallback):
        def __init__(self):
            super().__init__()
            self.next_eval = task.eval_every

        def _on_step(self) -> bool:
            if self.num_timesteps < self.next_eval:
                return True
            self.next_eval += task.eval_every
            seconds = clock()
            t0 = time.perf_counter()
            sync_envs_normalization(self.training_env, eval_env)  # the observation statistics trained with
            returns, _ = evaluate_policy(self.model, eval_env, n_eval_episodes=task.eval_episodes, deterministic=True)
            clock.exclude(time.perf_counter() - t0)
            result["returns"].append((self.num_timesteps, round(float(returns), 1)))
            if returns >= task.threshold:
                result.update(steps=self.num_timesteps, seconds=seconds)
                return False
            return True

    # The zoo's linear schedules run over its n_timesteps; SB3 computes progress from ``total_timesteps``, so the
    # budget is the zoo's and the callback stops the run at this task's budget.
    budget = task.max_steps

    class Budget(BaseCallback):
        def _on_step(self) -> bool:
            return self.num_timesteps < budget

    clock.started = time.perf_counter()
    model.learn(total_timesteps=max(task.sb3_timesteps, budget), callback=[EvalEvery(), Budget()])
    result["total_steps"] = model.num_timesteps
    result["train_seconds"] = clock()
    return result


def _one(job: tuple[str, str, Task, int, tuple[str, ...]]) -> tuple[str, str, int, dict]:
    """One (system, task, seed) run in a worker process, on one torch thread."""
    from hpc_rl.launch import set_torch_threads

    system, env_id, task, seed, overrides = job
    set_torch_threads()
    started = time.perf_counter()
    # A worker process writes to the bench's own stdout, which carries the JSON alone: progress goes to stderr.
    with contextlib.redirect_stdout(sys.stderr):
        if system == "hpc_rl":
            result = run_hpc_rl(env_id, task, seed, overrides)
        else:
            result = run_sb3(env_id, task, seed)
    result["wall_seconds"] = time.perf_counter() - started
    # Each run's figures as it ends, on stderr: a suite stopped early still says what it measured.
    print(json.dumps({"system": system, "task": env_id, "seed": seed,
                      **{k: None if isinstance(v, float) and math.isinf(v) else v for k, v in result.items()}}),
          file=sys.stderr, flush=True)
    return system, env_id, seed, result


def _median(values: list[float]) -> float | None:
    m = statistics.median(values)
    return None if math.isinf(m) else round(m, 2)


def summarize(runs: list[dict]) -> dict:
    """The per-system figures of one task: seeds, solved, medians (null when the median seed missed), per seed."""
    return {"seeds": len(runs), "solved": sum(math.isfinite(r["steps"]) for r in runs),
            "median_steps": _median([r["steps"] for r in runs]),
            "median_seconds": _median([r["seconds"] for r in runs]),
            "per_seed_steps": [None if math.isinf(r["steps"]) else r["steps"] for r in runs],
            "per_seed_seconds": [None if math.isinf(r["seconds"]) else round(r["seconds"], 2) for r in runs],
            "per_seed_final_return": [r["returns"][-1][1] if r["returns"] else None for r in runs]}


def tasks_of(args) -> dict[str, Task]:
    out = {}
    for env_id in args.tasks:
        task = TASKS[env_id]
        overrides = {k: v for k, v in (("max_steps", args.max_steps), ("eval_every", args.eval_every),
                                       ("eval_episodes", args.eval_episodes)) if v is not None}
        if any(v < 1 for v in overrides.values()):
            raise ValueError(f"--max-steps, --eval-every and --eval-episodes must be >= 1, got {overrides}")
        out[env_id] = Task(**{**task.__dict__, **overrides})
    return out


def run(args) -> dict:
    seeds = seed_report(args.seeds, args.allow_tuning_seeds)  # before any training: a refused seed costs nothing
    if args.jobs < 1:
        raise ValueError(f"--jobs must be >= 1, got {args.jobs}")
    tasks = tasks_of(args)
    # Task, seed, then system: the two systems' runs of one (task, seed) are neighbours, so with two workers they
    # run side by side.
    overrides = tuple(getattr(args, "overrides", ()))
    jobs = [(system, env_id, task, seed, overrides) for env_id, task in tasks.items() for seed in args.seeds
            for system in args.systems]
    started = time.perf_counter()
    if args.jobs == 1:
        done = [_one(job) for job in jobs]
    else:
        # spawn: fresh interpreters (no torch state forked from this one), each running one run after another.
        with multiprocessing.get_context("spawn").Pool(args.jobs) as pool:
            done = pool.map(_one, jobs, chunksize=1)
    results: dict[tuple[str, str], list[dict]] = {}
    for system, env_id, _seed, result in done:
        results.setdefault((env_id, system), []).append(result)
    out = {"tasks": {env_id: {"threshold": task.threshold, "max_steps": task.max_steps,
                              **{system: summarize(results[env_id, system]) for system in args.systems}}
                     for env_id, task in tasks.items()},
           **seeds, "hpc_rl_overrides": list(overrides), "jobs": args.jobs, "wall_seconds": round(time.perf_counter() - started, 1)}
    return out
