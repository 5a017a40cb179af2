"""Rank -> role assignment and its checks."""

import pytest

from hpc_rl.topology import Role, Topology, TopologyConfig, local_rank


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


def test_local_rank_reads_the_launcher(monkeypatch):
    for var in ("OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "PMI_LOCAL_RANK"):
        monkeypatch.delenv(var, raising=False)
    assert local_rank() == 0
    monkeypatch.setenv("SLURM_LOCALID", "2")
    assert local_rank() == 2
    monkeypatch.setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3")
    assert local_rank() == 3
