"""Segments on the wire: pack/unpack round trip, and malformed segments refused before training."""

import numpy as np
import pytest
import torch

from hpc_rl.config import EnvConfig, PipelineConfig, TrainConfig
from hpc_rl.data.batch import SegmentError, SegmentSchema, validate
from hpc_rl.envs.moba import MobaConfig
from hpc_rl.model.config import ModelConfig
from hpc_rl.runner import SerialRunner

MODEL = ModelConfig(core="lstm", lstm_size=16, embed_size=8)


@pytest.fixture(scope="module")
def real_batch(tmp_path_factory):
    config = TrainConfig(runs_dir=str(tmp_path_factory.mktemp("runs")), model=MODEL,
                         env=EnvConfig(num_envs=2, moba=MobaConfig()), pipeline=PipelineConfig(segment_len=32))
    return SerialRunner(config).collect()


@pytest.mark.parametrize("fp16", [False, True])
def test_round_trip(real_batch, fp16):
    schema = SegmentSchema(MobaConfig().spec(), 4, 32, MODEL.chunk_len, MODEL.lstm_size, fp16)
    payload = schema.pack(real_batch.fields, env_rank=3, seq=17)
    batch, env_rank, seq = schema.unpack(payload)
    assert (env_rank, seq) == (3, 17)
    assert torch.equal(batch.actions["target"], real_batch.actions["target"])
    assert torch.equal(batch.logp, real_batch.logp) and torch.equal(batch.chunk_h, real_batch.chunk_h)
    tol = 1e-2 if fp16 else 0.0
    for key, value in real_batch.obs.items():
        assert torch.allclose(batch.obs[key].float(), value.float(), atol=tol, rtol=tol), key
    validate(batch, schema, max_version=0)
    joined = schema.concat([batch, batch])
    assert joined.hero.shape == (32, 8) and joined.chunk_h.shape == (32 // MODEL.chunk_len, 8, MODEL.lstm_size)
    assert joined.bootstrap_value.shape == (8,)
    assert torch.equal(joined.bootstrap_value[4:], real_batch.bootstrap_value)


def _damaged(batch, what):
    schema, payload = _packed(batch)
    b = schema.unpack(payload)[0]
    if what == "nan":
        b.value[3, 1] = float("nan")
    elif what == "illegal_action":
        masked = (~b.obs["action_mask"]).nonzero()
        t, a, action = masked[0].tolist()
        b.actions["action"][t, a] = action
        b.weight[t, a] = 1.0
    elif what == "out_of_range":
        b.actions["action"][0, 0] = 99
    elif what == "future_version":
        b.version[:] = 5
    elif what == "weight":
        b.weight[0, 0] = 2.0
    return b


def _packed(batch):
    schema = SegmentSchema(MobaConfig().spec(), 4, 32, MODEL.chunk_len, MODEL.lstm_size)
    return schema, schema.pack(batch.fields, 0, 1)


@pytest.mark.parametrize("what, message", [("nan", "non-finite"), ("illegal_action", "illegal"),
                                           ("out_of_range", "out of range"), ("future_version", "beyond the learner"),
                                           ("weight", "weights outside")])
def test_malformed_segments_are_refused(real_batch, what, message):
    with pytest.raises(SegmentError, match=message):
        validate(_damaged(real_batch, what), _packed(real_batch)[0], max_version=0)


def test_short_payload_is_refused(real_batch):
    schema, payload = _packed(real_batch)
    with pytest.raises(SegmentError, match="bytes"):
        schema.unpack(payload[: schema.layout.nbytes // 2])
    assert np.asarray(payload).dtype == np.uint8


def test_a_float_field_whose_sum_overflows_is_still_finite(real_batch):
    """validate sums a float field first and checks it element-wise only when the sum is not finite."""
    schema, payload = _packed(real_batch)
    batch = schema.unpack(payload)[0]
    big = batch.replace(value=torch.full_like(batch.value, 3e38))  # finite, but the sum overflows float32
    assert not torch.isfinite(big.value.sum())
    validate(big, schema, max_version=0)
    big.value[2, 1] = float("inf")
    with pytest.raises(SegmentError, match="non-finite values in value"):
        validate(big, schema, max_version=0)
