"""The GPU path's speed: the default job with its inference and learner ranks on the GPU beside the same job on CPU
cores, a scaling curve over env ranks, and the learner's samples/s per GPU as the model grows.

    python -m hpc_rl.bench gpu --json                       # on a machine with a GPU and >= 16 cores
    python -m hpc_rl.bench gpu --parts devices --seconds 40 --progress results.jsonl

- ``devices``: the default MOBA job (jobs/train.py) with ``--env-ranks`` env ranks, one inference rank and two
  learners, run for ``--seconds`` each: every rank on CPU cores; inference and learners on the GPU; the same in
  mixed precision (``ppo.precision=bfloat16``); and the GPU job with an LSTM of ``--large-lstm`` units. The env ranks
  are on CPU cores in every job. ``gpu_vs_cpu_learner_samples`` and ``gpu_vs_cpu_env_steps`` are ratios within
  this one run.
- ``scaling``: the GPU job with 1, 2, 4, 8, 12 env ranks (``--scaling``): the rates per configuration and the
  efficiency against linear scaling from the first (rate / (first rate x env ranks / first env ranks)).
- ``model``: the PPO update alone (``hpc_rl.algo.learner.Learner.update``, the default job's PPO settings) on one
  batch of ``--model-batch`` copies x 64 steps x 2 agents, every agent trained (no scripted side), on the GPU for
  each LSTM size in ``--lstm-sizes``, float32 and bfloat16: samples/s per GPU. Honor of Kings (Ye et al. 2020,
  section 5.1) reports about 80,000 samples/s per P40 with an LSTM of 1024 units unrolled over 16 steps and
  minibatches of 4096 per GPU; the default 128 copies give 16,384 samples in 4 minibatches of 4,096, over chunks
  of 16 steps.

Job rates are steady-state rates over the last two thirds of a job's versions (its start, CUDA's and the
compilation of the env's kernels included, would otherwise count): ``env_steps_per_s`` copy-steps of the env ranks
per second, ``learner_samples_per_s`` trained samples consumed by the learners per second (``perf/learner_samples``,
counted once whatever the epochs, as ``perf/learner_samples_per_s`` counts them), ``inference_batch`` the
mean observations in one forward pass of the inference rank and ``inference_ms`` its mean time. docs/GPU.md holds
the figures of one run.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path

import numpy as np

from hpc_rl import metric_names as M
from hpc_rl.bench.e2e import launch_job
from hpc_rl.config import compose_config
from hpc_rl.launch import set_torch_threads

PARTS = ("devices", "model", "scaling", "inference")
HOK_SAMPLES_PER_GPU = 80_000  # Honor of Kings 1v1 (Ye et al. 2020, 5.1): training samples per second per P40


def add_arguments(parser) -> None:
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    parser.add_argument("--seconds", type=float, default=40.0, help="wall time of each job (pipeline.max_seconds)")
    parser.add_argument("--env-ranks", type=int, default=8, help="env ranks of the devices part's jobs")
    parser.add_argument("--learners", type=int, default=2)
    parser.add_argument("--large-lstm", type=int, default=1024, help="the LSTM size of the devices part's large job")
    parser.add_argument("--scaling", type=int, nargs="+", default=[1, 2, 4, 8, 12], help="env ranks per point")
    parser.add_argument("--lstm-sizes", type=int, nargs="+", default=[128, 1024, 2048])
    parser.add_argument("--model-batch", type=int, default=128, help="copies in the model part's batch")
    parser.add_argument("--repeats", type=int, default=5, help="timed updates per model point; the fastest counts")
    parser.add_argument("--gpu-device", default="cuda", help="the device of the GPU side (cpu: try the benchmark on a "
                                                              "machine without a GPU)")
    parser.add_argument("--jobs", nargs="+", default=None, help="the devices part's jobs to run (default: all)")
    parser.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                        help="config overrides for every job (after the part's own), e.g. pipeline.async_actions=true")
    parser.add_argument("--inference-copies", type=int, nargs="+", default=[8, 64, 512],
                        help="MOBA copies (2 agents each) per forward pass in the inference part")
    parser.add_argument("--progress", type=Path, default=None,
                        help="append one JSON line per finished configuration to this file (kept if the bench is "
                             "stopped before its end)")


# --- figures of a job ----------------------------------------------------------------------------------------------
def steady_rates(wall: np.ndarray, env_steps: np.ndarray, learner_samples: np.ndarray) -> dict:
    """Rates over the last two thirds of a job: from the first version logged at or after a third of the job's last
    wall time to the last version. ``wall`` (controller seconds since the start), ``env_steps`` (copy-steps of all env
    ranks so far) and ``learner_samples`` (trained samples consumed so far) are metrics.h5's per-version rows."""
    if len(wall) < 2:
        raise ValueError(f"{len(wall)} versions are too few for a steady-state rate (need >= 2): run longer")
    first = min(int(np.searchsorted(wall, wall[-1] / 3)), len(wall) - 2)
    seconds = float(wall[-1] - wall[first])
    return {"env_steps_per_s": float(env_steps[-1] - env_steps[first]) / seconds,
            "learner_samples_per_s": float(learner_samples[-1] - learner_samples[first]) / seconds,
            "window_versions": len(wall) - 1 - first, "window_seconds": seconds}


def _figures(run_dir: Path) -> dict:
    from hpc_rl.storage import open_run

    m = open_run(run_dir).metrics
    rows = [m[key] for key in (M.WALL_SECONDS, M.ENV_STEPS, M.LEARNER_SAMPLES)]
    if any(not np.array_equal(r["version"], rows[0]["version"]) for r in rows):
        raise RuntimeError(f"{run_dir}: {M.WALL_SECONDS}, {M.ENV_STEPS} and {M.LEARNER_SAMPLES} are logged at "
                           f"different versions")
    out = steady_rates(*(r["value"] for r in rows))
    for key, name in ((M.INFERENCE_BATCH, "inference_batch"), (M.INFERENCE_MS, "inference_ms"),
                      (M.STALENESS_MEAN, "staleness_mean")):
        values = m[key]["value"]
        out[name] = float(values[len(values) // 3:].mean())
    out["versions"] = int(rows[0]["version"][-1])
    return out


def run_job(runs: Path, name: str, overrides: list[str], seconds: float, extra: list[str]) -> dict:
    """jobs/train.py with ``overrides`` then ``extra`` for ``seconds``; its figures, config and where its ranks
    ran."""
    started = time.monotonic()
    config = launch_job(runs, name, ["pipeline.max_versions=1000000", f"pipeline.max_seconds={seconds}",
                                     "pipeline.final_eval_games=0", "pipeline.allreduce=mpi", *overrides, *extra],
                        timeout=seconds + 300)
    summary = json.loads((runs / name / "summary.json").read_text())
    return {"name": name, "env_ranks": config.topology.env, "inference_ranks": config.topology.inference,
            "learners": config.topology.learner, "set": extra,
            "lstm_size": config.model.lstm_size, "precision": config.ppo.precision, "devices": summary["devices"],
            **_figures(runs / name),
            "job_seconds": time.monotonic() - started}


def _record(progress: Path | None, part: str, row: dict) -> None:
    if progress is not None:
        with progress.open("a") as f:
            f.write(json.dumps({"part": part, **row}) + "\n")


# --- parts -------------------------------------------------------------------------------------------------------
def devices(args, runs: Path) -> dict:
    topology = [f"topology.env={args.env_ranks}", "topology.inference=1", f"topology.learner={args.learners}"]
    cpu = ["pipeline.inference_device=cpu", "pipeline.learner_device=cpu"]
    gpu = [f"pipeline.inference_device={args.gpu_device}", f"pipeline.learner_device={args.gpu_device}"]
    large = f"model.lstm_size={args.large_lstm}"
    jobs = {"cpu": cpu, "gpu": gpu, "gpu_bf16": [*gpu, "ppo.precision=bfloat16"],
            f"cpu_lstm{args.large_lstm}": [*cpu, large], f"gpu_lstm{args.large_lstm}": [*gpu, large]}
    unknown = sorted(set(args.jobs or ()) - set(jobs))
    if unknown:
        raise ValueError(f"unknown jobs {unknown}; the devices part runs {sorted(jobs)}")
    rows = {}
    for name, overrides in jobs.items():
        if args.jobs and name not in args.jobs:
            continue
        rows[name] = run_job(runs, name, [*topology, *overrides], args.seconds, args.set)
        _record(args.progress, "devices", rows[name])
    out: dict = {"jobs": rows}
    pairs = {"gpu_vs_cpu": ("gpu", "cpu"), "bf16_vs_fp32": ("gpu_bf16", "gpu"),
             f"gpu_vs_cpu_lstm{args.large_lstm}": (f"gpu_lstm{args.large_lstm}", f"cpu_lstm{args.large_lstm}")}
    for label, (a, b) in pairs.items():  # ratios within this run, of the jobs it ran
        if a in rows and b in rows:
            for key in ("learner_samples_per_s", "env_steps_per_s"):
                out[f"{label}_{key.removesuffix('_per_s')}"] = rows[a][key] / rows[b][key]
    return out


def efficiency(ranks: list[int], rates: list[float]) -> list[float]:
    """Each point's rate against linear scaling from the first point: rate / (rate_0 * ranks / ranks_0)."""
    return [rate / (rates[0] * n / ranks[0]) for n, rate in zip(ranks, rates)]


def scaling(args, runs: Path) -> dict:
    rows = []
    for n in args.scaling:
        overrides = [f"topology.env={n}", "topology.inference=1", f"topology.learner={args.learners}",
                     f"pipeline.inference_device={args.gpu_device}", f"pipeline.learner_device={args.gpu_device}"]
        rows.append(run_job(runs, f"scale{n}", overrides, args.seconds, args.set))
        _record(args.progress, "scaling", rows[-1])
    ranks = [r["env_ranks"] for r in rows]
    return {"points": rows,
            "env_steps_efficiency": efficiency(ranks, [r["env_steps_per_s"] for r in rows]),
            "learner_samples_efficiency": efficiency(ranks, [r["learner_samples_per_s"] for r in rows])}


def model(args, runs: Path) -> dict:
    """The learner's update alone on the GPU, per LSTM size and precision."""
    import dataclasses

    import torch

    from hpc_rl.algo.learner import Learner
    from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
    from hpc_rl.model.config import ModelConfig
    from hpc_rl.model.policy import Policy
    from hpc_rl.runner import SerialRunner

    device = torch.device(args.gpu_device)
    base = compose_config([f"runs_dir={runs}", "run_name=model"])  # the default job's PPO and model settings
    config = TrainConfig(runs_dir=str(runs), run_name="model-batch",
                         env=EnvConfig(num_envs=args.model_batch, vs_scripted_fraction=0.0),
                         model=base.model, ppo=base.ppo, pipeline=PipelineConfig(segment_len=64))
    runner = SerialRunner(config)
    batch = runner.collect()  # real observations; the stored LSTM states are replaced by zeros of each size
    samples = batch.obs["global"].shape[0] * batch.obs["global"].shape[1]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    rows = []
    for size in args.lstm_sizes:
        sized = batch.replace(chunk_h=torch.zeros(*batch.chunk_h.shape[:-1], size),
                              chunk_c=torch.zeros(*batch.chunk_c.shape[:-1], size))
        for precision in ("float32", "bfloat16"):
            policy = Policy(runner.spec, dataclasses.replace(base.model, lstm_size=size)).to(device)
            learner = Learner(policy, dataclasses.replace(base.ppo, precision=precision), device=device)
            learner.update(sized)  # warm-up: cuDNN's choices, allocations, Adam's state
            times = []
            for _ in range(args.repeats):
                sync()
                t0 = time.perf_counter()
                learner.update(sized)
                sync()
                times.append(time.perf_counter() - t0)
            rate = samples * base.ppo.epochs / min(times)
            row = {"lstm_size": size, "precision": precision, "parameters": sum(p.numel() for p in policy.parameters()),
                   "batch_samples": samples, "epochs": base.ppo.epochs, "samples_per_s": rate,
                   "vs_honor_of_kings": rate / HOK_SAMPLES_PER_GPU}
            rows.append(row)
            _record(args.progress, "model", row)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return {"device": name, "honor_of_kings_samples_per_gpu": HOK_SAMPLES_PER_GPU, "rows": rows}


def inference(args, runs: Path) -> dict:
    """One inference step (observations to the device, ``act``, actions back) of the default model and of an LSTM of
    ``--large-lstm`` units, per batch size: on one CPU thread, and on the GPU with pinned and with pageable copies."""
    import dataclasses

    import torch

    from hpc_rl.model.device import to_device
    from hpc_rl.model.policy import Policy, act, hero_indices

    base = compose_config([f"runs_dir={runs}", "run_name=inference"])
    variants = [("cpu", True)] + [(args.gpu_device, pin) for pin in (True, False)]
    rows = []
    for copies in args.inference_copies:
        env = dataclasses.replace(base.env, num_envs=copies).make(num_envs=copies)
        n = copies * env.spec.num_agents
        flat = {k: v.reshape(n, *v.shape[2:]) for k, v in env.reset(seed=0).items()}
        for size in (base.model.lstm_size, args.large_lstm):
            torch.manual_seed(0)
            model = Policy(env.spec, dataclasses.replace(base.model, lstm_size=size)).eval()
            for name, pin in variants:
                device = torch.device(name)
                policy = model.to(device)
                hero = torch.from_numpy(np.tile(hero_indices(env.spec), copies)).to(device)
                starts = torch.zeros(n, dtype=torch.bool, device=device)
                state = policy.initial_state(n, device)
                times = []
                for i in range(23):  # the first 3 warm up (cuDNN's choices, the caching allocators)
                    t0 = time.perf_counter()
                    step = act(policy, to_device(flat, device, pin), hero, starts, state)
                    for actions in step.actions.values():  # the copy back, as an inference rank makes it
                        actions.cpu().numpy()
                    if i >= 3:
                        times.append(time.perf_counter() - t0)
                row = {"copies": copies, "batch": n, "lstm_size": size, "device": name, "pinned": pin and
                       device.type == "cuda", "step_ms": 1e3 * float(np.median(times))}
                rows.append(row)
                _record(args.progress, "inference", row)
    return {"rows": rows}


def run(args) -> dict:
    import torch

    set_torch_threads()  # as every rank runs: the CPU figures are one core's
    parts = [p for p in args.parts.split(",") if p]
    unknown = sorted(set(parts) - set(PARTS))
    if unknown:
        raise ValueError(f"unknown parts {unknown}; choose from {PARTS}")
    if args.gpu_device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("the gpu benchmark needs a CUDA device, and torch sees none (--gpu-device cpu tries it on "
                         "CPU cores)")
    gpu = torch.cuda.get_device_name(0) if args.gpu_device.startswith("cuda") else "cpu"
    out: dict = {"gpu": gpu, "seconds_per_job": args.seconds}
    with tempfile.TemporaryDirectory() as tmp:
        for part in parts:
            out[part] = {"devices": devices, "scaling": scaling, "model": model, "inference": inference}[part](
                args, Path(tmp))
    return out
