"""End to end: the distributed job's consumption rate and data quality, beside the serial runner and SB3.

    python -m hpc_rl.bench e2e --json

- MOBA 1v1, the default local job (6 ranks: controller, 2 env, 1 inference, 2 learners, oversubscribed), run for
  ``--moba-versions`` versions: ``moba_samples_per_s`` (agent steps consumed by the learners per second since
  the learners started), ``moba_env_steps_per_s`` (env ranks' stepping rate), ``staleness_mean``, ``reuse``; and
  the serial runner (the same roles in one process) on the same work (same env copies, segment length, global
  batch, model, scripted-bot and league settings) for the same number of updates: ``serial_samples_per_s`` (the
  same ``perf/learner_samples_per_s``), and the ratio.
- CartPole-v1 through the distributed job (``experiment=cartpole_fast``): ``cartpole_env_steps_per_s`` consumed,
  whether greedy evaluation reached 475, its reuse and staleness; beside Stable-Baselines3 PPO (rl-zoo settings)
  measured in the same run: ``sb3_env_steps_per_s``.

``--async-actions`` runs both distributed jobs with OpenAI Five's asynchronous action offset
(``pipeline.async_actions=true``), which overlaps env stepping with inference. ``--cartpole-preset`` picks the
CartPole experiment (default ``cartpole_fast``: 32 copies per env rank and the action offset; ``cartpole`` is the
learning test's preset with 8).
"""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from hpc_rl import metric_names as M
from hpc_rl.launch import mpirun_command, rank_env, set_torch_threads

ROOT = Path(__file__).resolve().parents[2]


def add_arguments(parser) -> None:
    parser.add_argument("--moba-versions", type=int, default=30)
    parser.add_argument("--cartpole-versions", type=int, default=400)
    parser.add_argument("--skip-sb3", action="store_true")
    parser.add_argument("--async-actions", action="store_true", help="pipeline.async_actions=true in both jobs")
    parser.add_argument("--cartpole-preset", default="cartpole_fast", help="conf/experiment preset of the CartPole job")


def _run_job(runs: Path, name: str, overrides: list[str], timeout: float) -> dict:
    cmd = mpirun_command(6, [str(ROOT / "jobs/train.py"), f"run_name={name}", f"runs_dir={runs}", *overrides])
    started = time.monotonic()
    out = subprocess.run(cmd, capture_output=True, text=True, env=rank_env(), timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"training job failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    from hpc_rl.storage import open_run

    m = open_run(runs / name).metrics
    last = lambda key: float(m[key]["value"][-1])  # noqa: E731
    weights = np.array([m[M.staleness_bin(b)]["value"].sum() for b in range(M.STALENESS_BINS)])
    return {
        "samples_per_s": last(M.LEARNER_SAMPLES_PER_S),
        "env_steps_per_s": last(M.ENV_STEPS_PER_S),
        "staleness_mean": float((weights * np.arange(M.STALENESS_BINS)).sum() / max(weights.sum(), 1)),
        "reuse": last(M.REUSE),
        "wall_seconds": time.monotonic() - started,
    }


def _serial_samples_per_s(runs: Path, versions: int) -> float:
    """The serial runner (the same roles in one process) on the default job's work: its 16 MOBA copies (2 env ranks
    x 8) on one env worker, the same global batch (segments of 16 copies, as many copy-segments per update as the
    2 learners take together), model, PPO, scripted-bot and league settings, for the same number of updates."""
    import dataclasses

    from hpc_rl.config import TrainConfig
    from hpc_rl.runner import SerialRunner

    cfg = TrainConfig()
    env_ranks, learners = cfg.topology.env, cfg.topology.learner
    if (cfg.pipeline.segments_per_batch * learners) % env_ranks:
        raise ValueError("the default job's global batch is not a whole number of 16-copy segments")
    config = dataclasses.replace(
        cfg, run_name="serial", runs_dir=str(runs),
        env=dataclasses.replace(cfg.env, num_envs=cfg.env.num_envs * env_ranks),
        pipeline=dataclasses.replace(cfg.pipeline, max_versions=versions,
                                     segments_per_batch=cfg.pipeline.segments_per_batch * learners // env_ranks))
    return SerialRunner(config).run()[M.LEARNER_SAMPLES_PER_S]


def run(args) -> dict:
    set_torch_threads()
    out: dict = {"async_actions": bool(args.async_actions), "cartpole_preset": args.cartpole_preset}
    offset = [f"pipeline.async_actions={str(bool(args.async_actions)).lower()}"]
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        moba = _run_job(runs, "moba", [f"pipeline.max_versions={args.moba_versions}", *offset], timeout=3600)
        out.update({f"moba_{k}": v for k, v in moba.items()})
        out["serial_samples_per_s"] = _serial_samples_per_s(runs, args.moba_versions)
        out["moba_vs_serial"] = moba["samples_per_s"] / out["serial_samples_per_s"]

        # The preset's own async_actions holds unless --async-actions asks for the offset.
        cartpole = _run_job(runs, "cartpole", [f"experiment={args.cartpole_preset}",
                                                *(offset if args.async_actions else []),
                                                f"pipeline.max_versions={args.cartpole_versions}"], timeout=3600)
        from hpc_rl.evaluation import evaluate_return, load_policy

        policy, config, _ = load_policy(runs / "cartpole")
        greedy = float(evaluate_return(policy, config.env.make(num_envs=20), seed=7).mean())
        out.update({"cartpole_env_steps_per_s": cartpole["samples_per_s"], "cartpole_reuse": cartpole["reuse"],
                    "cartpole_staleness_mean": cartpole["staleness_mean"], "cartpole_greedy_return": greedy,
                    "cartpole_reached_475": greedy >= 475})
    if not args.skip_sb3:
        from hpc_rl.bench.cartpole import run_sb3

        sb3 = run_sb3(seed=0, max_steps=100_000, eval_every=10**9, eval_episodes=1)
        out["sb3_env_steps_per_s"] = sb3["steps_per_s"]
        out["cartpole_vs_sb3"] = out["cartpole_env_steps_per_s"] / sb3["steps_per_s"]
    return out

