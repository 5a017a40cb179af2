"""The Go network (``hpc_rl.model.go_net``) and its input planes (``hpc_rl.envs.go.input_planes``)."""

import numpy as np
import pytest
import torch

from hpc_rl.envs.go import BLACK, EMPTY, NUM_PLANES, WHITE, GoGames, input_planes
from hpc_rl.model.config import GoNetConfig
from hpc_rl.envs.go_search import ownership_targets
from hpc_rl.model.go_net import (FrozenNetEvaluator, GoNet, NetEvaluator, alphazero_loss, legal_softmax,
                                 ownership_loss)


def test_planes_show_the_board_to_the_player_to_move():
    s = 5
    games = GoGames(2, s)
    # Game 0: one black stone. Game 1: the ko of tests/test_envs_go.py, black having just taken at (1, 1) (point 6).
    ko = [1, 2, 5, 8, 11, 12, 24, 6, 7]
    games.play_sequences([0, 1], [[12] + [0] * 8, ko], [1, 9])
    assert games.to_play.tolist() == [1, 1]  # white to play in both
    planes = input_planes(games, [0, 1])
    assert planes.shape == (2, NUM_PLANES, s, s) and planes.dtype == np.float32
    board = games.boards()
    assert planes[0, 0].sum() == 0 and planes[0, 1].sum() == 1 and planes[0, 1, 2, 2] == 1  # the opponent's stone
    np.testing.assert_array_equal(planes[1, 0], board[1] == WHITE)
    np.testing.assert_array_equal(planes[1, 1], board[1] == BLACK)
    assert board[1].ravel()[6] == EMPTY and planes[1, 2].ravel()[6] == 0  # empty, but the ko point
    np.testing.assert_array_equal(planes[:, 2].reshape(2, -1), games.legal_mask()[:, :-1])
    assert not planes[:, 3].any() and planes[:, 4].all()
    games.step([3, 3])
    assert input_planes(games, [1])[0, 3].all()  # black to play
    np.testing.assert_array_equal(input_planes(games, [1])[0, 0], games.boards()[1] == BLACK)


def test_planes_tell_whether_a_pass_ends_the_game():
    """The same board and player to move, once after the opponent's pass: a pass there ends the game (scored), so
    the network must see the two apart; without it, a pass that wins by komi after black's is learned as white's
    pass anywhere."""
    games = GoGames(2, 5)
    games.play_sequences([0, 1], [[12, 13, 25], [25, 13, 12]], [3, 3])  # B 12, W 13, B pass / B pass, W 13, B 12
    np.testing.assert_array_equal(games.boards()[0], games.boards()[1])
    assert games.to_play.tolist() == [1, 1]
    planes = input_planes(games, [0, 1])
    np.testing.assert_array_equal(planes[0, :5], planes[1, :5])
    assert planes[0, 5].all() and not planes[1, 5].any()
    assert games.clone().step([25, 25]).tolist() == [True, False]  # white's pass ends game 0 only


def test_shapes_and_evaluator():
    torch.manual_seed(0)
    net = GoNet(GoNetConfig(blocks=2, filters=8), board_size=5)
    games = GoGames(3, 5)
    games.step([0, 6, 24])
    legal = games.legal_mask()
    legal[1, 3] = False
    logits, value = net(torch.from_numpy(input_planes(games, [0, 1, 2])))
    assert logits.shape == (3, 26) and value.shape == (3,) and (value.abs() <= 1).all()
    priors, values = NetEvaluator(net)(input_planes(games, [0, 1, 2]), legal)
    assert priors.shape == (3, 26) and values.shape == (3,)
    assert (priors[~legal] == 0).all() and np.allclose(priors.sum(1), 1, atol=1e-6)
    with pytest.raises(ValueError, match="blocks"):
        GoNetConfig(blocks=-1)


def test_a_tiny_net_learns_a_few_positions():
    """AlphaGo Zero's loss falls as the net fits the policy and value targets of 16 positions."""
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    games = GoGames(16, 5)
    for _ in range(6):
        mask = games.legal_mask()
        games.step([rng.choice(np.flatnonzero(m[:-1])) for m in mask])
    planes = torch.from_numpy(input_planes(games, range(16)))
    pi = torch.from_numpy(rng.dirichlet(np.full(26, 0.3), size=16).astype(np.float32))
    z = torch.from_numpy(rng.choice([-1.0, 1.0], size=16).astype(np.float32))
    net = GoNet(GoNetConfig(blocks=1, filters=8), board_size=5)
    opt = torch.optim.Adam(net.parameters(), lr=3e-3, weight_decay=1e-4)
    losses = []
    for _ in range(30):
        loss = alphazero_loss(*net(planes), pi, z)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0]


def test_ownership_head_and_loss_match_a_slow_reference():
    """KataGo's ownership loss: per point -(1+o*)/2 log((1+o)/2) - (1-o*)/2 log((1-o)/2) with o = tanh(y), the mean
    over the points and over the scored rows; the head's logits per point, beside unchanged policy and value."""
    torch.manual_seed(0)
    net = GoNet(GoNetConfig(blocks=1, filters=8), 5).eval()
    planes = (torch.rand(6, NUM_PLANES, 5, 5) < 0.3).float()
    logits, value, owner = net.with_ownership(planes)
    assert owner.shape == (6, 25)
    plain = net(planes)
    assert torch.equal(plain[0], logits) and torch.equal(plain[1], value)
    target = torch.randint(-1, 2, (6, 25)).float()
    scored = torch.tensor([True, False, True, True, False, True])
    rows = []
    for i in range(6):
        if scored[i]:
            o = torch.tanh(owner[i].double())
            t = target[i].double()
            rows.append((-(1 + t) / 2 * torch.log((1 + o) / 2) - (1 - t) / 2 * torch.log((1 - o) / 2)).mean())
    assert torch.isclose(ownership_loss(owner, target, scored).double(), torch.stack(rows).mean(), atol=1e-5)
    assert ownership_loss(owner, target, torch.zeros(6, dtype=torch.bool)) == 0


def test_ownership_targets_take_the_player_to_moves_view():
    final = np.array([1, -1, 0, 1], np.int8)  # black's view
    targets = ownership_targets(np.array([0, 1, 0]), final)
    assert targets.dtype == np.int8
    assert targets.tolist() == [[1, -1, 0, 1], [-1, 1, 0, -1], [1, -1, 0, 1]]


def test_a_frozen_evaluator_gives_the_networks_priors_and_values():
    """``FrozenNetEvaluator`` (a ladder's player: the network exported to ONNX Runtime, batch norm folded into the
    convolutions) gives ``NetEvaluator``'s numbers up to rounding, at any batch size (the export's batch is 2)."""
    torch.manual_seed(0)
    net = GoNet(GoNetConfig(blocks=2, filters=8), 5)
    net.train()
    for _ in range(3):  # batch norm's running statistics away from their initial values
        net(torch.randn(16, NUM_PLANES, 5, 5))
    planes = np.random.default_rng(0).random((6, NUM_PLANES, 5, 5), dtype=np.float32)
    legal = np.ones((6, 26), dtype=bool)
    legal[:, ::4] = False
    evaluator = FrozenNetEvaluator(net)
    for rows in (slice(0, 1), slice(0, 6)):
        plain, frozen = NetEvaluator(net)(planes[rows], legal[rows]), evaluator(planes[rows], legal[rows])
        np.testing.assert_allclose(frozen[0], plain[0], atol=1e-6)
        np.testing.assert_allclose(frozen[1], plain[1], atol=1e-6)
        assert (frozen[0][~legal[rows]] == 0).all() and np.abs(plain[1]).max() > 0


def test_legal_softmax_matches_a_slow_reference():
    rng = np.random.default_rng(1)
    logits, legal = rng.normal(size=(5, 7)) * 30, rng.random((5, 7)) < 0.5
    legal[:, -1] = True  # pass
    out = legal_softmax(logits, legal)
    for row in range(5):
        idx = np.flatnonzero(legal[row])
        expected = np.zeros(7)
        expected[idx] = [np.exp(logits[row, i]) / sum(np.exp(logits[row, j]) for j in idx) for i in idx]
        np.testing.assert_allclose(out[row], expected, rtol=1e-12, atol=1e-300)


def test_a_frozen_evaluator_keeps_saturated_values_in_range():
    """ONNX Runtime's tanh gives 1.0000001 for some inputs where PyTorch's gives 1 (seen with this network at
    seed 0): a value head driven into saturation still answers values in [-1, 1], as the search requires."""
    torch.manual_seed(0)
    net = GoNet(GoNetConfig(blocks=1, filters=8), 5).eval()
    with torch.no_grad():
        net.value_fc[2].weight.mul_(120.0)
    planes = np.random.default_rng(0).random((512, NUM_PLANES, 5, 5), dtype=np.float32)
    _, values = FrozenNetEvaluator(net)(planes, np.ones((512, 26), dtype=bool))
    assert np.abs(values).max() <= 1.0 and np.abs(values).max() > 0.9999
