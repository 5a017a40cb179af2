"""Resume from DIR's latest checkpoint and commit one version after another until killed.

Prints "committed V" (flushed) after each commit returns, so the parent knows what was certainly committed.
"""

import sys

import numpy as np

from hpc_rl.storage import commit_checkpoint, load_latest, prune_checkpoints

directory = sys.argv[1]
latest = load_latest(directory, config_hash="cfg")
version = 0 if latest is None else latest.version
rng = np.random.default_rng(version)
while True:
    version += 1
    params = {"w": np.full((128, 128), float(version)), "noise": rng.normal(size=4096)}
    commit_checkpoint(directory, version, {"params": params, "optimizer": {"step": version}}, "cfg")
    prune_checkpoints(directory, keep_last=2, keep_every=1000)
    print(f"committed {version}", flush=True)
