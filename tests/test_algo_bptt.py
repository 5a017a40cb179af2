"""Truncated BPTT from stored states against a step-by-step LSTM cell loop."""

import pytest
import torch
from torch import nn

from hpc_rl.algo.bptt import from_chunks, to_chunks, unroll_lstm


def cell_loop(lstm, x, starts, h, c):
    """The reference: one LSTMCell step at a time, zeroing the state before a step that starts a game."""
    cell = nn.LSTMCell(lstm.input_size, lstm.hidden_size)
    cell.load_state_dict({"weight_ih": lstm.weight_ih_l0, "weight_hh": lstm.weight_hh_l0,
                          "bias_ih": lstm.bias_ih_l0, "bias_hh": lstm.bias_hh_l0})
    outs, states = [], []
    for t in range(x.shape[0]):
        keep = (~starts[t]).float().unsqueeze(-1)
        states.append((h.clone(), c.clone()))
        h, c = cell(x[t], (h * keep, c * keep))
        outs.append(h)
    return torch.stack(outs), states


def test_unroll_matches_cell_loop_with_resets():
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 5)
    x = torch.randn(16, 4, 3)
    starts = torch.rand(16, 4) < 0.2
    h0, c0 = torch.randn(4, 5), torch.randn(4, 5)
    out, (h, _) = unroll_lstm(lstm, x, starts, (h0, c0))
    ref, _ = cell_loop(lstm, x, starts, h0, c0)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h, ref[-1], rtol=1e-5, atol=1e-6)
    # The acting path: one step.
    one, (h1, _) = unroll_lstm(lstm, x[:1], starts[:1], (h0, c0))
    torch.testing.assert_close(one[0], ref[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(h1, ref[0], rtol=1e-5, atol=1e-6)
    # The learner's path: every piece between resets side by side in one call, no final state.
    packed, none = unroll_lstm(lstm, x, starts, (h0, c0), need_state=False)
    assert none is None and starts[1:].any()
    torch.testing.assert_close(packed, ref, rtol=1e-5, atol=1e-6)


def test_chunks_from_stored_states_reproduce_the_full_unroll_and_truncate_gradients():
    torch.manual_seed(1)
    lstm = nn.LSTM(3, 5)
    steps, batch, chunk = 64, 3, 16
    x = torch.randn(steps, batch, 3, requires_grad=True)
    starts = torch.rand(steps, batch) < 0.05
    h0 = torch.zeros(batch, 5)
    with torch.no_grad():
        ref, states = cell_loop(lstm, x, starts, h0, h0.clone())
    stored_h = torch.stack([states[t][0] for t in range(0, steps, chunk)])
    stored_c = torch.stack([states[t][1] for t in range(0, steps, chunk)])
    out, _ = unroll_lstm(lstm, to_chunks(x, chunk), to_chunks(starts, chunk),
                         (stored_h.reshape(-1, 5), stored_c.reshape(-1, 5)), need_state=False)
    full = from_chunks(out, steps // chunk)
    torch.testing.assert_close(full, ref, rtol=1e-5, atol=1e-6)
    # The gradient of chunk 2's outputs stops at its first step: nothing reaches chunk 1's inputs.
    full[2 * chunk:3 * chunk].sum().backward()
    assert x.grad[:2 * chunk].abs().sum().item() == 0.0
    assert x.grad[2 * chunk:3 * chunk].abs().sum().item() > 0.0


def test_chunk_layout_round_trip_and_errors():
    x = torch.arange(2 * 32 * 3).reshape(32, 3, 2)
    chunks = to_chunks(x, 16)
    assert chunks.shape == (16, 6, 2)
    assert torch.equal(chunks[:, 3 + 1], x[16:, 1])  # chunk k of column b is column k·B + b
    assert torch.equal(from_chunks(chunks, 2), x)
    with pytest.raises(ValueError, match="multiple"):
        to_chunks(torch.zeros(20, 2), 16)
    with pytest.raises(ValueError, match="starts"):
        unroll_lstm(nn.LSTM(1, 1), torch.zeros(4, 2, 1), torch.zeros(4, 3, dtype=torch.bool),
                    (torch.zeros(2, 1), torch.zeros(2, 1)))
