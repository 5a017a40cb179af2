"""The file format of a run (docs/FORMAT.md): every HDF5 file carries its format, older formats are read and newer
ones refused naming both versions; a run directory kept from an earlier version of the code (tests/data/) is read
by today's readers; pandas tables of a run; analysis scripts on a copied run and on a run still being written."""

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from hpc_rl.league.tournament import read_ratings
from hpc_rl.storage import MetricsWriter, open_run, read_metrics, read_pool, write_pool
from hpc_rl.storage.hdf5 import HEADER_BYTES, FormatError
from hpc_rl.storage.metrics import FORMAT as METRICS_FORMAT
from hpc_rl.storage.pool import FORMAT as POOL_FORMAT
from hpc_rl.storage.replay_buffer import FORMAT as REPLAY_BUFFER_FORMAT
from hpc_rl.storage.replay_buffer import read_replay_buffer, write_replay_buffer

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)
FIXTURE = ROOT / "tests" / "data" / "moba_run_2026_11"
FIXTURE_B = ROOT / "tests" / "data" / "moba_run_2026_11b"  # pool.h5 format 2, ratings.json digested
SCRIPTS = ("curves", "win_rate", "data_quality", "throughput")


def _set_format(path: Path, value: int | None) -> None:
    """Rewrite a file's ``format`` attribute (None: remove it, as files written before versioning lack it)."""
    with h5py.File(path, "r+") as f:
        if value is None:
            del f.attrs["format"]
        else:
            f.attrs["format"] = value


# --- format versions ---------------------------------------------------------------------------------------------
def test_metrics_carry_their_format_read_it_unversioned_and_refuse_a_newer_one(tmp_path):
    path = tmp_path / "metrics.h5"
    with MetricsWriter(path) as writer:
        writer.log("train/loss", 1, 64, 0.5, wall_time=100.0)
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == METRICS_FORMAT == 2
    _set_format(path, None)  # as written before the attribute existed
    assert read_metrics(path)["train/loss"].tolist() == [(1, 64, 100.0, 0.5)]
    _set_format(path, METRICS_FORMAT + 1)
    before = path.read_bytes()
    message = (rf"{path}: metrics.h5 format 3, newer than this version of hpc_rl reads \(format 2 at most\)")
    with pytest.raises(FormatError, match=message):
        read_metrics(path)
    with pytest.raises(FormatError, match=message):  # a resume neither sets it aside nor rewrites it
        MetricsWriter(path, resume_version=0, recover=True)
    assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["metrics.h5"]


def test_a_replay_buffer_carries_its_format_and_refuses_a_newer_one(tmp_path):
    path = tmp_path / "replay_buffer" / "learner0.h5"
    write_replay_buffer(path, {"z": np.array([1.0, -1.0], np.float32), "version": np.array([3, 4])}, version=4)
    data = path.read_bytes()
    assert data.startswith(b"hpc_rl replay_buffer 1\nsize ")  # the digest header
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == REPLAY_BUFFER_FORMAT == 1
    arrays, attrs = read_replay_buffer(path)
    assert attrs == {"version": 4} and arrays["z"].tolist() == [1.0, -1.0] and arrays["version"].tolist() == [3, 4]
    path.write_bytes(data[:HEADER_BYTES].replace(b"replay_buffer 1", b"replay_buffer 2") + data[HEADER_BYTES:])
    with pytest.raises(FormatError, match=r"replay_buffer format 2, newer than this version of hpc_rl reads "
                                          r"\(format 1 at most\)"):
        read_replay_buffer(path)
    with pytest.raises(ValueError, match="different lengths"):
        write_replay_buffer(path, {"z": np.zeros(2), "version": np.zeros(3)})


def test_the_pool_carries_its_format_reads_earlier_ones_and_refuses_a_newer_one(tmp_path):
    path = tmp_path / "pool.h5"
    write_pool(path, [2, 4], [0.0, -0.5], eta=0.01)
    assert read_pool(path) == ([2, 4], [0.0, -0.5], {"eta": 0.01})  # the format is no setting of the pool
    data = path.read_bytes()
    assert data.startswith(b"hpc_rl pool.h5 2\nsize ")  # the digest header
    with h5py.File(path, "r") as f:
        assert f.attrs["format"] == POOL_FORMAT == 2
    for legacy in (1, None):  # format 1: a bare HDF5 file, with the attribute or written before it existed
        with h5py.File(path, "w") as f:
            f["version"], f["quality"] = np.array([2, 4]), np.array([0.0, -0.5])
            f.create_dataset("checkpoint", data=np.array(["v000002.h5", "v000004.h5"], dtype=object),
                             dtype=h5py.string_dtype())
            f.attrs["eta"] = 0.01
            if legacy is not None:
                f.attrs["format"] = legacy
        assert read_pool(path) == ([2, 4], [0.0, -0.5], {"eta": 0.01})
    path.write_bytes(data[:HEADER_BYTES].replace(b"pool.h5 2", b"pool.h5 3") + data[HEADER_BYTES:])
    with pytest.raises(FormatError, match=r"pool.h5 format 3, newer than this version of hpc_rl reads \(format 2 "
                                          r"at most\)"):
        read_pool(path)
    with pytest.raises(ValueError, match="'format' is the file's format"):
        write_pool(path, [2], [0.0], format=7)


# --- the run kept from an earlier version -------------------------------------------------------------------------
def test_the_kept_run_reads_with_todays_readers():
    """tests/data/moba_run_2026_11: checkpoint format 2, metrics.h5 format 2, pool.h5 format 1 (docs/FORMAT.md)."""
    run = open_run(FIXTURE)
    assert run.config["model"]["lstm_size"] == 16 and run.meta["world_size"] == 7
    assert run.status["state"] == run.summary["state"] == "finished" and run.summary["version"] == 4
    metrics = run.metrics
    assert len(metrics) == 61 and sum(len(s) for s in metrics.values()) == 201
    loss = metrics["train/policy_loss"]
    assert loss["version"].tolist() == [1, 2, 3, 4] and loss["step"].tolist() == [244, 244, 824, 824]
    np.testing.assert_allclose(loss["value"], [0.002720900811254978, -0.2323090396821499, -0.017017588019371033,
                                               -0.06849098298698664])
    assert metrics["eval/games_vs_scripted"]["value"].tolist() == [6.0, 6.0]
    assert run.pool == {"version": [4], "quality": [0.0], "eta": 0.01, "latest_fraction": 0.8}

    assert run.checkpoint_versions == [4]
    ckpt = run.load_checkpoint()
    assert (ckpt.version, ckpt.config_hash, ckpt.content_hash) == (
        4, "96cbb44e6cee7da02a7e760f17a5d73821db6a6aa087b98269a19e077f6877fd",
        "f2afd765204ce2fcc6396ec63df4cf2bbb0651397e12d8e27f5430b3afb95438")
    assert sorted(ckpt.sections) == ["clip", "learner", "normalizers", "optimizer", "params"]
    from hpc_rl.evaluation import load_policy

    policy, config, version = load_policy(FIXTURE)
    # Hashed as the code that wrote it did: the settings added since (absent from its config.yaml) left out.
    written = yaml.safe_load((FIXTURE / "config.yaml").read_text())
    assert version == 4 and config.config_hash(written) == ckpt.config_hash != config.config_hash()
    total = sum(float(p.detach().double().sum()) for p in policy.state_dict().values())
    assert total == pytest.approx(32.87684948579408, rel=1e-6)  # every parameter of the checkpoint, loaded


def test_the_kept_run_of_digested_pool_and_ratings_reads_with_todays_readers():
    """tests/data/moba_run_2026_11b: pool.h5 format 2 and ratings.json with their digests, checkpoint format 2,
    metrics.h5 format 2 with checksummed names (docs/FORMAT.md); written by the same command as the fixture above."""
    run = open_run(FIXTURE_B)
    assert run.config["model"]["lstm_size"] == 16 and run.meta["world_size"] == 7
    assert run.status["state"] == run.summary["state"] == "finished" and run.summary["version"] == 4
    metrics = run.metrics
    assert len(metrics) == 65 and sum(len(s) for s in metrics.values()) == 230
    loss = metrics["train/policy_loss"]
    assert loss["version"].tolist() == [1, 2, 3, 4] and loss["step"].tolist() == [134, 134, 512, 626]
    np.testing.assert_allclose(loss["value"], [0.0019425693899393082, -0.23058956488966942, -0.014777839183807373,
                                               -0.14901101775467396])
    assert metrics["eval/games_vs_scripted"]["value"].tolist() == [4.0, 6.0]
    assert (FIXTURE_B / "pool.h5").read_bytes().startswith(b"hpc_rl pool.h5 2\n")
    assert run.pool == {"version": [4], "quality": [0.0], "eta": 0.01, "latest_fraction": 0.8}
    records = read_ratings(FIXTURE_B / "ratings.json")
    assert "blake2b-256" in json.loads((FIXTURE_B / "ratings.json").read_text()) and records
    ckpt = run.load_checkpoint()
    assert (ckpt.version, ckpt.config_hash, ckpt.content_hash) == (
        4, "9e018596a4b1985b3affaf98dc3b309deb4ea76a1fb3827360292b839facd560",
        "0c6e9119112d4e2893b426f0a1818f22f4dd08771fa55accd989806ae2e47f8f")
    from hpc_rl.evaluation import load_policy

    policy, config, version = load_policy(FIXTURE_B)
    total = sum(float(p.detach().double().sum()) for p in policy.state_dict().values())
    assert version == 4 and total == pytest.approx(32.94115515115118, rel=1e-6)


def test_pandas_tables_of_the_kept_run():
    run = open_run(FIXTURE)
    frame = run.metrics_frame()
    assert list(frame.columns) == ["name", "version", "step", "wall_time", "value", "source"] and len(frame) == 201
    staleness = frame[frame.name == "data/staleness_mean"]
    assert staleness.version.tolist() == [1, 2, 3, 4] and staleness.value.tolist() == [0.0, 1.0, 1.625, 2.0]
    assert (frame.source == "").all()

    ratings = run.ratings_frame()
    assert len(ratings) == 13 and set(ratings.player) == {"policy", "random", "scripted"}
    sigma = ratings[(ratings.family == "trueskill_sigma") & (ratings.player == "policy")]
    record = json.loads((FIXTURE / "ratings.json").read_text())["records"][0]
    assert sigma.version.tolist() == [record["version"]] == [4]
    assert sigma.value.tolist() == [record["ratings"]["v4"][1]] == [4.059097426177462]
    assert ratings[ratings.name == "eval/draw_rate/scripted"].value.tolist() == [1.0]

    evaluations = run.evaluations_frame()
    assert evaluations.to_dict("records")[0] | {"seconds": 0} == {
        "source": "summary", "version": 4, "bot": "scripted",
        "bot_hash": "076b0599b0fc1588e534fff36a1dd46f21bf579f4b341be3587196a79fd333a1", "ci95_low": 0.0,
        "ci95_high": 0.6576280471103807, "draws": 2, "games": 2, "seconds": 0, "seed": 12345, "win_rate": 0.0,
        "wins": 0}


def test_pandas_tables_of_a_run_without_metrics_or_evaluations(tmp_path):
    (tmp_path / "meta.json").write_text("{}")
    run = open_run(tmp_path)
    assert run.metrics_frame().empty and run.ratings_frame().empty and run.evaluations_frame().empty
    assert list(run.metrics_frame().columns) == ["name", "version", "step", "wall_time", "value", "source"]


# --- analysis scripts on copied and live runs ---------------------------------------------------------------------
def _script(name: str):
    spec = importlib.util.spec_from_file_location(f"analysis_{name}", ROOT / "analysis" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _table(path: Path) -> list[dict[str, str]]:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    cells = lambda ln: [c.strip() for c in ln.strip().strip("|").split("|")]  # noqa: E731
    return [dict(zip(cells(lines[0]), cells(ln))) for ln in lines[2:]]


def test_every_analysis_script_reads_a_run_copied_elsewhere(tmp_path):
    """Nothing a reader needs is an absolute path inside the run: summary.json names where the run was written."""
    copy = tmp_path / "elsewhere" / "copied"
    shutil.copytree(FIXTURE, copy)
    assert Path(open_run(copy).summary["files"]["run_dir"]) != copy
    for name in SCRIPTS:
        assert _script(name).main([str(copy), "--out", str(tmp_path / name)]) == 0
        assert (tmp_path / name / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert {row["run"] for row in _table(tmp_path / name / f"{name}.md")} == {"copied"}
    assert _table(tmp_path / "curves" / "curves.md")[0]["last version"] == "4"
    assert [row["games"] for row in _table(tmp_path / "win_rate" / "win_rate.md")] == ["6", "6"]
    from hpc_rl.evaluation import load_policy

    assert load_policy(copy)[2] == 4


def test_an_analysis_script_reads_a_run_while_its_metrics_are_written(tmp_path):
    """A writer holds metrics.h5 open in SWMR mode, as a job's controller does, while the script reads it in
    another process and sees the rows flushed so far."""
    run = tmp_path / "live"
    shutil.copytree(FIXTURE, run)
    with MetricsWriter(run / "metrics.h5", resume_version=4, flush_every_s=1e9) as writer:
        writer.log("train/policy_loss", 5, 10_000, -0.25)
        writer.flush()
        out = subprocess.run([sys.executable, str(ROOT / "analysis" / "curves.py"), str(run), "--metric",
                              "train/policy_loss", "--out", str(tmp_path / "plots")],
                             capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert out.returncode == 0, out.stdout + out.stderr
    row = _table(tmp_path / "plots" / "curves.md")[0]
    assert row["last version"] == "5" and float(row["final"]) == -0.25
