"""`make reproduce`'s driver (hpc_rl/reproduce.py): which members are finished and skipped, and the multiruns that
cover the rest exactly, on real run directories (config.yaml and summary.json as a job writes them)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from hpc_rl.reproduce import Panel, finished_members, is_finished, launch_groups, main, read_panel

# The tests marked light run in the base install tier (scripts/light_tier_check.sh); the others read the checkout's
# conf/ablation (not installed with the package) or import the cluster tier's launcher.


def member_dir(sweep: Path, name: str, queue, seed, summary: dict | None) -> None:
    """A run directory as jobs/train.py leaves it: its config, and the summary once the job has ended."""
    run = sweep / name
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(yaml.safe_dump({"seed": seed, "pipeline": {"staleness_queue": queue}}))
    if summary is not None:
        (run / "summary.json").write_text(json.dumps(summary))


def test_read_panel_takes_the_ablation_configs():
    assert read_panel("staleness") == Panel("staleness", "pipeline.staleness_queue", ("0", "2", "8"),
                                            read_panel("staleness").seeds)
    assert read_panel("reuse").key == "pipeline.target_reuse" and read_panel("reuse").values == ("1", "2", "4")
    batch = read_panel("batch_size")
    assert batch.key == "pipeline.segments_per_batch" and batch.values == ("1", "2", "4", "8")
    with pytest.raises(ValueError, match="no ablation 'nope'"):
        read_panel("nope")


@pytest.mark.light
def test_is_finished():
    assert is_finished({"state": "finished", "version": 250}, 250)
    assert is_finished({"state": "finished", "version": 300}, 250)
    assert not is_finished({"state": "finished", "version": 100}, 250)  # a shorter run trains on when resumed
    assert not is_finished({"state": "preempted", "version": 250}, 250)
    assert not is_finished({"state": "cancelled", "version": 40}, 250)
    assert not is_finished(None, 250)


@pytest.mark.light
def test_finished_members_read_each_run_directory(tmp_path):
    panel = Panel("staleness", "pipeline.staleness_queue", ("0", "2", "8"), ("3", "4"), versions=250)
    member_dir(tmp_path, "queue0-seed3", 0, 3, {"state": "finished", "version": 250})
    member_dir(tmp_path, "queue8-seed4", 8, 4, {"state": "finished", "version": 250})
    member_dir(tmp_path, "queue2-seed3", 2, 3, {"state": "preempted", "version": 120})   # resumes when relaunched
    member_dir(tmp_path, "queue2-seed4", 2, 4, None)                                     # still running, or crashed
    member_dir(tmp_path, "queue0-seed4", 0, 4, {"state": "finished", "version": 100})    # a shorter budget
    member_dir(tmp_path, "queue8-seed9", 8, 9, {"state": "finished", "version": 250})    # not one of the seeds
    (tmp_path / "index.tsv").write_text("queue0-seed3\t\n")                              # files are not members
    assert finished_members(panel, tmp_path) == {("0", "3"), ("8", "4")}
    assert finished_members(panel, tmp_path / "not_started") == set()


@pytest.mark.light
def test_launch_groups_cover_the_pending_members_exactly():
    panel = Panel("staleness", "pipeline.staleness_queue", ("0", "2", "8"), ("3", "4", "5"))
    assert launch_groups(panel.members) == [(("0", "2", "8"), ("3", "4", "5"))]  # a fresh panel: one multirun
    pending = [m for m in panel.members if m not in {("0", "3"), ("0", "4"), ("0", "5"), ("2", "3")}]
    groups = launch_groups(pending)
    covered = [(v, s) for values, seeds in groups for v in values for s in seeds]
    assert sorted(covered) == sorted(pending)  # every pending member once, no finished one
    assert groups == [(("2",), ("4", "5")), (("8",), ("3", "4", "5"))]
    assert launch_groups([]) == []


def test_dry_run_skips_finished_members(tmp_path, capsys):
    sweep = tmp_path / "staleness"
    for queue in (0, 2, 8):
        member_dir(sweep, f"queue{queue}-seed3", queue, 3, {"state": "finished", "version": 40})
    member_dir(sweep, "queue8-seed4", 8, 4, {"state": "finished", "version": 40})
    member_dir(sweep, "queue2-seed4", 2, 4, {"state": "cancelled", "version": 12})
    assert main(["--runs", str(tmp_path), "--panels", "staleness", "reuse", "--seeds", "3", "4", "--versions", "40",
                 "--parallel", "2", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "12 members in 2 panel(s): 4 finished (skipped), 8 to run, 2 at a time" in out
    assert "== staleness (pipeline.staleness_queue, 40 versions): 4/6 finished, 2 to run" in out
    commands = [line for line in out.splitlines() if line.startswith("$ ")]
    assert len(commands) == 2
    assert commands[0].endswith("pipeline.staleness_queue=0,2 seed=4")
    for part in ("ablation=staleness", "experiment=figure5", "hydra/launcher=local_slurm",
                 "hydra.launcher.array_parallelism=2", f"hydra.sweep.dir={sweep}", "pipeline.max_versions=40"):
        assert f" {part} " in commands[0]
    assert commands[1].endswith("pipeline.target_reuse=1,2,4 seed=3,4")
    # The batch panel runs half the versions unless told, and its members' finished summaries are judged by them.
    main(["--runs", str(tmp_path), "--panels", "batch_size", "--seeds", "3", "--versions", "40", "--dry-run"])
    assert "pipeline.max_versions=20 pipeline.segments_per_batch=1,2,4,8 seed=3" in capsys.readouterr().out


def test_failed_member_watchdog_ignores_earlier_jobs(tmp_path):
    # A resumed sweep launches into a directory whose .submitit/ holds an earlier, cancelled array (tasks 4 and 5
    # never ran, so they left no result): the watchdog of the new launch must watch its own job only.
    launcher = pytest.importorskip("hydra_plugins.hpc_rl_launcher.checked_launcher")  # the cluster install tier
    for name in ("340", "340_0", "340_4", "340_5"):
        (tmp_path / name).mkdir()
    (tmp_path / "multirun.yaml").write_text("")
    earlier = {p.name for p in tmp_path.iterdir()}
    for name in ("345", "345_0", "345_1"):
        (tmp_path / name).mkdir()
    assert launcher.task_folders(tmp_path, earlier) == ["345_0", "345_1"]
    assert launcher.task_folders(tmp_path, set())[:3] == ["340_0", "340_4", "340_5"]
    (tmp_path / "346").mkdir()  # a single job (no array): its own folder
    assert launcher.task_folders(tmp_path, earlier | {"345", "345_0", "345_1"}) == ["346"]
    assert launcher.task_folders(tmp_path / "absent", set()) == []
