"""The running observation normaliser: z-score, clip ±5, and statistics that merge across processes."""

import numpy as np
import pytest
import torch

from hpc_rl.algo.normalizer import NormStats, RunningNormalizer, merge, normalize


def test_merging_two_halves_equals_one_pass():
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, size=(1001, 4)) * np.array([1, 10, 0.1, 1])
    whole = NormStats.of(x)
    merged = merge(NormStats.of(x[:377]), NormStats.of(x[377:]))
    assert merged.count == 1001
    np.testing.assert_allclose(merged.mean, x.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(merged.var, x.var(axis=0), rtol=1e-10)
    np.testing.assert_allclose(merged.m2, whole.m2, rtol=1e-10)
    assert merge(NormStats.empty(4), whole).mean.tolist() == whole.mean.tolist()


def test_running_updates_equal_the_statistics_of_everything_seen():
    rng = np.random.default_rng(1)
    batches = [rng.normal(size=(n, 3)) for n in (5, 50, 1)]
    norm = RunningNormalizer(3)
    for b in batches:
        norm.update(b)
    everything = np.concatenate(batches)
    np.testing.assert_allclose(norm.stats.mean, everything.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(norm.stats.var, everything.var(axis=0), rtol=1e-10)


def test_update_with_reduce_over_two_processes_equals_one_process_with_both_batches():
    rng = np.random.default_rng(2)
    prior, mine, theirs = rng.normal(size=(20, 2)), rng.normal(1.0, 3.0, size=(30, 2)), rng.normal(size=(7, 2))
    sent = []
    RunningNormalizer(2).update(theirs, reduce=lambda x: sent.append(x) or x)  # process 1's contribution

    distributed = RunningNormalizer(2)
    distributed.update(prior)
    distributed.update(mine, reduce=lambda x: x + sent[0])
    single = RunningNormalizer(2)
    single.update(prior)
    single.update(np.concatenate([mine, theirs]))
    assert distributed.stats.count == single.stats.count == 57
    np.testing.assert_allclose(distributed.stats.mean, single.stats.mean, rtol=1e-10)
    np.testing.assert_allclose(distributed.stats.m2, single.stats.m2, rtol=1e-8)


def test_z_score_and_clip():
    out = normalize(torch.tensor([[1.0, 100.0, -100.0]]), torch.tensor([0.0, 0.0, 0.0]), torch.tensor([2.0, 1.0, 1.0]))
    assert out.tolist() == [[0.5, 5.0, -5.0]]
    norm = RunningNormalizer(1, eps=0.0)
    norm.update(np.array([[1.0], [3.0]]))  # mean 2, std 1
    assert norm(torch.tensor([[4.0], [2.0], [-50.0]])).flatten().tolist() == [2.0, 0.0, -5.0]


def test_state_round_trip_and_bad_input():
    norm = RunningNormalizer(2)
    norm.update(np.ones((3, 2)))
    other = RunningNormalizer(2)
    other.load_state_dict(norm.state_dict())
    assert other.stats.count == 3 and other.stats.mean.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="features"):
        RunningNormalizer(3).load_state_dict(norm.state_dict())
    with pytest.raises(ValueError, match="merge"):
        merge(NormStats.empty(2), NormStats.empty(3))
    with pytest.raises(ValueError, match="clip"):
        RunningNormalizer(2, clip=0)
