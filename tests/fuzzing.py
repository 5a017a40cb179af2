"""Runs a fuzzing program of tests/programs (fuzz_checkpoint.py, fuzz_metrics.py) in a subprocess, so that a reader
that crashes or hangs on a damaged file (HDF5 has segfaulted and stalled on such files) fails the calling test
instead of ending pytest; returns the program's counts, the JSON object of its last line."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

PROGRAMS = Path(__file__).resolve().parent / "programs"


def run_fuzzer(program: str, *args: object, timeout: float) -> dict:
    try:
        proc = subprocess.run([sys.executable, str(PROGRAMS / program), *map(str, args)], capture_output=True,
                              text=True, timeout=timeout)
    except subprocess.TimeoutExpired as hung:
        pytest.fail(f"the reader hung after:\n{(hung.stdout or b'').decode()[-500:]}")
    tail = "\n".join(proc.stdout.splitlines()[-5:])
    assert proc.returncode == 0, f"the reader died (exit {proc.returncode}) after:\n{tail}\n{proc.stderr[-2000:]}"
    counts = json.loads(proc.stdout.splitlines()[-1])
    assert counts["silent"] == 0 and counts["other"] == 0, proc.stdout[-3000:]
    return counts
