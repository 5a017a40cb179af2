"""The batch schema is declared once (hpc_rl.data.batch.batch_fields): the buffer, the wire layout, packing, joining
and validation all follow it, so a field an environment declares travels to the learner with no other edit."""

import dataclasses

import numpy as np
import pytest
import torch

from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.data.batch import AGENT, CHUNK, STEP, WIRE_IDS, SegmentError, SegmentSchema, batch_fields, validate
from hpc_rl.envs.api import StepInfo
from hpc_rl.envs.moba import MobaConfig, MobaEnv
from hpc_rl.model.config import ModelConfig
from hpc_rl.roles.protocol import request_layout
from hpc_rl.runner import SerialRunner

MODEL = ModelConfig(core="lstm", lstm_size=16, embed_size=8)
SEGMENT = 32


class ProbeEnv:
    """MOBA with one declared per-agent info: ``probe`` (E, A, 2) = (game step count, 10 * copy + agent), so every
    value in a batch says exactly which step and agent it came from."""

    def __init__(self, num_envs: int):
        self.inner = MobaEnv(MobaConfig(), num_envs)
        self.num_envs = num_envs
        self.spec = dataclasses.replace(self.inner.spec, step_infos=(StepInfo("probe", (2,), "float32"),))
        self.steps = 0

    def reset(self, seed):
        return self.inner.reset(seed)

    def step(self, actions):
        obs, events, dones, infos = self.inner.step(actions)
        self.steps += 1
        agents = self.spec.num_agents
        probe = np.empty((self.num_envs, agents, 2), np.float32)
        probe[..., 0] = self.steps
        probe[..., 1] = 10 * np.arange(self.num_envs)[:, None] + np.arange(agents)[None, :]
        return obs, events, dones, {**infos, "probe": probe}


def expected_probe(first_step: int, num_envs: int, agents: int) -> np.ndarray:
    """(T, E*A, 2): what the ProbeEnv reported for the segment starting after ``first_step`` env steps."""
    out = np.empty((SEGMENT, num_envs * agents, 2), np.float32)
    out[..., 0] = first_step + 1 + np.arange(SEGMENT)[:, None]
    out[..., 1] = (10 * np.arange(num_envs)[:, None] + np.arange(agents)[None, :]).reshape(-1)
    return out


def test_every_derived_structure_follows_the_declaration():
    spec = MobaConfig().spec()
    fields = batch_fields(spec, MODEL.lstm_size)
    names = [f.name for f in fields]
    assert len(names) == len(set(names))
    schema = SegmentSchema(spec, 4, SEGMENT, MODEL.chunk_len, MODEL.lstm_size)
    assert list(schema.layout.fields) == names + [WIRE_IDS]
    buffer = schema.buffer()
    assert list(buffer.arrays) == names
    for f in fields:
        lead = {STEP: (SEGMENT, 4), CHUNK: (SEGMENT // MODEL.chunk_len, 4), AGENT: (4,)}[f.kind]
        assert buffer.arrays[f.name].shape == lead + f.shape and buffer.arrays[f.name].dtype == f.dtype


def test_a_step_without_every_field_is_refused():
    schema = SegmentSchema(MobaConfig().spec(), 4, SEGMENT, MODEL.chunk_len, MODEL.lstm_size)
    with pytest.raises(KeyError, match=r"missing fields \['actions/action'"):
        schema.buffer().store(0, {"reward": np.zeros(4, np.float32)})


def test_a_declared_step_info_travels_to_the_learner(tmp_path):
    env = ProbeEnv(num_envs=2)
    agents = env.spec.num_agents
    config = TrainConfig(runs_dir=str(tmp_path), model=MODEL, env=EnvConfig(num_envs=2, vs_scripted_fraction=0.0),
                         pipeline=PipelineConfig(segment_len=SEGMENT, segments_per_batch=1, max_versions=2))
    runner = SerialRunner(config, env=env)
    first, second = runner.collect(), runner.collect()
    np.testing.assert_array_equal(first["info/probe"].numpy(), expected_probe(0, 2, agents))
    np.testing.assert_array_equal(second["info/probe"].numpy(), expected_probe(SEGMENT, 2, agents))

    # The env rank's message carries it ...
    request = request_layout(env.spec, 2, fp16=False)
    assert request.fields["info/probe"].shape == (2, agents, 2)
    # ... and so does a segment on the wire, into the learner's joined batch, checked like every float field.
    schema = SegmentSchema(env.spec, 2 * agents, SEGMENT, MODEL.chunk_len, MODEL.lstm_size, fp16_observations=True)
    taken = [schema.unpack(schema.pack(b.fields, env_rank=1, seq=k))[0] for k, b in enumerate((first, second))]
    joined = schema.concat(taken)
    np.testing.assert_array_equal(joined["info/probe"].numpy(),
                                  np.concatenate([expected_probe(0, 2, agents), expected_probe(SEGMENT, 2, agents)],
                                                 axis=1))
    validate(joined, schema, max_version=0)
    broken = joined.replace(**{"info/probe": torch.full_like(joined["info/probe"], float("nan"))})
    with pytest.raises(SegmentError, match="non-finite values in info/probe"):
        validate(broken, schema, max_version=0)

    # The roles on their own: the learner role takes, checks and trains on segments that carry it.
    runner.run()
    trained = [h.batch["info/probe"].numpy() for h in runner.learner_worker.store.held if h.uses]
    assert len(trained) == 2  # pipeline.max_versions updates of one segment each
    for probe in trained:
        first = int(probe[0, 0, 0]) - 1
        np.testing.assert_array_equal(probe, expected_probe(first, 2, agents))
