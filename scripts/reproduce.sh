#!/usr/bin/env bash
# `make reproduce`: OpenAI Five's Figure 5 staleness and sample-reuse ablations at small scale on the local Slurm
# cluster, then the plots. Each sweep is one Slurm array job of 9 members (3 values x 3 seeds), every member a 7-rank
# MPI job (conf/experiment/reproduce.yaml); REPRO_PARALLEL members run at once (default 2 on 2 cores).
#   make reproduce                       # both sweeps, then docs/figures/*.png and *.md
#   REPRO_VERSIONS=60 make reproduce     # shorter members
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${REPRO_OUT:-docs/figures}
RUNS=${REPRO_RUNS:-runs/reproduce}
VERSIONS=${REPRO_VERSIONS:-400}
PARALLEL=${REPRO_PARALLEL:-2}

bash slurm/local_cluster.sh up
mkdir -p "$OUT" "$RUNS"
for sweep in staleness reuse; do
    echo "== sweep $sweep: 9 members of $VERSIONS versions, $PARALLEL at a time ($(date +%H:%M))"
    $PY jobs/train.py -m "ablation=$sweep" experiment=reproduce hydra/launcher=local_slurm \
        hydra.launcher.tasks_per_node=7 "hydra.launcher.array_parallelism=$PARALLEL" \
        "hydra.sweep.dir=$RUNS/$sweep" "pipeline.max_versions=$VERSIONS"
done
echo "== plots ($(date +%H:%M))"
$PY analysis/data_quality.py "$RUNS/staleness" "$RUNS/reuse" --out "$OUT"
$PY analysis/curves.py "$RUNS/staleness" "$RUNS/reuse" --out "$OUT"
# Last: members too short to learn anything leave no threshold to measure a speed-up at, and it says so.
$PY analysis/speedup.py "$RUNS/staleness" "$RUNS/reuse" --out "$OUT"
echo "plots and tables in $OUT"
