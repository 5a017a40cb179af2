"""`make reproduce`'s driver (hpc_rl/reproduce.py): which members are finished and skipped, and the multiruns that
cover the rest exactly, on real run directories (config.yaml and summary.json as a job writes them); and, on the
local Slurm cluster, what stopping it does to the jobs it submitted."""

from __future__ import annotations

import json
from dataclasses import replace
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from hpc_rl.launch import rank_env
from hpc_rl.reproduce import Panel, finished_members, is_finished, launch_groups, main, read_panel, running_members
from hpc_rl.slurm import active_jobs, job_states, submitted_jobs, task_folders, wait_for_jobs

ROOT = Path(__file__).resolve().parent.parent

# The tests marked light run in the base install tier (scripts/light_tier_check.sh); the others read the checkout's
# conf/ablation (not installed with the package) or need the local Slurm cluster.


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
    # A run time budget (pipeline.max_run_seconds): done when the run's time over its sittings reached it.
    assert is_finished({"state": "time_limit", "version": 80, "run_seconds": 903.0}, 1000000, 900.0)
    assert not is_finished({"state": "time_limit", "version": 30, "run_seconds": 240.5}, 1000000, 900.0)  # a sitting's
    assert not is_finished({"state": "time_limit", "version": 80, "run_seconds": 903.0}, 250)  # no time budget
    assert not is_finished({"state": "cancelled", "version": 80, "run_seconds": 950.0}, 1000000, 900.0)


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


def test_values_run_some_of_a_panels_values(tmp_path, capsys):
    """``--values`` keeps the panel's order and counts only its members; a value the ablation config does not sweep,
    or values given for two panels at once, are refused before anything runs."""
    assert main(["--runs", str(tmp_path), "--panels", "reuse", "--seeds", "3", "4", "--values", "4", "1.0",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 members in 1 panel(s): 0 finished (skipped), 4 to run" in out
    assert "pipeline.target_reuse=1,4 seed=3,4\n" in out
    main(["--runs", str(tmp_path), "--panels", "reuse", "--seeds", "3", "--values", "1", "4", "--dry-run",
          "--launcher", "local"])
    commands = [line for line in capsys.readouterr().out.splitlines() if line.startswith("$ ")]
    assert [c.split()[-2:] for c in commands] == [["pipeline.target_reuse=1", "seed=3"],
                                                   ["pipeline.target_reuse=4", "seed=3"]]
    with pytest.raises(SystemExit, match=r"--values 3: not among the reuse panel's values 1, 2, 4"):
        main(["--runs", str(tmp_path), "--panels", "reuse", "--values", "1", "3", "--dry-run"])
    with pytest.raises(SystemExit, match="name one panel, got staleness reuse"):
        main(["--runs", str(tmp_path), "--panels", "staleness", "reuse", "--values", "1", "--dry-run"])


def test_a_run_without_the_panels_own_settings_is_not_its_member(tmp_path, capsys):
    """The reuse panel fixes a learning rate: a finished run of the same value and seed at another rate (an earlier
    panel's) is not one of its members, unless the command line overrides the rate to that one."""
    assert ("ppo.lr.start", 3.0e-3) in read_panel("reuse").settings
    sweep = tmp_path / "reuse"
    for lr, name in ((3.0e-3, "reuse1-lr0.003-seed3"), (1.0e-3, "reuse2-seed3")):
        value = 1 if lr == 3.0e-3 else 2
        run = sweep / name
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump(
            {"seed": 3, "pipeline": {"target_reuse": value}, "ppo": {"lr": {"start": lr}}}))
        (run / "summary.json").write_text(json.dumps({"state": "finished", "version": 40}))
    panel = replace(read_panel("reuse"), seeds=("3",), versions=40)
    assert finished_members(panel, sweep) == {("1", "3")}
    main(["--runs", str(tmp_path), "--panels", "reuse", "--seeds", "3", "--versions", "40", "--dry-run"])
    assert "pipeline.target_reuse=2,4 seed=3\n" in capsys.readouterr().out
    main(["--runs", str(tmp_path), "--panels", "reuse", "--seeds", "3", "--versions", "40", "--dry-run",
          "ppo.lr.start=1e-3"])
    assert "pipeline.target_reuse=1,4 seed=3 ppo.lr.start=1e-3\n" in capsys.readouterr().out


def test_local_dry_run_runs_each_member_as_its_own_job_seed_by_seed(tmp_path, capsys):
    member_dir(tmp_path / "staleness", "queue2-seed3", 2, 3, {"state": "finished", "version": 40})
    assert main(["--runs", str(tmp_path), "--panels", "staleness", "reuse", "--seeds", "3", "4", "--versions", "40",
                 "--launcher", "local", "--ranks", "7", "--dry-run", "topology.inference=2"]) == 0
    out = capsys.readouterr().out
    assert "12 members in 2 panel(s): 1 finished (skipped), 11 to run, 1 at a time" in out
    commands = [line[2:].split() for line in out.splitlines() if line.startswith("$ ")]
    # Seed by seed across the panels: a sitting cut short leaves every value with about as many seeds.
    assert [(c[5], c[-3], c[-2]) for c in commands] == [
        ("ablation=staleness", "pipeline.staleness_queue=0", "seed=3"),
        ("ablation=staleness", "pipeline.staleness_queue=8", "seed=3"),
        ("ablation=reuse", "pipeline.target_reuse=1", "seed=3"),
        ("ablation=reuse", "pipeline.target_reuse=2", "seed=3"),
        ("ablation=reuse", "pipeline.target_reuse=4", "seed=3"),
        ("ablation=staleness", "pipeline.staleness_queue=0", "seed=4"),
        ("ablation=staleness", "pipeline.staleness_queue=2", "seed=4"),
        ("ablation=staleness", "pipeline.staleness_queue=8", "seed=4"),
        ("ablation=reuse", "pipeline.target_reuse=1", "seed=4"),
        ("ablation=reuse", "pipeline.target_reuse=2", "seed=4"),
        ("ablation=reuse", "pipeline.target_reuse=4", "seed=4")]
    first = commands[0]
    assert first[1:5] == ["-m", "hpc_rl.launch", "7", str(ROOT / "jobs" / "train.py")]
    assert first[6:9] == ["experiment=figure5", f"runs_dir={tmp_path / 'staleness'}", "pipeline.max_versions=40"]
    assert first[-1] == "topology.inference=2"


def test_neural_mmo_panels_budget_wall_time_and_take_their_ranks_from_the_topology(tmp_path, capsys):
    """The Neural MMO sweeps give each member 900 s over all its sittings: a member whose sittings summed to that is
    skipped, one whose sitting ended at its own time limit before is run again; each member runs on its composed
    topology's ranks (12: a learner per population and 8 in all) on experiment=nmmo."""
    sweep = tmp_path / "nmmo_populations"
    for name, k, seed, summary in (("populations1-seed3", 1, 3, {"state": "time_limit", "run_seconds": 901.5}),
                                   ("populations2-seed3", 2, 3, {"state": "time_limit", "run_seconds": 240.2})):
        (sweep / name).mkdir(parents=True)
        (sweep / name / "config.yaml").write_text(yaml.safe_dump(
            {"seed": seed, "env": {"nmmo": {"populations": k}}, "topology": {"learner": 8},
             "pipeline": {"max_run_seconds": 900, "max_versions": 1000000, "final_eval_games": 8}}))
        (sweep / name / "summary.json").write_text(json.dumps({**summary, "version": 50}))
    assert main(["--runs", str(tmp_path), "--panels", "nmmo_populations", "--seeds", "3", "--launcher", "local",
                 "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "4 members in 1 panel(s): 1 finished (skipped), 3 to run" in out
    assert "== nmmo_populations (env.nmmo.populations, 900 s of training each): 1/4 finished, 3 to run" in out
    commands = [line[2:].split() for line in out.splitlines() if line.startswith("$ ")]
    assert [c[-2] for c in commands] == ["env.nmmo.populations=2", "env.nmmo.populations=4", "env.nmmo.populations=8"]
    assert commands[0][1:4] == ["-m", "hpc_rl.launch", "12"]
    assert "experiment=nmmo" in commands[0] and "pipeline.max_versions=1000000" in commands[0]
    main(["--runs", str(tmp_path), "--panels", "nmmo_agents", "--seeds", "3", "--dry-run", "--launcher", "local"])
    assert [c.split()[4] for c in capsys.readouterr().out.splitlines() if c.startswith("$ ")] == ["5"] * 4
    with pytest.raises(SystemExit, match="Figure 5's panels and Neural MMO's train different presets"):
        main(["--runs", str(tmp_path), "--panels", "staleness", "nmmo_agents", "--dry-run"])


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_stopped_local_sitting_stops_its_members_and_they_resume(tmp_path):
    """``--launcher local`` on one node without Slurm: SIGTERM to the driver is passed on to every running member,
    whose ranks commit a checkpoint and end cancelled; the members are left to resume, none is left running."""
    runs = tmp_path / "runs"
    driver = _driver(runs, "--launcher", "local", "--parallel", "2")
    sweep, deadline, poll = runs / "staleness", time.monotonic() + 300, 0.5
    try:
        # Both running members past their first checkpoint (checkpoint_every=2 versions).
        while len(list(sweep.glob("*/checkpoints/v*.h5"))) < 2 or \
                len({p.parent.parent for p in sweep.glob("*/checkpoints/v*.h5")}) < 2:
            assert driver.poll() is None, driver.communicate()
            assert time.monotonic() < deadline, "the members did not reach their first checkpoint"
            time.sleep(poll)
            poll = min(poll * 1.5, 5.0)
        tree = psutil.Process(driver.pid).children(recursive=True)
        driver.send_signal(signal.SIGTERM)
        out, err = driver.communicate(timeout=180)
    finally:
        driver.kill()
    assert driver.returncode == 128 + signal.SIGTERM, (out, err)
    assert "passed the stop on to 2 running member(s); run again to resume" in err, err
    assert not [p for p in tree if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    summaries = {d.name: json.loads((d / "summary.json").read_text()) for d in sweep.iterdir() if
                 (d / "summary.json").is_file()}
    assert sorted(summaries) == ["queue0-seed9", "queue2-seed9"], summaries  # the third never started
    assert {s["state"] for s in summaries.values()} == {"cancelled"}, summaries
    assert (sweep / "logs" / "0-seed9.log").is_file()
    dry = subprocess.run([sys.executable, "-m", "hpc_rl.reproduce", "--runs", str(runs), "--panels", "staleness",
                          "--seeds", "9", "--versions", "100000", "--launcher", "local", "--dry-run"], cwd=ROOT,
                         env=rank_env(), capture_output=True, text=True, timeout=120)
    assert "0 finished (skipped), 3 to run" in dry.stdout, dry.stdout


@pytest.mark.light
def test_task_folders_leave_out_earlier_jobs(tmp_path):
    # A resumed sweep launches into a directory whose .submitit/ holds an earlier, cancelled array (tasks 4 and 5
    # never ran, so they left no result): the failed-member watchdog and the driver's cancel see this launch's only.
    for name in ("340", "340_0", "340_4", "340_5"):
        (tmp_path / name).mkdir()
    (tmp_path / "multirun.yaml").write_text("")
    earlier = {p.name for p in tmp_path.iterdir()}
    for name in ("345", "345_0", "345_1"):
        (tmp_path / name).mkdir()
    assert task_folders(tmp_path, earlier) == ["345_0", "345_1"]
    assert submitted_jobs(tmp_path, earlier) == ["345"]
    assert task_folders(tmp_path, set())[:3] == ["340_0", "340_4", "340_5"]
    assert submitted_jobs(tmp_path) == ["340", "345"]
    (tmp_path / "346").mkdir()  # a single job (no array): its own folder
    assert task_folders(tmp_path, earlier | {"345", "345_0", "345_1"}) == ["346"]
    assert task_folders(tmp_path / "absent", set()) == []


def _driver(runs: Path, *extra: str) -> subprocess.Popen:
    """``make reproduce``'s driver on one staleness seed whose members would run far longer than the test."""
    return subprocess.Popen([sys.executable, "-m", "hpc_rl.reproduce", "--runs", str(runs), "--panels", "staleness",
                             "--seeds", "9", "--versions", "100000", "pipeline.checkpoint_every=2", *extra],
                            cwd=ROOT, env=rank_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # signalled alone, as by kill or a scheduler, not as a group


def _member_running(runs: Path, driver: subprocess.Popen, timeout: float = 300) -> tuple[str, int]:
    """Wait until a member of the driver's multirun has started its job (its run directory's meta.json written
    since the driver started); return the multirun's Slurm job id and the multirun's pid."""
    sweep, started = runs / "staleness", time.time()
    earlier = set(submitted_jobs(sweep / ".submitit"))
    deadline = time.monotonic() + timeout
    while not any(meta.stat().st_mtime >= started for meta in sweep.glob("*/meta.json")):
        assert driver.poll() is None, driver.communicate()
        assert time.monotonic() < deadline, "no member started"
        time.sleep(0.5)
    jobs = [job for job in submitted_jobs(sweep / ".submitit") if job not in earlier]
    children = subprocess.run(["pgrep", "-P", str(driver.pid)], capture_output=True, text=True).stdout.split()
    assert len(jobs) == 1 and len(children) == 1, (jobs, children)
    return jobs[0], int(children[0])


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


@pytest.mark.slurm
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_a_stopped_driver_cancels_its_jobs_and_a_killed_ones_are_not_launched_twice(slurm_cluster, tmp_path):
    runs = tmp_path / "runs"
    # SIGKILL: the driver cannot clean up. Its multirun and the array job live on; the next driver must not launch
    # their members a second time beside them.
    first = _driver(runs)
    try:
        job, multirun = _member_running(runs, first)
    finally:
        first.kill()
        first.communicate(timeout=30)
    try:
        second = _driver(runs)
        out, err = second.communicate(timeout=120)
        assert second.returncode != 0
        assert f"still queued or running in staleness: {job}" in err and f"scancel {job}" in err, err
        assert active_jobs([job]) == [job]  # the refusal cancels nothing either
    finally:
        os.kill(multirun, signal.SIGKILL)  # the orphaned multirun: nothing of the test may outlive it
        subprocess.run(["scancel", job], timeout=30)
    assert set(wait_for_jobs([job], timeout=120).values()) == {"CANCELLED"}

    # SIGTERM: the driver ends its multirun and cancels its own job; the member's run is left to resume.
    third = _driver(runs)
    try:
        job, multirun = _member_running(runs, third)
        third.send_signal(signal.SIGTERM)
        out, err = third.communicate(timeout=120)
    finally:
        third.kill()
    assert third.returncode == 128 + signal.SIGTERM, (out, err)
    assert f"stopped by SIGTERM: ended the staleness multirun and cancelled its Slurm jobs ({job})" in err, err
    assert not _alive(multirun)
    assert set(wait_for_jobs([job], timeout=120).values()) == {"CANCELLED"}, job_states(job)
    assert active_jobs(submitted_jobs(runs / "staleness" / ".submitit")) == []
    started = running_members(runs / "staleness", replace(read_panel("staleness"), versions=100000))
    assert started, "the cancelled member's run directory is left unfinished, to resume"
    dry = subprocess.run([sys.executable, "-m", "hpc_rl.reproduce", "--runs", str(runs), "--panels", "staleness",
                          "--seeds", "9", "--versions", "100000", "--dry-run"], cwd=ROOT, env=rank_env(),
                         capture_output=True, text=True, timeout=120)
    assert "0 finished (skipped), 3 to run" in dry.stdout, dry.stdout
