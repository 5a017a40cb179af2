"""The base install tier (``pip install .``: no MPI, Horovod or Slurm) holds storage, analysis, evaluation, the
environments, the bots and rendering; scripts/light_tier_check.sh runs the tests marked ``light`` in such an install."""

import importlib
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.light

ROOT = Path(__file__).resolve().parent.parent
# What the base tier promises (README, "Install tiers"), the scripts run from a checkout included.
BASE_MODULES = ["hpc_rl.storage", "hpc_rl.storage.tensorboard", "hpc_rl.evaluation", "hpc_rl.config",
                "hpc_rl.envs.moba", "hpc_rl.envs.go", "hpc_rl.envs.go_search", "hpc_rl.envs.scripted",
                "hpc_rl.envs.gym_adapter", "hpc_rl.envs.render", "hpc_rl.play", "hpc_rl.actors", "hpc_rl.study",
                "hpc_rl.league.ratings", "hpc_rl.league.tournament", "hpc_rl.league.go_players", "hpc_rl.league.go_ladder",
                "hpc_rl.roles.console", "hpc_rl.transport", "hpc_rl.launch"]
BASE_SCRIPTS = sorted(str(p) for p in (ROOT / "analysis").glob("*.py")) + [str(ROOT / "jobs" / "evaluate.py"),
                                                                             str(ROOT / "jobs" / "tournament.py"),
                                                                             str(ROOT / "jobs" / "go_ladder.py")]
# The other tiers' packages: the MPI tier's, Horovod, and the cluster tier's.
NOT_IN_BASE = ("mpi4py", "horovod", "submitit", "hydra_plugins.hydra_submitit_launcher")


def test_base_tier_modules_and_scripts_import_no_mpi_horovod_or_submitit():
    # In a fresh interpreter (this process may have imported mpi4py for other tests); the scripts run as modules, so
    # that only their imports run, not their main().
    program = f"""
import importlib, runpy, sys
for name in {BASE_MODULES!r}:
    importlib.import_module(name)
for path in {BASE_SCRIPTS!r}:
    runpy.run_path(path, run_name="base_tier_check")
print(sorted(name for name in sys.modules if name.startswith({NOT_IN_BASE!r})))
"""
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
    assert len(BASE_SCRIPTS) >= 8  # analysis/ was found



def test_slurm_launcher_without_the_cluster_tier_names_it(monkeypatch):
    """Hydra's plugin scan imports the project's launcher in every tier: without hydra-submitit-launcher (the base
    tier) its error names the tier to install, in the warning Hydra prints."""
    # Not installed: the package and every submodule an earlier test may have imported (a submodule left in
    # sys.modules would be found without its package).
    launcher = "hydra_plugins.hydra_submitit_launcher"
    for name in [launcher, *(n for n in sys.modules if n.startswith(launcher + "."))]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.delitem(sys.modules, "hydra_plugins.hpc_rl_launcher.checked_launcher", raising=False)
    with pytest.raises(ImportError, match=r"cluster install tier: pip install '\.\[cluster\]'"):
        importlib.import_module("hydra_plugins.hpc_rl_launcher.checked_launcher")
