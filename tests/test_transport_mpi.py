"""What only MPI ranks can show, for both MPI backends: a SIGSTOPped peer, the start-up probe, a payload changed by a
bare Put behind the protocol, a ring built differently on one rank (refused by the collective check), the ring's
races (per-writer order, a put that timed out, a stress test of everything at once), and the benchmark. The
channels' guarantees, shared with the local backend, are in test_transport_channels.py."""

import json

import pytest

pytestmark = pytest.mark.mpi

BACKENDS = ["rma", "twosided"]


def _report(out) -> dict:
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no JSON report in output:\n{out.stdout}\n{out.stderr}"
    return json.loads(lines[-1])


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


@pytest.mark.parametrize("backend, seconds", [("rma", "12"), ("twosided", "3")])
def test_ring_takes_each_writers_segments_in_the_order_it_put_them(mpi, backend, seconds):
    # 3 writers put batches of 64 8-byte segments into 64 slots while the owner polls flat out. One Accumulate
    # makes a batch's READY words visible a part at a time (its tail first, here), so an owner taking whatever it
    # found READY took a writer's later segments before earlier ones: RMA in 19 of 20 runs of 12 s (0-131 times a
    # run), two-sided (receive-buffer order) hundreds of times in every 5 s run.
    r = _report(mpi(4, ["tests/mpi_programs/ring_order.py", backend, seconds, "64", "64"], timeout=90))
    assert r["backend"] == backend
    assert r["segments"] > 0 and r["exactly_once"] and r["payloads_match"]
    assert r["out_of_order"] == 0, "a writer's segment was taken before one it put earlier"


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_put_that_timed_out_leaves_the_ring_working(mpi, backend):
    # RMA: the put that times out on a full ring holds a ticket; the writer's next put voids it once its slot
    # comes free, so later tickets of that slot do not wait forever (before, the next put after the owner came back
    # timed out waiting for slot 0, ticket 4).
    r = _report(mpi(2, ["tests/mpi_programs/ring_abandoned.py", backend], timeout=90))
    assert r["timeouts"] == 2, "the stalled owner did not make the writer's puts time out"
    assert r["last_seq"] == r["stalled_seq"] + 6
    assert r["taken_in_order_once"] and r["payloads_match"]


@pytest.mark.parametrize("policy", ["block", "drop_oldest"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_under_stress_loses_duplicates_tears_and_reorders_nothing(mpi, backend, policy):
    # 4 writers, 3 slots of 256 bytes, for 5 s: single puts and batches of up to 7 (more than the ring), sizes
    # around the 64-byte boundaries up to slot_bytes, refused oversize puts, puts timing out after 0.25 s and
    # retried; the owner flat out, slow, then stalled with its views held, in turn. Each payload carries writer,
    # seq, length and a CRC-32 of its own, checked by the owner apart from the ring's checksum.
    r = _report(mpi(5, ["tests/mpi_programs/ring_stress.py", backend, policy, "5"], timeout=120))
    assert r["backend"] == backend
    assert r["cycles"] >= 1, "the owner never went through a stall"
    assert min(r["oversize_tried"]) > 0 and r["refused"] == r["oversize_tried"], "an oversize put was not refused"
    assert r["bad"] == 0, "a payload differs from what its writer put (torn, or under another header)"
    assert r["taken"] == r["distinct_taken"] and r["taken_not_produced"] == 0, "a segment was taken twice"
    assert r["lost"] == 0, "a segment was neither taken nor dropped"
    assert r["out_of_order"] == 0
    assert r["dropped_and_taken"] == 0 and r["drops_not_produced"] == 0
    assert r["distinct_drops"] == r["drops_listed"] == r["dropped_total"], "drops not counted exactly"
    if policy == "block":
        assert r["drops_listed"] == 0 and r["taken"] == r["produced"]
        assert sum(r["timeouts"]) > 0, "the stalled owner never made a put time out"
    else:
        assert r["drops_listed"] > 0, "the stalled owner forced no drops"


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


@pytest.mark.parametrize("channel", ["ring", "params", "step"])
def test_rma_reader_catches_a_payload_changed_behind_the_protocol(mpi, channel):
    # Proves the checksum check is live: without it the no-torn-read tests could pass without looking.
    r = _report(mpi(2, ["tests/mpi_programs/transport_corrupt.py", channel], timeout=60))
    assert r["raised"]
    assert "rank 1" in r["message"] and ("torn" in r["message"] or "checksum" in r["message"])
    if channel == "step":  # and a reply whose seq answers no request is refused, not taken for the reply
        assert r["reply_message"] is not None and "step reply 5 from rank 0 answers no request" in r["reply_message"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ring_built_differently_on_one_rank_is_refused_on_every_rank(mpi, backend):
    # The RMA owner frees slots by the policy the writers follow, so a mixed ring must never start.
    r = _report(mpi(3, ["tests/mpi_programs/transport_ring_mismatch.py", backend], timeout=60))
    assert r["backend"] == backend
    assert len(r["errors"]) == 3 and all(e is not None for e in r["errors"])
    assert all("rank 1" in e and "drop_oldest" in e and "block" in e for e in r["errors"])


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
