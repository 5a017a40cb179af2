"""Truncated backpropagation through time over fixed-length chunks (OpenAI Five: 16 steps).

A segment of T steps is cut into T/L chunks of L steps. Each chunk starts from the LSTM state that the acting
policy stored when it reached the chunk's first step, so every chunk unrolls independently (gradients stop at
chunk boundaries) and all chunks of a batch unroll together as one batch of L steps.

The state a step receives is zeroed when the step is the first of a new game (``starts``: the previous step was
``done``), exactly as the acting policy does, so the learner recomputes what the actor computed.
"""

from __future__ import annotations

import itertools

import torch
from torch import nn

LSTMState = tuple[torch.Tensor, torch.Tensor]


def unroll_lstm(lstm: nn.LSTM, x: torch.Tensor, starts: torch.Tensor, state: LSTMState,
                need_state: bool = True) -> tuple[torch.Tensor, LSTMState | None]:
    """Run a one-layer ``lstm`` over ``x`` (L, N, F), resetting the state of row n before step t where starts[t, n].

    ``state`` is ``(h, c)``, each (N, H), the state before step 0 (it too is reset where ``starts[0]``). Returns the
    outputs (L, N, H) and the state after step L−1 (None when a reset falls inside and ``need_state`` is False).

    On a CPU every ``lstm`` call has a large fixed cost, so resets inside the sequence are handled in one call: a
    reset cuts a row into independent pieces (the first starts from ``state``, every later one from zeros), and all
    pieces run side by side, left-aligned and zero-padded at the end (the padding cannot reach earlier outputs).
    The padded run's final state is not the rows' final state; when that is needed the sequence is instead split in
    time at every step holding a reset.
    """
    if x.dim() != 3 or starts.shape != x.shape[:2]:
        raise ValueError(f"x must be (L, N, F) and starts (L, N); got {tuple(x.shape)} and {tuple(starts.shape)}")
    steps, rows = starts.shape
    keep = (~starts[0]).to(x.dtype).unsqueeze(-1)
    h, c = state[0] * keep, state[1] * keep
    inner = starts.clone()
    inner[0] = False
    if steps == 1:  # acting: one fused cell step costs a third of an ``lstm`` call
        h, c = torch.lstm_cell(x[0], (h, c), lstm.weight_ih_l0, lstm.weight_hh_l0, lstm.bias_ih_l0, lstm.bias_hh_l0)
        return h.unsqueeze(0), (h, c)
    if not bool(inner.any()):
        out, (h, c) = lstm(x, (h.unsqueeze(0), c.unsqueeze(0)))
        return out, (h.squeeze(0), c.squeeze(0))
    if need_state:
        return _split_in_time(lstm, x, starts, (h, c))

    # Pieces: row n's first piece has id n; the later ones are numbered after all rows, by (row, time).
    reset_row, reset_time = torch.nonzero(inner.t(), as_tuple=True)
    num_pieces = rows + reset_row.numel()
    rank = inner.t().reshape(-1).long().cumsum(0).reshape(rows, steps).t() - 1  # latest reset's number, per (t, n)
    later = inner.long().cumsum(0) > 0
    piece = torch.where(later, rows + rank, torch.arange(rows, device=x.device).expand(steps, rows))
    piece_start = torch.zeros(num_pieces, dtype=torch.long, device=x.device)
    piece_start[rows:] = reset_time
    time = torch.arange(steps, device=x.device).unsqueeze(1).expand(steps, rows)
    dest = ((time - piece_start[piece]) * num_pieces + piece).reshape(-1)

    padded = x.new_zeros(steps * num_pieces, x.shape[2]).index_copy(0, dest, x.reshape(steps * rows, -1))
    zeros = h.new_zeros(num_pieces - rows, h.shape[1])
    out, _ = lstm(padded.view(steps, num_pieces, -1),
                  (torch.cat([h, zeros]).unsqueeze(0), torch.cat([c, zeros]).unsqueeze(0)))
    return out.reshape(steps * num_pieces, -1).index_select(0, dest).view(steps, rows, -1), None


def _split_in_time(lstm: nn.LSTM, x: torch.Tensor, starts: torch.Tensor, state: LSTMState) -> tuple[torch.Tensor, LSTMState]:
    """The same unroll as one ``lstm`` call per stretch between steps holding a reset; exact final state."""
    h, c = state
    keep = (~starts).to(x.dtype).unsqueeze(-1)
    reset_steps = torch.nonzero(starts[1:].any(dim=1)).flatten().add(1).tolist()
    bounds = [0, *reset_steps, x.shape[0]]
    outputs = []
    for lo, hi in itertools.pairwise(bounds):
        h, c = h * keep[lo], c * keep[lo]
        out, (h1, c1) = lstm(x[lo:hi], (h.unsqueeze(0), c.unsqueeze(0)))
        outputs.append(out)
        h, c = h1.squeeze(0), c1.squeeze(0)
    return torch.cat(outputs, dim=0), (h, c)


def to_chunks(x: torch.Tensor, chunk_len: int) -> torch.Tensor:
    """(T, B, ...) → (L, T/L · B, ...): chunk k of column b becomes column k·B + b."""
    steps, batch = x.shape[:2]
    if steps % chunk_len:
        raise ValueError(f"segment length {steps} is not a multiple of the BPTT chunk length {chunk_len}")
    n = steps // chunk_len
    return x.reshape(n, chunk_len, batch, *x.shape[2:]).transpose(0, 1).reshape(chunk_len, n * batch, *x.shape[2:])


def from_chunks(x: torch.Tensor, num_chunks: int) -> torch.Tensor:
    """The inverse of ``to_chunks``: (L, n · B, ...) → (n · L, B, ...)."""
    chunk_len, nb = x.shape[:2]
    if nb % num_chunks:
        raise ValueError(f"{nb} columns do not split into {num_chunks} chunks")
    batch = nb // num_chunks
    return x.reshape(chunk_len, num_chunks, batch, *x.shape[2:]).transpose(0, 1).reshape(
        num_chunks * chunk_len, batch, *x.shape[2:])
