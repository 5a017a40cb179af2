"""What the benchmarks compare, checked in process: the e2e bench's two sides do equal work (or it refuses, naming
what differs), and learning is reported on seeds other than the ones the defaults were tuned on. No speed is
asserted: speed is what the benchmarks print."""

import dataclasses
from argparse import Namespace
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpc_rl.algo.config import PPOConfig
from hpc_rl.bench import REPORT_SEEDS, TUNING_SEEDS, e2e, gpu, learning, seed_report
from hpc_rl.config import EnvConfig, LeagueConfig, PipelineConfig, TrainConfig, compose_config
from hpc_rl.topology import TopologyConfig

ROOT = Path(__file__).resolve().parent.parent


def _bench_configs():
    """The configs ``bench e2e`` runs: the default job's (as jobs/train.py composes it) and the serial runner's."""
    pipeline = compose_config(["pipeline.max_versions=30", "pipeline.async_actions=false"])
    return pipeline, e2e.serial_config(pipeline)


def test_work_counts_the_global_batch_minibatches_and_shares():
    config = TrainConfig(topology=TopologyConfig(env=2, inference=1, learner=3),
                         env=EnvConfig(num_envs=8, vs_scripted_fraction=0.25),
                         pipeline=PipelineConfig(segment_len=64, segments_per_batch=2),
                         league=LeagueConfig(past_fraction=0.2), ppo=PPOConfig(epochs=1))
    w = e2e.work(config)
    # 3 learners x 2 segments x 8 copies x 64 steps x 2 heroes
    assert w["samples_per_update"] == 3 * 2 * 8 * 64 * 2
    # a learner's 2 x 8 x 2 x 4 = 128 BPTT chunks of 16 steps in 4 minibatches of 32; 3 learners average theirs
    assert (w["epochs"], w["gradient_steps_per_epoch"], w["global_minibatch"]) == (1, 4, 3 * 32 * 16)
    assert w["vs_scripted_share"] == 0.25 and w["past_version_share"] == pytest.approx(0.2 * 0.75)
    no_league = dataclasses.replace(config, league=LeagueConfig(past_fraction=0.0))
    assert e2e.work(no_league)["past_version_share"] == 0.0 and e2e.work(no_league)["league_pool_every"] == 0


def test_e2e_pipeline_and_serial_runner_do_equal_work():
    pipeline, serial = _bench_configs()
    sides = e2e.equal_work(pipeline, serial)
    assert sides["pipeline"] == sides["serial"]
    # The default job plays the bot and past versions, so equal shares are a claim about both, not two zeros.
    assert sides["serial"]["vs_scripted_share"] > 0 and sides["serial"]["past_version_share"] > 0
    assert serial.topology.world_size == 4 and serial.env.num_envs == pipeline.env.num_envs * pipeline.topology.env


def test_e2e_make_trains_job_and_the_default_job_do_the_same_training_work():
    # The bench's default MOBA job is make train's (one learner, 8 segments); its serial side does its work, and
    # the batch and gradient steps are the default job's (two learners, 4 segments each).
    pipeline = compose_config(["experiment=moba_kickstart", "pipeline.max_versions=30"])
    sides = e2e.equal_work(pipeline, e2e.serial_config(pipeline))
    default = e2e.work(_bench_configs()[0])
    assert pipeline.topology.learner == 1 and pipeline.topology.world_size == 5
    assert all(sides["serial"][k] == default[k] for k in ("samples_per_update", "gradient_steps_per_epoch",
                                                          "global_minibatch", "env_copies", "model"))
    assert sides["serial"]["epochs"] == 2 and sides["serial"]["vs_scripted_share"] == 1.0


@pytest.mark.parametrize("change, field", [
    (lambda c: dataclasses.replace(c, pipeline=dataclasses.replace(c.pipeline, segments_per_batch=1)),
     "samples_per_update"),
    (lambda c: dataclasses.replace(c, env=dataclasses.replace(c.env, vs_scripted_fraction=0.0)), "vs_scripted_share"),
    (lambda c: dataclasses.replace(c, league=dataclasses.replace(c.league, past_fraction=0.0)), "past_version_share"),
    (lambda c: dataclasses.replace(c, ppo=dataclasses.replace(c.ppo, num_minibatches=8)), "global_minibatch"),
    (lambda c: dataclasses.replace(c, pipeline=dataclasses.replace(c.pipeline, target_reuse=2.0)), "target_reuse"),
])
def test_e2e_refuses_a_serial_side_with_other_work_and_names_the_field(change, field):
    pipeline, serial = _bench_configs()
    with pytest.raises(e2e.UnequalWork, match=f"no ratio is measured; they differ in: .*{field} "):
        e2e.equal_work(pipeline, change(serial))


def test_e2e_refuses_a_topology_whose_batch_the_serial_runner_cannot_hold():
    pipeline = compose_config(["topology.env=3", "topology.inference=1", "topology.learner=2"])
    with pytest.raises(e2e.UnequalWork, match="8 segments of one env rank each is not a whole number"):
        e2e.serial_config(pipeline)


def test_learning_is_reported_on_seeds_the_defaults_were_not_tuned_on():
    assert not set(REPORT_SEEDS) & set(TUNING_SEEDS) and e2e.CARTPOLE_SEED not in TUNING_SEEDS
    assert seed_report(list(REPORT_SEEDS), allow_tuning_seeds=False) == {
        "seeds": list(REPORT_SEEDS), "tuning_seeds": list(TUNING_SEEDS), "tuning_seeds_reported": []}
    # Refused before any training starts (the run would take minutes), naming the seed and the way out.
    args = Namespace(seeds=[3, 1], allow_tuning_seeds=False, tasks=["CartPole-v1"], systems=["hpc_rl"], jobs=1,
                     max_steps=512, eval_every=512, eval_episodes=1)
    with pytest.raises(ValueError, match=r"seeds \[1\] chose the learning defaults.*--allow-tuning-seeds"):
        learning.run(args)
    assert seed_report([3, 1], allow_tuning_seeds=True)["tuning_seeds_reported"] == [1]


def test_ablation_sweeps_run_seeds_the_defaults_were_not_tuned_on():
    for path in sorted((ROOT / "conf/ablation").glob("*.yaml")):
        seeds = str(yaml.safe_load(path.read_text())["hydra"]["sweeper"]["params"]["seed"])
        assert not {int(s) for s in seeds.split(",")} & set(TUNING_SEEDS), path.name


def test_learning_bench_runs_both_systems_and_counts_a_missed_budget_as_unsolved():
    """The suite's JSON on a budget far too small to solve CartPole (475 within 1,024 steps): the shape the docs
    promise, and a miss is unsolved with a null median, not a number."""
    args = Namespace(seeds=[3], allow_tuning_seeds=False, tasks=["CartPole-v1"], systems=["hpc_rl", "sb3"], jobs=1,
                     max_steps=1024, eval_every=512, eval_episodes=2)
    out = learning.run(args)
    task = out["tasks"]["CartPole-v1"]
    assert task["threshold"] == 475.0 and out["seeds"] == [3]
    for system in ("hpc_rl", "sb3"):
        figures = task[system]
        assert figures["seeds"] == 1 and figures["solved"] == 0, figures
        assert figures["median_steps"] is None and figures["median_seconds"] is None
        assert figures["per_seed_steps"] == [None] and figures["per_seed_final_return"][0] < 475
    assert learning.TASKS.keys() >= {"CartPole-v1", "Acrobot-v1", "MountainCar-v0", "LunarLander-v3"}


def test_gpu_bench_rates_are_the_last_two_thirds_of_a_job():
    """Steady-state rates: from the first version logged at or after a third of the last wall time, against the
    counters' differences computed by hand; efficiency against linear scaling from the first point."""
    wall = np.array([4.0, 9.0, 12.0, 15.0, 21.0, 30.0])
    env_steps = np.array([100.0, 900.0, 1500.0, 2100.0, 3300.0, 5100.0])
    samples = np.array([0.0, 1000.0, 2000.0, 3000.0, 5000.0, 8000.0])
    rates = gpu.steady_rates(wall, env_steps, samples)  # a third of 30 s is 10 s: the window starts at 12 s
    assert rates == {"env_steps_per_s": (5100 - 1500) / 18, "learner_samples_per_s": (8000 - 2000) / 18,
                     "window_versions": 3, "window_seconds": 18.0}
    assert gpu.steady_rates(wall[:2], env_steps[:2], samples[:2])["window_seconds"] == 5.0
    with pytest.raises(ValueError, match="too few"):
        gpu.steady_rates(wall[:1], env_steps[:1], samples[:1])
    assert gpu.efficiency([1, 2, 4], [100.0, 150.0, 400.0]) == [1.0, 0.75, 1.0]


def test_gpu_analysis_writes_the_tables_and_the_scaling_plot(tmp_path):
    """analysis/gpu.py on benchmark rows (one per configuration, as --progress appends them)."""
    import json
    import subprocess
    import sys

    def job(name, env_ranks, env_rate, sets=()):
        return {"part": "scaling", "name": name, "env_ranks": env_ranks, "inference_ranks": 1, "learners": 2,
                "set": list(sets), "lstm_size": 128, "precision": "float32",
                "devices": {"inference": ["cuda:0"], "learner": ["cuda:0", "cuda:0"]}, "env_steps_per_s": env_rate,
                "learner_samples_per_s": 2 * env_rate, "inference_batch": 16.0 * env_ranks, "inference_ms": 5.0}

    rows = [job("scale1", 1, 1000.0), job("scale4", 4, 3000.0), job("scale4", 4, 3500.0, ["topology.inference=2"]),
            {"part": "model", "lstm_size": 1024, "precision": "float32", "parameters": 10, "batch_samples": 4096,
             "samples_per_s": 160000.0, "vs_honor_of_kings": 2.0}]
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = subprocess.run([sys.executable, str(ROOT / "analysis/gpu.py"), str(path), "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "out/gpu_scaling.png").stat().st_size > 0
    scaling = (tmp_path / "out/gpu_scaling.md").read_text()
    assert "| 0.75 " in scaling and "topology.inference=2" in scaling  # 3000 / (1000 x 4)
    assert "| 160000 " in (tmp_path / "out/gpu_model.md").read_text()
    path.write_text("not json\n")
    bad = subprocess.run([sys.executable, str(ROOT / "analysis/gpu.py"), str(path), "--out", str(tmp_path / "o2")],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert bad.returncode == 2 and "rows.jsonl:1 is not a JSON row" in bad.stderr
