"""Resume from DIR's latest checkpoint and commit one version after another until killed.

Prints one line, flushed, as it reaches each point, so that after a SIGKILL the parent reads from the pipe how far
the writer had got (a line is in the pipe once its print returns):
    begin V           commit_checkpoint is called for version V
    stage V NAME      the commit reached NAME (hpc_rl.storage.checkpoint.COMMIT_STAGES, in order)
    committed V       commit_checkpoint returned: V is certainly committed
    pruned V          the checkpoints older than the last two are deleted; the next line is the next begin
"""

import sys

import numpy as np

from hpc_rl.storage import commit_checkpoint, load_latest, prune_checkpoints

directory = sys.argv[1]
latest = load_latest(directory)
version = 0 if latest is None else latest.version
rng = np.random.default_rng(version)
while True:
    version += 1
    params = {"w": np.full((128, 128), float(version)), "noise": rng.normal(size=4096)}
    print(f"begin {version}", flush=True)
    commit_checkpoint(directory, version, {"params": params, "optimizer": {"step": version}}, "cfg",
                      on_stage=lambda name: print(f"stage {version} {name}", flush=True))
    print(f"committed {version}", flush=True)
    prune_checkpoints(directory, keep_last=2, keep_every=1000)
    print(f"pruned {version}", flush=True)
