"""Damaged run files never crash a resume: random bit flips, truncations, zeroed or overwritten blocks, random files,
empty files and directories in the place of ``latest``, ``pool.h5``, ``ratings.json`` and ``metrics.h5``. Each read
either refuses the file with the documented error naming it, or returns exactly what was written; what a resume
can rebuild (the pool, the ratings, the metrics) it sets aside and rebuilds. Checkpoints have their own fuzzing in
tests/test_storage.py (2000 damaged files, in a subprocess)."""

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest

from hpc_rl.league.pool import OpponentPool
from hpc_rl.league.tournament import RatingBook, read_ratings
from hpc_rl.roles.controller import resume_pool
from hpc_rl.storage import commit_checkpoint, load_latest, read_pool, write_pool
from hpc_rl.storage.hdf5 import DamagedFileError
from hpc_rl.storage.layout import RunLayout

sys.path.insert(0, str(Path(__file__).parent / "programs"))
from fuzz_checkpoint import damaged  # noqa: E402
from fuzzing import run_fuzzer  # noqa: E402

pytestmark = pytest.mark.light
KINDS = ("flip", "truncate", "zero", "overwrite", "random")


def _trials(original: bytes, path: Path, trials: int, seed: int):
    """Write a damaged copy of ``original`` at ``path`` for each trial (an empty file and a directory first) and
    yield whether its bytes are the original ones."""
    rng = np.random.default_rng(seed)
    for trial in range(trials):
        if path.is_dir():
            path.rmdir()
        if trial == 0:
            path.write_bytes(b"")
        elif trial == 1:
            path.unlink()
            path.mkdir()
        else:
            path.write_bytes(damaged(original, KINDS[trial % len(KINDS)], rng)[0])
        yield path.is_file() and path.read_bytes() == original


def test_a_damaged_latest_resumes_a_checkpoint_as_written(tmp_path, caplog):
    sections = {v: {"params": {"w": np.full((4, 4), v, np.float32)}} for v in (1, 2, 3)}
    for version, tree in sections.items():
        commit_checkpoint(tmp_path, version, tree, "cfg")
    latest = tmp_path / "latest"
    original = latest.read_bytes()
    with caplog.at_level(logging.CRITICAL):
        for unchanged in _trials(original, latest, 200, seed=1):
            ckpt = load_latest(tmp_path)  # a name of no checkpoint: the newest that verifies
            assert np.array_equal(ckpt.sections["params"]["w"], sections[ckpt.version]["params"]["w"])
            assert ckpt.version == 3 or not unchanged


def test_a_damaged_pool_is_refused_naming_it_and_a_resume_rebuilds_it(tmp_path, capsys):
    path = tmp_path / "pool.h5"
    write_pool(path, [4, 8, 12], [0.0, -0.25, -0.5], eta=0.01, latest_fraction=0.8)
    original, written = path.read_bytes(), read_pool(path)
    outcomes = {"refused": 0, "unchanged": 0}
    for unchanged in _trials(original, path, 300, seed=2):
        try:
            got = read_pool(path)
        except DamagedFileError as err:
            assert str(err).startswith(f"{path}: ") and not unchanged, err
            outcomes["refused"] += 1
            continue
        assert unchanged and got == written
        outcomes["unchanged"] += 1
    assert outcomes["refused"] > 250, outcomes
    # The resume: set aside, rebuilt from the checkpoints kept for the pool (every 4th up to the resumed version).
    layout = RunLayout(tmp_path)
    for version in (4, 6, 7, 8, 12):
        commit_checkpoint(layout.checkpoints, version, {"params": {"w": np.zeros(2)}}, "cfg")
    path.write_bytes(original[:-10])
    pool = resume_pool(layout, 8, OpponentPool(latest_fraction=0.8, eta=0.01), keep_every=4)
    assert (pool.versions, pool.qualities) == ([4, 8], [0.0, 0.0])
    assert not path.exists() and len(list(tmp_path.glob("pool.h5.damaged.*"))) == 1
    assert "pool.h5 is damaged: set aside as pool.h5.damaged." in capsys.readouterr().out


def _book(run_dir: Path) -> RatingBook:
    book = RatingBook.load(run_dir, -1)
    for version in (2, 4, 6):
        match = {"scores": [1.0, 0.5, 0.0, 1.0], "wins": 2, "draws": 1, "games": 4}
        book.add(version, {"random": match, "scripted": match})
    book.save()
    return book


def test_damaged_ratings_are_refused_naming_them_and_a_resume_starts_a_new_table(tmp_path, capsys):
    written = _book(tmp_path).records
    path = RunLayout(tmp_path).ratings
    original = path.read_bytes()
    assert json.loads(original)["blake2b-256"]
    outcomes = {"refused": 0, "unchanged": 0}
    for unchanged in _trials(original, path, 300, seed=3):
        try:
            records = read_ratings(path)
        except DamagedFileError as err:
            assert str(err).startswith(f"{path}: ") and not unchanged, err
            outcomes["refused"] += 1
            continue
        assert records == json.loads(json.dumps(written))  # as written, bit for bit (whitespace aside)
        outcomes["unchanged"] += 1
    assert outcomes["refused"] > 250, outcomes
    assert RatingBook.load(tmp_path, 6).last_version == -1 and path.exists()  # an evaluator rank: read only
    book = RatingBook.load(tmp_path, 6, recover=True)  # the controller: set aside, a new table
    assert book.last_version == -1 and not path.exists() and len(list(tmp_path.glob("ratings.json.damaged.*"))) == 1
    assert "ratings.json is damaged: set aside as ratings.json.damaged." in capsys.readouterr().out
    _book(tmp_path)
    assert RatingBook.load(tmp_path, 4, recover=True).records == written[:2]  # an undamaged table: kept


def test_damaged_metrics_are_refused_and_a_resume_sets_them_aside(tmp_path):
    """In a subprocess: h5py parses these bytes, and a crash must fail this test, not end pytest."""
    counts = run_fuzzer("fuzz_metrics.py", tmp_path, 300, 4, timeout=180)
    assert counts["refused"] > 250, counts
