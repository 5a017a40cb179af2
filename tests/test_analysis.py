"""Offline analysis (``hpc_rl.study``, ``hpc_rl.stats``): the maths against hand-computed cases and slow references,
and every ``analysis/`` script run on synthetic run and sweep directories (real metrics.h5 files written by
MetricsWriter) with its tables checked."""

from __future__ import annotations

import importlib.util
import itertools
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from hpc_rl.stats import mean_ci95, permutation_p, ratio_ci95, spread, trailing_mean, wilson_interval
from hpc_rl.study import (choose_baseline, default_metric, default_thresholds, direction_test, first_crossing,
                          load_runs, markdown_table, measured_reuse, measured_staleness, speedup, speedup_rows,
                          staleness_histogram, swept_key)
from hpc_rl.storage import MetricsWriter
from hpc_rl.storage.metrics import ROW
from hpc_rl.storage.run import record_config_changes

pytestmark = pytest.mark.light  # runs in the base install tier (scripts/light_tier_check.sh)

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("curves", "win_rate", "data_quality", "throughput", "speedup", "go_selfplay")
T0 = 1_700_000_000.0  # wall clock of every synthetic run's first row


# --- slow references, written like the definitions -----------------------------------------------------------
def wilson_by_scan(wins: int, games: int, z: float = 1.96, grid: int = 200_001) -> tuple[float, float]:
    """Every p on a fine grid with (p̂ − p)² <= z² p (1 − p) / n: the Wilson interval's definition, by brute force."""
    p = np.linspace(0.0, 1.0, grid)
    inside = p[(wins / games - p) ** 2 <= z * z * p * (1 - p) / games]
    return float(inside.min()), float(inside.max())


def permutation_p_by_enumeration(slower: list, faster: list) -> float:
    """Every ordering of the pooled seeds, the first len(slower) taken as the slower group: the share of orderings
    whose Mann-Whitney U (pairs slower > faster, ties one half; never reached = None, above every number) is at
    least the observed one."""
    def key(v):
        return math.inf if v is None else v

    def u(a, b):
        return sum((key(x) > key(y)) + 0.5 * (key(x) == key(y)) for x in a for y in b)

    pooled, k = slower + faster, len(slower)
    observed = u(slower, faster)
    orders = list(itertools.permutations(pooled))
    return sum(u(o[:k], o[k:]) >= observed for o in orders) / len(orders)


def rows(pairs: list[tuple[int, float]]) -> np.ndarray:
    return np.array([(v, 10 * v, T0 + v, x) for v, x in pairs], dtype=ROW)


# --- pure computations ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("wins,games", [(0, 10), (10, 10), (3, 10), (15, 20), (1, 1), (47, 400)])
def test_wilson_interval_matches_its_definition(wins, games):
    low, high = wilson_interval(wins, games)
    ref_low, ref_high = wilson_by_scan(wins, games)
    assert low == pytest.approx(ref_low, abs=1e-5) and high == pytest.approx(ref_high, abs=1e-5)


def test_wilson_interval_hand_cases():
    # 0 of n: the interval is [0, z² / (n + z²)].
    assert wilson_interval(0, 10) == pytest.approx((0.0, 1.96 ** 2 / (10 + 1.96 ** 2)))
    assert wilson_interval(0, 0) == (0.0, 1.0)
    with pytest.raises(ValueError, match="wins <= games"):
        wilson_interval(11, 10)


def test_ratio_ci95_agrees_with_the_bootstrap():
    # Skewed positive samples as lifetimes are (exponential, the head-to-head's sizes times four): the delta method's
    # interval on the log scale against the bootstrap percentile interval of the ratio of means (the slow reference).
    rng = np.random.default_rng(0)
    a, b = rng.exponential(33.0, 320), rng.exponential(7.0, 700)
    ratio, low, high = ratio_ci95(a, b)
    assert ratio == a.mean() / b.mean()
    draws = 20_000
    boot = (a[rng.integers(0, a.size, (draws, a.size))].mean(axis=1)
            / b[rng.integers(0, b.size, (draws, b.size))].mean(axis=1))
    ref_low, ref_high = np.quantile(boot, [0.025, 0.975])
    assert low == pytest.approx(ref_low, rel=0.02) and high == pytest.approx(ref_high, rel=0.02)
    assert high - ratio > ratio - low and ref_high - ratio > ratio - ref_low  # wider above than below, as both are


def test_ratio_ci95_covers_the_true_ratio_95_times_in_100():
    # 4,000 head-to-head-sized experiments (80 and 175 lifetimes) from exponentials of means 33 and 7.
    rng = np.random.default_rng(1)
    trials, true = 4_000, 33.0 / 7.0
    a, b = rng.exponential(33.0, (trials, 80)), rng.exponential(7.0, (trials, 175))
    covered = sum(low <= true <= high for _, low, high in (ratio_ci95(x, y) for x, y in zip(a, b)))
    assert 0.93 <= covered / trials <= 0.965, covered / trials


def _worlds_of_lifetimes(rng, worlds: int):
    """Lifetimes of two players' agents over ``worlds`` worlds, clustered as evaluation worlds are: each world's map
    lengthens or shortens every life in it (u, both sides), and the trained side's lives besides (v); 2-8 and 5-15
    agents a side per world. The ratio of means tends to 33/7 · E[v]."""
    u, v = rng.lognormal(0, 0.5, worlds), rng.lognormal(0, 0.4, worlds)
    wa = np.repeat(np.arange(worlds), rng.integers(2, 9, worlds))
    wb = np.repeat(np.arange(worlds), rng.integers(5, 16, worlds))
    return rng.exponential(33 * (u * v)[wa]), rng.exponential(7 * u[wb]), wa, wb


def test_ratio_ci95_by_world_agrees_with_the_bootstrap_over_worlds():
    rng = np.random.default_rng(3)
    a, b, wa, wb = _worlds_of_lifetimes(rng, 128)
    ratio, low, high = ratio_ci95(a, b, wa, wb)
    assert ratio == a.mean() / b.mean()
    # The slow reference: resample whole worlds, the ratio of the resampled agents' means, percentile interval.
    boot = []
    for _ in range(4_000):
        take = rng.integers(0, 128, 128)
        pick_a, pick_b = np.concatenate([a[wa == w] for w in take]), np.concatenate([b[wb == w] for w in take])
        boot.append(pick_a.mean() / pick_b.mean())
    ref_low, ref_high = np.quantile(boot, [0.025, 0.975])
    assert low == pytest.approx(ref_low, rel=0.03) and high == pytest.approx(ref_high, rel=0.03)
    # The same values taken as independent draws give a narrower interval.
    _, ind_low, ind_high = ratio_ci95(a, b)
    assert ind_high - ind_low < high - low


def test_ratio_ci95_by_world_covers_where_independent_draws_do_not():
    # 2,000 evaluations of 128 clustered worlds: by world the interval covers the true ratio about 95 times in 100;
    # taking every lifetime as an independent draw, fewer.
    rng = np.random.default_rng(2)
    true, trials = 33 / 7 * np.exp(0.4 ** 2 / 2), 2_000
    by_world = independent = 0
    for _ in range(trials):
        a, b, wa, wb = _worlds_of_lifetimes(rng, 128)
        by_world += ratio_ci95(a, b, wa, wb)[1] <= true <= ratio_ci95(a, b, wa, wb)[2]
        independent += ratio_ci95(a, b)[1] <= true <= ratio_ci95(a, b)[2]
    assert 0.93 <= by_world / trials <= 0.965 and independent / trials < 0.925, (by_world, independent)


def test_ratio_ci95_and_mean_ci95_edge_cases():
    assert math.isnan(ratio_ci95(np.array([3.0]), np.array([1.0, 2.0]))[1])
    assert ratio_ci95(np.array([3.0]), np.array([1.0, 2.0]))[0] == 2.0
    with pytest.raises(ValueError, match="values on both sides"):
        ratio_ci95(np.array([]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="positive means"):
        ratio_ci95(np.array([0.0, 0.0]), np.array([1.0, 2.0]))
    with pytest.raises(ValueError, match="both sides or of neither"):
        ratio_ci95(np.array([1.0, 2.0]), np.array([1.0, 2.0]), np.array([0, 1]))
    with pytest.raises(ValueError, match="one world per value"):
        ratio_ci95(np.array([1.0, 2.0]), np.array([1.0, 2.0]), np.array([0]), np.array([0, 1]))
    assert math.isnan(ratio_ci95(np.array([1.0, 2.0]), np.array([1.0, 2.0]), np.array([0, 0]), np.array([0, 0]))[1])
    mean, low, high = mean_ci95(np.array([1.0, 3.0]))
    assert (mean, low, high) == pytest.approx((2.0, 2.0 - 1.96, 2.0 + 1.96))  # sd sqrt(2), n 2: se 1
    assert math.isnan(mean_ci95(np.array([5.0]))[1])


def test_trailing_mean_against_loop():
    values = np.array([1.0, 2.0, 3.0, 4.0, 10.0])
    assert trailing_mean(values, 2).tolist() == [1.0, 1.5, 2.5, 3.5, 7.0]
    rng = np.random.default_rng(0)
    x = rng.normal(size=50)
    slow = [np.mean(x[max(0, i - 6):i + 1]) for i in range(50)]
    assert np.allclose(trailing_mean(x, 7), slow)
    with pytest.raises(ValueError, match="window"):
        trailing_mean(x, 0)


def test_first_crossing():
    versions = np.array([1, 2, 3, 4, 5])
    values = np.array([0.1, np.nan, 0.49, 0.5, 0.2])
    assert first_crossing(versions, values, 0.5) == 4  # >= counts, the later dip does not undo it
    assert first_crossing(versions, values, 0.0) == 1
    assert first_crossing(versions, values, 0.6) is None
    assert first_crossing(versions[::-1], values[::-1], 0.45) == 3  # rows out of order are sorted by version
    with pytest.raises(ValueError, match="shape"):
        first_crossing(versions, values[:3], 0.5)


def test_speedup_is_eq_2():
    assert speedup(10, 20) == 0.5
    assert speedup(30, 10) == 3.0
    assert speedup(None, 10) is None and speedup(10, None) is None
    with pytest.raises(ValueError, match="> 0"):
        speedup(10, 0)


def test_staleness_histogram_and_measured_staleness():
    metrics = {f"data/staleness_hist/{b:02d}": rows([(1, 0.0), (2, 0.0)]) for b in range(16)}
    metrics["data/staleness_hist/01"] = rows([(1, 300.0), (2, 0.0)])
    metrics["data/staleness_hist/04"] = rows([(1, 0.0), (2, 100.0)])
    metrics["data/staleness_hist/15"] = rows([(1, 0.0), (2, 0.0)])
    metrics["data/staleness_mean"] = rows([(1, 1.0), (2, 4.0)])
    hist = staleness_histogram(metrics)
    assert hist[1] == 300 and hist[4] == 100 and hist.sum() == 400
    # Per sample: (300 x 1 + 100 x 4) / 400, not the mean over versions (2.5).
    assert measured_staleness(metrics) == pytest.approx(1.75)
    del metrics["data/staleness_hist/07"]
    assert measured_staleness(metrics) == pytest.approx(2.5)
    with pytest.raises(ValueError, match="staleness_hist/07"):
        staleness_histogram(metrics)
    assert measured_reuse({"data/reuse": rows([(1, 1.0), (2, 2.0), (3, 3.0)])}) == pytest.approx(2.0)


def test_spread_counts_seeds_that_never_reached():
    s = spread([0.5, None, 0.4])
    assert (s.n, s.runs) == (2, 3)
    assert s.mean == pytest.approx(0.45) and s.min == 0.4 and s.max == 0.5
    assert s.std == pytest.approx(math.sqrt(2 * 0.05 ** 2))
    assert spread([None]).n == 0 and math.isnan(spread([None]).mean)


@pytest.mark.parametrize("slower,faster", [
    ([5, 6, 7], [1, 2, 3]),                 # the smallest p of 3 against 3: 1 / 20
    ([1, 2, 3], [5, 6, 7]),                 # the opposite direction: p = 1
    ([40, None, 35, 30], [20, 25, 30, 50]),  # a tie across the groups and a seed that never reached
    ([None, None, 10], [None, 12, 8]),       # ties among seeds that never reached
    ([4, 4, 4], [4, 4]),                     # all tied: every split is as extreme, p = 1
    ([9, 2, 7, 5, 6], [1, 3]),               # unequal groups
])
def test_permutation_p_matches_enumeration(slower, faster):
    assert permutation_p(slower, faster) == pytest.approx(permutation_p_by_enumeration(slower, faster), abs=1e-12)


def test_permutation_p_sampled_and_errors():
    # 7 against 7 is 3,432 splits: exact below the limit, sampled above it (p = (1 + hits) / (1 + draws)).
    slower, faster = [30, 31, 45, None, 28, 40, 33], [20, 29, 25, 35, 22, 27, 26]
    exact = permutation_p(slower, faster)
    assert 0 < exact < 0.01
    sampled = permutation_p(slower, faster, exact_limit=0, draws=20_000, seed=1)
    assert sampled == pytest.approx(exact, abs=0.003) and sampled > 0
    assert permutation_p([5], [1], exact_limit=0, draws=9) > 0  # never 0, even when every draw misses
    with pytest.raises(ValueError, match="both sides"):
        permutation_p([], [1, 2])
    with pytest.raises(ValueError, match="NaN"):
        permutation_p([float("nan")], [1.0])


def test_direction_tests_of_the_three_panels():
    # Staleness: queue 8 took 40, 50, never; queue 0 took 10, 12, 11: the one split of 20 most extreme.
    stale = direction_test({0.0: [10, 12, 11], 2.0: [20, 10, 30], 8.0: [40, 50, None]}, 0.0,
                           "pipeline.staleness_queue", 195.0)
    assert stale.p == pytest.approx(0.05)
    assert stale.line() == "direction test: staleness 8 is slower than 0 (versions to 195, one-sided), p = 0.05"
    # Reuse: reuse 4 faster than 1, so the test of "slower" fails.
    reuse = direction_test({1.0: [30, 40, 35], 4.0: [10, 12, 11]}, 1.0, "pipeline.target_reuse", 100.0)
    assert reuse.p == 1.0 and reuse.line().startswith("direction test: reuse 4 is slower than 1 (")
    # Batch, baseline 2: segments 8 (4x) took 40-48 against 100-120: fewer, and x4 = 160-192 more than 100-120.
    key = "pipeline.segments_per_batch"
    sublinear = {1.0: [200, 210, 220], 2.0: [100, 110, 120], 4.0: [60, 70, 65], 8.0: [40, 44, 48]}
    test = direction_test(sublinear, 2.0, key, 195.0)
    assert test.p == pytest.approx(0.05)
    assert test.what.startswith("a 4x batch (segments_per_batch 8) needs fewer versions to 195 than the baseline (2)")
    # Linear or better (x4 = 80-96 versions, below the baseline's): the sublinear half fails, p is the larger.
    superlinear = {**sublinear, 8.0: [20, 22, 24]}
    assert direction_test(superlinear, 2.0, key, 195.0).p == 1.0
    # No gain (the 4x batch never reached T): the "fewer versions" half fails.
    assert direction_test({**sublinear, 8.0: [None, None, None]}, 2.0, key, 195.0).p == 1.0
    # Without a 4x batch, the largest above the baseline and its own ratio.
    test = direction_test({1.0: [100, 110, 115], 2.0: [60, 70, 65]}, 1.0, key, 195.0)
    assert "a 2x batch" in test.what and "1/2 as many" in test.what and test.p == pytest.approx(0.05)
    assert direction_test({2.0: [1], 1.0: [2]}, 2.0, key, 1.0).p is None
    assert direction_test({0.0: [1, 2]}, 0.0, "pipeline.staleness_queue", 1.0).line().endswith("p = -")
    with pytest.raises(ValueError, match="baseline value 3"):
        direction_test({0.0: [1]}, 3.0, key, 1.0)


def test_speedup_rows_hand_case():
    # crossings[value][seed][threshold]; thresholds (T1, T2).
    crossings = {0.0: [[5, 10], [5, 10]], 2.0: [[10, 20], [13, 25]], 8.0: [[20, 40], [20, None]]}
    rows_ = {(r.value, r.threshold): r for r in speedup_rows(crossings, 0.0, [1.0, 2.0])}
    assert rows_[(2.0, 2.0)].speedups.values == (0.5, 0.4)
    assert rows_[(8.0, 2.0)].speedups.values == (0.25,) and rows_[(8.0, 2.0)].speedups.runs == 2
    assert rows_[(0.0, 1.0)].speedups.values == (1.0, 1.0)
    assert rows_[(2.0, 1.0)].versions.mean == 11.5
    # Baseline 8: at T2 one of its two seeds reached (half: trusted), at T1 both.
    rows_ = {(r.value, r.threshold): r for r in speedup_rows(crossings, 8.0, [1.0, 2.0])}
    assert rows_[(0.0, 2.0)].speedups.values == (4.0, 4.0)
    rows_ = {(r.value, r.threshold): r for r in speedup_rows(crossings, 8.0, [1.0, 2.0], min_reached=0.75)}
    assert rows_[(0.0, 2.0)].baseline_versions is None and rows_[(0.0, 2.0)].speedups.n == 0
    with pytest.raises(ValueError, match="one entry per threshold"):
        speedup_rows(crossings, 0.0, [1.0])
    with pytest.raises(ValueError, match="baseline value 3"):
        speedup_rows(crossings, 3.0, [1.0, 2.0])


def test_choose_baseline_and_thresholds():
    assert choose_baseline([8, 0, 2], "smallest") == 0 and choose_baseline([8, 0, 2], "largest") == 8
    assert choose_baseline([1.0, 2.0, 4.0], "2") == 2.0
    with pytest.raises(ValueError, match="not a swept value"):
        choose_baseline([1.0, 2.0], "3")
    with pytest.raises(ValueError, match="--baseline"):
        choose_baseline([1.0, 2.0], "middle")
    # Baseline seeds start at 0.0 and 0.2 (mean 0.1) and peak at 0.9 and 0.7 (mean 0.8).
    assert default_thresholds([np.array([0.0, 0.9, 0.5]), np.array([np.nan, 0.2, 0.7])], (0.5, 1.0)) == \
        pytest.approx([0.45, 0.8])
    with pytest.raises(ValueError, match="never rises"):
        default_thresholds([np.zeros(5), np.zeros(3)])


def test_markdown_table_is_aligned_and_checked():
    text = markdown_table(["a", "bb"], [[1, "x"], ["long", 2]])
    assert text.splitlines() == ["| a    | bb |", "|------|----|", "| 1    | x  |", "| long | 2  |"]
    with pytest.raises(ValueError, match="2 cells"):
        markdown_table(["a"], [[1, 2]])


# --- synthetic run and sweep directories -----------------------------------------------------------------------
def config(seed: int = 0, queue: int = 0, reuse: float = 1.0, segments: int = 4) -> dict:
    return {"run_name": f"r{seed}", "runs_dir": "runs", "seed": seed, "env": {"name": "moba", "num_envs": 8},
            "topology": {"env": 2, "inference": 1, "learner": 2, "evaluator": 0},
            "pipeline": {"segment_len": 64, "segments_per_batch": segments, "staleness_queue": queue,
                         "target_reuse": reuse},
            "ppo": {"epochs": 1}}


def write_run(path: Path, cfg: dict, series: dict[str, list[float]]) -> None:
    """A run directory: config.yaml, meta.json, status.json and metrics.h5 with one row per version 1..N."""
    path.mkdir(parents=True)
    (path / "config.yaml").write_text(yaml.safe_dump(cfg))
    (path / "meta.json").write_text("{}")
    (path / "status.json").write_text('{"state": "finished", "version": %d}' % len(next(iter(series.values()))))
    with MetricsWriter(path / "metrics.h5", flush_every_s=1e9) as writer:
        for name, values in series.items():
            for v, x in enumerate(values, 1):
                writer.log(name, v, 1000 * v, x, wall_time=T0 + 60.0 * v)


def pipeline_series(n: int, staleness: int, reuse: float) -> dict[str, list[float]]:
    series = {f"data/staleness_hist/{b:02d}": [100.0 if b == staleness else 0.0] * n for b in range(16)}
    series["data/staleness_mean"] = [float(staleness)] * n
    series["data/reuse"] = [reuse] * n
    return series


def ramp(n: int, reach: int, cap: float = 0.9) -> list[float]:
    """0.5 x v / reach, capped: first >= 0.5 at version ``reach`` (never when cap < 0.5), >= 0.25 at ceil(reach/2)."""
    return [min(0.5 * v / reach, cap) for v in range(1, n + 1)]


@pytest.fixture(scope="module")
def dirs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("analysis")
    n = 30
    moba = pipeline_series(n, 0, 1.0)
    moba.update({f"data/staleness_hist/{b:02d}": [30.0 if b == 0 else 10.0 if b == 1 else 0.0] * n
                 for b in range(16)})
    moba["data/staleness_mean"] = [0.25] * n
    moba["data/reuse"] = [1.0 + 0.01 * v for v in range(1, n + 1)]
    moba["data/rejected_segments"] = [0.0] * (n - 1) + [3.0]
    moba["eval/games_vs_scripted"] = [20.0] * n
    moba["eval/win_rate_vs_scripted"] = [min(v // 2, 20) / 20 for v in range(1, n + 1)]
    moba["perf/env_steps_per_s"] = [1000.0 + v for v in range(1, n + 1)]
    moba["perf/learner_samples_per_s"] = [500.0] * n
    moba["perf/inference_batch"] = [16.0] * n
    moba["perf/inference_passes"] = [0.0] * 16 + [1.0] * 4 + [2.0] * (n - 20)
    moba["perf/inference_ms"] = [0.0] * 16 + [2.5] * (n - 16)  # 0: no inference report yet (left out)
    moba["perf/env_steps"] = [1000.0 * v for v in range(1, n + 1)]
    moba["perf/wall_seconds"] = [60.0 * v for v in range(1, n + 1)]
    write_run(root / "moba_run", config(), moba)
    record_config_changes(root / "moba_run" / "config_changes.jsonl", 12, [("ppo.lr.start", 0.001, 0.0001)])
    gym = pipeline_series(10, 1, 1.0)
    gym["stats/episode_return"] = [float(v) for v in range(10)]
    gym["perf/env_steps_per_s"] = [200.0] * 10
    write_run(root / "gym_run", config(), gym)
    rated = dict(moba)
    rated["eval/trueskill/policy"] = [5.0 * v for v in range(1, n + 1)]
    rated["eval/trueskill/scripted"] = [40.0] * n
    write_run(root / "rated_run", config(), rated)

    # A staleness sweep (queue 0, 2, 8; two seeds): first >= 0.5 at versions 10, 10 | 20, 25 | 40, never.
    sweep = root / "ablation_staleness"
    sweep.mkdir()
    reach = {0: (10, 10), 2: (20, 25), 8: (40, 40)}
    lines, number = [], 0
    for queue, seeds in reach.items():
        for seed, r in enumerate(seeds):
            series = pipeline_series(60, queue, 1.0)
            series["eval/win_rate_vs_scripted"] = ramp(60, r, cap=0.3 if (queue, seed) == (8, 1) else 0.9)
            series["eval/games_vs_scripted"] = [20.0] * 60
            write_run(sweep / str(number), config(seed, queue=queue), series)
            lines.append(f"{number}\tpipeline.staleness_queue={queue} seed={seed}")
            number += 1
    lines.append("9\tpipeline.staleness_queue=2 seed=2")  # a member that never started: skipped with a note
    (sweep / "index.tsv").write_text("\n".join(lines) + "\n")

    # A batch-size sweep (segments 1, 2, 4; one seed): first >= 0.5 at versions 40, 20, 16.
    batch = root / "ablation_batch_size"
    batch.mkdir()
    for number, (segments, r) in enumerate([(1, 40), (2, 20), (4, 16)]):
        series = pipeline_series(50, 0, 1.0)
        series["stats/episode_return"] = ramp(50, r)
        write_run(batch / str(number), config(0, segments=segments), series)
    (batch / "index.tsv").write_text("".join(f"{i}\tpipeline.segments_per_batch={s}\n"
                                             for i, s in enumerate([1, 2, 4])))
    return {"root": root, "moba": root / "moba_run", "gym": root / "gym_run", "rated": root / "rated_run",
            "staleness": sweep, "batch": batch}


def run_script(name: str, *args, ok: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, str(ROOT / "analysis" / f"{name}.py"), *map(str, args)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    if ok:
        assert out.returncode == 0, f"{name} failed:\n{out.stdout}\n{out.stderr}"
    return out


def table(path: Path) -> list[dict[str, str]]:
    lines = [ln for ln in path.read_text().splitlines() if ln.startswith("|")]
    cells = lambda ln: [c.strip() for c in ln.strip().strip("|").split("|")]  # noqa: E731
    return [dict(zip(cells(lines[0]), cells(ln))) for ln in lines[2:]]


def png_ok(path: Path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


# --- the scripts ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", SCRIPTS)
def test_script_help(name):
    out = run_script(name, "--help")
    assert "RUN_OR_SWEEP_DIR" in out.stdout and "--out" in out.stdout


def test_curves(dirs, tmp_path):
    out = run_script("curves", dirs["moba"], dirs["gym"], dirs["staleness"], "--out", tmp_path)
    png_ok(tmp_path / "curves.png")
    rows = {r["run"]: r for r in table(tmp_path / "curves.md")}
    assert rows["moba_run"]["last version"] == "30" and float(rows["moba_run"]["final"]) == 0.75
    assert rows["moba_run"]["best at version"] == "30" and float(rows["moba_run"]["wall time (minutes)"]) == 29.0
    assert rows["moba_run"]["setting changes"] == "v12 ppo.lr.start 0.001 -> 0.0001"  # marked on the plot too
    assert rows["ablation_staleness/0"]["setting changes"] == "-"
    assert float(rows["ablation_staleness/0"]["best"]) == 0.9  # the ramp capped at 0.9 from version 18
    assert rows["ablation_staleness/0"]["best at version"] == "18"
    assert "gym_run" not in rows and "gym_run has no eval/win_rate_vs_scripted" in out.stdout
    assert "ablation_staleness/9" not in rows and "TrueSkill plot skipped" in out.stdout
    assert not (tmp_path / "trueskill.png").exists()
    run_script("curves", dirs["gym"], "--smooth", 3, "--out", tmp_path / "gym")
    gym = table(tmp_path / "gym" / "curves.md")[0]
    assert float(gym["final"]) == pytest.approx(8.0)  # mean of returns 7, 8, 9


def test_curves_prefers_trueskill(dirs, tmp_path):
    assert default_metric(load_runs([dirs["rated"], dirs["moba"]])) == "eval/trueskill/policy"
    run_script("curves", dirs["rated"], "--out", tmp_path)
    png_ok(tmp_path / "trueskill.png")
    row = table(tmp_path / "curves.md")[0]
    assert "eval/trueskill/policy" in (tmp_path / "curves.md").read_text() and float(row["final"]) == 150.0


def test_win_rate(dirs, tmp_path):
    run_script("win_rate", dirs["moba"], "--rows", 3, "--out", tmp_path)
    png_ok(tmp_path / "win_rate.png")
    rows = table(tmp_path / "win_rate.md")
    assert [r["version"] for r in rows] == ["1", "15", "30"]  # rows 0, 14.5 -> 14 (to even), 29
    last = rows[-1]
    assert (last["games"], last["wins"], float(last["win rate"])) == ("20", "15", 0.75)
    low, high = wilson_by_scan(15, 20)
    assert float(last["ci low"]) == pytest.approx(low, abs=1e-3)
    assert float(last["ci high"]) == pytest.approx(high, abs=1e-3)
    out = run_script("win_rate", dirs["gym"], "--out", tmp_path / "gym")
    assert "nothing written" in out.stdout and not (tmp_path / "gym" / "win_rate.png").exists()
    # Blocks of 20 versions pool the disjoint ten-version windows ending at 10 and 20 (5 + 10 wins of 40), then 30.
    run_script("win_rate", dirs["moba"], "--block", 20, "--out", tmp_path / "blocks")
    rows = table(tmp_path / "blocks" / "win_rate.md")
    assert [(r["version"], r["games"], r["wins"]) for r in rows] == [("20", "40", "15"), ("30", "20", "15")]
    assert "blocks of 20 versions" in (tmp_path / "blocks" / "win_rate.md").read_text()
    # The first block reaching each level, with the env steps played by then.
    run_script("win_rate", dirs["moba"], "--block", 20, "--levels", 0.3, 0.7, 0.9, "--out", tmp_path / "levels")
    rows = table(tmp_path / "levels" / "levels.md")
    assert [(r["level"], r["version"], r["env steps"], r["wins"]) for r in rows] == [
        ("0.300", "20", "20000", "15"), ("0.700", "30", "30000", "15"), ("0.900", "not reached", "", "")]
    bad = run_script("win_rate", dirs["moba"], "--block", 15, "--out", tmp_path / "bad", ok=False)
    assert bad.returncode == 2 and "--block must be a positive multiple of 10, got 15" in bad.stderr


def test_env_steps_are_summed_over_a_run_s_jobs():
    """perf/env_steps restarts at 0 with every job of a run (a resume): the run's steps add the jobs'."""
    spec = importlib.util.spec_from_file_location("win_rate", ROOT / "analysis" / "win_rate.py")
    win_rate = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(win_rate)
    got = win_rate.run_env_steps(np.array([1, 2, 3, 5, 4, 6]), np.array([10.0, 20.0, 5.0, 3.0, 15.0, 9.0]))
    assert got.tolist() == [10.0, 20.0, 25.0, 38.0, 35.0, 44.0]  # jobs from versions 3 and 5; rows in any order


def test_data_quality(dirs, tmp_path):
    run_script("data_quality", dirs["moba"], dirs["staleness"], "--out", tmp_path)
    png_ok(tmp_path / "data_quality.png")
    rows = {r["run"]: r for r in table(tmp_path / "data_quality.md")}
    moba = rows["moba_run"]
    assert moba["samples"] == "1200" and float(moba["staleness mean"]) == 0.25
    assert float(moba["p(0)"]) == 0.75 and float(moba["p(1-7)"]) == 0.25 and float(moba["p(>=8)"]) == 0
    assert float(moba["reuse mean"]) == pytest.approx(1.155, abs=1e-3) and float(moba["reuse last"]) == 1.3
    assert moba["rejected segments"] == "3"
    queue8 = rows["ablation_staleness/4"]
    assert float(queue8["staleness mean"]) == 8 and float(queue8["p(>=8)"]) == 1


def test_throughput(dirs, tmp_path):
    run_script("throughput", dirs["moba"], dirs["gym"], "--out", tmp_path)
    png_ok(tmp_path / "throughput.png")
    rows = {r["run"]: r for r in table(tmp_path / "throughput.md")}
    assert float(rows["moba_run"]["env steps/s"]) == 1015.5  # median of 1001..1030
    assert float(rows["moba_run"]["inference ms"]) == 2.5 and rows["moba_run"]["env steps"] == "30000"
    assert float(rows["moba_run"]["inference passes"]) == 2.0
    assert float(rows["gym_run"]["env steps/s"]) == 200 and rows["gym_run"]["inference batch"] == "-"


def test_speedup_staleness_sweep(dirs, tmp_path):
    out = run_script("speedup", dirs["staleness"], "--thresholds", 0.25, 0.5, "--out", tmp_path)
    png_ok(tmp_path / "speedup_ablation_staleness.png")
    assert "ablation_staleness/9 has no metrics.h5; member skipped" in out.stdout
    rows = {(float(r["pipeline.staleness_queue"]), float(r["threshold"])): r
            for r in table(tmp_path / "speedup_ablation_staleness.md")}
    q2 = rows[(2, 0.5)]
    assert q2["reached"] == "2/2" and float(q2["baseline versions"]) == 10
    assert float(q2["speedup mean"]) == pytest.approx(0.45) and float(q2["speedup min"]) == 0.4
    assert float(q2["speedup max"]) == 0.5 and float(q2["speedup std"]) == pytest.approx(0.0707, abs=1e-3)
    q8 = rows[(8, 0.5)]
    assert q8["reached"] == "1/2" and float(q8["speedup mean"]) == 0.25
    assert float(q8["staleness measured"]) == 8 and float(q8["reuse measured"]) == 1
    # At T = 0.25 the queue-2 seeds reach at versions 10 and 13 (ceil(25 / 2)), the baseline at 5.
    assert float(rows[(2, 0.25)]["versions mean"]) == 11.5
    assert float(rows[(0, 0.5)]["speedup mean"]) == 1.0
    assert float(rows[(0, 0.5)]["batch (env steps)"]) == 4 * 2 * 64 * 8
    # The table ends with the direction test at the middle threshold (0.5): queue 8 took 40 and never, queue 0 took
    # 10 and 10; of the 6 splits of the four seeds, only the observed one is as extreme.
    text = (tmp_path / "speedup_ablation_staleness.md").read_text()
    assert text.splitlines()[-1] == ("direction test: staleness 8 is slower than 0 (versions to 0.5, one-sided), "
                                     "p = 0.167")
    run_script("speedup", dirs["staleness"], "--thresholds", 0.25, 0.5, "--test-threshold", 0.25, "--out",
               tmp_path / "t")
    # At 0.25: queue 8 at 20 and 20 (the capped seed reaches 0.25 too), queue 0 at 5 and 5: again 1 of 6.
    last = (tmp_path / "t" / "speedup_ablation_staleness.md").read_text().splitlines()[-1]
    assert last == "direction test: staleness 8 is slower than 0 (versions to 0.25, one-sided), p = 0.167"
    bad = run_script("speedup", dirs["staleness"], "--thresholds", 0.25, 0.5, "--test-threshold", 0.3, "--out",
                     tmp_path / "bad", ok=False)
    assert bad.returncode == 2 and "--test-threshold 0.300 is not one of the thresholds" in bad.stderr


def test_speedup_baseline_flag_default_thresholds_and_errors(dirs, tmp_path):
    run_script("speedup", dirs["staleness"], "--thresholds", 0.5, "--baseline", "largest", "--out", tmp_path)
    rows = {float(r["pipeline.staleness_queue"]): r for r in table(tmp_path / "speedup_ablation_staleness.md")}
    assert float(rows[0]["speedup mean"]) == 4.0  # the queue-8 seed that reached took 40 versions, queue 0 took 10
    # Batch sweep: default thresholds from the baseline (segments 1, ramp to version 40 over 50 versions): start
    # 0.5 / 40 = 0.0125, best 0.5 x 50 / 40 = 0.625.
    out = run_script("speedup", dirs["batch"], "--out", tmp_path)
    assert "batch_size (pipeline.segments_per_batch)" in out.stdout and "stats/episode_return" in out.stdout
    rows = table(tmp_path / "speedup_ablation_batch_size.md")
    thresholds = [0.0125 + f * (0.625 - 0.0125) for f in (0.25, 0.5, 0.75)]
    assert sorted({float(r["threshold"]) for r in rows}) == pytest.approx(thresholds, abs=1e-3)
    for t in thresholds:
        (row,) = [r for r in rows if r["pipeline.segments_per_batch"] == "4" and abs(float(r["threshold"]) - t) < 1e-3]
        # The ramp to version ``reach`` first reaches t at ceil(2 t reach).
        assert float(row["speedup mean"]) == pytest.approx(math.ceil(2 * t * 40) / math.ceil(2 * t * 16), abs=1e-3)
    png_ok(tmp_path / "speedup_ablation_batch_size.png")
    # One seed per value: the 4x batch (segments 4) reached the middle threshold at version 11, the baseline at 26,
    # and 4 x 11 > 26: both halves hold, but one seed against one gives p = 1/2 at best.
    last = (tmp_path / "speedup_ablation_batch_size.md").read_text().splitlines()[-1]
    assert last.startswith("direction test: a 4x batch (segments_per_batch 4) needs fewer versions to 0.31875 than the "
                           "baseline (1), but more than 1/4 as many (sublinear), p = 0.5")
    bad = run_script("speedup", dirs["moba"], "--out", tmp_path, ok=False)
    assert bad.returncode == 2 and "not a sweep directory" in bad.stderr
    bad = run_script("speedup", dirs["staleness"], "--baseline", "3", "--out", tmp_path, ok=False)
    assert bad.returncode == 2 and "not a swept value" in bad.stderr


def test_swept_key_detection(dirs):
    runs = load_runs([dirs["staleness"]])
    assert swept_key(runs) == "pipeline.staleness_queue"
    assert len(runs) == 6  # member 9 never started
    with pytest.raises(ValueError, match="cannot tell"):
        swept_key(load_runs([dirs["moba"], dirs["gym"]]))


# --- Go self-play windows --------------------------------------------------------------------------------------
def go_sittings(seed: int = 0):
    """Two sittings of synthetic self-play: per game its end time, winner (0 black), resignation and moves; and the
    controller's reports every 7 s of each sitting, counting from the sitting's start as a job does."""
    rng = np.random.default_rng(seed)
    games, reports, version = [], [], 0
    for start, length in ((T0, 1500.0), (T0 + 2000.0, 700.0)):
        ends = np.sort(rng.uniform(start, start + length, int(length / 3)))
        games.append([(t, int(rng.integers(2)), bool(rng.random() < 0.4), int(rng.integers(20, 90))) for t in ends])
        for t in np.arange(start + 7.0, start + length, 7.0):
            version += 1
            done = [g for g in games[-1] if g[0] <= t]
            if done:
                reports.append((version, t, len(done), np.mean([g[1] == 0 for g in done]),
                                np.mean([g[2] for g in done]), np.mean([g[3] for g in done]), 1.0 / version))
    return games, reports


def windows_by_hand(games, reports, window_s):
    """Per sitting, windows of window_s from its first report; a window's games those whose report falls in it."""
    out, minutes = [], 0.0
    for sitting, played in enumerate(games, 1):
        times = [r[1] for r in reports if played[0][0] <= r[1] <= played[-1][0] + 7.0]
        t0, t_end = times[0], times[-1]
        edges = [*np.arange(t0 + window_s, t_end, window_s), t_end]
        reported = [max(r for r in times if r <= e) for e in edges]  # the last report of each window
        low = -np.inf
        for edge, upto in zip(edges, reported):
            won = [g for g in played if low < g[0] <= upto]
            if won:
                out.append((sitting, round(minutes + (edge - t0) / 60, 6), len(won), np.mean([g[1] == 0 for g in won]),
                            np.mean([g[2] for g in won]), np.mean([g[3] for g in won])))
                low = upto
        minutes += (t_end - t0) / 60
    return out


def test_selfplay_windows_match_the_games_they_hold():
    from hpc_rl.study import selfplay_windows

    games, reports = go_sittings()
    names = ("selfplay/games", "selfplay/black_win_share", "selfplay/resigned_share", "selfplay/game_length",
             "train/value_loss")
    metrics = {name: np.array([(r[0], 0, r[1], r[2 + i]) for r in reports], dtype=ROW) for i, name in enumerate(names)}
    for window_s in (300.0, 600.0, 5000.0):
        windows = selfplay_windows(metrics, window_s)
        expected = windows_by_hand(games, reports, window_s)
        got = [(w.sitting, round(w.minutes, 6), w.games, w.black_won, w.resigned, w.moves) for w in windows]
        assert [g[:3] for g in got] == [e[:3] for e in expected]
        np.testing.assert_allclose([g[3:] for g in got], [e[3:] for e in expected], atol=1e-9)
        assert windows[-1].value_loss == pytest.approx(1.0 / reports[-1][0]) and windows[-1].buffer_black is None
    assert {w.sitting for w in selfplay_windows(metrics, 600.0)} == {1, 2}
    with pytest.raises(ValueError, match="no selfplay/games"):
        selfplay_windows({}, 600.0)


def test_go_selfplay_script(tmp_path):
    games, reports = go_sittings(1)
    run = tmp_path / "go_run"
    run.mkdir()
    (run / "config.yaml").write_text(yaml.safe_dump({"run_name": "go_run", "env": {"name": "go"}}))
    (run / "meta.json").write_text("{}")
    (run / "status.json").write_text('{"state": "finished", "version": %d}' % reports[-1][0])
    names = ("selfplay/games", "selfplay/black_win_share", "selfplay/resigned_share", "selfplay/game_length")
    with MetricsWriter(run / "metrics.h5", flush_every_s=1e9) as writer:
        for r in reports:
            for i, name in enumerate(names):
                writer.log(name, r[0], 0, r[2 + i], wall_time=r[1])
    run_script("go_selfplay", run, "--out", tmp_path / "plots", "--window-minutes", "5")
    rows = table(tmp_path / "plots" / "go_selfplay.md")
    expected = windows_by_hand(games, reports, 300.0)
    assert len(rows) == len(expected) and [int(r["games"]) for r in rows] == [e[2] for e in expected]
    png_ok(tmp_path / "plots" / "go_selfplay.png")
    bad = run_script("go_selfplay", run, "--out", tmp_path / "plots", "--window-minutes", "0", ok=False)
    assert bad.returncode == 2 and "--window-minutes must be > 0" in bad.stderr
