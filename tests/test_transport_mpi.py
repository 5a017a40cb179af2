"""The transport's channels with real Open MPI ranks, adversarially, for both backends."""

import json

import pytest

pytestmark = pytest.mark.mpi

BACKENDS = ["rma", "twosided"]
CONSUMERS = ["poll", "view"]  # the owner copies with poll(), or reads in place with take_view() / release()


def _report(out) -> dict:
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON report in output:\n{out.stdout}\n{out.stderr}"
    return json.loads(lines[-1])


def _ring(backend, slots, per_writer, policy, delay, max_bytes, consumer):
    return ["tests/mpi_programs/transport_ring.py", backend, slots, per_writer, policy, delay, max_bytes] + (
        ["view"] if consumer == "view" else [])


def _check_views(r, consumer, slots=4):
    assert 0 <= r["max_ready"] <= slots
    if consumer == "view":
        assert r["release_twice_refused"] is True, "releasing a view twice was not refused"


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_exactly_once_with_small_ring_and_slow_consumer(mpi, backend, consumer):
    # 3 writers x 100 segments through 4 slots; the owner sleeps 5 ms between polls (with take_view: while it
    # holds the views), so writers block often.
    r = _report(mpi(4, _ring(backend, "4", "100", "block", "0.005", "16384", consumer), timeout=90))
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
def test_ring_no_torn_reads_six_writers_four_slots(mpi, backend, consumer):
    # drop_oldest with an owner polling flat out: writers steal READY slots while the owner may be copying them
    # (take_view: while it compares the views in place, byte for byte).
    r = _report(mpi(7, _ring(backend, "4", "120", "drop_oldest", "0", "65536", consumer), timeout=120))
    assert r["produced"] == 720
    assert r["bad_payloads"] == 0, "a consumed payload differs from what its writer wrote"
    assert r["consumed"] == r["distinct_consumed"]
    assert r["consumed_or_dropped_equals_produced"] and r["dropped_and_consumed"] == 0
    assert r["consumed"] > 0
    _check_views(r, consumer)


@pytest.mark.parametrize("consumer", CONSUMERS)
@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_drop_oldest_counts_exactly_what_it_dropped(mpi, backend, consumer):
    r = _report(mpi(4, _ring(backend, "4", "100", "drop_oldest", "0.01", "16384", consumer), timeout=90))
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
def test_ring_batched_puts_keep_every_guarantee(mpi, backend, policy):
    # 3 writers x 100 segments through 4 slots with put_many, in batches of 1..6 (larger than the ring: split);
    # the owner reads in place and is slow enough that the writers block (block) or steal (drop_oldest).
    r = _report(mpi(4, _ring(backend, "4", "100", policy, "0.005", "16384", "view") + ["batch"], timeout=90))
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
    if backend == "rma":  # one ticket counter orders every put, batched or not
        assert r["in_order"], "a writer's segments were consumed out of order"
    _check_views(r, "view")


@pytest.mark.parametrize("backend,policy", [("rma", "block"), ("rma", "drop_oldest"), ("twosided", "block")])
def test_ring_ready_slots_counts_what_waits_and_takes_nothing(mpi, backend, policy):
    r = _report(mpi(3, ["tests/mpi_programs/transport_occupancy.py", backend, policy], timeout=60))
    assert r["backend"] == backend
    assert r["seen"] == {"empty": 0, "two_put": 2, "two_put_again": 2, "taken": 2, "while_held": 0, "released": 0,
                         "full": 4, "drained": 4, "after_drain": 0}
    assert r["left_at_close"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_parameter_channel_readers_never_see_a_mix(mpi, backend):
    # 256 KiB vectors published back to back for 2 s; 3 readers poll flat out.
    r = _report(mpi(4, ["tests/mpi_programs/transport_params.py", backend, "2", "32768"], timeout=90))
    assert r["published"] > 50
    for reader in r["readers"]:
        assert reader["received"] > 5
        assert reader["mixed"] == 0, f"rank {reader['rank']} got a vector mixing versions"
        assert reader["wrong_version"] == 0
        assert reader["backwards"] == 0, "a reader went back to an older version"
        assert reader["last"] == r["published"], "a reader never got the final version"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fp16", ["0", "1"])
def test_step_exchange_round_trips(mpi, backend, fp16):
    r = _report(mpi(3, ["tests/mpi_programs/transport_step.py", backend, "100", fp16], timeout=90))
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
def test_idle_waiting_ranks_use_little_cpu(mpi, backend):
    r = _report(mpi(3, ["tests/mpi_programs/transport_idle.py", backend, "5"], timeout=90))
    for rank in r["ranks"][:2]:  # rank 0 waits for a request, rank 1 for its reply; rank 2 sleeps outside MPI
        assert rank["wall_s"] > 4.9
        assert rank["cpu_s"] < 0.2 * rank["wall_s"], f"rank {rank['rank']} used {rank['cpu_s']:.2f} s of CPU"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("channel", ["ring", "step", "params"])
def test_stopped_peer_raises_timeout_naming_it(mpi, backend, channel):
    r = _report(mpi(2, ["tests/mpi_programs/transport_sigstop.py", backend, channel, "1.0"], timeout=60))
    assert r["raised"], "waiting on a SIGSTOPped peer did not raise"
    assert r["peer"] == 1 and r["error_channel"] == channel
    assert "rank 1" in r["message"] and repr(channel) in r["message"]
    assert 1.0 <= r["waited_s"] < 1.5, "the error did not come at the deadline"
    if channel == "ring":
        assert r["puts_before_error"] == (4 if backend == "rma" else 1)  # RMA fills 4 slots without the owner
        assert r["owner_drained"] == r["puts_before_error"]
    elif channel == "step":
        assert r["reply_after_resume"] == 1
    else:
        assert r["version_after_resume"] == 2


def test_probe_chooses_rma_on_this_host(mpi):
    r = _report(mpi(3, ["tests/mpi_programs/transport_probe.py", "auto"], timeout=60))
    assert r["agree"]
    assert r["backend"] == "rma"
    assert r["probe"]["window_ok"] and r["probe"]["passive_progress_ok"]
    assert r["probe"]["progress_s"] < 0.15  # well within the 0.3 s the target stayed out of MPI


def test_probe_falls_back_when_no_window_can_be_created(mpi):
    # osc/pt2pt refuses MPI_THREAD_MULTIPLE (mpi4py's default), so window creation fails on every rank, as it does
    # across hosts with Debian's Open MPI.
    r = _report(mpi(3, ["tests/mpi_programs/transport_probe.py", "auto"], timeout=60, env={"OMPI_MCA_osc": "pt2pt"}))
    assert r["agree"]
    assert r["backend"] == "twosided"
    assert r["probe"]["window_ok"] is False
    assert "window creation failed" in r["probe"]["reason"]


def test_probe_falls_back_when_rma_needs_the_target(mpi):
    # osc/pt2pt at a serialized thread level creates windows, but its RMA completes only when the target enters MPI.
    r = _report(mpi(3, ["tests/mpi_programs/transport_probe.py", "auto"], timeout=60,
                    env={"OMPI_MCA_osc": "pt2pt", "MPI4PY_RC_THREAD_LEVEL": "serialized"}))
    assert r["backend"] == "twosided"
    assert r["probe"]["window_ok"] is True and r["probe"]["passive_progress_ok"] is False
    assert r["probe"]["progress_s"] >= 0.15


def test_probe_honours_forced_twosided(mpi):
    r = _report(mpi(2, ["tests/mpi_programs/transport_probe.py", "twosided"], timeout=60))
    assert r["backend"] == "twosided" and r["probe"]["window_ok"] is None


@pytest.mark.parametrize("channel", ["ring", "params"])
def test_rma_reader_catches_a_payload_changed_behind_the_protocol(mpi, channel):
    # Proves the checksum check is live: without it the no-torn-read tests could pass without looking.
    r = _report(mpi(2, ["tests/mpi_programs/transport_corrupt.py", channel], timeout=60))
    assert r["raised"]
    assert "rank 1" in r["message"] and ("torn" in r["message"] or "checksum" in r["message"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_built_differently_on_one_rank_is_refused_on_every_rank(mpi, backend):
    # The RMA owner frees slots by the policy the writers follow, so a mixed ring must never start.
    r = _report(mpi(3, ["tests/mpi_programs/transport_ring_mismatch.py", backend], timeout=60))
    assert r["backend"] == backend
    assert len(r["errors"]) == 3 and all(e is not None for e in r["errors"])
    assert all("rank 1" in e and "drop_oldest" in e and "block" in e for e in r["errors"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_refuses_bad_puts_before_they_take_a_slot(mpi, backend):
    # Bad segments (oversized, strided, a batch with one oversized) raise ValueError and put nothing: the ring goes
    # on with seqs 1, 2, ... and every good segment arrives. The compiled RMA writer refuses bad batches itself.
    out = mpi(2, ["tests/mpi_programs/transport_ring_misuse.py", backend], timeout=60)
    lines = [line for line in out.stdout.splitlines() if line.startswith("[")]
    assert lines, f"no JSON report in output:\n{out.stdout}\n{out.stderr}"
    writer, owner = json.loads(lines[-1])
    assert writer["backend"] == backend
    for key in ("oversized", "oversized_in_batch") + (("c_oversized",) if backend == "rma" else ()):
        assert "exceeds slot_bytes=4096" in writer[key], key
    assert "C-contiguous" in writer["strided"]
    assert "rank 1 owns this ring" in owner["owner_put"]
    if backend == "rma":
        assert "1 to 4 payloads" in writer["c_too_many"] and "1 to 4 payloads" in writer["c_checksums_mismatch"]
        assert writer["put_after_close"] == "ValueError: transport ring: the ring is closed"
    else:
        assert writer["put_after_close"] is not None  # an MPI error on the freed communicator, not a hang
    assert writer["seqs"] == [1, 2, 3, 4, 5, 6]
    assert owner["received_in_order"] and owner["payloads_match"]
    assert writer["left_at_close"] == owner["left_at_close"] == 0


def test_transport_bench_reports_every_figure_measured_alike():
    # A small run of `python -m hpc_rl.bench transport`: every figure present and measured (no timing asserted).
    from argparse import Namespace

    from hpc_rl.bench import transport as bench

    r = bench.run(Namespace(bytes_per_run=2 << 20, repeats=2, roundtrips=20, timeout=120))
    assert r["probe"]["backend"] == "rma"
    for size in ("64KiB", "1MiB"):
        figures = r[size]
        rings = ("rma", "rma_batch", "rma_copy", "rma_nochecksum", "rma_batch_nochecksum", "twosided")
        for name in ("raw_put", "raw_put_busy", "memcpy") + rings:
            assert figures[f"{name}_GBps"] > 0, (size, name)
        raw = max(figures["raw_put_GBps"], figures["raw_put_busy_GBps"])  # the better bare loop is the reference
        for name in rings:
            assert figures[f"{name}_over_raw_put"] == round(figures[f"{name}_GBps"] / raw, 3)
            assert len(figures[f"{name}_over_raw_put_runs"]) == 2
        cpu = figures["cpu_us_per_segment"]
        assert all(cpu["writer"][m] > 0 for m in ("raw_put", "raw_put_busy") + rings)
        assert all(cpu["owner"][m] > 0 for m in rings)
        model, nbytes = figures["cost_model"], 64 << 10 if size == "64KiB" else 1 << 20
        assert model["raw_put_us"] == pytest.approx(nbytes / raw / 1e3, rel=1e-3, abs=0.01)
        single_us = nbytes / figures["rma_nochecksum_GBps"] / 1e3
        assert model["fixed_us"] + model["per_segment_us"] == pytest.approx(single_us, rel=1e-3, abs=0.02)
    for backend in ("rma", "twosided"):
        assert 0 < r["roundtrip_us_8KiB"][backend]["median"] <= r["roundtrip_us_8KiB"][backend]["p90"]
    compiled = r["compiled"]  # setup installs mpicc (libopenmpi-dev), so the C version runs here
    for size in ("64KiB", "1MiB"):
        figures = compiled[size]
        for put in ("single", "batch"):
            assert figures[f"{put}_put_us"] > 0
            assert figures[f"{put}_over_raw_put"] == round(figures["raw_put_us"] / figures[f"{put}_put_us"], 3)
