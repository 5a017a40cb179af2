"""End to end: the distributed job's consumption rate beside the serial runner on equal work, and the distributed
job on CartPole.

    python -m hpc_rl.bench e2e --json

- MOBA 1v1: the job `make train` runs (jobs/train.py with ``--moba-preset``, default ``moba_kickstart``: 5 ranks,
  controller, 2 env, 1 inference, 1 learner, oversubscribed; ``none``: the plain default job, 6 ranks with 2
  learners) for ``--moba-versions`` versions, then the serial runner (the same roles in one process) on the
  same work for the same number of versions. The serial side's config is the job's with its topology collapsed to
  one rank per role (``serial_config``): all 16 copies on one env worker and as many segments per update as the
  learners take together. ``work`` derives what each side computes from its config; the bench refuses to run when
  the two differ, naming the fields, and the JSON carries both (``work.pipeline``, ``work.serial``) beside
  ``moba_vs_serial_learner_samples``, the ratio of their learner samples per second.
- CartPole-v1 through the distributed job (``--cartpole-preset``, default ``cartpole_fast``: 32 copies per env rank
  and the action offset; ``cartpole`` is the preset it builds on, with 8), trained with seed ``REPORT_SEEDS[0]``
  (no seed a learning default was tuned on): its throughput, reuse, staleness, and whether greedy evaluation
  reached 475. Nothing is set beside it: the CartPole benchmark compares learning (time to 475) with
  Stable-Baselines3 under one protocol.

``--async-actions`` runs both distributed jobs, and the serial runner, with OpenAI Five's asynchronous action
offset (``pipeline.async_actions=true``), which overlaps env stepping with inference in the distributed job.
Throughput keys name what they count: ``*_learner_samples_per_s`` samples consumed by the learners (steps of the
agents being trained, counted once however many PPO epochs use them), ``*_env_steps_per_s`` copy-steps of the env
ranks (one copy advanced one step). What each key means and why the comparison is fair: docs/BENCHMARKS.md.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from hpc_rl import metric_names as M
from hpc_rl.bench import REPORT_SEEDS
from hpc_rl.config import TrainConfig, compose_config
from hpc_rl.launch import mpirun_command, rank_env, set_torch_threads

ROOT = Path(__file__).resolve().parents[2]
CARTPOLE_SEED = REPORT_SEEDS[0]


def add_arguments(parser) -> None:
    parser.add_argument("--moba-versions", type=int, default=30)
    parser.add_argument("--moba-preset", default="moba_kickstart",
                        help="conf/experiment preset of the MOBA job (default: make train's); none: the default job")
    parser.add_argument("--cartpole-versions", type=int, default=400)
    parser.add_argument("--async-actions", action="store_true",
                        help="pipeline.async_actions=true in both jobs and the serial runner")
    parser.add_argument("--cartpole-preset", default="cartpole_fast", help="conf/experiment preset of the CartPole job")


# --- equal work --------------------------------------------------------------------------------------------------
def _digest(fields: dict) -> str:
    return hashlib.sha256(json.dumps(fields, sort_keys=True, default=str).encode()).hexdigest()[:16]


def work(config: TrainConfig) -> dict:
    """What a run of ``config`` computes, from the config alone (its ``topology`` is the side's: the serial runner
    runs ``hpc_rl.runner.TOPOLOGY``). Two runs with equal work play the same games in as many copies, train on
    batches of the same size in the same gradient steps of the same model, for as many updates; only where the roles
    run differs.

    - ``samples_per_update``: agent-steps in the global batch: learners x segments per learner's batch x copies per
      env rank (one segment holds every copy of one env rank) x segment length x agents per copy. Steps of the
      sides the policy does not learn (the scripted bot's, past versions') are in it with training weight 0.
    - ``gradient_steps_per_epoch``, ``global_minibatch``: each learner cuts its batch into ``ppo.num_minibatches``
      along BPTT chunks (``torch.chunk``: ceil(chunks / num_minibatches) each) and the learners average their
      gradients, so a step's global minibatch is learners x a learner's minibatch, in agent-steps.
    - ``vs_scripted_share``: copies where the frozen bot plays one side; ``past_version_share``: copies playing a
      past version (``league.past_fraction`` of the self-play copies; 0 without the league). The pool gains a
      version every ``league_pool_every`` versions: a run shorter than that plays no past version on either side.
    - ``target_reuse``, ``staleness_queue``, ``buffer_batches``, ``publish_every``, ``checkpoint_every``: what the
      learners do besides gradient steps (throttle, hold back, drop beyond a bound, publish, checkpoint).
    """
    env, pipeline, ppo, model = config.env, config.pipeline, config.ppo, config.model
    learners, agents = config.topology.learner, env.agents_per_copy
    chunks = pipeline.segments_per_batch * env.num_envs * agents * (pipeline.segment_len // model.chunk_len)
    per_minibatch = -(-chunks // ppo.num_minibatches)
    scripted_share = env.scripted_copies() / env.num_envs
    return {
        "env": env.name,
        "env_settings": _digest(dataclasses.asdict(env.moba)) if env.is_moba else None,
        "env_copies": config.topology.env * env.num_envs,
        "agents_per_copy": agents,
        "segment_len": pipeline.segment_len,
        "samples_per_update": learners * pipeline.segments_per_batch * env.num_envs * pipeline.segment_len * agents,
        "epochs": ppo.epochs,
        "gradient_steps_per_epoch": -(-chunks // per_minibatch),
        "global_minibatch": learners * per_minibatch * model.chunk_len,
        "model": dataclasses.asdict(model),
        "vs_scripted_share": round(scripted_share, 6),
        "past_version_share": round(config.league.past_fraction * (1 - scripted_share), 6) if config.uses_league
        else 0.0,
        "league_pool_every": pipeline.keep_every if config.uses_league else 0,
        "target_reuse": config.target_reuse,
        "staleness_queue": pipeline.staleness_queue,
        "buffer_batches": pipeline.buffer_batches,
        "publish_every": pipeline.publish_every,
        "checkpoint_every": pipeline.checkpoint_every,
        "updates": pipeline.max_versions,
    }


class UnequalWork(ValueError):
    """The two sides of a comparison would do different work: no ratio of their rates means anything."""


def equal_work(pipeline: TrainConfig, serial: TrainConfig) -> dict:
    """``{"pipeline": work, "serial": work}``; raises ``UnequalWork`` naming every field that differs."""
    sides = {"pipeline": work(pipeline), "serial": work(serial)}
    differ = [f"{k} (pipeline {v!r}, serial {sides['serial'][k]!r})" for k, v in sides["pipeline"].items()
              if sides["serial"][k] != v]
    if differ:
        raise UnequalWork(f"the serial runner would not do the pipeline's work, so no ratio is measured; they differ "
                          f"in: {'; '.join(differ)}")
    return sides


def serial_config(pipeline: TrainConfig, run_name: str = "serial") -> TrainConfig:
    """The serial runner's config for ``pipeline``'s work: every env rank's copies on its one env worker, and as many
    of those (wider) segments per update as the pipeline's learners take together."""
    from hpc_rl.runner import TOPOLOGY

    env_ranks, learners = pipeline.topology.env, pipeline.topology.learner
    segments = pipeline.pipeline.segments_per_batch * learners
    if segments % env_ranks:
        raise UnequalWork(f"the pipeline's global batch of {segments} segments of one env rank each is not a whole "
                          f"number of the serial runner's segments, which hold all {env_ranks} env ranks' copies")
    return dataclasses.replace(
        pipeline, run_name=run_name, topology=TOPOLOGY,
        env=dataclasses.replace(pipeline.env, num_envs=pipeline.env.num_envs * env_ranks),
        pipeline=dataclasses.replace(pipeline.pipeline, segments_per_batch=segments // env_ranks))


# --- measuring ---------------------------------------------------------------------------------------------------
def _figures(run_dir: Path) -> dict:
    """Throughput and data quality of a finished run, from its metrics.h5 (the last version's rates: since the
    learners started)."""
    from hpc_rl.storage import open_run

    m = open_run(run_dir).metrics
    last = lambda key: float(m[key]["value"][-1])  # noqa: E731
    weights = np.array([m[M.staleness_bin(b)]["value"].sum() for b in range(M.STALENESS_BINS)])
    return {
        "learner_samples_per_s": last(M.LEARNER_SAMPLES_PER_S),
        "env_steps_per_s": last(M.ENV_STEPS_PER_S),
        "staleness_mean": float((weights * np.arange(M.STALENESS_BINS)).sum() / max(weights.sum(), 1)),
        "reuse": last(M.REUSE),
    }


def launch_job(runs: Path, name: str, overrides: list[str], timeout: float) -> TrainConfig:
    """Run jobs/train.py as run ``name`` in ``runs`` with ``overrides``, on as many ranks as its topology needs;
    its config. Raises RuntimeError with the job's output tail when it fails."""
    overrides = [f"run_name={name}", f"runs_dir={runs}", *overrides]
    config = compose_config(overrides)
    cmd = mpirun_command(config.topology.world_size, [str(ROOT / "jobs/train.py"), *overrides])
    out = subprocess.run(cmd, capture_output=True, text=True, env=rank_env(), timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"job {name} failed ({out.returncode}):\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return config


def _run_job(runs: Path, name: str, overrides: list[str], timeout: float) -> dict:
    started = time.monotonic()
    launch_job(runs, name, overrides, timeout)
    return {**_figures(runs / name), "wall_seconds": time.monotonic() - started}


def _run_serial(config: TrainConfig) -> dict:
    from hpc_rl.runner import SerialRunner

    started = time.monotonic()
    SerialRunner(config).run()
    return {**_figures(Path(config.runs_dir) / config.run_name), "wall_seconds": time.monotonic() - started}


def run(args) -> dict:
    if args.moba_versions < 1 or args.cartpole_versions < 1:
        raise ValueError("--moba-versions and --cartpole-versions must be >= 1")
    set_torch_threads()
    offset = [f"pipeline.async_actions={str(bool(args.async_actions)).lower()}"]
    no_eval = ["pipeline.final_eval_games=0"]  # a job's wall time is its training, as the serial runner's
    with tempfile.TemporaryDirectory() as tmp:
        runs = Path(tmp)
        preset = [] if args.moba_preset == "none" else [f"experiment={args.moba_preset}"]
        moba_overrides = [*preset, f"pipeline.max_versions={args.moba_versions}", *offset]
        moba_config = compose_config(["run_name=moba", f"runs_dir={runs}", *moba_overrides])
        serial = serial_config(moba_config)
        out: dict = {"async_actions": bool(args.async_actions), "moba_preset": args.moba_preset,
                     "moba_ranks": moba_config.topology.world_size, "work": equal_work(moba_config, serial)}

        moba = _run_job(runs, "moba", [*moba_overrides, *no_eval], timeout=3600)
        out.update({f"moba_{k}": v for k, v in moba.items()})
        out.update({f"serial_{k}": v for k, v in _run_serial(serial).items()})
        out["moba_vs_serial_learner_samples"] = moba["learner_samples_per_s"] / out["serial_learner_samples_per_s"]

        # The preset's own async_actions holds unless --async-actions asks for the offset.
        cartpole = _run_job(runs, "cartpole", [f"experiment={args.cartpole_preset}", f"seed={CARTPOLE_SEED}",
                                                *(offset if args.async_actions else []),
                                                f"pipeline.max_versions={args.cartpole_versions}", *no_eval],
                            timeout=3600)
        from hpc_rl.evaluation import evaluate_return, load_policy

        policy, config, _ = load_policy(runs / "cartpole")
        greedy = float(evaluate_return(policy, config.env.make(num_envs=20), seed=7).mean())
        out.update({"cartpole_preset": args.cartpole_preset, "cartpole_seed": CARTPOLE_SEED,
                    **{f"cartpole_{k}": v for k, v in cartpole.items()},
                    "cartpole_greedy_return": greedy, "cartpole_reached_475": greedy >= 475})
    return out
