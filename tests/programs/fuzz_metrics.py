"""Damage copies of one metrics.h5 TRIALS times (seed SEED) in DIR; read each as analysis does (``read_table``) and
as a resume does (``MetricsWriter(recover=True)``); print the outcome counts.

The damage is ``fuzz_checkpoint.damaged``'s. Each trial is announced (flushed) before it, so a crash or a hang names
the trial that caused it; the last line is a JSON object of counts: "refused" (read_table raised DamagedFileError
naming the file, and the resume set it aside and started an empty file), "unchanged" (the table read is the one
written, and the resume kept it), "silent" (other rows read: must never happen) and "other" (any other exception).
Run as a subprocess: h5py parses these bytes, and a segmentation fault must fail the test that drives it.
"""

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
from fuzz_checkpoint import damaged  # noqa: E402

from hpc_rl.storage.hdf5 import DamagedFileError  # noqa: E402
from hpc_rl.storage.metrics import MetricsTable, MetricsWriter, read_table  # noqa: E402


def same(a: MetricsTable, b: MetricsTable) -> bool:
    return a.series.keys() == b.series.keys() and all(np.array_equal(a.series[n], b.series[n]) for n in a.series)


def main(directory: Path, trials: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    written = directory / "written" / "metrics.h5"
    written.parent.mkdir(parents=True)
    with MetricsWriter(written) as writer:
        for version in range(1, 25):
            writer.log_many({f"train/loss{i}": version * i / 3 for i in range(6)}, version=version, step=10 * version)
    original, reference = written.read_bytes(), read_table(written)
    counts = {"refused": 0, "unchanged": 0, "silent": 0, "other": 0}
    kinds = ("flip", "truncate", "zero", "overwrite", "random")
    for trial in range(trials):
        run = directory / f"trial{trial}"
        run.mkdir()
        path = run / "metrics.h5"
        data, what = damaged(original, kinds[trial % len(kinds)], rng)
        path.write_bytes(data)
        print(f"trial {trial}: {what}", flush=True)
        try:
            try:
                table = read_table(path)
            except DamagedFileError as err:
                assert str(path) in str(err), err
                MetricsWriter(path, resume_version=24, recover=True).close()
                set_aside = [p.name for p in run.iterdir() if p.name.startswith("metrics.h5.damaged.")]
                assert len(set_aside) == 1 and read_table(path).rows == 0, (set_aside, read_table(path).rows)
                counts["refused"] += 1
                continue
            MetricsWriter(path, resume_version=24, recover=True).close()
            kept = read_table(path)
        except Exception as err:  # noqa: BLE001 - counted and shown: only DamagedFileError is allowed
            counts["other"] += 1
            print(f"trial {trial}: {type(err).__name__}: {err}", flush=True)
            continue
        counts["unchanged" if same(table, reference) and same(kept, reference) else "silent"] += 1
        if not same(table, reference):
            print(f"trial {trial}: damaged rows read", flush=True)
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
