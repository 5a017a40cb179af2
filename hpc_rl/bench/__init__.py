"""Benchmarks: ``python -m hpc_rl.bench NAME [--json] [options]``; what each measures: docs/BENCHMARKS.md.

Each benchmark is a module ``hpc_rl.bench.<NAME>`` with ``add_arguments(parser)`` and ``run(args) -> dict``; the
dict holds the figures (numbers, not prose). Speed is measured here and only here, never by timed assertions in
tests; figures measured in one run are compared as ratios, since the machines are noisy.

A benchmark that reports learning reports it on seeds other than ``TUNING_SEEDS`` (``add_seed_arguments``,
``seed_report``): a default chosen because it did well on some seeds looks better on those seeds than it is.
"""

import importlib
import pkgutil

NAMES = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))

# The seeds the learning defaults were chosen on: the measurements of docs/LEARNING.md (hpc_rl/algo/config.py's and
# hpc_rl/config.py's defaults) ran on seeds 0-2, and the batch size's on 100-109 as well. The presets in
# conf/experiment/ were set from runs whose seeds were not recorded; seed 0, every run's default, is in this set.
TUNING_SEEDS = (0, 1, 2, *range(100, 110))
# What a learning benchmark reports by default: the first three seeds outside TUNING_SEEDS.
REPORT_SEEDS = (3, 4, 5)


def load(name: str):
    if name not in NAMES:
        raise SystemExit(f"unknown benchmark {name!r}; available: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")


def add_seed_arguments(parser) -> None:
    """``--seeds`` (default ``REPORT_SEEDS``) and ``--allow-tuning-seeds``, for a benchmark that reports learning."""
    parser.add_argument("--seeds", type=int, nargs="+", default=list(REPORT_SEEDS),
                        help=f"training seeds to report (default {' '.join(map(str, REPORT_SEEDS))}; the tuning "
                             f"seeds {', '.join(map(str, TUNING_SEEDS))} are refused without --allow-tuning-seeds)")
    parser.add_argument("--allow-tuning-seeds", action="store_true",
                        help="report on seeds the learning defaults were chosen on (the JSON says which)")


def seed_report(seeds: list[int], allow_tuning_seeds: bool) -> dict:
    """The seeds a learning benchmark reports, for its JSON; refuses a tuning seed unless explicitly allowed."""
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0:
        raise ValueError(f"--seeds must be distinct seeds >= 0, got {seeds}")
    tuned = [s for s in seeds if s in TUNING_SEEDS]
    if tuned and not allow_tuning_seeds:
        raise ValueError(f"seeds {tuned} chose the learning defaults (TUNING_SEEDS = {list(TUNING_SEEDS)} in "
                         f"hpc_rl/bench/__init__.py): a report on them flatters the defaults; pick other seeds "
                         f"(default {list(REPORT_SEEDS)}) or pass --allow-tuning-seeds")
    return {"seeds": list(seeds), "tuning_seeds": list(TUNING_SEEDS), "tuning_seeds_reported": tuned}
