"""The transport's pure parts: byte layouts, FP16 packing, checksums, slot states, configs, the backoff waiter."""

import importlib
import sys
import time

import numpy as np
import pytest

from hpc_rl.transport import ArrayLayout, PollConfig, RingConfig, TransportConfig, TransportTimeout, checksum
from hpc_rl.transport.layout import (align, free_for, ready, state_phase, state_ticket, taken,
                                     writing)
from hpc_rl.transport.wait import Waiter


def test_array_layout_round_trip_is_exact_and_aligned():
    fields = {"a": ((3, 5), np.float32), "m": ((7,), bool), "i": ((2, 2), np.int64)}
    layout = ArrayLayout(fields)
    # each field starts on an 8-byte boundary: 60 bytes of a -> 64, 7 of m -> 72, 32 of i -> 104
    assert [f.offset for f in layout.fields.values()] == [0, 64, 72]
    assert layout.nbytes == 104
    rng = np.random.default_rng(0)
    arrays = {"a": rng.normal(size=(3, 5)).astype(np.float32), "m": rng.random(7) < 0.5,
              "i": rng.integers(-9, 9, (2, 2))}
    back = layout.unpack(layout.pack(arrays))
    for key, value in arrays.items():
        assert back[key].dtype == value.dtype and np.array_equal(back[key], value)


def test_fp16_fields_halve_their_bytes_and_round_to_float16():
    layout = ArrayLayout({"obs": ((4, 100), np.float32), "mask": ((4, 3), bool)}, half=["obs"])
    full = ArrayLayout({"obs": ((4, 100), np.float32), "mask": ((4, 3), bool)})
    assert layout.nbytes == align(4 * 100 * 2, 8) + align(12, 8)
    assert full.nbytes == 4 * 100 * 4 + align(12, 8)
    obs = np.random.default_rng(1).normal(size=(4, 100)).astype(np.float32)
    back = layout.unpack(layout.pack({"obs": obs, "mask": np.ones((4, 3), bool)}))
    assert back["obs"].dtype == np.float32
    np.testing.assert_array_equal(back["obs"], obs.astype(np.float16).astype(np.float32))
    assert np.abs(back["obs"] - obs).max() <= np.abs(obs).max() * 2 ** -11


def test_array_layout_rejects_bad_input_naming_it():
    with pytest.raises(ValueError, match="'m' is bool"):
        ArrayLayout({"m": ((2,), bool)}, half=["m"])
    with pytest.raises(ValueError, match="not in the layout"):
        ArrayLayout({"m": ((2,), bool)}, half=["x"])
    layout = ArrayLayout({"a": ((2,), np.float32)})
    with pytest.raises(ValueError, match="field 'a': shape"):
        layout.pack({"a": np.zeros(3, np.float32)})
    with pytest.raises(ValueError, match="differ from the layout"):
        layout.pack({"b": np.zeros(2, np.float32)})
    with pytest.raises(ValueError, match=">= 8 bytes"):
        layout.unpack(np.zeros(4, np.uint8))
    with pytest.raises(TypeError, match="float64.*float32"):  # a field's dtype is exact: no silent cast
        layout.pack({"a": np.zeros(2, np.float64)})
    lent = layout.pack({"a": np.ones(2, np.float32)})
    lent.flags.writeable = False
    view = layout.unpack(lent)["a"]  # a read-only payload (the ring's lent slots) gives read-only fields
    assert not view.flags.writeable and np.shares_memory(view, lent)


def test_checksum_detects_a_torn_payload():
    rng = np.random.default_rng(2)
    old, new = rng.integers(0, 255, 65536, dtype=np.uint8), rng.integers(0, 255, 65536, dtype=np.uint8)
    torn = np.concatenate([new[:32768], old[32768:]])  # half of a new write over an old one
    assert checksum(new) == checksum(new.copy())
    assert checksum(torn) not in (checksum(old), checksum(new))
    flipped = new.copy()
    flipped[12345] ^= 1
    assert checksum(flipped) != checksum(new)
    # the checksum covers bytes, whatever the dtype the caller hands in
    assert checksum(new.view(np.uint64)) == checksum(new)


def test_slot_state_words_round_trip():
    assert free_for(0) == 0  # zeroed memory is slot 0's first state
    for ticket in (0, 1, 2, 12345, (1 << 30) - 1):
        for state, phase in ((free_for(ticket), "free"), (writing(ticket), "writing"), (ready(ticket), "ready"),
                             (taken(ticket), "taken")):
            assert state_phase(state) == phase and state_ticket(state) == ticket
            assert state < 2 ** 32  # fits the 32-bit state word
        assert len({free_for(ticket), writing(ticket), ready(ticket), taken(ticket), free_for(ticket + 1)}) == 5
    assert ready(1 << 30) == ready(0)  # tickets wrap after 2^30 puts
    assert free_for(-1) == free_for((1 << 30) - 1)  # the round before ticket 0, as the writers of ticket < N see it
    np.testing.assert_array_equal(free_for(np.arange(3, dtype=np.uint32)), [0, 4, 8])  # arrays too (the owner's)


def test_compiled_ring_state_arithmetic_matches_layout_across_the_wrap():
    """_ring.c's FREE(t) (the writer's claim) and FREE(t + N) after READY(t) / TAKEN(t) (the owner's release) against
    layout.py per ticket, the 2^30 ticket wrap included, and the constants it copies."""
    from hpc_rl.transport import _ring  # loads libmpi; MPI is not initialised by these pure functions
    from hpc_rl.transport.layout import PHASE_READY, TICKET_BITS
    from hpc_rl.transport.rma import HEADER_BYTES

    assert (_ring.TICKET_BITS, _ring.PHASE_READY, _ring.HEADER_BYTES) == (TICKET_BITS, PHASE_READY, HEADER_BYTES)
    for slots in (1, 8, 1000):
        for first in (0, 5, (1 << 30) - 3, (1 << 30) - 1, 1 << 30, 3 * (1 << 30) + 7, (1 << 64) - 2):
            for ticket in range(first, first + 2 * slots, max(1, slots // 4)):
                assert _ring.free_for(ticket) == free_for(ticket)
                for phase in (ready, taken):
                    assert _ring.freed(phase(ticket), slots) == free_for(ticket + slots), (ticket, slots, phase)


def test_rma_backend_without_its_compiled_module_names_the_fix(monkeypatch):
    """Installed where no MPI compiler wrapper was found, hpc_rl has no _ring (setup.py skips it): importing the rma
    backend then says how to build it."""
    monkeypatch.setitem(sys.modules, "hpc_rl.transport._ring", None)  # find_spec finds no such module
    monkeypatch.delitem(sys.modules, "hpc_rl.transport.rma", raising=False)
    with pytest.raises(ImportError, match=r"_ring, the experience ring's C module, which was not built: no MPI "
                                          r"compiler wrapper .* pip install '\.\[mpi\]'"):
        importlib.import_module("hpc_rl.transport.rma")


def test_configs_reject_bad_values_naming_the_field():
    with pytest.raises(ValueError, match="backend"):
        TransportConfig(backend="shm")
    with pytest.raises(ValueError, match="timeout_s"):
        TransportConfig(timeout_s=0)
    with pytest.raises(ValueError, match="full_policy"):
        RingConfig(full_policy="drop_newest")
    with pytest.raises(ValueError, match="slots"):
        RingConfig(slots=0)
    with pytest.raises(ValueError, match="spin_s"):
        PollConfig(spin_s=1.0)
    with pytest.raises(ValueError, match="max_sleep_s"):
        PollConfig(max_sleep_s=1.0)
    with pytest.raises(ValueError, match="min_sleep_s"):
        PollConfig(min_sleep_s=0.01, max_sleep_s=0.001)


def test_waiter_times_out_naming_peer_and_channel():
    waiter = Waiter(PollConfig(), 0.2, "ring", 5, "a free slot")
    start = time.monotonic()
    with pytest.raises(TransportTimeout) as info:
        while True:
            waiter.step()
    waited = time.monotonic() - start
    assert 0.2 <= waited < 0.35
    assert info.value.peer == 5 and info.value.channel == "ring"
    assert "rank 5" in str(info.value) and "'ring'" in str(info.value) and "a free slot" in str(info.value)


def test_waiter_backs_off_so_a_long_wait_uses_little_cpu():
    poll = PollConfig(spin_s=2e-4, min_sleep_s=5e-5, max_sleep_s=1e-3)
    waiter = Waiter(poll, 1.0, "step", 1, "a reply")
    wall, cpu, steps = time.monotonic(), time.process_time(), 0
    with pytest.raises(TransportTimeout):
        while True:
            waiter.step()
            steps += 1
    wall, cpu = time.monotonic() - wall, time.process_time() - cpu
    assert cpu < 0.2 * wall
    # once backed off, at most one poll per max_sleep_s (sleeps last at least as long as asked)
    spin_steps = steps - (wall - poll.spin_s) / poll.max_sleep_s
    assert steps <= 2000 + wall / poll.max_sleep_s and spin_steps < 10_000


def test_waiter_spins_before_sleeping_then_doubles_its_sleeps(monkeypatch):
    """Within spin_s a step only yields; later steps sleep min_sleep_s, doubling up to max_sleep_s. The sleeps are
    recorded, not slept, so the sequence does not depend on the machine's load."""
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    waiter = Waiter(PollConfig(spin_s=0.01, min_sleep_s=1e-4, max_sleep_s=1e-3), 10.0, "step", 1, "x")
    start = time.monotonic()
    while time.monotonic() - start < 0.005:
        waiter.step()
    assert slept == []
    while time.monotonic() - start < 0.011:  # past the spin phase
        pass
    for _ in range(6):
        waiter.step()
    assert slept == pytest.approx([1e-4, 2e-4, 4e-4, 8e-4, 1e-3, 1e-3])


def test_cost_model_solves_the_two_measured_batches():
    from hpc_rl.bench.transport import cost_model

    # cost(k) = 16 / k + 3 µs per segment: cost(1) = 19, cost(16) = 4
    assert cost_model(19.0, 4.0, 16, 3.6) == {"fixed_us": 16.0, "per_segment_us": 3.0, "raw_put_us": 3.6}
    assert cost_model(10.0, 10.0, 4, 3.6) == {"fixed_us": 0.0, "per_segment_us": 10.0, "raw_put_us": 3.6}
    with pytest.raises(ValueError, match="at least 2"):
        cost_model(19.0, 4.0, 1, 3.6)
