#!/usr/bin/env bash
# `make reproduce`: OpenAI Five's Figure 5 at small scale on the local Slurm cluster, all three panels: batch size
# (5a), staleness (5b) and sample reuse (5c), each a Hydra multirun of conf/experiment/figure5.yaml members (CartPole
# through the 6-rank pipeline) driven by hpc_rl/reproduce.py, then the plots and tables with their direction tests.
# Resumable: members already finished are skipped, so the sweeps can span sittings (run it again after a stop).
#   make reproduce                               # everything (docs/analysis.md gives the time it takes)
#   REPRO_PARALLEL=4 make reproduce              # members at once, on a machine with the cores for 4 x 6 ranks
#   REPRO_SEEDS="3 4" REPRO_VERSIONS=100 make reproduce   # a short pilot (its own REPRO_RUNS, so it stays apart)
#   REPRO_PANELS="staleness reuse" make reproduce          # some panels only
set -euo pipefail
cd "$(dirname "$0")/.."
PY=.venv/bin/python
OUT=${REPRO_OUT:-docs/figures/figure5}         # apart from the earlier MOBA sweeps' figures in docs/figures
RUNS=${REPRO_RUNS:-runs/figure5}
VERSIONS=${REPRO_VERSIONS:-250}                 # staleness and reuse members
BATCH_VERSIONS=${REPRO_BATCH_VERSIONS:-$((VERSIONS / 2))}
PARALLEL=${REPRO_PARALLEL:-1}                  # 2 cores: one 6-rank member at a time is fastest
PANELS=${REPRO_PANELS:-batch_size staleness reuse}
SEEDS=${REPRO_SEEDS:-}                         # default: the ablation configs' seeds
# Return thresholds: CartPole-v1 starts near 20 and ends at 500; the direction tests use the middle one.
THRESHOLDS=${REPRO_THRESHOLDS:-100 200 300}

bash slurm/local_cluster.sh up
mkdir -p "$OUT" "$RUNS"
# shellcheck disable=SC2086  # the lists split into words on purpose
$PY -m hpc_rl.reproduce --runs "$RUNS" --panels $PANELS ${SEEDS:+--seeds $SEEDS} --versions "$VERSIONS" \
    --batch-versions "$BATCH_VERSIONS" --parallel "$PARALLEL"
echo "== plots ($(date +%H:%M))"
sweeps=()
for panel in $PANELS; do sweeps+=("$RUNS/$panel"); done
# stats/episode_return is already a mean over the last ten versions' episodes: no further smoothing.
$PY analysis/curves.py "${sweeps[@]}" --metric stats/episode_return --out "$OUT"
$PY analysis/data_quality.py "${sweeps[@]}" --out "$OUT"
for panel in $PANELS; do
    # Figure 5a's baseline is the paper's second-smallest batch (2 segments per learner); 5b's and 5c's the smallest
    # queue and reuse.
    baseline=$([ "$panel" = batch_size ] && echo 2 || echo smallest)
    # shellcheck disable=SC2086
    $PY analysis/speedup.py "$RUNS/$panel" --metric stats/episode_return --thresholds $THRESHOLDS \
        --baseline "$baseline" --out "$OUT"
done
echo "plots and tables in $OUT"
