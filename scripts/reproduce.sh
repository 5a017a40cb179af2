#!/usr/bin/env bash
# `make reproduce`: OpenAI Five's Figure 5 staleness and sample-reuse ablations at small scale on the local Slurm
# cluster, then the plots. Each sweep is one Slurm array job of 9 members (3 values x 3 seeds), every member a 7-rank
# MPI job (conf/experiment/reproduce.yaml); REPRO_PARALLEL members run at once. On 2 cores one at a time is fastest
# (a 300-version member alone: ~3.5 minutes; two at once: ~12 minutes each, 14 ranks thrashing 2 cores).
#   make reproduce                       # both sweeps, then docs/figures/*.png and *.md (~75 minutes here)
#   REPRO_VERSIONS=60 make reproduce     # shorter members
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${REPRO_OUT:-docs/figures}
RUNS=${REPRO_RUNS:-runs/reproduce}
VERSIONS=${REPRO_VERSIONS:-300}
PARALLEL=${REPRO_PARALLEL:-1}

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
# Ratings come every 10th version from 8+8 games: a trailing mean over 3 of them damps single lucky evaluations.
$PY analysis/curves.py "$RUNS/staleness" "$RUNS/reuse" --smooth 3 --out "$OUT"
# Last: members too short to learn anything leave no threshold to measure a speed-up at, and it says so.
$PY analysis/speedup.py "$RUNS/staleness" "$RUNS/reuse" --smooth 3 --out "$OUT"
echo "plots and tables in $OUT"
