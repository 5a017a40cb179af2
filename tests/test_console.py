"""What a training job prints for its user (hpc_rl.roles.console): banner, progress line, summary; in-process."""

from pathlib import Path

import pytest

from hpc_rl.roles.console import (duration, final_eval_line, progress_line, rank_ranges, sitting_limit,
                                  start_banner, summary_block, time_left, waiting_line)

ROLES = {0: "controller", 1: "env[0]", 2: "env[1]", 3: "inference[0]", 4: "learner[0]", 5: "learner[1]"}


def test_durations_and_rank_ranges():
    assert [duration(s) for s in (0, 59.6, 61, 3599, 3600, 7384)] == ["0:00", "1:00", "1:01", "59:59", "1:00:00",
                                                                       "2:03:04"]
    assert rank_ranges(ROLES) == "0 controller, 1-2 env, 3 inference, 4-5 learner"
    # Roles that interleave stay apart; an evaluator rank comes last.
    assert rank_ranges({0: "controller", 1: "env[0]", 2: "learner[0]", 3: "env[1]", 4: "evaluator[0]"}) == (
        "0 controller, 1 env, 2 learner, 3 env, 4 evaluator")


def test_start_banner_says_where_what_budget_and_how_to_stop():
    fresh = start_banner(Path("/r/runs/demo"), -1, None, ROLES, "MOBA 1v1 training", 500, 600.0, "Ctrl-C stops")
    assert fresh.splitlines() == ["hpc_rl: MOBA 1v1 training; new run in /r/runs/demo",
                                  "  ranks: 0 controller, 1-2 env, 3 inference, 4-5 learner",
                                  "  budget: until version 500 or 10:00 of wall time, whichever comes first",
                                  "  stop: Ctrl-C stops"]
    resumed = start_banner(Path("/r/x"), 40, "v00000040.h5", {0: "controller"}, "gym:CartPole-v1 training", 50, 0.0,
                           None)
    assert resumed.splitlines() == ["hpc_rl: gym:CartPole-v1 training; resuming /r/x from version 40 (v00000040.h5)",
                                    "  ranks: 0 controller", "  budget: until version 50"]


def test_time_left_is_whichever_limit_ends_the_run_first():
    # 10 versions in 100 s from version 0: 490 more versions take 4900 s, the time limit ends it in 500 s.
    assert time_left(100.0, 10, 0, 500, 600.0) == 500.0
    assert time_left(100.0, 10, 0, 20, 600.0) == 100.0  # the versions end it first
    assert time_left(100.0, 30, 20, 40, 0.0) == 100.0  # a resumed attempt's pace counts its own versions only
    assert time_left(700.0, 10, 0, 500, 600.0) == 0.0  # past the limit, before the stop lands
    assert time_left(5.0, 0, 0, 500, 0.0) is None  # no version yet, no time limit: unknown


def test_a_sitting_stops_at_its_own_limit_or_at_what_is_left_of_the_runs():
    assert sitting_limit(0.0, 0.0, 500.0) == (0.0, "")  # no limit
    assert sitting_limit(600.0, 0.0, 500.0) == (600.0, "time limit of 600 s")  # a sitting's limit ignores the past
    # The run's budget counts the earlier sittings: 900 s with 700 s spent leaves this sitting 200 s.
    assert sitting_limit(0.0, 900.0, 700.0) == (200.0, "the run's time limit of 900 s (700 s in earlier sittings)")
    assert sitting_limit(150.0, 900.0, 700.0) == (150.0, "time limit of 150 s")  # whichever is shorter
    assert sitting_limit(600.0, 900.0, 0.0) == (600.0, "time limit of 600 s")
    # A run that spent its budget stops at its next version.
    assert sitting_limit(0.0, 900.0, 950.0) == (1.0, "the run's time limit of 900 s (950 s in earlier sittings)")


def test_progress_line_keeps_the_version_first_and_shows_the_clock():
    line = progress_line(12, 724.0, 190.0, [("env", "2108 steps/s"), ("return", "21.5")])
    assert line == "v   12  12:04 elapsed, ~3:10 left  env 2108 steps/s  return 21.5"
    assert progress_line(3, 5.0, None, []) == "v    3  0:05 elapsed"


def test_waiting_line_names_the_version_to_come_and_is_not_a_progress_line():
    line = waiting_line(0, 90.0, [("env", "131 steps/s"), ("games", "12")])
    assert line == "waiting for version 1  1:30 elapsed  env 131 steps/s  games 12"
    assert not line.startswith("v")


MOBA_EVAL = {"games": 100, "wins": 43, "draws": 7, "win_rate": 0.43, "ci95": [0.3373, 0.5286], "bot": "scripted",
             "bot_hash": "ab12", "seed": 12345, "seconds": 41.2}


def test_final_evaluation_line():
    assert final_eval_line(MOBA_EVAL) == ("win rate 0.43 [0.34, 0.53] over 100 games vs scripted (both sides, "
                                          "draws lose), 41 s")
    gym = {"episodes": 100, "mean_return": 487.25, "std_return": 20.0, "seed": 12345, "seconds": 2.0}
    assert final_eval_line(gym) == "mean greedy return 487.2 (std 20.0) over 100 episodes, 2 s"
    assert final_eval_line(None) == "none"


@pytest.mark.parametrize("state, ending", [("finished", "finished"), ("time_limit", "stopped by its time limit"),
                                           ("cancelled", "stopped by a signal (TERM, or USR1: Ctrl-C)")])
def test_summary_block(state, ending):
    summary = {"run_name": "demo", "state": state, "version": 238, "seconds": 641.0,
               "final_eval": MOBA_EVAL if state != "cancelled" else None,
               "final_eval_note": None if state != "cancelled" else "stopped by a signal: the job ends without it",
               "files": {"run_dir": "/r/demo", "metrics": "/r/demo/metrics.h5"},
               "next": ["tensorboard --logdir /r/demo/tensorboard", "python jobs/evaluate.py /r/demo --games 400"]}
    lines = summary_block(summary).splitlines()
    assert lines[0] == f"== run demo {ending} at version 238 after 10:41 =="
    if state == "cancelled":
        assert lines[1:3] == ["final evaluation: none", "  (stopped by a signal: the job ends without it)"]
    else:
        assert lines[1] == ("final evaluation: win rate 0.43 [0.34, 0.53] over 100 games vs scripted (both sides, "
                            "draws lose), 41 s")
    assert lines[-6:] == ["files:", "  run_dir  /r/demo", "  metrics  /r/demo/metrics.h5", "next:",
                          "  tensorboard --logdir /r/demo/tensorboard",
                          "  python jobs/evaluate.py /r/demo --games 400"]
