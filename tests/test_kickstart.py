"""Kickstarting: the teacher's labels on every step (hpc_rl.envs.teacher), their trip to the learner, and the
distillation term of the loss (hpc_rl.algo.ppo.kickstart_loss, ppo.kickstart_coef)."""

import dataclasses

import numpy as np
import pytest
import torch

from hpc_rl.algo.config import PPOConfig
from hpc_rl.algo.ppo import kickstart_loss
from hpc_rl.algo.schedules import Schedule
from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.envs.scripted import ScriptedBot
from hpc_rl.envs.teacher import TEACHER_HEADS, TeacherLabels, teacher_info
from hpc_rl.model.config import ModelConfig
from hpc_rl.runner import SerialRunner


@pytest.fixture(autouse=True)
def one_torch_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def test_a_step_reports_the_teachers_actions_on_the_observation_it_consumed():
    config = MobaConfig(map_size=32.0)  # the lane is near: the bot fights within the steps played
    env = TeacherLabels(MobaEnv(config, 4), ScriptedBot(config))
    reference = ScriptedBot(config)
    assert [i.name for i in env.spec.step_infos] == [teacher_info(h) for h in TEACHER_HEADS]
    players = ScriptedBot(config)  # heroes that walk to the lane and fight, so the labels cover every action
    obs = env.reset(seed=5)
    seen = set()
    for _ in range(400):  # past the first creep wave: the bot attacks, moves and targets
        expected = reference.act(obs)
        mask = obs["action_mask"]
        obs, _, dones, infos = env.step(players.act(obs))
        for head in TEACHER_HEADS:
            np.testing.assert_array_equal(infos[teacher_info(head)], expected[head])
        # The teacher's primary action is legal on the observation it was chosen for.
        assert np.take_along_axis(mask, infos[teacher_info("action")][..., None], -1).all()
        seen |= set(infos[teacher_info("action")].ravel().tolist())
    assert seen >= {1, 2}  # moves and attacks


def test_kickstart_loss_is_the_cross_entropy_of_legal_teacher_actions():
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 0.0], [1.0, -1.0, 0.0]])
    mask = torch.tensor([[True, True, True], [True, False, True], [True, True, False]])
    teacher = torch.tensor([1, 2, 2])  # the last is illegal under its mask: left out
    logp = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), -1).gather(1, teacher[:, None]).squeeze(1)
    expected = -(math_log_softmax(logits[0].tolist(), 1) + math_log_softmax([0.5, 0.0], 1)) / 2
    assert kickstart_loss(logp).item() == pytest.approx(expected, rel=1e-6)
    weights = torch.tensor([0.0, 1.0, 1.0])
    assert kickstart_loss(logp, weights).item() == pytest.approx(-math_log_softmax([0.5, 0.0], 1), rel=1e-6)
    logits.requires_grad_(True)
    logp = torch.log_softmax(logits.masked_fill(~mask, float("-inf")), -1).gather(1, teacher[:, None]).squeeze(1)
    kickstart_loss(logp).backward()
    assert torch.isfinite(logits.grad).all() and (logits.grad[2] == 0).all()


def math_log_softmax(xs: list[float], i: int) -> float:
    """Slow reference: log(exp(x_i) / Σ exp(x_j))."""
    import math
    return xs[i] - math.log(sum(math.exp(x) for x in xs))


def test_a_kickstart_coefficient_needs_a_teacher_and_a_teacher_needs_the_moba():
    with pytest.raises(ValueError, match="env.teacher=scripted"):
        TrainConfig(ppo=PPOConfig(kickstart_coef=Schedule(1.0, 0.0, 100)))
    with pytest.raises(ValueError, match="env.teacher"):
        EnvConfig(name="gym:CartPole-v1", teacher="scripted")
    with pytest.raises(ValueError, match="env.teacher"):
        EnvConfig(teacher="oracle")
    TrainConfig(env=EnvConfig(teacher="scripted"), ppo=PPOConfig(kickstart_coef=Schedule(1.0, 0.0, 100)))


@pytest.mark.slow
def test_the_learner_moves_the_policy_towards_the_teacher(tmp_path):
    """The labels travel env worker -> inference -> segment -> learner as batch fields; with a large kickstart
    coefficient the policy's log-probability of the teacher's actions rises on the batch it trains on."""
    config = TrainConfig(run_name="ks", runs_dir=str(tmp_path),
                         env=EnvConfig(num_envs=4, vs_scripted_fraction=1.0, teacher="scripted"),
                         model=ModelConfig(core="lstm", lstm_size=32, embed_size=16),
                         ppo=PPOConfig(epochs=1, num_minibatches=2, lr=Schedule(3e-3, kind="constant"),
                                       kickstart_coef=Schedule(1.0, 0.0, 30)),
                         pipeline=PipelineConfig(segment_len=32, segments_per_batch=1, max_versions=100))
    runner = SerialRunner(config)
    batch = runner.collect()
    taught = batch.weight > 0
    labels = {h: batch[f"info/{teacher_info(h)}"] for h in TEACHER_HEADS}
    assert (labels["action"][taught] == 1).float().mean() > 0.5  # the teacher walks to the lane at first
    assert len(set(labels["move"][taught & (labels["action"] == 1)].tolist())) > 1
    metrics = [runner.learner.update(batch) for _ in range(25)]
    first, last = metrics[0]["train/kickstart_loss"], metrics[-1]["train/kickstart_loss"]
    assert metrics[0]["train/kickstart_coef"] == 1.0 and metrics[-1]["train/kickstart_coef"] == pytest.approx(0.2)
    assert last < 0.5 * first
    # Without kickstarting the term is neither computed nor reported as anything but 0.
    plain = dataclasses.replace(config, env=dataclasses.replace(config.env, teacher=""),
                                ppo=dataclasses.replace(config.ppo, kickstart_coef=Schedule(0.0, kind="constant")),
                                run_name="plain")
    assert SerialRunner(plain).update(batch)["train/kickstart_loss"] == 0.0
