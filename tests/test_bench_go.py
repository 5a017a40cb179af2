"""`python -m hpc_rl.bench go` on a tiny setting: every searcher searched the same positions, the guided search ran
its simulations, the figures are present and sane, the match is counted, no strength is reported without a
committed evaluation (no timing asserted)."""

from argparse import Namespace

import pytest

from hpc_rl.bench import go as bench

ARGS = dict(board_size=5, positions=2, opening_moves=(2, 6), simulations=20, rollouts=2, uct_c=2.0,
            python_positions=1, match_games=2, seed=0, guided_games=3, guided_moves=1, guided_simulations=4,
            guided_leaves=2, guided_blocks=1, guided_filters=8, ladder_simulations=8, ladder_leaves=2,
            ladder_blocks=1, ladder_filters=8, evaluation="no-such-dir")


def test_go_bench_measures_all_three_searches_and_plays_the_match(tmp_path):
    r = bench.run(Namespace(**{**ARGS, "evaluation": str(tmp_path)}))
    assert r["strength"] is None and "no committed evaluation" in r["strength_source"]
    assert r["positions"] == 2 and all(2 <= n < 6 for n in r["opening_moves"])
    assert r["ours_simulations"] == 2 * 20  # no root is solved this early
    for key in ("rollout_mcts_sims_per_s", "openspiel_mcts_sims_per_s", "openspiel_python_mcts_sims_per_s",
                "rollout_mcts_sims_per_s_on_python_positions", "ours_vs_openspiel", "ours_vs_openspiel_python"):
        assert r[key] > 0, key
    assert (r["rollouts_per_leaf"], r["simulations_per_search"], r["python_positions"]) == (2, 20, 1)
    assert r["guided_simulations_run"] == 3 * 1 * 4 and 1 <= r["guided_batch_size"] <= 3 * 2
    for key in ("guided_sims_per_s_per_core", "net_positions_per_s", "search_only_sims_per_s"):
        assert r[key] > 0, key
    assert 0 < r["guided_net_share"] < 1 and r["guided_net"] == "1x8"
    for key in ("ladder_sims_per_s_torch", "ladder_sims_per_s_onnx", "ladder_onnx_vs_torch"):
        assert r[key] > 0, key
    assert (r["ladder_net"], r["ladder_simulations"], r["ladder_leaves"]) == ("1x8", 8, 2)
    match = r["match"]
    assert match["games"] == 2 and match["wins"] + match["losses"] + match["draws"] == 2


def test_openings_are_seeded_legal_stones():
    a = bench.random_openings(7, 3, 4, 9, seed=1)
    assert a == bench.random_openings(7, 3, 4, 9, seed=1) and all(4 <= len(x) < 9 for x in a)
    assert all(max(x) < 49 and len(set(x)) == len(x) for x in a)  # stones only, no pass; few captures this early


@pytest.mark.parametrize("field, value", [("board_size", 4), ("positions", 0), ("simulations", 1), ("rollouts", 0),
                                          ("opening_moves", (5, 5)), ("python_positions", 3), ("match_games", -1),
                                          ("seed", -1), ("guided_games", 0), ("guided_simulations", 1),
                                          ("guided_blocks", -1), ("ladder_simulations", 1),
                                          ("ladder_leaves", 0), ("ladder_blocks", -1)])
def test_go_bench_rejects_bad_options(field, value):
    with pytest.raises(ValueError, match=field.replace("_", "-")):
        bench.run(Namespace(**{**ARGS, field: value}))
