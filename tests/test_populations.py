"""Populations over one Neural MMO world (``env.nmmo.populations``, hpc_rl.populations): which slot, learner and
checkpoint group belongs to which population; an inference rank running each population's policy on its agents and
routing their segments to that population's learners (in process); a real MPI job of two populations whose
checkpoints advance together and whose resume continues both."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hpc_rl.algo.bptt import from_chunks, to_chunks
from hpc_rl.config import SHAPE_KEYS, EnvConfig, LeagueConfig, PipelineConfig, TrainConfig
from hpc_rl.envs.nmmo_config import NmmoConfig
from hpc_rl.launch import mpirun_command
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import Policy, hero_indices
from hpc_rl.populations import (join_sections, learner_population, merge_metrics, population_learners,
                                population_rows, population_sections, slot_population)
from hpc_rl.storage import open_run
from hpc_rl.topology import TopologyConfig
from test_pipeline import Job

ROOT = Path(__file__).resolve().parent.parent
MODEL = ModelConfig(core="lstm", lstm_size=16, embed_size=16)
WORLD = NmmoConfig(num_agents=16, map_size=24, border=2, vision=3, max_seen=4, populations=2)


def populations_config(runs_dir, populations: int = 2, learners: int = 2) -> TrainConfig:
    return TrainConfig(run_name="pop", runs_dir=str(runs_dir),
                       env=EnvConfig(name="nmmo", num_envs=2, vs_scripted_fraction=0.0,
                                     nmmo=dataclasses.replace(WORLD, populations=populations)),
                       league=LeagueConfig(past_fraction=0.0), model=MODEL,
                       topology=TopologyConfig(env=1, inference=1, learner=learners),
                       pipeline=PipelineConfig(segment_len=32, segments_per_batch=1))


def test_slots_learners_checkpoint_groups_and_metrics_belong_to_populations():
    # Slot a is in population a mod K, in every copy; each population's rows of an env rank's copies x agents.
    assert slot_population(6, 3) == (0, 1, 2, 0, 1, 2)
    rows = population_rows(np.array(slot_population(4, 2)), copies=2)
    assert [r.tolist() for r in rows] == [[0, 2, 4, 6], [1, 3, 5, 7]]
    # Learner i trains population i mod K: learners 0 .. K-1 lead them (learner 0 all of them); each has one.
    assert population_learners(5, 2) == [[0, 2, 4], [1, 3]]
    assert [learner_population(i, 2) for i in range(3)] == [0, 1, 0]
    with pytest.raises(ValueError, match=r"topology.learner \(1\) must be >= env.nmmo.populations \(2\)"):
        population_learners(1, 2)
    # One checkpoint holds every population's sections; one population's layout is every other run's.
    a, b = {"params": {"w": 1}}, {"params": {"w": 2}}
    assert join_sections([a]) is a and population_sections(a, 0, 1) is a
    joined = join_sections([a, b])
    assert sorted(joined) == ["population_0", "population_1"] and population_sections(joined, 1, 2) is b
    with pytest.raises(ValueError, match="no population_2 .* another number of populations"):
        population_sections(joined, 2, 3)
    with pytest.raises(ValueError, match="holds no single policy .* trained with populations"):
        population_sections(joined, 0, 1)
    # A version's row: each population's figures under its name, and their mean under the plain one.
    assert merge_metrics([{"x": 1.0}]) == {"x": 1.0}
    assert merge_metrics([{"x": 1.0}, {"x": 3.0}]) == {"x": 2.0, "population_0/x": 1.0, "population_1/x": 3.0}
    # The final evaluation's line names each population's mean lifetime.
    from hpc_rl.roles.console import final_eval_line

    final = {"worlds": 2, "policy_agents": 64, "policy_mean_lifetime": 9.0, "policy_ci95": [6.5, 11.5],
             "random_mean_lifetime": 7.8, "random_ci95": [6.0, 9.5], "lifetime_ratio": 1.15, "seconds": 3.0}
    assert "9.0 [6.5, 11.5] vs random" in final_eval_line(final)
    final |= {"population_0_mean_lifetime": 10.8, "population_1_mean_lifetime": 7.4}
    assert "9.0 [6.5, 11.5] (populations: 10.8, 7.4) vs random" in final_eval_line(final)
    final |= {"head_to_head_policy_mean_lifetime": 14.0, "head_to_head_random_mean_lifetime": 5.6,
              "head_to_head_ratio": 2.5}
    assert "worlds; head to head in the same worlds 14.0 vs 5.6 (2.50x), 3 s" in final_eval_line(final)
    final |= {"head_to_head_ratio_ci95": [2.1, 2.95], "lifetime_ratio_ci95": [0.9, 1.4]}  # where the evaluation has them
    assert "(1.15x [0.90, 1.40]) over the first 64 agents" in final_eval_line(final)
    assert "14.0 vs 5.6 (2.50x [2.10, 2.95]), 3 s" in final_eval_line(final)


def test_the_world_spec_and_the_config_carry_the_populations(tmp_path):
    spec = WORLD.spec()
    assert spec.agent_team == (0, 1) * 8
    assert hero_indices(spec).tolist() == [a // 2 for a in range(16)]  # each policy numbers its own slots
    with pytest.raises(ValueError, match=r"nmmo.populations must be >= 1 and divide nmmo.num_agents \(16\)"):
        dataclasses.replace(WORLD, populations=3)
    config = populations_config(tmp_path)
    assert config.populations == 2 and TrainConfig().populations == 1
    with pytest.raises(ValueError, match="each population learns on learner ranks of its own"):
        populations_config(tmp_path, learners=1)
    from hpc_rl.runner import SerialRunner

    with pytest.raises(ValueError, match="env.nmmo.populations=2 needs the MPI job"):
        SerialRunner(config)
    # Populations change the saved state's layout: a resume may not change their number.
    assert "env.nmmo.populations" in SHAPE_KEYS


def test_every_population_decides_with_the_control_vector_of_every_learner():
    """Two populations of one learner each: each is the first of its population (it publishes, reports and
    checkpoints), but only learner 0 of all hears the controller's stop, and both see the sums over both."""
    import threading

    from hpc_rl.roles.allreduce import SingleAllreduce
    from hpc_rl.roles.learner import CONTROL, LockstepLearner
    from test_roles_logic import Link, ThreadAllreduce

    reduce = ThreadAllreduce(2)
    learners = [LockstepLearner(None, SingleAllreduce(), Link(stop=7 + 2 * k), reduce.of(k), population=k)
                for k in (0, 1)]
    assert [(w.index, w.first, w.population) for w in learners] == [(0, True, 0), (0, False, 1)]
    for k, w in enumerate(learners):
        w.produced, w.consumed = 100.0 * (k + 1), 10.0 * (k + 1)
    out = [None, None]
    threads = [threading.Thread(target=lambda k=k: out.__setitem__(k, learners[k]._control(True, 5.0)))
               for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert out[0] == out[1] == {"not_ready": 0.0, "stop_version": 7.0, "produced": 300.0, "consumed": 30.0,
                                "next_batch": 10.0, "rejected": 0.0}
    assert tuple(out[0]) == CONTROL


def test_each_population_s_policy_plays_its_agents_and_its_learners_get_their_segments(tmp_path):
    """One env rank, one inference rank and two learners (one per population) in process, on the local transport:
    the populations' policies differ and are published at different versions; every segment in a learner's ring holds
    its population's agents only, acted on by its population's policy."""
    from hpc_rl.roles.common import open_channels
    from hpc_rl.roles.control import ControlLink, LocalControlHub
    from hpc_rl.roles.env_worker import EnvWorker
    from hpc_rl.roles.inference import InferenceWorker
    from hpc_rl.roles.protocol import encode_parameters
    from hpc_rl.topology import Topology
    from hpc_rl.transport import Transport
    from hpc_rl.transport.local import LocalWorld

    config = populations_config(tmp_path)
    config = dataclasses.replace(config, transport=dataclasses.replace(config.transport, backend="local"))
    topology = Topology(config.topology)  # 0 controller, 1 env, 2 inference, 3-4 learners
    spec = config.env.make(num_envs=1).spec
    world, hub = LocalWorld(5), LocalControlHub(5)
    channels = [open_channels(Transport(world.comm(r), config.transport), config, spec, topology) for r in range(5)]
    policies = []
    for population, (rank, version) in enumerate(((3, 1), (4, 2))):  # each population's first learner publishes
        torch.manual_seed(population)
        policies.append(Policy(spec, MODEL).eval())
        channels[rank].params[population].publish(encode_parameters(version, policies[-1]))
    link = lambda rank: ControlLink(hub.endpoint(rank), heartbeat_s=0.02)  # noqa: E731
    env = EnvWorker(config, 1, 0, channels[1].steps, link(1), 0)
    inference = InferenceWorker(config, spec, [1], channels[2].steps, channels[2].rings, channels[2].params, link(2))
    inference.start()
    env.start()
    rings = [channels[3].rings[0], channels[4].rings[1]]
    while not all(ring.ready_slots() for ring in rings):
        env.send()
        inference.serve(channels[2].steps.poll_requests())
        env.receive()
    # The env rank counts each population's agents' episodes (slots 0, 2, ... and 1, 3, ...) as well as all of them.
    ended, _returns, lengths = env.population_counts.sum(axis=0)
    assert env.games > 0 and (ended, lengths) == (env.games, env.lengths_sum)
    per_population = WORLD.num_agents // 2
    for population, ring in enumerate(rings):
        taken = ring.take_view()
        batch = inference.schema.unpack(taken[0].payload)[0]
        ring.release(taken)
        # The population's agents of both copies (slots 0, 2, ... or 1, 3, ...), its policy's version on every step.
        assert batch.hero.shape == (32, 2 * per_population)
        assert torch.equal(batch.hero[0], torch.arange(per_population).repeat(2))
        assert (batch.version == population + 1).all()
        # Its own policy computed the behaviour log-probabilities of its agents, the other population's did not.
        n = batch.chunk_h.shape[0]
        recomputed = []
        with torch.no_grad():
            for policy in policies:
                step = policy({k: to_chunks(v, 16) for k, v in batch.obs.items()}, to_chunks(batch.hero, 16),
                              to_chunks(batch.starts, 16), (batch.chunk_h.reshape(-1, 16),
                                                            batch.chunk_c.reshape(-1, 16)),
                              actions={k: to_chunks(v, 16) for k, v in batch.actions.items()})
                recomputed.append(from_chunks(step.logp, n))
        torch.testing.assert_close(recomputed[population], batch.logp, rtol=1e-5, atol=1e-5)
        assert not torch.allclose(recomputed[1 - population], batch.logp, rtol=1e-3, atol=1e-3)


@pytest.mark.mpi
@pytest.mark.timeout(540)
def test_mpi_job_of_two_populations_checkpoints_both_evaluates_lifetimes_and_resumes_both(tmp_path):
    """experiment=nmmo_populations (the preset of experiment=nmmo with two populations) on 5 ranks (one env rank):
    each population's learner (its own Horovod communicator) trains its policy, one checkpoint per version holds
    both, the final evaluation reports the lifetimes of the policies' agents, the random bot's and each
    population's, and a resume continues both from the committed version."""
    args = [str(ROOT / "jobs/train.py"), "experiment=nmmo_populations", "run_name=pop", f"runs_dir={tmp_path}",
            "topology.env=1", "pipeline.checkpoint_every=1", "pipeline.heartbeat_s=0.2"]
    job = Job(mpirun_command(5, [*args, "pipeline.max_versions=2", "pipeline.final_eval_games=2"]), tmp_path)
    assert job.wait(260) == 0, job.output
    run = open_run(tmp_path / "pop")
    assert run.checkpoint_versions == [1, 2]
    first = run.load_checkpoint(2).sections
    assert sorted(first) == ["population_0", "population_1"]
    assert [int(first[f"population_{k}"]["learner"]["version"]) for k in (0, 1)] == [2, 2]
    # Two policies with unshared weights (each population started from parameters of its own).
    name = next(iter(first["population_0"]["params"]))
    assert not np.array_equal(first["population_0"]["params"][name], first["population_1"]["params"][name])
    metrics = run.metrics
    for k in (0, 1):
        assert np.isfinite(metrics[f"population_{k}/train/policy_loss"]["value"]).all()
    np.testing.assert_allclose(metrics["train/policy_loss"]["value"],
                               (metrics["population_0/train/policy_loss"]["value"]
                                + metrics["population_1/train/policy_loss"]["value"]) / 2, rtol=1e-6)
    final = json.loads((tmp_path / "pop" / "summary.json").read_text())["final_eval"]
    assert final["worlds"] == 2
    for player in ("policy", "random", "population_0", "population_1"):  # the first 32 agents of each world
        assert final[f"{player}_mean_lifetime"] > 1
        low, high = final[f"{player}_ci95"]
        assert low <= final[f"{player}_mean_lifetime"] <= high
    assert final["policy_agents"] == final["random_agents"] == 64
    assert final["population_0_agents"] + final["population_1_agents"] == 64
    assert final["lifetime_ratio"] == final["policy_mean_lifetime"] / final["random_mean_lifetime"]
    # Head to head, blocks of two slots alternating between the populations' policies and the random bot.
    assert final["head_to_head_policy_agents"] + final["head_to_head_random_agents"] == 64
    assert final["head_to_head_ratio"] == (final["head_to_head_policy_mean_lifetime"] /
                                           final["head_to_head_random_mean_lifetime"])
    evaluation = run.evaluations_frame().iloc[0]  # the analysis's table holds every figure
    assert evaluation.policy_mean_lifetime == final["policy_mean_lifetime"]
    assert [evaluation.population_1_ci95_low, evaluation.population_1_ci95_high] == final["population_1_ci95"]
    assert "mean lifetime" in job.output

    # The resume restores both populations' state and trains both on.
    resumed = Job(mpirun_command(5, [*args, "pipeline.max_versions=3", "pipeline.final_eval_games=0"]), tmp_path)
    assert resumed.wait(260) == 0, resumed.output
    run = open_run(tmp_path / "pop")
    assert run.checkpoint_versions[-1] == 3
    last = run.load_checkpoint(3).sections
    assert "resume version 2" in (tmp_path / "pop" / "logs" / "rank_3.log").read_text()
    flat = {(k, v): np.concatenate([np.ravel(x) for x in sections[f"population_{k}"]["params"].values()])
            for v, sections in ((2, first), (3, last)) for k in (0, 1)}
    # Each population's agents' episodes, as env ranks count them (a version's metrics hold the deaths whose env
    # heartbeat has reached the controller by then: over the whole run, both populations' agents have died).
    for k in (0, 1):
        assert (run.metrics[f"population_{k}/stats/episode_length"]["value"] > 1).all()
    for k in (0, 1):
        assert int(last[f"population_{k}"]["learner"]["version"]) == 3
        # One more update of its own version 2: moved, and far nearer it than the other population's.
        step = np.abs(flat[k, 3] - flat[k, 2]).max()
        assert 0 < step < np.abs(flat[k, 3] - flat[1 - k, 2]).max() / 10
