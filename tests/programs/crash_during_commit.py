"""Commit checkpoint VERSION into DIR and SIGKILL this process at commit stage STAGE (or never, with 'none')."""

import os
import signal
import sys

import numpy as np

from hpc_rl.storage import commit_checkpoint

directory, version, stage = sys.argv[1], int(sys.argv[2]), sys.argv[3]


def on_stage(name: str) -> None:
    if name == stage:
        os.kill(os.getpid(), signal.SIGKILL)


params = {"w": np.full((64, 64), float(version)), "b": np.arange(64, dtype=np.float32) + version}
commit_checkpoint(directory, version, {"params": params, "meta": {"version": version}}, "cfg", on_stage=on_stage)
