"""Rank -> role assignment and its checks."""

import pytest
import torch

from hpc_rl.model.device import select_device
from hpc_rl.topology import (PlacementError, Role, Topology, TopologyConfig, check_components, gpu_slots,
                             het_components)


def test_default_topology_assigns_roles_in_order():
    topo = Topology(TopologyConfig(env=2, inference=1, learner=2))
    assert topo.config.world_size == 6
    assert topo.role_map() == {0: "controller[0]", 1: "env[0]", 2: "env[1]", 3: "inference[0]",
                               4: "learner[0]", 5: "learner[1]"}
    assert topo.ranks(Role.LEARNER) == [4, 5]
    topo.check(6)


def test_env_ranks_are_spread_over_inference_ranks():
    topo = Topology(TopologyConfig(env=5, inference=2, learner=1, evaluator=1))
    env_ranks, inf_ranks = topo.ranks(Role.ENV), topo.ranks(Role.INFERENCE)
    assert env_ranks == [1, 2, 3, 4, 5] and inf_ranks == [6, 7]
    assert topo.envs_for_inference(0) == [1, 2, 3] and topo.envs_for_inference(1) == [4, 5]
    served = sorted(r for i in range(2) for r in topo.envs_for_inference(i))
    assert served == env_ranks
    assert topo.ranks(Role.EVALUATOR) == [9]


def test_wrong_world_size_is_a_clear_error():
    topo = Topology(TopologyConfig())
    with pytest.raises(ValueError, match="needs 6 ranks .* has 4: launch with -np 6"):
        topo.check(4)


@pytest.mark.parametrize("kwargs", [{"env": 0}, {"learner": 0}, {"evaluator": -1}, {"env": 1, "inference": 2}])
def test_bad_topology_is_refused(kwargs):
    with pytest.raises(ValueError, match="topology"):
        TopologyConfig(**kwargs)


def test_gpu_slots_count_only_the_inference_and_learner_ranks_of_each_host():
    topo = Topology(TopologyConfig(env=2, inference=1, learner=2))  # 0 controller, 1-2 env, 3 inference, 4-5 learner
    # One node: the GPU ranks are its 4th to 6th ranks, and its first 3 GPU ranks.
    assert gpu_slots(topo, ["n1"] * 6) == {3: 0, 4: 1, 5: 2}
    # Env ranks on their own node, the GPU ranks over two: each GPU node counts from 0.
    assert gpu_slots(topo, ["cpu1", "cpu1", "cpu1", "gpu1", "gpu1", "gpu2"]) == {3: 0, 4: 1, 5: 0}
    # A node list ordered by role with an env rank beside the GPU ranks: it takes no GPU and no slot.
    assert gpu_slots(topo, ["a", "a", "b", "b", "b", "b"]) == {3: 0, 4: 1, 5: 2}
    # Ranks of a node need not be contiguous: slots follow rank order within each host.
    assert gpu_slots(topo, ["a", "a", "b", "b", "a", "b"]) == {3: 0, 4: 0, 5: 1}
    with pytest.raises(ValueError, match="5 hosts given for the topology's 6 ranks"):
        gpu_slots(topo, ["a"] * 5)


def test_a_rank_takes_the_gpu_of_its_slot(monkeypatch):
    """cuda:<slot mod the node's GPUs> (the device is only named here: no CUDA is needed)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert [select_device("auto", slot) for slot in range(3)] == [torch.device("cuda", i) for i in (0, 1, 0)]
    assert select_device("cuda", 5) == torch.device("cuda", 1)
    assert select_device("cuda:1", 0) == torch.device("cuda", 1) and select_device("cpu", 1).type == "cpu"


def test_het_components_read_slurms_environment():
    assert het_components({"SLURM_NTASKS": "6"}) is None
    env = {"SLURM_HET_SIZE": "2", "SLURM_NTASKS_HET_GROUP_0": "3", "SLURM_NTASKS_HET_GROUP_1": "4"}
    assert het_components(env) == [3, 4]


def test_components_must_not_mix_env_ranks_with_inference_or_learner_ranks():
    topo = Topology(TopologyConfig(env=2, inference=1, learner=2))
    check_components(topo, [3, 3])  # controller + env | inference + learners
    check_components(topo, [1, 2, 3])  # the controller alone, env ranks, GPU ranks
    with pytest.raises(PlacementError, match=r"component 0 \(ranks 0-3\) holds env ranks and inference/learner "
                                             r"ranks.* 1 controller \+ 2 env = 3 tasks, then 1 inference \+ 2 "
                                             r"learner = 3 \(sbatch --ntasks=3 : --ntasks=3 slurm/train_het"):
        check_components(topo, [4, 2])
    with pytest.raises(PlacementError, match=r"component 1 \(ranks 2-5\) holds env ranks"):
        check_components(topo, [2, 4])
