"""Benchmarks: ``python -m hpc_rl.bench NAME [--json] [options]``.

Each benchmark is a module ``hpc_rl.bench.<NAME>`` with ``add_arguments(parser)`` and ``run(args) -> dict``; the
dict holds the figures (numbers, not prose). Speed is measured here and only here, never by timed assertions in
tests; figures measured in one run are compared as ratios, since the machines are noisy.
"""

import importlib
import pkgutil

NAMES = sorted(m.name for m in pkgutil.iter_modules(__path__) if not m.name.startswith("_"))


def load(name: str):
    if name not in NAMES:
        raise SystemExit(f"unknown benchmark {name!r}; available: {', '.join(NAMES)}")
    return importlib.import_module(f"{__name__}.{name}")
