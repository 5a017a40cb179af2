"""Teacher labels: what a reference bot would play, reported beside every step for kickstarting.

Kickstarting (Schmitt et al. 2018, "Kickstarting Deep Reinforcement Learning") adds to the student's RL loss the
cross-entropy between a teacher's policy and the student's, annealed to nothing, so the student starts from the
teacher's competence and RL takes it further. ``TeacherLabels`` wraps a vectorised environment and reports, for
every agent and step, the action the teacher plays on the observation the agent acted on: the step infos
``teacher/<head>`` (declared in the spec, so they travel to the learner as the batch fields
``info/teacher/<head>`` with no other edit; ``hpc_rl.data.batch``). The learner's use of them is
``ppo.kickstart_coef`` (``hpc_rl.algo.learner``).

The teacher acts on the observation before the step, so the labels a step reports belong to the step's own
observation: the step that consumed ``obs_t`` reports ``teacher(obs_t)``, which the inference rank stores with step t.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

import numpy as np

from hpc_rl.envs.api import Actions, Obs, StepInfo, VecEnv

if TYPE_CHECKING:  # environments load no torch
    from hpc_rl.actors import Actor

TEACHER_HEADS = ("action", "move", "target")


def teacher_info(head: str) -> str:
    """The step info (and, prefixed with ``info/``, the batch field) of the teacher's choice for ``head``."""
    return f"teacher/{head}"


class TeacherLabels:
    """``env`` with the ``teacher``'s actions on every step's observation reported as ``infos["teacher/<head>"]``."""

    def __init__(self, env: VecEnv, teacher: "Actor"):
        self.env, self.teacher = env, teacher
        self.num_envs = env.num_envs
        self.spec = replace(env.spec, step_infos=env.spec.step_infos + tuple(
            StepInfo(teacher_info(head), (), "int64") for head in TEACHER_HEADS))
        self.obs: Obs | None = None

    def reset(self, seed: int) -> Obs:
        self.obs = self.env.reset(seed)
        self.teacher.reset(np.ones(self.num_envs, bool))
        return self.obs

    def step(self, actions: Actions) -> tuple[Obs, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
        if self.obs is None:
            raise RuntimeError("step before reset")
        labels = self.teacher.act(self.obs)
        self.obs, events, dones, infos = self.env.step(actions)
        self.teacher.reset(dones)
        infos = dict(infos)
        for head in TEACHER_HEADS:
            infos[teacher_info(head)] = np.asarray(labels[head], np.int64)
        return self.obs, events, dones, infos

    def __getattr__(self, name: str):
        # Everything else (config, render state) is the wrapped env's.
        return getattr(self.env, name)
