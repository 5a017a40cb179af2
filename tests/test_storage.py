"""HDF5 checkpoints (atomic commit, digest verification, fuzzed damage, fallback, a full filesystem, retention) and
metrics.h5."""

import json
import logging
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import hpc_rl
from hpc_rl.storage import (CheckpointError, MetricsWriter, commit_checkpoint, load_checkpoint, load_latest,
                            open_run, prune_checkpoints, read_metrics, write_meta)
from hpc_rl.storage.checkpoint import (COMMIT_STAGES, HEADER_BYTES, CheckpointWriteError, checkpoint_name,
                                       _content_hash, committed_versions, digest_header, verify_digest)
from hpc_rl.storage.tree import write_tree
from fuzzing import run_fuzzer

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)

ROOT = Path(__file__).resolve().parent.parent


def _sections(version: int) -> dict:
    rng = np.random.default_rng(version)
    return {
        "params": {"lstm.weight": rng.normal(size=(16, 8)), "head.bias": rng.normal(size=4).astype(np.float32)},
        "optimizer": {"state": {0: {"step": 3, "exp_avg": rng.normal(size=(16, 8))}},
                      "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999), "params": [0, 1]}]},
        "rng": {"key": np.array(12345, dtype=np.uint64), "empty": np.zeros((0, 3)), "flags": np.array([True, False])},
        "misc": {"name": "ppo", "none": None, "ratio": 0.5},
    }


def _assert_tree_equal(a, b):
    assert type(a) is type(b) or (isinstance(a, np.ndarray) and isinstance(b, np.ndarray)), (a, b)
    if isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            _assert_tree_equal(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_tree_equal(x, y)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    else:
        assert a == b


def test_checkpoint_round_trip_keeps_every_leaf_type(tmp_path):
    path = commit_checkpoint(tmp_path, 7, _sections(7), "cfg-a")
    assert path.name == "v000007.h5"
    assert (tmp_path / "latest").read_text().strip() == "v000007.h5"
    ckpt = load_checkpoint(path)
    assert ckpt.version == 7
    _assert_tree_equal(ckpt.sections, _sections(7))
    with h5py.File(path) as f:
        assert f["params/lstm.weight"].fletcher32 and f["params/__tree__"].fletcher32


def test_a_checkpoint_records_the_settings_it_was_trained_with(tmp_path):
    settings = {"ppo": {"lam": 0.9, "lr": {"start": 1e-4, "kind": "constant"}}, "env": {"name": "gym:CartPole-v1"}}
    ckpt = load_checkpoint(commit_checkpoint(tmp_path, 1, _sections(1), "cfg-a", config=settings))
    assert (ckpt.config, ckpt.config_hash) == (settings, "cfg-a")
    assert load_checkpoint(commit_checkpoint(tmp_path, 2, _sections(2), "cfg-a")).config is None


def _flip_byte_in_dataset(path: Path, name: str) -> None:
    with h5py.File(path, "r") as f:
        offset = f[name].id.get_chunk_info(0).byte_offset
    with open(path, "r+b") as fh:
        fh.seek(offset + 5)
        byte = fh.read(1)
        fh.seek(offset + 5)
        fh.write(bytes([byte[0] ^ 0x10]))


def _zero_block(path: Path, offset: int, size: int) -> None:
    with open(path, "r+b") as fh:
        fh.seek(offset)
        fh.write(bytes(size))


@pytest.mark.parametrize("damage, why", [("bitflip", "digest mismatch"), ("truncate", "truncated"),
                                         ("empty", "truncated"), ("zeroed_block", "digest mismatch"),
                                         ("zeroed_header", "damaged digest header")])
def test_damaged_latest_is_refused_and_resume_falls_back(tmp_path, damage, why, caplog):
    commit_checkpoint(tmp_path, 1, _sections(1), "cfg")
    newest = commit_checkpoint(tmp_path, 2, _sections(2), "cfg")
    if damage == "bitflip":
        _flip_byte_in_dataset(newest, "params/lstm.weight")
    elif damage == "truncate":
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    elif damage == "empty":
        newest.write_bytes(b"")
    elif damage == "zeroed_block":  # HDF5's own metadata: such a block has crashed h5py when parsed
        _zero_block(newest, HEADER_BYTES + 1024, 4096)
    else:
        _zero_block(newest, 0, 64)
    with pytest.raises(CheckpointError, match=why):
        load_checkpoint(newest)
    with caplog.at_level(logging.WARNING):
        ckpt = load_latest(tmp_path)
    assert ckpt.version == 1
    _assert_tree_equal(ckpt.sections, _sections(1))
    refused = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checkpoint refused")]
    assert len(refused) == 1 and "v000002.h5" in refused[0] and why in refused[0]
    assert "resuming from v000001.h5 instead" in caplog.text


def test_fuzzed_checkpoints_are_refused_and_never_crash_the_reader(tmp_path):
    """Flips, truncations, zeroed or overwritten blocks of 16 B to 4 KiB, random files: in a subprocess, so that a
    crash (HDF5 has segfaulted and hung on such files) fails this test instead of ending pytest."""
    trials = 2000
    counts = run_fuzzer("fuzz_checkpoint.py", tmp_path, trials, 1, timeout=120)
    assert counts["refused"] + counts["unchanged"] == trials and counts["refused"] > 0.9 * trials, counts


def test_the_digest_header_must_be_exactly_as_written():
    payload = bytes(range(256)) * 4
    good = digest_header(payload) + payload
    assert verify_digest(good) is None
    assert "truncated or extended" in verify_digest(good[:-1]) and "truncated or extended" in verify_digest(good + b"0")
    assert "truncated: 100 bytes" in verify_digest(good[:100])
    header = good[:HEADER_BYTES]
    assert verify_digest(header.replace(b"size 1024", b"size 01024")[:HEADER_BYTES] + payload) == (
        "damaged digest header (not as written)")
    assert verify_digest(header.replace(b"checkpoint 2", b"checkpoint 1") + payload).startswith("format 1 in a digest")
    assert verify_digest(header[:-1] + b"x" + payload).startswith("damaged digest header")  # the NUL padding too


def test_a_checkpoint_written_before_digests_still_loads_and_the_log_says_it_is_unchecked(tmp_path, caplog):
    """Format 1, as commits wrote it before digests: a bare HDF5 file (no user block), attribute format 1."""
    legacy = tmp_path / "v000001.h5"
    with h5py.File(legacy, "w") as f:
        f.attrs["format"], f.attrs["version"], f.attrs["config_hash"] = 1, 1, "cfg"
        for name, tree in _sections(1).items():
            write_tree(f.create_group(name), tree)
        f.attrs["content_hash"] = _content_hash(f)
    assert verify_digest(legacy.read_bytes()).startswith("no digest: written before checkpoint files carried one")
    with caplog.at_level("WARNING"):
        ckpt = load_checkpoint(legacy)
    assert ckpt.version == 1 and "parsed without checking its bytes" in caplog.text
    _assert_tree_equal(ckpt.sections, _sections(1))
    # format 2's HDF5 bytes without their digest header (format 2 inside, laid out as format 1) are refused
    path = commit_checkpoint(tmp_path / "new", 1, _sections(1), "cfg")
    path.write_bytes(path.read_bytes()[HEADER_BYTES:])
    with pytest.raises(CheckpointError, match="format 2 in a file laid out as format 1"):
        load_checkpoint(path)


def test_a_checkpoint_of_a_newer_format_is_refused_naming_both_formats(tmp_path):
    path = commit_checkpoint(tmp_path, 1, _sections(1), "cfg")
    data = path.read_bytes()
    path.write_bytes(data[:HEADER_BYTES].replace(b"checkpoint 2", b"checkpoint 3") + data[HEADER_BYTES:])
    with pytest.raises(CheckpointError, match=r"checkpoint format 3, newer than this version of hpc_rl reads "
                                              r"\(format 2 at most\)"):
        load_checkpoint(path)


def test_what_hdf5_cannot_parse_is_a_checkpoint_error(tmp_path):
    """Bytes whose digest matches but that are no HDF5 file (which no commit writes): h5py's error is wrapped."""
    payload = b"not an HDF5 file" * 100
    path = tmp_path / "v000001.h5"
    path.write_bytes(digest_header(payload) + payload)
    with pytest.raises(CheckpointError, match="v000001.h5: unreadable"):
        load_checkpoint(path)
    with pytest.raises(CheckpointError, match="v000002.h5: unreadable .*No such file"):  # pruned since listed
        load_checkpoint(tmp_path / "v000002.h5")


def test_no_verifiable_checkpoint_is_an_error_not_a_fresh_start(tmp_path):
    path = commit_checkpoint(tmp_path, 1, _sections(1), "cfg")
    path.write_bytes(b"not hdf5")
    with pytest.raises(CheckpointError, match="no checkpoint verifies"):
        load_latest(tmp_path)
    assert load_latest(tmp_path / "empty") is None


@pytest.mark.parametrize("stage", COMMIT_STAGES)
def test_sigkill_at_each_commit_stage_leaves_a_loadable_latest(tmp_path, stage):
    for version, kill_at in ((1, "none"), (2, stage)):
        proc = subprocess.run([sys.executable, str(ROOT / "tests/programs/crash_during_commit.py"), str(tmp_path),
                               str(version), kill_at], capture_output=True, text=True, timeout=60)
        assert proc.returncode == (0 if kill_at == "none" else -9), proc.stderr
    ckpt = load_latest(tmp_path)
    assert ckpt.version in (1, 2)
    # Until the new file is renamed into place, `latest` must still name the old one; after, either is complete.
    expected = 1 if COMMIT_STAGES.index(stage) < COMMIT_STAGES.index("replaced") else None
    if expected is not None:
        assert ckpt.version == expected
    assert np.all(ckpt.sections["params"]["w"] == ckpt.version)
    if stage == "committed":
        assert ckpt.version == 2


def _commit_with_file_size_limit(directory: Path, version: int, sections: dict, limit: int) -> Path:
    """Commit with RLIMIT_FSIZE lowered (any user): writes past ``limit`` bytes fail with EFBIG, SIGXFSZ ignored."""
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, hard))
    try:
        return commit_checkpoint(directory, version, sections, "cfg")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, handler)


@pytest.mark.parametrize("full", ["tmpfs", "file_size_limit"])
def test_a_commit_that_cannot_write_leaves_no_temporary_file(tmp_path, full, tiny_tmpfs):
    directory = tiny_tmpfs(tmp_path / "checkpoints", "1m") if full == "tmpfs" else tmp_path / "checkpoints"
    big = {"params": {"w": np.ones((512, 512))}}  # 2 MiB of arrays: more than the tmpfs or the limit allows
    commit_checkpoint(directory, 1, _sections(1), "cfg")
    with pytest.raises(CheckpointWriteError) as failed:
        if full == "tmpfs":
            commit_checkpoint(directory, 2, big, "cfg")
        else:
            _commit_with_file_size_limit(directory, 2, big, limit=2**20)
    message = str(failed.value)
    assert "\n" not in message and f"cannot write {directory / 'v000002.h5'}:" in message, message
    assert ("No space left on device" if full == "tmpfs" else "File too large") in message
    needed = re.search(r"it needs (\d+) bytes \(2\.0 MiB\) free on ", message)
    assert needed and 2 * 2**20 < int(needed[1]) < 2.1 * 2**20, message  # the arrays and HDF5's overhead
    assert message.endswith("latest still names v000001.h5"), message
    assert sorted(p.name for p in directory.iterdir()) == ["latest", "v000001.h5"]  # no temporary file
    ckpt = load_latest(directory)
    assert ckpt.version == 1
    _assert_tree_equal(ckpt.sections, _sections(1))
    assert commit_checkpoint(directory, 3, _sections(3), "cfg").name == "v000003.h5"  # the next that fits commits
    assert load_latest(directory).version == 3


def test_retention_keeps_last_k_and_every_mth(tmp_path):
    for v in range(1, 13):
        commit_checkpoint(tmp_path, v, {"params": {"w": np.zeros(2)}}, "cfg")
    (tmp_path / ".v000013.h5.999.tmp").write_bytes(b"partial")
    deleted = prune_checkpoints(tmp_path, keep_last=3, keep_every=5)
    assert committed_versions(tmp_path) == [5, 10, 11, 12]
    assert deleted == [1, 2, 3, 4, 6, 7, 8, 9]
    assert not list(tmp_path.glob(".*.tmp"))
    with pytest.raises(ValueError):
        prune_checkpoints(tmp_path, keep_last=0, keep_every=5)


def test_metrics_append_read_live_and_cut_on_resume(tmp_path):
    path = tmp_path / "metrics.h5"
    writer = MetricsWriter(path, flush_every_s=1e9)
    for v in range(10):
        writer.log_many({"train/loss": 1.0 / (v + 1), "perf/env_steps_per_s": 100.0 * v}, version=v, step=v * 64)
    writer.flush()
    live = read_metrics(path)  # while the writer still holds the file open in SWMR mode
    assert sorted(live) == ["perf/env_steps_per_s", "train/loss"]
    assert list(live["train/loss"]["version"]) == list(range(10))
    writer.log("train/loss", 10, 640, 0.05)
    writer.close()
    assert read_metrics(path)["train/loss"].shape == (11,)

    with MetricsWriter(path, resume_version=6) as resumed:
        assert resumed  # opened and cut
        resumed.log("train/loss", 7, 7 * 64, 0.2)
    series = read_metrics(path)
    assert list(series["train/loss"]["version"]) == [0, 1, 2, 3, 4, 5, 6, 7]
    assert series["train/loss"]["value"][-1] == pytest.approx(0.2)
    assert list(series["perf/env_steps_per_s"]["version"]) == list(range(7))
    with pytest.raises(ValueError):
        MetricsWriter(tmp_path / "m2.h5").log("/bad", 0, 0, 1.0)


def test_open_run_reads_checkpoints_and_metrics(tmp_path):
    with pytest.raises(FileNotFoundError):
        open_run(tmp_path / "missing")
    commit_checkpoint(tmp_path / "checkpoints", 3, _sections(3), "cfg")
    with MetricsWriter(tmp_path / "metrics.h5") as w:
        w.log("eval/win_rate", 3, 192, 0.75)
    run = open_run(tmp_path)
    assert run.checkpoint_versions == [3]
    assert run.load_checkpoint().version == 3
    assert run.metrics["eval/win_rate"]["value"][0] == 0.75
    assert checkpoint_name(3) == "v000003.h5"


def test_meta_json_records_git_slurm_and_fields(tmp_path, monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    write_meta(tmp_path, world_size=6, roles={0: "controller[0]"}, transport="rma")
    meta = open_run(tmp_path).meta
    assert meta["slurm"]["SLURM_JOB_ID"] == "4242"
    assert meta["world_size"] == 6 and meta["transport"] == "rma" and meta["roles"] == {"0": "controller[0]"}
    source = Path(hpc_rl.__file__).resolve().parents[1]
    if (source / ".git").exists():  # hpc_rl runs from a checkout (make setup installs it editable)
        assert len(meta["git_sha"]) == 40 and isinstance(meta["git_dirty"], bool)
    else:  # installed by `pip install .` (the base tier's check): there is no checkout to describe
        assert meta["git_sha"] is None and meta["git_dirty"] is None


# What a writer killed after each line of tests/programs/commit_forever.py was doing: the work that follows the point
# that line reports, inside a commit; after "stage V committed", "committed V" or "pruned V" it was between commits.
_WORK_AFTER = {"begin": "building the image", "image_built": "writing the temporary file",
               "tmp_written": "fsync of the temporary file", "tmp_synced": "renaming it to its name",
               "replaced": "fsync of the directory", "dir_synced": "writing latest's temporary file",
               "latest_tmp_written": "renaming latest", "latest_replaced": "fsync of the directory after latest"}
_BETWEEN = "between commits"


def _kill_landed(last_line: str) -> tuple[str, int]:
    """Where a kill landed, from the last line the writer printed, and the version that line names."""
    word, version, *stage = last_line.split()
    point = "begin" if word == "begin" else stage[0] if word == "stage" else None
    return _WORK_AFTER.get(point, _BETWEEN), int(version)


def test_sigkill_at_random_moments_never_loses_more_than_the_version_in_flight(tmp_path):
    rng = np.random.default_rng(7)
    certain = 0
    landed: list[str] = []
    for _ in range(20):
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests/programs/commit_forever.py"), str(tmp_path)],
                                stdout=subprocess.PIPE, text=True)
        lines: list[str] = []

        def read_until(word: str) -> None:
            while not (lines and lines[-1].startswith(word)):
                line = proc.stdout.readline()
                assert line, f"the writer ended (exit {proc.wait()}) after {lines}"
                lines.append(line.strip())

        # Let it commit at least once, timing that commit; then kill it after a random delay from the beginning of
        # the next commit, up to 1.5 times that long: most kills land inside a commit, some after it.
        read_until("begin")
        begun = time.monotonic()
        read_until("committed")
        took = time.monotonic() - begun
        read_until("begin")
        time.sleep(rng.uniform(0.0, 1.5 * took))
        proc.kill()
        out, _ = proc.communicate()
        lines += out.splitlines()
        committed = [int(line.split()[1]) for line in lines if line.startswith("committed")]
        assert committed, "the writer never committed"
        certain = max(certain, committed[-1])
        ckpt = load_latest(tmp_path)
        assert certain <= ckpt.version <= certain + 1  # at most the version being written is lost
        assert np.all(ckpt.sections["params"]["w"] == ckpt.version)
        # `latest` names the version of the last line once that commit renamed it, the version before until then.
        where, version = _kill_landed(lines[-1])
        if where == "renaming latest":
            assert ckpt.version in (version - 1, version)
        elif where in (_BETWEEN, "fsync of the directory after latest"):
            assert ckpt.version == version, where
        else:
            assert ckpt.version == version - 1, where
        landed.append(where)
        certain = ckpt.version
    tally = {where: landed.count(where) for where in (_BETWEEN, *_WORK_AFTER.values()) if where in landed}
    print(f"where the {len(landed)} kills landed: {tally}")
    assert len(landed) - landed.count(_BETWEEN) >= len(landed) / 4, f"too few kills inside a commit: {tally}"


def test_pool_file_round_trips_and_is_replaced_whole(tmp_path):
    from hpc_rl.storage import read_pool, write_pool

    assert read_pool(tmp_path / "pool.h5") is None
    write_pool(tmp_path / "pool.h5", [10, 20], [0.0, -0.25], eta=0.01)
    write_pool(tmp_path / "pool.h5", [10, 20, 30], [0.0, -0.25, 0.0], eta=0.01)
    versions, qualities, attrs = read_pool(tmp_path / "pool.h5")
    assert versions == [10, 20, 30] and qualities == [0.0, -0.25, 0.0] and attrs["eta"] == 0.01
    with h5py.File(tmp_path / "pool.h5") as f:
        assert f["quality"].fletcher32 and [c.decode() for c in f["checkpoint"][()]] == [
            checkpoint_name(v) for v in (10, 20, 30)]
    assert not list(tmp_path.glob(".*.tmp"))
    write_meta(tmp_path)
    assert open_run(tmp_path).pool["version"] == [10, 20, 30]
    with pytest.raises(ValueError, match="2 versions and 1 qualities"):
        write_pool(tmp_path / "pool.h5", [1, 2], [0.0])


def _strand_metrics(path: Path, versions: int) -> None:
    """A writer process SIGKILLed while it holds ``path`` in SWMR mode (a crashed controller)."""
    code = ("import os, signal, sys; from hpc_rl.storage import MetricsWriter\n"
            f"w = MetricsWriter({str(path)!r}, flush_every_s=1e9)\n"
            f"for v in range({versions}): w.log_many({{'train/loss': v / 10, 'perf/x': v}}, version=v, step=v)\n"
            "w.flush(); os.kill(os.getpid(), signal.SIGKILL)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == -signal.SIGKILL, proc.stderr


def test_metrics_left_open_by_a_crashed_writer_is_recovered_by_the_run_owner(tmp_path, caplog):
    from hpc_rl.storage.metrics import MetricsFileInUse

    path = tmp_path / "metrics.h5"
    _strand_metrics(path, 10)
    with pytest.raises(OSError, match="already open for write"):
        h5py.File(path, "r+", libver="latest").close()  # HDF5 refuses it: the consistency flag is set
    before = read_metrics(path)  # an SWMR read still sees every flushed row
    assert list(before["train/loss"]["version"]) == list(range(10))
    with pytest.raises(MetricsFileInUse, match="resuming the run recovers it"):
        MetricsWriter(path, resume_version=6)  # not the run's owner: refused, nothing changed
    with caplog.at_level(logging.WARNING, logger="hpc_rl.storage.metrics"):
        with MetricsWriter(path, resume_version=6, recover=True) as writer:
            writer.log("train/loss", 7, 7, 0.7)
            writer.log("eval/new_name", 7, 7, 1.0)  # a name first seen after the start: no reopen
            writer.flush()
            live = read_metrics(path)
            assert list(live["eval/new_name"]["version"]) == [7]
    assert "recovered metrics.h5: 14 rows up to version 6 (was left open by a crashed job)" in caplog.text
    after = read_metrics(path)
    for name in ("train/loss", "perf/x"):
        np.testing.assert_array_equal(after[name][:7], before[name][:7])
    assert list(after["train/loss"]["version"]) == list(range(8)) and list(after["perf/x"]["version"]) == list(range(7))
    h5py.File(path, "r+", libver="latest").close()  # closed cleanly: writable again


def test_hdf5_opens_retry_another_process_lock_then_fail_clearly(tmp_path):
    from hpc_rl.storage.hdf5 import FileBusyError, open_h5

    path = tmp_path / "held.h5"
    h5py.File(path, "w").close()
    # A writer outside SWMR mode holds HDF5's exclusive lock for 1.5 s.
    holder = subprocess.Popen([sys.executable, "-c", "import h5py, sys, time\n"
                               f"f = h5py.File({str(path)!r}, 'a'); print('held', flush=True); time.sleep(1.5)"],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(BlockingIOError):
            h5py.File(path, "r").close()
        with pytest.raises(FileBusyError, match="still locked by another process"):
            open_h5(path, "r", timeout_s=0.2)
        with open_h5(path, "r", timeout_s=30) as f:  # retried until the holder lets go
            assert f.filename == str(path)
    finally:
        holder.kill()
        holder.wait()


def test_run_lock_refuses_a_live_holder_and_takes_over_a_stale_one(tmp_path, monkeypatch):
    import json
    import socket

    from hpc_rl.storage.layout import RunLayout
    from hpc_rl.storage.runlock import RunLockedError, acquire_run_lock, release_run_lock

    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    lock = RunLayout(tmp_path).lock
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock.write_text(json.dumps({"host": socket.gethostname(), "pid": live.pid, "slurm_job_id": None,
                                    "start_time": "then"}))
        with pytest.raises(RunLockedError, match=f"in use by another job \\(host {socket.gethostname()}, pid "
                                                 f"{live.pid}, no Slurm job, since then\\)"):
            acquire_run_lock(tmp_path)
        # A holder on another host without Slurm cannot be checked: refused too.
        lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "slurm_job_id": None, "start_time": "then"}))
        with pytest.raises(RunLockedError, match="host elsewhere"):
            acquire_run_lock(tmp_path)
    finally:
        live.kill()
        live.wait()
    # The holder's pid is gone from this host: stale, taken over.
    lock.write_text(json.dumps({"host": socket.gethostname(), "pid": live.pid, "slurm_job_id": None,
                                "start_time": "then"}))
    mine = acquire_run_lock(tmp_path)
    assert json.loads(lock.read_text()) == mine and mine["pid"] == os.getpid()
    # Our own Slurm job's lock from another host (the job requeued onto another node): taken over.
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    lock.write_text(json.dumps({"host": "elsewhere", "pid": 1, "slurm_job_id": "4242", "start_time": "then"}))
    assert acquire_run_lock(tmp_path)["slurm_job_id"] == "4242"
    release_run_lock(tmp_path)
    assert not lock.exists()


def test_metrics_of_the_earlier_layout_are_read_and_converted_on_resume(tmp_path):
    from hpc_rl.storage.metrics import ROW

    path = tmp_path / "metrics.h5"
    with h5py.File(path, "w", libver="latest") as f:  # one dataset per name, as runs wrote before the rows table
        for name, versions in (("train/loss", range(1, 6)), ("perf/env_steps", range(1, 4))):
            f.create_dataset(f"metrics/{name}", data=np.array([(v, 10 * v, 100.0 + v, v / 2) for v in versions], ROW),
                             maxshape=(None,), chunks=(1024,))
    old = read_metrics(path)
    assert list(old["train/loss"]["version"]) == [1, 2, 3, 4, 5] and list(old["perf/env_steps"]["step"]) == [10, 20, 30]
    with MetricsWriter(path, resume_version=4) as writer:
        writer.log("train/loss", 5, 50, 9.0)
    new = read_metrics(path)
    np.testing.assert_array_equal(new["train/loss"][:4], old["train/loss"][:4])
    assert new["train/loss"]["value"].tolist() == [0.5, 1.0, 1.5, 2.0, 9.0]
    np.testing.assert_array_equal(new["perf/env_steps"], old["perf/env_steps"])


def test_metrics_on_a_full_filesystem_fail_in_one_line_and_a_resume_keeps_the_rows(tmp_path, tiny_tmpfs):
    """The writer runs in a subprocess: after a failed write HDF5 can crash the process that closes the file."""
    directory = tiny_tmpfs(tmp_path / "run", "256k")
    path = directory / "metrics.h5"
    out = subprocess.run([sys.executable, str(ROOT / "tests/programs/fill_metrics.py"), str(path)],
                         capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-2000:]
    error = out.stdout.strip().splitlines()[-1]
    assert error.startswith(f"error cannot write {path}: No space left on device (errno 28); the rows needed "), error
    last = int(out.stdout.strip().splitlines()[-2].split()[1])
    subprocess.run(["mount", "-o", "remount,size=4m", str(directory)], check=True)  # the quota grows
    resumed = MetricsWriter(path, resume_version=last, recover=True)  # left in SWMR mode: recovered
    resumed.close()
    metrics = read_metrics(path)
    assert len(metrics) == 50 and all(list(s["version"]) == list(range(1, last + 1)) for s in metrics.values())
