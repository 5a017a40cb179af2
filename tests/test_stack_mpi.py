"""The MPI and Horovod stack, proven with real Open MPI ranks."""

import json
import time

import pytest

pytestmark = pytest.mark.mpi


def _last_json(stdout: str):
    lines = [line for line in stdout.splitlines() if line.startswith(("{", "["))]
    assert lines, f"no JSON line in output:\n{stdout}"
    return json.loads(lines[-1])


def test_horovod_on_learner_subcommunicator_matches_single_process(mpi):
    out = mpi(4, ["tests/mpi_programs/stack_horovod.py"], timeout=180)
    results = _last_json(out.stdout)
    learners, others = results[:2], results[2:]
    assert all(r["moved"] > 1e-3 for r in learners), "training did not change the parameters"
    assert max(r["learner_max_diff"] for r in learners) == 0.0, "learners' parameters differ"
    assert learners[0]["single_max_diff"] < 1e-5, "2 learners x B differ from 1 process x 2B"
    assert [r["other_work"] for r in others] == [2 * sum(i * i for i in range(100_000))] * 2


def test_world_allreduce_across_ranks(mpi):
    out = mpi(6, ["tests/mpi_programs/hello_ranks.py"], timeout=120)
    report = _last_json(out.stdout)
    assert report["rank_sum"] == sum(range(6))
    assert sorted(r["rank"] for r in report["ranks"]) == list(range(6))
    assert {r["size"] for r in report["ranks"]} == {6}


def test_raising_rank_aborts_whole_job_under_mpirun(mpi):
    start = time.monotonic()
    out = mpi(3, ["tests/mpi_programs/raise_on_rank.py", "1"], timeout=60, check=False)
    elapsed = time.monotonic() - start
    assert out.returncode != 0
    assert "deliberate failure on rank 1" in out.stderr
    assert elapsed < 30, f"the job took {elapsed:.1f}s to die after a rank raised"
