"""The channels' guarantees, tested alike on every backend: the same scenarios (``mpi_programs/channel_scenarios.py``)
run on real Open MPI ranks for rma and twosided, and on threads of this process over a LocalWorld for local."""

import json

import pytest

from mpi_programs.channel_scenarios import run_on_threads


def mpi_param(*values):
    return pytest.param(*values, marks=pytest.mark.mpi)


BACKENDS = [mpi_param("rma"), mpi_param("twosided"), "local"]
CONSUMERS = ["poll", "view"]  # the owner copies with poll(), or reads in place with take_view() / release()


@pytest.fixture(scope="session")
def channels(mpi):
    """``channels(num_ranks, scenario, argv, timeout)``: the scenario's report, from an mpirun job of
    ``transport_channels.py`` (rma, twosided) or from ``num_ranks`` threads (local; ``argv[0]`` is the backend).
    Either way the report has been through JSON."""

    def run(num_ranks: int, scenario: str, argv: list[str], timeout: float) -> dict:
        if argv[0] == "local":
            return json.loads(json.dumps(run_on_threads(num_ranks, scenario, argv, timeout)))
        out = mpi(num_ranks, ["tests/mpi_programs/transport_channels.py", scenario, *argv], timeout=timeout)
        lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
        assert lines, f"no JSON report in output:\n{out.stdout}\n{out.stderr}"
        return json.loads(lines[-1])

    return run


def _ring(backend, slots, per_writer, policy, delay, max_bytes, consumer):
    return [backend, slots, per_writer, policy, delay, max_bytes] + (["view"] if consumer == "view" else [])


def _check_views(r, consumer, slots=4):
    assert 0 <= r["max_ready"] <= slots
    if consumer == "view":
        assert r["release_twice_refused"] is True, "releasing a view twice was not refused"


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_exactly_once_with_small_ring_and_slow_consumer(channels, backend, consumer):
    # 3 writers x 100 segments through 4 slots; the owner sleeps 5 ms between polls (with take_view: while it
    # holds the views), so writers block often.
    r = channels(4, "ring", _ring(backend, "4", "100", "block", "0.005", "16384", consumer), timeout=90)
    assert r["backend"] == backend
    assert r["produced"] == 300
    assert r["consumed"] == 300 and r["distinct_consumed"] == 300, "a segment was lost or delivered twice"
    assert r["consumed_equals_produced"]
    assert r["bad_payloads"] == 0
    assert r["dropped_total"] == 0 and r["drops_listed"] == 0
    assert r["blocked_puts"] > 0, "the producers never found the ring full: the test did not stress it"
    assert r["max_ready"] > 0
    _check_views(r, consumer)


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_no_torn_reads_six_writers_four_slots(channels, backend, consumer):
    # drop_oldest with an owner polling flat out: writers steal READY slots while the owner may be copying them
    # (take_view: while it compares the views in place, byte for byte).
    r = channels(7, "ring", _ring(backend, "4", "120", "drop_oldest", "0", "65536", consumer), timeout=120)
    assert r["produced"] == 720
    assert r["bad_payloads"] == 0, "a consumed payload differs from what its writer wrote"
    assert r["consumed"] == r["distinct_consumed"]
    assert r["consumed_or_dropped_equals_produced"] and r["dropped_and_consumed"] == 0
    assert r["consumed"] > 0
    _check_views(r, consumer)


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_drop_oldest_counts_exactly_what_it_dropped(channels, backend, consumer):
    r = channels(4, "ring", _ring(backend, "4", "100", "drop_oldest", "0.01", "16384", consumer), timeout=90)
    assert r["produced"] == 300
    assert r["drops_listed"] > 0, "the slow consumer should have forced drops"
    assert r["distinct_drops"] == r["drops_listed"], "one segment counted as dropped twice"
    assert r["dropped_total"] == r["drops_listed"], "the owner's count differs from the writers' drop lists"
    assert r["dropped_and_consumed"] == 0, "a segment was both consumed and counted as dropped"
    assert r["consumed"] + r["drops_listed"] == r["produced"]
    assert r["consumed_or_dropped_equals_produced"]
    assert r["bad_payloads"] == 0
    _check_views(r, consumer)


@pytest.mark.parametrize("policy", ["block", "drop_oldest"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_batched_puts_keep_every_guarantee(channels, backend, policy):
    # 3 writers x 100 segments through 4 slots with put_many, in batches of 1..6 (larger than the ring: split);
    # the owner reads in place and is slow enough that the writers block (block) or steal (drop_oldest).
    r = channels(4, "ring", _ring(backend, "4", "100", policy, "0.005", "16384", "view") + ["batch"], timeout=90)
    assert r["produced"] == 300
    assert r["bad_payloads"] == 0
    assert r["consumed"] == r["distinct_consumed"]
    assert r["consumed_or_dropped_equals_produced"] and r["dropped_and_consumed"] == 0
    assert r["dropped_total"] == r["drops_listed"] == r["distinct_drops"]
    if policy == "block":
        assert r["consumed_equals_produced"] and r["drops_listed"] == 0
        assert r["blocked_puts"] > 0, "the producers never found the ring full: the test did not stress it"
    else:
        assert r["drops_listed"] > 0, "the slow consumer should have forced drops"
    assert r["in_order"], "a writer's segments were consumed out of order"
    _check_views(r, "view")


@pytest.mark.parametrize("backend,policy", [mpi_param("rma", "block"), mpi_param("rma", "drop_oldest"),
                                            mpi_param("twosided", "block"), ("local", "block"),
                                            ("local", "drop_oldest")])
def test_ring_ready_slots_counts_what_waits_and_takes_nothing(channels, backend, policy):
    r = channels(3, "occupancy", [backend, policy], timeout=60)
    assert r["backend"] == backend
    assert r["seen"] == {"empty": 0, "two_put": 2, "two_put_again": 2, "taken": 2, "while_held": 0, "released": 0,
                         "full": 4, "drained": 4, "after_drain": 0}
    assert r["left_at_close"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_parameter_channel_readers_never_see_a_mix(channels, backend):
    # 256 KiB vectors published back to back for 2 s; 3 readers poll flat out.
    r = channels(4, "params", [backend, "2", "32768"], timeout=90)
    assert r["published"] > 50
    for reader in r["readers"]:
        assert reader["received"] > 5
        assert reader["mixed"] == 0, f"rank {reader['rank']} got a vector mixing versions"
        assert reader["wrong_version"] == 0
        assert reader["backwards"] == 0, "a reader went back to an older version"
        assert reader["last"] == r["published"], "a reader never got the final version"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fp16", ["0", "1"])
def test_step_exchange_round_trips(channels, backend, fp16):
    r = channels(3, "step", [backend, "100", fp16], timeout=90)
    assert r["served"] == 200
    assert r["bad_requests"] == 0 and r["bad_replies"] == 0
    if fp16 == "1":
        assert 0 < r["max_obs_error"] < 5e-3  # float16 rounding of N(0, 1) values, and nothing worse
        assert r["request_bytes"] == 144
    else:
        assert r["max_obs_error"] == 0.0
        assert r["request_bytes"] == 224


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_idle_waiting_ranks_use_little_cpu(channels, backend):
    r = channels(3, "idle", [backend, "5"], timeout=90)
    cpu = "thread_cpu_s" if backend == "local" else "cpu_s"  # local ranks are threads of one process
    for rank in r["ranks"][:2]:  # rank 0 waits for a request, rank 1 for its reply; rank 2 sleeps outside MPI
        assert rank["wall_s"] > 4.9
        assert rank[cpu] < 0.2 * rank["wall_s"], f"rank {rank['rank']} used {rank[cpu]:.2f} s of CPU"


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_refuses_bad_puts_before_they_take_a_slot(channels, backend):
    # Bad segments (oversized, strided, a batch with one oversized) raise ValueError and put nothing: the ring goes
    # on with seqs 1, 2, ... and every good segment arrives. The compiled RMA writer refuses bad batches itself.
    r = channels(2, "ring_misuse", [backend], timeout=60)
    writer, owner = r["writer"], r["owner"]
    assert r["backend"] == backend
    for key in ("oversized", "oversized_in_batch") + (("c_oversized",) if backend == "rma" else ()):
        assert "exceeds slot_bytes=4096" in writer[key], key
    assert "C-contiguous" in writer["strided"]
    assert "rank 1 owns this ring" in owner["owner_put"]
    if backend == "rma":
        assert "1 to 4 payloads" in writer["c_too_many"] and "1 to 4 payloads" in writer["c_checksums_mismatch"]
        assert writer["put_after_close"] == "ValueError: transport ring: the ring is closed"
    elif backend == "local":
        assert writer["put_after_close"] == "ValueError: transport channel 'ring': closed on rank 0"
    else:
        assert writer["put_after_close"] is not None  # an MPI error on the freed communicator, not a hang
    assert writer["seqs"] == [1, 2, 3, 4, 5, 6]
    assert owner["received_in_order"] and owner["payloads_match"]
    assert writer["left_at_close"] == owner["left_at_close"] == 0
