"""``hydra/launcher=checked_submitit_slurm``: hydra-submitit-launcher's Slurm launcher, plus a check of every
sweep member's config before anything is submitted.

The stock launcher composes each member's config inside the Slurm job, so a bad value in a sweep (a negative
learning rate, a topology that does not match the ranks requested) would only fail once the allocation is granted.
Here every member is composed and built into a ``TrainConfig`` (which validates itself) in the submitting process,
and the MPI world each member gets (nodes x tasks_per_node) is checked against its topology.

(No ``from __future__ import annotations`` here: Hydra's plugin scan executes this module without registering it in
``sys.modules``, where dataclasses look up string annotations.)
"""


import _thread
import sys
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn
from omegaconf import open_dict

try:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher
except ImportError as error:  # the base install tier, where Hydra's plugin scan finds this module too
    raise ImportError("hydra/launcher=checked_submitit_slurm needs hydra-submitit-launcher and submitit, the cluster "
                      "install tier: pip install '.[cluster]'") from error


@dataclass
class CheckedSlurmQueueConf(SlurmQueueConf):
    _target_: str = "hydra_plugins.hpc_rl_launcher.checked_launcher.CheckedSlurmLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="checked_submitit_slurm", node=CheckedSlurmQueueConf,
                             provider="hpc_rl")


class CheckedSlurmLauncher(SlurmLauncher):
    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hpc_rl.config import build_config

        ranks = int(self.params["nodes"]) * int(self.params["tasks_per_node"])
        try:
            for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
                member = self.hydra_context.config_loader.load_sweep_config(self.config, list(overrides))
                if "topology" not in member:  # not a training job (e.g. jobs/stack_check.py): nothing to check
                    continue
                with open_dict(member.hydra.job):
                    member.hydra.job.num = idx
                HydraConfig.instance().set_config(member)  # resolves ${hydra:...} as the member's job will
                try:
                    config = build_config(member)
                except ValueError as err:
                    raise ValueError(f"sweep member #{idx} ({' '.join(overrides)}): {err}") from None
                if config.topology.world_size != ranks:
                    raise ValueError(f"sweep member #{idx}: its topology needs {config.topology.world_size} ranks but "
                                     f"the launcher starts {ranks} (nodes x tasks_per_node)")
        finally:
            HydraConfig.instance().set_config(self.config)
        folder = Path(str(self.params["submitit_folder"])).parent
        # A sweep directory launched into again (a resumed sweep) keeps the earlier jobs' folders: not this launch's.
        earlier = {p.name for p in folder.iterdir()} if folder.is_dir() else set()
        watchdog = FailedMemberWatchdog(folder, earlier)
        watchdog.start()
        try:
            return super().launch(job_overrides, initial_job_idx)
        finally:
            watchdog.stop.set()


class FailedMemberWatchdog(threading.Thread):
    """Ends the sweep when a member failed without a result.

    Without Slurm accounting (no ``sacct``) submitit cannot see that a member's job died (say, every rank failed in
    ``MPI_Init``) and waits for its result forever. This thread asks ``scontrol`` instead and, once every task of
    the array has ended and one of them left no result, names it and interrupts the launcher.
    """

    def __init__(self, submitit_dir: Path, earlier: set[str], poll_s: float = 5.0):
        """``earlier``: the folders of jobs submitted before this launch, which it ignores."""
        super().__init__(daemon=True)
        self.dir, self.earlier, self.poll_s = submitit_dir, earlier, poll_s
        self.stop = threading.Event()

    def run(self) -> None:
        from hpc_rl.slurm import TERMINAL_STATES, job_states, task_folders

        while not self.stop.wait(self.poll_s):
            tasks = [self.dir / name for name in task_folders(self.dir, self.earlier)]
            if not tasks:
                continue
            try:
                states = job_states(tasks[0].name.split("_")[0])
            except RuntimeError:  # forgotten by slurmctld (MinJobAge): submitit can read the results itself
                return
            if not states or any(state not in TERMINAL_STATES for state in states.values()):
                continue
            failed = [t for t in tasks if not list(t.glob("*_result.pkl"))]
            if failed:
                names = ", ".join(f"{t.name} ({states.get(t.name, '?')}, logs in {t})" for t in failed)
                print(f"sweep members ended without a result: {names}", file=sys.stderr, flush=True)
                _thread.interrupt_main()
            return
