"""What the roles say to each other: the step messages follow the env spec, the parameter payload round-trips."""

import numpy as np
import pytest
import torch

from hpc_rl.envs.api import EntitySpec, EnvSpec, StepInfo
from hpc_rl.model.config import ModelConfig
from hpc_rl.model.policy import HEADS, Policy
from hpc_rl.roles.protocol import decode_parameters, encode_parameters, parameter_bytes, reply_layout, request_layout

SPEC = EnvSpec(num_agents=2, agent_team=(0, 1), global_features=6, num_actions=4, num_moves=3,
               entities=(EntitySpec("hero", 2, 5),), reward_events=("win", "kill"),
               step_infos=(StepInfo("lane", (3,), "int64"),))


def test_step_layouts_follow_the_env_spec():
    shapes = SPEC.observation_shapes(num_envs=3)
    request = request_layout(SPEC, 3, fp16=True)
    assert set(request.fields) == set(shapes) | {"events", "done", "winner", "game_time", "info/lane", "stop"}
    assert request.fields["entities/hero"].wire_dtype == np.float16
    assert request.fields["entities/hero/mask"].wire_dtype == np.dtype(bool)
    assert request.fields["events"].shape == (3, 2, 2) and request.fields["events"].wire_dtype == np.float32
    assert request.fields["info/lane"].shape == (3, 2, 3) and request.fields["info/lane"].dtype == np.int64
    reply = reply_layout(SPEC, 3)
    assert list(reply.fields) == list(HEADS) and reply.nbytes == len(HEADS) * 3 * 2 * 8


def test_parameter_payload_round_trips_with_its_version():
    torch.manual_seed(0)
    source, target = Policy(SPEC, ModelConfig(core="lstm", lstm_size=8, embed_size=8)), Policy(SPEC, ModelConfig(core="lstm", lstm_size=8,
                                                                                                     embed_size=8))
    payload = encode_parameters(17, source)
    assert payload.nbytes == parameter_bytes(source)
    assert decode_parameters(payload, target) == 17
    for (name, a), b in zip(source.state_dict().items(), target.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
    with pytest.raises(ValueError, match="parameter payload of"):
        decode_parameters(payload[:-4], target)
