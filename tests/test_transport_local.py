"""The local backend's own guarantees: ranks of one process, created collectively without waiting, stepped by one
thread without hanging, and no MPI. The guarantees every backend shares are in test_transport_channels.py."""

import subprocess
import sys
import time

import numpy as np
import pytest

from hpc_rl.transport import (LocalWorld, RingConfig, Transport, TransportConfig, TransportError, TransportTimeout)


def transports(size: int, **config) -> list[Transport]:
    """One Transport per rank of a new LocalWorld of ``size`` ranks."""
    world = LocalWorld(size)
    return [Transport(world.comm(rank), TransportConfig(backend="local", **config)) for rank in range(size)]


def test_local_channels_never_import_mpi4py():
    # In a fresh interpreter: this test process may have imported mpi4py for other tests.
    program = """
import sys
import numpy as np
from hpc_rl.transport import LocalWorld, RingConfig, Transport, TransportConfig
world = LocalWorld(3)
ts = [Transport(world.comm(r), TransportConfig(backend="local")) for r in range(3)]
steps = [t.step_exchange({1: 0}, 8, 8) for t in ts]
rings = [t.experience_ring(2, RingConfig(slots=2, slot_bytes=8)) for t in ts]
params = [t.parameter_channel(2, 8) for t in ts]
steps[1].send_request(np.ones(8, np.uint8))
steps[0].send_reply(1, steps[0].wait_requests([1])[1] + 1)
assert steps[1].wait_reply().tolist() == [2] * 8
assert rings[0].put(np.ones(8, np.uint8)) == 1
params[2].publish(np.arange(8, dtype=np.uint8))
assert params[0].wait_version(1)[0] == 1
for rank in (0, 1, 2):
    steps[rank].close(), params[rank].close()
rings[0].close(), rings[1].close()
assert [seg.seq for seg in rings[2].close()] == [1]
print(ts[0].meta(), sorted(m for m in sys.modules if m.startswith("mpi4py") or m == "hpc_rl.transport.probe"))
"""
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "{'backend': 'local', 'probe': None} []"


def test_transport_refuses_a_communicator_of_the_other_kind():
    world = LocalWorld(2)
    with pytest.raises(ValueError, match="backend 'auto' on a communicator of type LocalComm"):
        Transport(world.comm(0), TransportConfig())
    with pytest.raises(ValueError, match="backend 'local' on a communicator of type object"):
        Transport(object(), TransportConfig(backend="local"))
    with pytest.raises(ValueError, match="rank 2 outside the LocalWorld of size 2"):
        world.comm(2)
    with pytest.raises(ValueError, match="at least 1 rank"):
        LocalWorld(0)


def test_mismatched_collective_creation_is_refused_on_every_rank():
    t = transports(3)
    block, drop = RingConfig(slots=4, slot_bytes=64), RingConfig(slots=4, slot_bytes=64, full_policy="drop_oldest")
    ring0 = t[0].experience_ring(0, block)  # the first to create it cannot know yet
    with pytest.raises(ValueError) as mismatch:
        t[1].experience_ring(0, drop)
    message = str(mismatch.value)
    assert "channel 0" in message and "rank 1" in message and "rank 0" in message
    assert "drop_oldest" in message and "'block'" in message
    with pytest.raises(ValueError, match="drop_oldest") as late:  # a later rank asking like the first is refused too
        t[2].experience_ring(0, block)
    assert str(late.value) == message
    with pytest.raises(ValueError, match="drop_oldest"):  # and so is the first rank's next use of it
        ring0.ready_slots()
    # Creation order stays matched after a refusal: every rank's next channel is channel 1.
    params = t[0].parameter_channel(0, 16)
    for rank in (1, 2):
        with pytest.raises(ValueError, match=rf"channel 1 .* as 'step' .* on rank {rank} and as 'params' .* on rank 0"):
            t[rank].step_exchange({1: 0}, 8, 8)
    with pytest.raises(ValueError, match="on rank 1 and as 'params'"):
        params.publish(np.zeros(16, np.uint8))
    steps = [t[r].step_exchange({1: 0}, 8, 8) for r in range(3)]  # channel 2, alike on every rank
    steps[1].send_request(np.ones(8, np.uint8))
    assert steps[0].poll_requests()[1].tolist() == [1] * 8


@pytest.mark.parametrize("wait", ["ring_put", "ring_close", "step_reply", "step_requests", "params"])
def test_a_wait_no_other_rank_can_end_times_out_on_one_thread_and_the_channel_goes_on(wait):
    # One thread steps every rank: a wait for a rank that cannot run meanwhile raises TransportTimeout at its
    # deadline, naming that rank, and leaves the channel usable once the thread has stepped the other rank.
    t = transports(2, timeout_s=0.3)
    if wait.startswith("ring"):
        rings = [x.experience_ring(1, RingConfig(slots=2, slot_bytes=64)) for x in t]
        writer, owner = rings
        assert [writer.put(np.full(64, i, np.uint8)) for i in range(2)] == [1, 2]
        call, peer = (lambda: writer.put(np.full(64, 2, np.uint8))), 1
        if wait == "ring_close":
            call, peer = owner.close, 0
    elif wait.startswith("step"):
        steps = [x.step_exchange({0: 1}, 8, 8) for x in t]
        steps[0].send_request(np.ones(8, np.uint8))
        call, peer = (steps[0].wait_reply, 1) if wait == "step_reply" else (lambda: steps[1].wait_requests([0]), 0)
        if wait == "step_requests":
            steps[1].send_reply(0, steps[1].wait_requests([0])[0])  # step 1 answered: rank 0 sends no step 2
            steps[0].wait_reply()
    else:
        params = [x.parameter_channel(0, 8) for x in t]
        call, peer = (lambda: params[1].wait_version(1)), 0
    start = time.monotonic()
    with pytest.raises(TransportTimeout) as timeout:
        call()
    waited = time.monotonic() - start
    assert 0.3 <= waited < 0.6, "the error did not come at the deadline"
    assert timeout.value.peer == peer and f"rank {peer}" in str(timeout.value)
    assert timeout.value.channel == wait.split("_")[0]
    if wait == "ring_put":  # the timed-out put claimed nothing: the ring drains, and the put succeeds when repeated
        assert [seg.seq for seg in owner.poll()] == [1, 2]
        assert writer.put(np.full(64, 2, np.uint8)) == 3
        writer.close()
        assert [(seg.seq, seg.payload[0]) for seg in owner.close()] == [(3, 2)]
        assert writer.blocked_puts == 1 and owner.dropped_total() == 0
    elif wait == "ring_close":  # the owner's close drained the ring while it waited, and keeps what it drained
        assert owner.ready_slots() == 0
        writer.close()
        assert [seg.seq for seg in owner.close()] == [1, 2]
        with pytest.raises(ValueError, match="'ring': closed on rank 1"):
            owner.take_view()
    elif wait == "step_reply":
        steps[1].send_reply(0, steps[1].wait_requests([0])[0] * 7)
        assert steps[0].wait_reply().tolist() == [7] * 8
    elif wait == "step_requests":
        steps[0].send_request(np.full(8, 2, np.uint8))
        assert steps[1].wait_requests([0])[0].tolist() == [2] * 8
    else:
        params[0].publish(np.arange(8, dtype=np.uint8))
        version, payload = params[1].wait_version(1)
        assert version == 1 and payload.tolist() == list(range(8))


def test_roles_stepped_round_robin_by_one_thread():
    # env ranks 1 and 2 -> inference rank 0 -> learner rank 3's ring; the learner publishes parameters that
    # inference reads. Nothing waits: every rank only polls, one after the other, and every message arrives.
    t = transports(4, timeout_s=1.0)
    steps = [x.step_exchange({1: 0, 2: 0}, 8, 8) for x in t]
    rings = [x.experience_ring(3, RingConfig(slots=4, slot_bytes=16)) for x in t]
    params = [x.parameter_channel(3, 8) for x in t]
    replies, segments, versions = {1: [], 2: []}, [], []
    for step in range(1, 21):
        for env in (1, 2):
            steps[env].send_request(np.full(8, step * 10 + env, np.uint8))
        for env, request in steps[0].poll_requests().items():
            steps[0].send_reply(env, request + 1)
            rings[0].put(np.concatenate([request, request]))
        for env in (1, 2):
            replies[env].append(int(steps[env].wait_reply()[0]))  # already there: returns without waiting
        segments += [int(seg.payload[0]) for seg in rings[3].poll()]
        params[3].publish(np.full(8, step, np.uint8))
        got = params[0].poll()
        versions.append(got[0])
    assert replies == {env: [step * 10 + env + 1 for step in range(1, 21)] for env in (1, 2)}
    assert segments == [step * 10 + env for step in range(1, 21) for env in (1, 2)]
    assert versions == list(range(1, 21))
    for rank in (0, 1, 2):
        rings[rank].close()
    assert rings[3].close() == []


def test_drop_oldest_on_one_thread_displaces_the_oldest_and_counts_it():
    t = transports(2)
    writer, owner = (x.experience_ring(1, RingConfig(slots=4, slot_bytes=8, full_policy="drop_oldest")) for x in t)
    assert [writer.put(np.full(8, i, np.uint8)) for i in range(1, 7)] == [1, 2, 3, 4, 5, 6]
    assert writer.drops == [(0, 1), (0, 2)] and owner.dropped_total() == 2 and writer.blocked_puts == 0
    views = owner.take_view()
    assert [(seg.writer, seg.seq, int(seg.payload[0])) for seg in views] == [(0, 3, 3), (0, 4, 4), (0, 5, 5), (0, 6, 6)]
    # Held views cannot be displaced: with every slot lent out, a put waits for the owner.
    with pytest.raises(TransportTimeout, match="a free slot"):
        writer.put(np.full(8, 7, np.uint8), timeout_s=0.05)
    owner.release(views[:1])
    assert writer.put(np.full(8, 7, np.uint8)) == 7 and writer.drops == [(0, 1), (0, 2)]
    owner.release(views[1:])
    assert [seg.seq for seg in owner.poll()] == [7]


def test_payloads_are_copied_in_and_views_are_read_only():
    t = transports(3)
    writer, _, owner = (x.experience_ring(2, RingConfig(slots=2, slot_bytes=8)) for x in t)
    buf = np.arange(8, dtype=np.uint8)
    writer.put(buf)
    buf[:] = 99  # the caller reuses its buffer at once
    (view,) = owner.take_view()
    assert view.payload.tolist() == list(range(8)) and view.slot is not None
    with pytest.raises(ValueError, match="read-only"):
        view.payload[0] = 1
    owner.release([view])
    with pytest.raises(ValueError, match="not a view held"):
        owner.release([view])
    params = [x.parameter_channel(0, 8) for x in t]
    vector = np.arange(8, dtype=np.uint8)
    params[0].publish(vector)
    vector[:] = 0
    (_, first), (_, second) = params[1].poll(), params[2].poll()
    first[:] = 5  # each reader's copy is its own
    assert second.tolist() == list(range(8))
    steps = [x.step_exchange({1: 0}, 8, 8) for x in t]
    request = np.ones(8, np.uint8)
    steps[1].send_request(request)
    request[:] = 3
    assert steps[0].poll_requests()[1].tolist() == [1] * 8


def test_ring_checksum_check_is_live():
    # A slot's byte changed behind the protocol (no writer can: this reaches into the ring's memory) is caught,
    # and the slots that take_view() took go back: the ring goes on.
    t = transports(2)
    writer, owner = (x.experience_ring(1, RingConfig(slots=2, slot_bytes=64)) for x in t)
    writer.put(np.arange(64, dtype=np.uint8))
    writer.put(np.arange(64, dtype=np.uint8))
    owner.state.memory[:, 10] ^= 1
    with pytest.raises(TransportError, match="segment 1 from rank 0 .* fails its checksum"):
        owner.take_view()
    assert owner.ready_slots() == 0
    assert [writer.put(np.full(64, i, np.uint8)) for i in range(2)] == [3, 4]  # both slots are free again
    assert [seg.seq for seg in owner.poll()] == [3, 4]


def test_misuse_raises_naming_what_is_wrong():
    t = transports(2)
    steps = [x.step_exchange({1: 0}, 8, 8) for x in t]
    with pytest.raises(ValueError, match="request of 9 bytes exceeds the channel's 8-byte slot"):
        steps[1].send_request(np.zeros(9, np.uint8))
    with pytest.raises(ValueError, match="rank 1 has no request outstanding"):
        steps[1].wait_reply()
    with pytest.raises(ValueError, match="rank 0 is not an env rank"):
        steps[0].send_request(np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="no unanswered request from env rank 1"):
        steps[0].send_reply(1, np.zeros(8, np.uint8))
    steps[1].send_request(np.zeros(8, np.uint8))
    steps[1].send_request(np.zeros(8, np.uint8))  # step 2 overwrites step 1 before inference read it
    with pytest.raises(TransportError, match="step request 2 from rank 1 after 0: a step was lost"):
        steps[0].poll_requests()
    steps = [x.step_exchange({1: 0}, 8, 8) for x in t]
    steps[1].send_request(np.zeros(8, np.uint8))
    assert list(steps[0].poll_requests()) == [1]
    steps[1].send_request(np.zeros(8, np.uint8))  # step 2 before step 1 was answered
    with pytest.raises(TransportError, match="rank 1 sent step 2 before step 1 was answered"):
        steps[0].poll_requests()
    params = [x.parameter_channel(0, 8) for x in t]
    with pytest.raises(ValueError, match="exceeds max_bytes=8"):
        params[0].publish(np.zeros(9, np.uint8))
    with pytest.raises(ValueError, match="only the publisher"):
        params[1].publish(np.zeros(8, np.uint8))
    with pytest.raises(ValueError, match="it does not read it"):
        params[0].poll()
    params[1].close()
    with pytest.raises(ValueError, match="'params': closed on rank 1"):
        params[1].poll()
