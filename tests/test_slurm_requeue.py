"""How ``hpc_rl.slurm.requeue`` judges an ``scontrol requeue`` that did not report success, in-process, with a
stand-in ``scontrol`` on PATH (the real one, on the local cluster, is in test_slurm_jobs.py)."""

import os
import stat

import pytest

from hpc_rl.slurm import RequeueError, requeue


def _scontrol(tmp_path, monkeypatch, on_requeue: str, restarts: int) -> None:
    script = tmp_path / "scontrol"
    script.write_text(f"""#!/bin/bash
if [ "$1" = requeue ]; then {on_requeue}; fi
echo "JobId=7 JobName=train JobState=RUNNING Restarts={restarts} BatchFlag=1"
""")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SLURM_RESTART_COUNT", "0")


def test_an_scontrol_killed_by_the_requeues_own_term_counts_as_requeued(tmp_path, monkeypatch):
    """Slurm ends a requeued job with TERM, which can reach scontrol before it reports success."""
    _scontrol(tmp_path, monkeypatch, "kill -TERM $$", restarts=1)
    requeue("7")


@pytest.mark.parametrize("on_requeue, why", [
    ("kill -TERM $$", "killed by signal 15"),
    ("echo 'Requeue of JobId=7 returned an error: Requested operation is presently disabled' >&2; exit 1",
     "Requested operation is presently disabled"),
])
def test_a_requeue_slurm_did_not_count_raises_the_reason(tmp_path, monkeypatch, on_requeue, why):
    _scontrol(tmp_path, monkeypatch, on_requeue, restarts=0)
    with pytest.raises(RequeueError, match=f"scontrol requeue 7 failed: .*{why}"):
        requeue("7")
