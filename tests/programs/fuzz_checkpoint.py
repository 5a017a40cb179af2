"""Damage copies of one committed checkpoint TRIALS times (seed SEED) in DIR and load each; print the outcome counts.

Damage kinds, in turn: bit flips, truncation, a zeroed block (16 B to 4 KiB), a block of random bytes, a file of
random bytes (``damaged``, which tests/programs/fuzz_metrics.py and tests/test_storage_damage.py use too). Each trial is announced (flushed) before its load, so a crash names the trial that caused it; the last
line is a JSON object of counts: "refused" (CheckpointError), "unchanged" (the damage changed no byte and the load
returned the original content), "silent" (changed bytes loaded: must never happen) and "other" (any other exception).
Run as a subprocess: a segmentation fault must fail the test that drives it, not end it.
"""

import json
import sys
from pathlib import Path

import numpy as np

from hpc_rl.storage import CheckpointError, commit_checkpoint, load_checkpoint


def damaged(original: bytes, kind: str, rng: np.random.Generator) -> tuple[bytes, str]:
    data = bytearray(original)
    if kind == "flip":
        offsets = rng.integers(0, len(data), size=rng.integers(1, 9))
        for offset in offsets:
            data[offset] ^= 1 << int(rng.integers(0, 8))
        return bytes(data), f"bits flipped at {sorted(int(o) for o in offsets)}"
    if kind == "truncate":
        size = int(rng.integers(0, len(data)))
        return bytes(data[:size]), f"truncated to {size} bytes"
    if kind in ("zero", "overwrite"):
        size = int(rng.integers(min(16, len(data)), min(4096, len(data)) + 1))  # a small file: up to all of it
        offset = int(rng.integers(0, len(data) - size)) if len(data) > size else 0
        data[offset:offset + size] = bytes(size) if kind == "zero" else rng.bytes(size)
        return bytes(data), f"{size} bytes at {offset} {'zeroed' if kind == 'zero' else 'overwritten'}"
    size = int(rng.integers(0, 2 * len(data)))
    return rng.bytes(size), f"{size} random bytes"


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return isinstance(b, np.ndarray) and a.dtype == b.dtype and a.shape == b.shape and np.array_equal(a, b)
    return type(a) is type(b) and a == b


def main(directory: Path, trials: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    params = {f"layer{i}.weight": rng.normal(size=(32, 16)).astype(np.float32) for i in range(6)}
    sections = {"params": params, "optimizer": {"state": {0: {"step": 7, "exp_avg": rng.normal(size=(32, 16))}},
                                                "param_groups": [{"lr": 3e-4, "betas": (0.9, 0.999)}]},
                "rng": {"key": np.array(12345, dtype=np.uint64)}, "misc": {"name": "ppo", "none": None}}
    path = commit_checkpoint(directory / "committed", 3, sections, "cfg")
    original, reference = path.read_bytes(), load_checkpoint(path).sections
    assert equal(reference, sections), "the undamaged checkpoint does not load as written"
    counts = {"refused": 0, "unchanged": 0, "silent": 0, "other": 0}
    trial_path = directory / "trial" / path.name
    trial_path.parent.mkdir()
    kinds = ("flip", "truncate", "zero", "overwrite", "random")
    for trial in range(trials):
        data, what = damaged(original, kinds[trial % len(kinds)], rng)
        trial_path.write_bytes(data)
        print(f"trial {trial}: {what}", flush=True)
        try:
            loaded = load_checkpoint(trial_path)
        except CheckpointError:
            counts["refused"] += 1
            continue
        except Exception as err:  # noqa: BLE001 - counted and shown: only CheckpointError is allowed
            counts["other"] += 1
            print(f"trial {trial}: {type(err).__name__}: {err}", flush=True)
            continue
        if data == original and equal(loaded.sections, reference):
            counts["unchanged"] += 1
        else:
            counts["silent"] += 1
            print(f"trial {trial}: damaged bytes loaded", flush=True)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
