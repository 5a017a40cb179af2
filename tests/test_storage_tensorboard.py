"""TensorBoard export of metrics.h5: offline (the command line) and live (one event file per attempt of a run)."""

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator

from hpc_rl.storage import MetricsWriter, read_metrics
from hpc_rl.storage import tensorboard as tb

ROOT = Path(__file__).resolve().parent.parent


def scalars(logdir: Path) -> dict[str, list]:
    """What TensorBoard shows: every scalar tag's (step, value, wall_time) events, none sampled away."""
    acc = EventAccumulator(str(logdir), size_guidance={SCALARS: 0})
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()[SCALARS]}


def assert_same(events: dict[str, list], metrics: dict[str, np.ndarray]) -> None:
    assert sorted(events) == sorted(metrics)
    for name, rows in metrics.items():
        steps, values, walls = (np.array(x) for x in zip(*events[name]))
        assert steps.tolist() == rows["version"].tolist(), name
        # TensorBoard keeps scalars as float32.
        np.testing.assert_array_equal(values, rows["value"].astype(np.float32), err_msg=name)
        np.testing.assert_allclose(walls, rows["wall_time"], rtol=0, atol=1e-3, err_msg=name)


def write_run(path: Path, versions: range, resume_version: int | None = None) -> None:
    rng = np.random.default_rng(versions.start)
    with MetricsWriter(path, resume_version=resume_version) as writer:
        for v in versions:
            values = {"train/policy_loss": rng.normal(), "perf/env_steps_per_s": 1000.0 * v + rng.random()}
            if v % 3 == 0:  # a series with gaps, like eval/win_rate_vs_scripted
                values["eval/win_rate_vs_scripted"] = v / 100
            writer.log_many(values, version=v, step=64 * v, wall_time=1.7e9 + v)


def test_the_command_line_exports_metrics_h5_and_tensorboard_reads_back_the_same_rows(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    write_run(run / "metrics.h5", range(1, 41))
    write_run(run / "metrics.h5", range(31, 61), resume_version=30)  # a resumed run: rows 31..40 replaced
    metrics = read_metrics(run / "metrics.h5")
    assert metrics["train/policy_loss"]["version"].tolist() == list(range(1, 61))

    cli = [sys.executable, "-m", "hpc_rl.storage.tensorboard", str(run)]
    out = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"wrote {60 + 60 + 20} rows of 3 series" in out.stdout
    assert_same(scalars(run / "tensorboard"), metrics)

    again = subprocess.run(cli, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert again.returncode == 1 and "already holds 1 event file" in again.stderr and "--overwrite" in again.stderr
    forced = subprocess.run(cli + ["--overwrite"], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert forced.returncode == 0, forced.stderr
    assert len(list((run / "tensorboard").glob(tb.EVENT_GLOB))) == 1
    assert_same(scalars(run / "tensorboard"), metrics)

    missing = subprocess.run([sys.executable, "-m", "hpc_rl.storage.tensorboard", str(tmp_path / "nothing")],
                             capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert missing.returncode == 1 and "no metrics file at" in missing.stderr


def test_a_resumed_attempt_replaces_the_steps_past_its_start_as_metrics_h5_does(tmp_path):
    logdir = tmp_path / "tensorboard"
    first = tb.open_export(logdir, first_version=1)
    for v in range(1, 26):  # the first attempt got to version 25; its last checkpoint was version 20
        first.log_many({"train/policy_loss": -v, "train/lr": 3e-4}, v, wall_time=1.7e9 + v)
    first.close()
    # TensorBoard orders event files by name: the creation second, then a per-process counter compared as text
    # ("10" before "9"). A resume is a new process in a later second; so is the second attempt here.
    time.sleep(1.0 - time.time() % 1.0 + 0.01)
    second = tb.TensorBoardExport(logdir, first_version=21)
    for v in range(21, 31):
        second.log_many({"train/policy_loss": v}, v, wall_time=1.8e9 + v)
    second.close()
    assert len(list(logdir.glob(tb.EVENT_GLOB))) == 2
    events = scalars(logdir)
    loss = events["train/policy_loss"]
    assert [s for s, _, _ in loss] == list(range(1, 31))
    assert [v for _, v, _ in loss] == [-v for v in range(1, 21)] + list(range(21, 31))
    assert [s for s, _, _ in events["train/lr"]] == list(range(1, 21))


def test_without_tensorboard_there_is_no_export_and_the_command_says_why(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorboard.summary.writer.event_file_writer", None)  # import fails
    assert not tb.tensorboard_available()
    assert tb.open_export(tmp_path / "tensorboard") is None
    assert not (tmp_path / "tensorboard").exists()
    write_run(tmp_path / "metrics.h5", range(1, 3))
    assert tb.main([str(tmp_path)]) == 1
    assert "tensorboard package is not installed" in capsys.readouterr().err
